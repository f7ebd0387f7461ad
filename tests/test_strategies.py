"""Strategy properties: FedProx with mu = 0 is FedAvg; FedPer never overwrites local layers."""

from __future__ import annotations

import numpy as np
import torch

from coordinator.strategy import FEDPER_LOCAL, FedPer, FedProx, Strategy
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


def test_fedprox_with_mu_zero_trains_exactly_like_fedavg():
    start = init_state(SPEC, 1)
    data = _data()
    plain = train_local(SPEC, start, data, TrainConfig(2, 0.05, 8, seed=3), make_loss(None))
    prox0 = train_local(SPEC, start, data, TrainConfig(2, 0.05, 8, prox_mu=0.0, seed=3), make_loss(None), prox_ref=start)
    assert all(torch.equal(plain.state[k], prox0.state[k]) for k in start)
    assert FedProx(0.0).configure_fit(0, TrainingPlan()).prox_mu == 0.0 and Strategy().configure_fit(0, TrainingPlan()) == TrainingPlan()


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
    from coordinator.strategy import FedDWA, Federation
    from coordinator.updates import ClientUpdate

    g = torch.Generator().manual_seed(0)
    base = init_state(SPEC, 0)

    def step(state, scale):
        return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in state.items()}

    trained = [step(base, 0.1) for _ in range(8)]
    ups = [
        spill_update(ClientUpdate(f"c{j}", 1, 0, 20 + 3 * j, 5, w, step(w, 0.01), size=0), tmp_path)  # as the service does
        for j, w in enumerate(trained)
    ]
    agg = FedDWA(top_k=2).aggregate_fit(1, Federation(SPEC, SPEC, base), ups)
    want = weighted_average(trained, [u.n_train for u in ups])
    assert set(agg.global_state) == set(want)
    for k in want:
        torch.testing.assert_close(agg.global_state[k], want[k], rtol=2e-7, atol=1e-7)
    assert sorted(agg.personal) == agg.participants == [u.client_id for u in ups]
    torch.testing.assert_close(agg.mixing.sum(0), torch.ones(8, dtype=torch.float64))
