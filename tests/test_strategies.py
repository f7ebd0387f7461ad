"""Strategy properties: FedProx with mu = 0 is FedAvg; FedPer never overwrites local layers; the registry
finds every strategy file, so a new strategy is one file; every strategy hands out and takes back its state."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator import strategies
from coordinator.config import AGGREGATIONS, CoordinatorConfig
from coordinator.strategies import FedAvg, Federation, make_strategy
from coordinator.strategies.feddwa import FedDWA, FedDWASettings
from coordinator.strategies.fedper import FEDPER_LOCAL, FedPer
from coordinator.strategies.fedprox import FedProx, FedProxSettings
from coordinator.updates import ClientUpdate
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from har_models.nn.model import ArchSpec, init_state
from har_models.nn.training import TrainConfig, make_loss, train_local
from har_models.wire import codec
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return WindowSet(rng.normal(size=(n, 6, 128)).astype(np.float32), np.arange(n) % 6, HAPT_LABELS)


@pytest.mark.slow
def test_fedprox_with_mu_zero_trains_exactly_like_fedavg():
    start = init_state(SPEC, 1)
    data = _data()
    plain = train_local(SPEC, start, data, TrainConfig(2, 0.05, 8, seed=3), make_loss(None))
    prox0 = train_local(SPEC, start, data, TrainConfig(2, 0.05, 8, prox_mu=0.0, seed=3), make_loss(None), prox_ref=start)
    assert all(torch.equal(plain.state[k], prox0.state[k]) for k in start)
    assert FedProx(FedProxSettings(mu=0.0)).configure_fit(0, TrainingPlan()).prox_mu == 0.0
    assert FedAvg().configure_fit(0, TrainingPlan()) == TrainingPlan()


@pytest.mark.slow
def test_fedprox_pulls_towards_the_received_model():
    start = init_state(SPEC, 1)
    data = _data()
    far = train_local(SPEC, start, data, TrainConfig(3, 0.1, 8, seed=3), make_loss(None)).state
    near = train_local(SPEC, start, data, TrainConfig(3, 0.1, 8, prox_mu=5.0, seed=3), make_loss(None), prox_ref=start).state

    def dist(s):
        return sum(float(((s[k] - start[k]) ** 2).sum()) for k in start)

    assert dist(near) < dist(far)


def test_fedper_keeps_the_dense_layers_local(tmp_path):
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.replace_windows("src", _data(50), 0.2, seed=1)
    local = {k: v + 1.0 for k, v in init_state(SPEC, 7).items()}
    store.set_meta("run_id", "r")
    store.save_local_model(SPEC.to_json(), {k: v.numpy() for k, v in local.items()})
    received = init_state(SPEC, 8)
    plan = FedPer().configure_fit(0, TrainingPlan(local_epochs=0))  # no training: the upload is the initial model itself
    ann = RoundAnnouncement(run_id="r", round=1, state="training", arch=SPEC.to_dict(), label_set="hapt6", selected=("c",), plan=plan)
    out = ClientTrainer(store, "c").run_round(ann, {k: v.numpy() for k, v in received.items()})
    sent = codec.decode(out.envelope).tensors
    for k in SPEC.shapes():
        want = local[k] if k in FEDPER_LOCAL else received[k]
        np.testing.assert_array_equal(sent[k], want.numpy(), err_msg=k)
    assert set(FEDPER_LOCAL) == {"hidden.weight", "hidden.bias", "out.weight", "out.bias"}


def test_feddwa_global_model_is_the_fedavg_average_of_its_updates(tmp_path):
    from coordinator.aggregation import weighted_average
    from coordinator.spill import spill_update

    g = torch.Generator().manual_seed(0)
    base = init_state(SPEC, 0)

    def step(state, scale):
        return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in state.items()}

    trained = [step(base, 0.1) for _ in range(8)]
    ups = [
        spill_update(ClientUpdate(f"c{j}", 1, 0, 20 + 3 * j, 5, w, step(w, 0.01), size=0), tmp_path)  # as the service does
        for j, w in enumerate(trained)
    ]
    agg = FedDWA(FedDWASettings(top_k=2)).aggregate_fit(1, Federation(SPEC, SPEC, base), ups)
    want = weighted_average(trained, [u.n_train for u in ups])
    assert set(agg.global_state) == set(want)
    for k in want:
        torch.testing.assert_close(agg.global_state[k], want[k], rtol=2e-7, atol=1e-7)
    assert sorted(agg.personal) == agg.participants == [u.client_id for u in ups]
    torch.testing.assert_close(agg.mixing.sum(0), torch.ones(8, dtype=torch.float64))


ROOT = Path(__file__).resolve().parents[1]
ALL = ("fedadam", "fedavg", "fedavgm", "feddwa", "fedexp", "fedper", "fedprox", "fedyogi")


def test_the_registry_holds_one_file_per_strategy_and_everything_reads_it():
    assert strategies.names() == AGGREGATIONS == ALL
    for name, cls in strategies.REGISTRY.items():
        assert cls.__module__ == f"coordinator.strategies.{name}", f"{name} is not alone in its file"
        assert make_strategy(name).name == name
    with pytest.raises(ValueError, match="unknown aggregation 'fedsgd'; choose one of fedadam, fedavg, fedavgm"):
        make_strategy("fedsgd")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        CoordinatorConfig(run_dir=Path("."), aggregation="fedsgd")
    # FedDist's paper mode only where one global model is taken whole by every client.
    assert sorted(n for n, c in strategies.REGISTRY.items() if c.feddist_paper) == ["fedavg", "fedprox"]


def test_a_strategy_reads_its_own_table_of_the_configuration():
    cfg = CoordinatorConfig(run_dir=Path("."), strategies={"fedprox": FedProxSettings(mu=0.5), "feddwa": {"top_k": 3}})
    assert make_strategy("fedprox", cfg).configure_fit(0, TrainingPlan()).prox_mu == 0.5
    assert make_strategy("feddwa", cfg).top_k == 3
    assert make_strategy("fedprox").configure_fit(0, TrainingPlan()).prox_mu == FedProxSettings().mu == 0.01
    with pytest.raises(TypeError, match="fedavg has no settings"):
        FedAvg(FedProxSettings())
    with pytest.raises(TypeError, match="settings must be FedProxSettings"):
        FedProx(FedDWASettings())


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_hands_out_its_state_and_takes_it_back(name: str):
    """After one round, a fresh strategy given the first one's state_dict() takes the same second step."""
    w0 = init_state(SPEC, 0)
    ups1 = [ClientUpdate(f"c{j}", 0, 0, 10 + j, 2, {k: v + 0.1 * (j + 1) for k, v in w0.items()}, None) for j in range(3)]
    first = make_strategy(name)
    g1 = first.aggregate_fit(0, Federation(SPEC, SPEC, w0), ups1).global_state
    saved = first.state_dict()
    ups2 = [ClientUpdate(u.client_id, 1, 0, u.n_train, 2, {k: v - 0.05 for k, v in g1.items()}, None) for u in ups1]
    want = first.aggregate_fit(1, Federation(SPEC, SPEC, g1), ups2).global_state
    again = make_strategy(name)
    again.load_state_dict(saved, SPEC)
    got = again.aggregate_fit(1, Federation(SPEC, SPEC, g1), ups2).global_state
    assert all(torch.equal(got[k], want[k]) for k in want)
    stateful = first.keeps_state
    assert bool(saved) == stateful == (name in ("fedavgm", "fedadam", "fedyogi", "fedexp"))
    if not stateful:
        with pytest.raises(ValueError, match="keeps no state"):
            again.load_state_dict({"m.conv.weight": torch.zeros(1)})


