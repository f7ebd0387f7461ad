"""int8_delta with error feedback is idempotent per exchange: encoding the same (run, round, stage) again, as a retry or after
a restart does, gives the same bytes and leaves the residual as after one encoding."""

from __future__ import annotations

import numpy as np

from edge_client.store import ClientStore
from edge_client.trainer import RESIDUAL_NAME, encode_for_upload
from har_models.data.labels import HAPT_LABELS
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=2)
RECEIVED = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}


def _ann(round_: int, stage: int = 0, run_id: str = "r") -> RoundAnnouncement:
    plan = TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, update_encoding="int8_delta")
    return RoundAnnouncement(run_id=run_id, round=round_, stage=stage, state="training", arch=SPEC.to_dict(), label_set="hapt6",
                             selected=("c",), plan=plan)  # fmt: skip


def _trained(round_: int) -> dict[str, np.ndarray]:
    """A trained model of this round: the received one moved by a delta that no int8 step codes exactly."""
    rng = np.random.default_rng(100 + round_)
    return {k: (v + rng.normal(scale=0.013, size=v.shape)).astype(np.float32) for k, v in RECEIVED.items()}


def _bytes(store: ClientStore, ann: RoundAnnouncement) -> bytes:
    arrays, encoding = encode_for_upload(store, ann, _trained(ann.round), RECEIVED)
    assert encoding == "int8_delta"
    return codec.encode(dict(arrays), kind="update", round=ann.round, arch_version=SPEC.version, client_id="c",
                        meta={"run_id": ann.run_id, "stage": ann.stage})  # fmt: skip


def _residual(store: ClientStore) -> dict[str, np.ndarray]:
    loaded = store.load_tensors(RESIDUAL_NAME)
    assert loaded is not None
    return {k: v for k, v in loaded[0].items() if k in RECEIVED}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_encoding_an_exchange_again_gives_the_same_bytes_and_residual(tmp_path):
    once = ClientStore(tmp_path / "once", HAPT_LABELS)
    twice = ClientStore(tmp_path / "twice", HAPT_LABELS)
    try:
        sent_once = [_bytes(once, _ann(r)) for r in (0, 1, 2)]
        residual_once = _residual(once)
        sent_twice = []
        for r in (0, 1, 2):
            first = _bytes(twice, _ann(r))
            after_first = _residual(twice)
            again = _bytes(twice, _ann(r))  # a retry of the same exchange
            assert again == first and _same(_residual(twice), after_first), r
            sent_twice.append(again)
        assert sent_twice == sent_once and _same(_residual(twice), residual_once)
        assert any(np.abs(v).max() > 0 for v in residual_once.values())  # there is feedback to double-count
    finally:
        once.close()
        twice.close()


def test_after_a_restart_the_same_exchange_encodes_the_same_and_the_next_one_continues(tmp_path):
    ref = ClientStore(tmp_path / "ref", HAPT_LABELS)
    expected = [_bytes(ref, _ann(r, stage=s)) for r, s in ((0, 0), (1, 0), (1, 1), (2, 0))]
    ref.close()
    store = ClientStore(tmp_path / "dev", HAPT_LABELS)
    assert [_bytes(store, _ann(r, stage=s)) for r, s in ((0, 0), (1, 0), (1, 1))] == expected[:3]
    store.close()
    store = ClientStore(tmp_path / "dev", HAPT_LABELS)  # the process restarted: round 1 stage 1 is encoded again
    try:
        assert _bytes(store, _ann(1, stage=1)) == expected[2]
        assert _bytes(store, _ann(2)) == expected[3]  # and the next exchange carries the residual of one encoding
    finally:
        store.close()


def test_another_run_starts_without_the_residual_even_for_the_same_round(tmp_path):
    store = ClientStore(tmp_path, HAPT_LABELS)
    fresh = ClientStore(tmp_path / "fresh", HAPT_LABELS)
    try:
        _bytes(store, _ann(0))
        _bytes(store, _ann(1))
        assert _bytes(store, _ann(1, run_id="r2")) == _bytes(fresh, _ann(1, run_id="r2"))
    finally:
        store.close()
        fresh.close()
