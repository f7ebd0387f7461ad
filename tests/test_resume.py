"""A coordinator that stops after a completed round resumes from it, with the same clients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.configs import config

from coordinator.config import Timing
from coordinator.service import Coordinator
from coordinator.state import LEGACY_SERVER_OPT_FILE, STRATEGY_STATE_FILE, RunState
from coordinator.strategies.fedopt import ServerOptSettings
from har_io.broker_config import BrokerConfig
from simulation.broker import EmbeddedBroker

pytestmark = pytest.mark.slow  # federations stopped and resumed

ROOT = Path(__file__).resolve().parents[1]


def _clients(broker: EmbeddedBroker, tmp_path: Path, n: int = 2) -> list[subprocess.Popen[bytes]]:
    procs = []
    for k in range(1, n + 1):
        cid = f"hapt-{k:02d}"
        cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, "--broker", f"127.0.0.1:{broker.port}",
               "--federation", "resume", "--source", f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}",
               "--state-dir", str(tmp_path / cid), "--threads", "1", "--max-seconds", "240"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT))
    return procs


def test_resume_continues_after_the_last_completed_round(tmp_path):
    run_dir = tmp_path / "run"
    with EmbeddedBroker() as broker:
        procs = _clients(broker, tmp_path)
        try:
            common = dict(run_dir=run_dir, broker=BrokerConfig(port=broker.port), federation="resume", run_id="r1",
                          timing={"start_timeout_s": 120, "round_timeout_s": 120}, model={"conv_filters": 8, "dense_units": 16})
            Coordinator(config(common, dict(rounds=1, timing=Timing(expected_clients=2))), progress=False).run()
            state = RunState(run_dir)
            first_global = state.load_round_models(0)[1]
            state.close()
            # The same run, asked for 3 rounds, picks up at round 1 from round 0's models. No expected count
            # this time: it starts once 2 clients are online and nobody new came for 1 s.
            cfg = config(common, dict(rounds=3, resume=True, min_clients=2, timing={"start_settle_s": 1.0}))
            doc = Coordinator(cfg, progress=False).run()
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    assert [r["round"] for r in doc["rounds"]] == [0, 1, 2]
    assert all(r["updates"] == 2 for r in doc["rounds"])
    state = RunState(run_dir)
    assert state.last_completed_round() == 2
    spec, g, _ = state.load_round_models(2)
    assert spec.conv_filters == 8 and not all(bool((g[k] == first_global[k]).all()) for k in g)
    assert json.loads((run_dir / "report.json").read_text())["run_id"] == "r1"


def _fedavgm_run(tmp_path: Path, name: str, stops: list[int]) -> dict[str, torch.Tensor]:
    """FedAvgM with beta 0.5 through round max(stops); the coordinator is restarted after each earlier stop."""
    run_dir = tmp_path / name
    with EmbeddedBroker() as broker:
        procs = _clients(broker, tmp_path / name)
        try:
            common = dict(run_dir=run_dir, broker=BrokerConfig(port=broker.port), federation="resume", run_id="m1",
                          timing={"start_timeout_s": 120, "round_timeout_s": 120}, model={"conv_filters": 8, "dense_units": 16},
                          training={"lr": 0.05}, aggregation="fedavgm", strategies={"server_opt": ServerOptSettings(momentum=0.5)})
            for k, last in enumerate(stops):
                more = dict(timing={"expected_clients": 2}) if k == 0 else dict(resume=True, min_clients=2, timing={"start_settle_s": 1.0})
                Coordinator(config(common, more, dict(rounds=last + 1)), progress=False).run()
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    state = RunState(run_dir)
    try:
        assert state.last_completed_round() == stops[-1]
        saved = state.load_strategy_state(stops[-1], "fedavgm")
        assert saved is not None and set(saved) == {f"m.{k}" for k in state.load_round_models(stops[-1])[1]}
        return state.load_round_models(stops[-1])[1]
    finally:
        state.close()


def test_server_optimiser_moments_survive_a_restart(tmp_path):
    """A FedAvgM run stopped after round 0 and resumed ends with the same model as one that never stopped.

    The clients' training is seeded by (seed, client, round), so only the server momentum m_t
    (Reddi et al. 2021, Alg. 2) could make the two differ: restarted at zero it changes
    round 1's step, and so the final model.
    """
    straight = _fedavgm_run(tmp_path, "straight", [2])
    resumed = _fedavgm_run(tmp_path, "resumed", [0, 2])
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_the_run_folder_keeps_any_strategy_state_under_its_name(tmp_path):
    """complete_round saves state_dict() with the strategy's name; a run folder of the old layout still loads."""
    from safetensors.torch import save_file

    from coordinator.strategies import make_strategy
    from har_models.nn.model import ArchSpec, init_state

    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    g = init_state(spec, 0)
    state = RunState(tmp_path / "run")
    try:
        moments = {f"m.{k}": torch.full_like(v, 0.25) for k, v in g.items()}
        state.complete_round(0, spec, g, {}, {"round": 0}, strategy_state=("fedavgm", moments))
        state.complete_round(1, spec, g, {}, {"round": 1}, strategy_state=("fedavg", {}))
        folder = tmp_path / "run" / "models"
        assert (folder / "r0000" / STRATEGY_STATE_FILE).exists() and not (folder / "r0001" / STRATEGY_STATE_FILE).exists()
        back = state.load_strategy_state(0, "fedavgm")
        assert back is not None and all(torch.equal(back[k], moments[k]) for k in moments)
        assert state.load_strategy_state(1, "fedavg") is None
        with pytest.raises(ValueError, match="state of strategy 'fedavgm', this run aggregates with 'fedadam'"):
            state.load_strategy_state(0, "fedadam")
        # Written before the strategies saved their state under one name: the server optimiser's own file.
        (folder / "r0000" / STRATEGY_STATE_FILE).rename(folder / "r0000" / LEGACY_SERVER_OPT_FILE)
        old = state.load_strategy_state(0, "fedavgm")
        assert old is not None and set(old) == set(moments)
        opt = make_strategy("fedavgm")
        opt.load_state_dict(old, spec)
        assert all(torch.equal(opt.state_dict()[k], moments[k]) for k in moments)
        (folder / "r0000" / LEGACY_SERVER_OPT_FILE).write_bytes(b"not safetensors")
        with pytest.raises(ValueError, match="unreadable"):
            state.load_strategy_state(0, "fedavgm")
        save_file({"m.x": torch.zeros(1)}, str(folder / "r0001" / STRATEGY_STATE_FILE), metadata={"strategy": "fedavgm"})
        with pytest.raises(ValueError, match="not a moment of a model tensor"):
            opt.load_state_dict(state.load_strategy_state(1, "fedavgm") or {}, spec)
    finally:
        state.close()