def test_a_strategy_state_is_refused_when_it_does_not_fit_the_model():
    opt = make_strategy("fedadam")
    with pytest.raises(ValueError, match="not a moment of a model tensor"):
        opt.load_state_dict({"m.nope": torch.zeros(2)}, SPEC)
    with pytest.raises(ValueError, match="holds NaN or inf"):
        opt.load_state_dict({"v.out.bias": torch.full((6,), float("nan"))}, SPEC)
    with pytest.raises(ValueError, match="has shape"):
        opt.load_state_dict({"m.out.bias": torch.zeros(7)}, SPEC)
    assert opt.state_dict() == {}  # nothing taken from a refused state


THROWAWAY = '''"""FedKeep: a throwaway strategy that keeps the global model as it was (tests only)."""

from __future__ import annotations

from coordinator.strategies.base import Aggregate, Strategy, contributors


class FedKeep(Strategy):
    """The server ignores what the clients trained."""

    name = "fedkeep"

    def aggregate_fit(self, round_, fed, results, failures=()):
        return Aggregate(dict(fed.global_state), {}, None, [u.client_id for u in contributors(results)])
'''


@pytest.mark.slow
def test_a_new_stateless_strategy_is_one_new_file(tmp_path: Path):
    """A copy of the code with one more file in coordinator/strategies/ runs a federation with it, by name.

    The new name reaches --aggregation's choices, the configuration's check and the study's
    names without any other edit. FedKeep keeps the initial model, so both rounds evaluate
    the same global model: the same figures, where FedAvg's model would move.
    """
    tree = tmp_path / "tree"
    for pkg in ("coordinator", "har_models", "har_io", "edge_client", "simulation"):
        shutil.copytree(ROOT / pkg, tree / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "datasets").symlink_to(ROOT / "datasets")
    (tree / "coordinator" / "strategies" / "fedkeep.py").write_text(THROWAWAY)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    check = ("from coordinator.config import AGGREGATIONS; from simulation.study import strategy_args; "
             "print(AGGREGATIONS, strategy_args('fedkeep+ala'))")
    out = subprocess.run([sys.executable, "-c", check], cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert "'fedkeep'" in out.stdout and "['--aggregation', 'fedkeep', '--client-init', 'ala']" in out.stdout, out.stderr
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "simulation.simulate", "--clients", "3", "--rounds", "2", "--conv-filters", "4",
           "--dense-units", "8", "--no-progress", "--aggregation", "fedkeep", "--run-dir", str(run_dir),
           "--round-timeout", "120", "--start-timeout", "120", "--generalisation-every", "0"]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((run_dir / "report.json").read_text())
    assert doc["config"]["aggregation"] == "fedkeep"
    assert [r["updates"] for r in doc["rounds"]] == [3, 3]
    assert doc["rounds"][0]["global"] == doc["rounds"][1]["global"]
    assert not list(run_dir.glob("models/*/strategy_state.safetensors"))  # stateless: nothing saved
