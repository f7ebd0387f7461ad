"""A federation whose clients train through three backends: PyTorch, numpy with PyTorch blocked, ExecuTorch.

Three HAPT subjects, a small CNN, the embedded broker, the coordinator in this process
and the clients as separate processes, exactly as devices would run them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig, EvaluationSettings, ModelSettings, Timing, TrainingSettings
from coordinator.evaluation import Evaluator
from coordinator.service import Coordinator
from coordinator.state import RunState
from har_io.broker_config import BrokerConfig
from har_models.data.subjects import union_test_set
from simulation.broker import EmbeddedBroker

pytestmark = pytest.mark.slow  # a federation of torch, numpy and ExecuTorch clients

ROOT = Path(__file__).resolve().parents[1]
BLOCK_TORCH = "import sys; sys.modules['torch'] = None; from edge_client.cli import main; sys.exit(main(sys.argv[1:]))"


def _client(k: int, backend: str, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    cid = f"hapt-{k:02d}"
    args = ["--client-id", cid, "--broker", f"127.0.0.1:{port}", "--federation", "mixed", "--source",
            f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}", "--state-dir", str(tmp / cid),
            "--backend", backend, "--program-cache", str(tmp / "programs"), "--max-seconds", "400", "--exit-after-run", "mixed"]
    # The numpy client runs with PyTorch made unimportable: any import of it would fail the client.
    cmd = [sys.executable, "-c", BLOCK_TORCH, *args] if backend == "numpy" else [sys.executable, "-m", "edge_client.cli", *args]
    with open(tmp / f"{cid}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def test_torch_numpy_and_executorch_clients_learn_together(tmp_path: Path) -> None:
    pytest.importorskip("executorch")
    backends = {1: "torch", 2: "numpy", 3: "executorch"}
    sources = {f"hapt-{k:02d}": f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}" for k in backends}
    with EmbeddedBroker() as broker:
        procs = [_client(k, b, broker.port, tmp_path) for k, b in backends.items()]
        try:
            cfg = CoordinatorConfig(
                run_dir=tmp_path / "run", broker=BrokerConfig(port=broker.port), federation="mixed", run_id="mixed",
                rounds=3, timing=Timing(expected_clients=3, start_timeout_s=300,
                                        round_timeout_s=300), model=ModelSettings(conv_filters=8,
                                        dense_units=32), training=TrainingSettings(lr=0.05,
                                        local_epochs=2), evaluation=EvaluationSettings(generalisation_every=0))
            doc = Coordinator(cfg, Evaluator(union_test_set(sources)), progress=False).run()
        finally:
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
    logs = {k: (tmp_path / f"hapt-{k:02d}.log").read_text() for k in backends}
    assert [r["updates"] for r in doc["rounds"]] == [3, 3, 3], logs
    assert doc["rounds"][-1]["global"]["accuracy"] > 0.5  # chance on six activities: 0.167
    assert "'backend': 'numpy'" in logs[2] and "'backend': 'executorch'" in logs[3]
    assert all(p.returncode == 0 for p in procs), {k: v[-2000:] for k, v in logs.items()}
    spec, _, _ = RunState(tmp_path / "run").load_round_models(2)
    assert spec.conv_filters == 8


def test_without_torch_and_without_backend_the_client_picks_numpy_says_so_and_trains(tmp_path: Path) -> None:
    """The Pi's install: no PyTorch, no ``--backend``, ``--threads 2``: the client takes the numpy backend, logs it, trains."""
    cid = "hapt-01"
    src = f"hapt:{ROOT / 'datasets' / 'hapt' / 'user01.npz'}"
    with EmbeddedBroker() as broker:
        args = ["--client-id", cid, "--broker", f"127.0.0.1:{broker.port}", "--federation", "plain", "--source", src,
                "--state-dir", str(tmp_path / cid), "--threads", "2", "--max-seconds", "300", "--exit-after-run", "plain"]  # fmt: skip
        with open(tmp_path / "client.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-c", BLOCK_TORCH, *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            cfg = CoordinatorConfig(
                run_dir=tmp_path / "run", broker=BrokerConfig(port=broker.port), federation="plain", run_id="plain",
                rounds=1, min_clients=1, timing=Timing(expected_clients=1, start_timeout_s=200,
                                                       round_timeout_s=200), model=ModelSettings(conv_filters=8,
                                                       dense_units=32), training=TrainingSettings(lr=0.05,
                                                       local_epochs=1), evaluation=EvaluationSettings(generalisation_every=0))
            doc = Coordinator(cfg, Evaluator(union_test_set({cid: src})), progress=False).run()
        finally:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    text = (tmp_path / "client.log").read_text()
    assert f"[{cid}] training backend: numpy (best installed; torch: torch not installed" in text, text[-2000:]
    assert "--threads 2 ignored" in text
    assert [r["updates"] for r in doc["rounds"]] == [1], text[-2000:]
    assert "'backend': 'numpy'" in text and proc.returncode == 0, text[-2000:]
