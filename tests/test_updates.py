"""Update validation: each way an upload can be wrong is rejected with its own reason."""

import numpy as np
import pytest

from coordinator.updates import UpdateRejected, validate_update
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=2)
STATE = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}
GOOD_META = {
    "run_id": "r",
    "stage": 0,
    "n_train": 40,
    "n_test": 10,
    "confusion": {"trained": np.eye(6, dtype=int).tolist(), "received": None},
}


def make(tensors=None, *, round_=3, version=2, client="c1", meta=None, kind="update"):
    return codec.encode(
        STATE if tensors is None else tensors,
        kind=kind,
        round=round_,
        arch_version=version,
        client_id=client,
        meta=GOOD_META if meta is None else meta,
    )


def check(data, *, topic_client="c1", guidance=False):
    return validate_update(
        data, topic_client=topic_client, run_id="r", round_=3, stage=0, spec=SPEC, selected={"c1", "c2"}, want_guidance=guidance
    )


def reason(data, **kw):
    with pytest.raises(UpdateRejected) as e:
        check(data, **kw)
    return e.value.reason


def test_a_good_update_is_accepted_with_its_metrics():
    u = check(make())
    assert (u.client_id, u.round, u.n_train, u.n_test) == ("c1", 3, 40, 10)
    np.testing.assert_array_equal(u.confusion["trained"], np.eye(6))
    assert "received" not in u.confusion
    assert all(np.array_equal(u.state[k].numpy(), STATE[k]) for k in STATE)


def test_each_defect_has_its_reason():
    nan_state = {**STATE, "out.bias": np.full(6, np.nan, np.float32)}
    corrupted = bytearray(make())
    corrupted[-3] ^= 0x55
    assert reason(bytes(corrupted)) == "sha256_mismatch"
    assert reason(make()[:-10]) == "truncated"
    assert reason(make(kind="model")) == "wrong_kind"
    assert reason(make(client="c2")) == "client_mismatch"
    assert reason(make(client="c9"), topic_client="c9") == "not_selected"
    assert reason(make(meta={**GOOD_META, "run_id": "old"})) == "wrong_run"
    assert reason(make(round_=2)) == "stale_round"
    assert reason(make(round_=4)) == "future_round"
    assert reason(make(meta={**GOOD_META, "stage": 1})) == "stale_stage"
    assert reason(make(version=1)) == "wrong_arch_version"
    assert reason(make({k: v for k, v in STATE.items() if k != "out.bias"})) == "wrong_tensors"
    assert reason(make({**STATE, "out.bias": np.zeros(7, np.float32)})) == "wrong_tensors"
    assert reason(make(nan_state)) == "non_finite"
    assert reason(make(), guidance=True) == "missing_guidance"
    assert reason(make(meta={**GOOD_META, "n_train": -1})) == "bad_metrics"
    assert reason(make(meta={**GOOD_META, "confusion": {"trained": [[1, 2], [3, 4]]}})) == "bad_metrics"


def test_guidance_model_is_split_off_by_prefix():
    guided = {**STATE, **{f"guidance/{k}": v + 1 for k, v in STATE.items()}}
    u = check(make(guided), guidance=True)
    np.testing.assert_array_equal(u.guidance["out.bias"].numpy(), STATE["out.bias"] + 1)
    np.testing.assert_array_equal(u.state["out.bias"].numpy(), STATE["out.bias"])


@pytest.mark.parametrize(
    "bad_meta",
    [
        {"n_train": 10**400},  # OverflowError in FedAvg before the range check
        {"n_train": 10**300},  # would make the aggregate exactly this one update
        {"n_train": 40.0},
        {"n_test": -1},
        {"confusion": {"trained": [[10**30] * 6] * 6}},
        {"confusion": {"trained": [[2**63 - 1] + [0] * 5] + [[0] * 6] * 5}},
        {"confusion": {"trained": [[1.5] * 6] * 6}},
        {"confusion": {"trained": [[1] * 6] * 6}},  # 36 windows counted, n_test is 10
        {"confusion": {"trained": [[0] * 5] * 6}},
    ],
)
def test_numbers_from_the_network_are_range_checked_where_they_enter(bad_meta):
    assert reason(make(meta={**GOOD_META, **bad_meta})) == "bad_metrics"


def test_an_update_may_not_claim_more_windows_than_its_status_reported():
    data = make()
    kw = dict(topic_client="c1", run_id="r", round_=3, stage=0, spec=SPEC, selected={"c1"}, want_guidance=False)
    assert validate_update(data, reported_n_train=40, **kw).n_train == 40
    with pytest.raises(UpdateRejected, match="status reported 39") as e:
        validate_update(data, reported_n_train=39, **kw)
    assert e.value.reason == "bad_metrics"


def test_the_intake_reads_metadata_with_update_meta_and_ignores_a_newer_clients_keys():
    """One parser: a key this build does not know is ignored by the intake, refused by the strict reading."""
    from har_models.wire.update_meta import UpdateMeta, UpdateMetaError

    newer = {**GOOD_META, "battery_pct": 81, "ala": {"passes": 1, "future": True}, "confusion": {**GOOD_META["confusion"], "x": 1}}
    u = check(make(meta=newer))
    assert (u.n_train, u.n_test) == (40, 10)
    assert u.confusion["trained"].tolist() == np.eye(6, dtype=int).tolist()
    assert set(u.confusion) == {"trained"}
    lenient = UpdateMeta.from_wire(newer, strict=False)
    assert (lenient.stage, lenient.label_set, lenient.train_loss, lenient.steps) == (0, "unnamed", (), 0)
    assert lenient.ala is not None and lenient.ala.passes == 1
    with pytest.raises(UpdateMetaError, match="unknown keys") as e:
        UpdateMeta.from_wire(newer)
    assert e.value.key == "battery_pct"


def test_metadata_faults_keep_their_reasons():
    """from_wire's key at fault maps onto the intake's reason codes; round checks keep precedence."""
    no_run = {k: v for k, v in GOOD_META.items() if k != "run_id"}
    assert reason(make(meta=no_run)) == "wrong_run"
    assert reason(make(meta={**GOOD_META, "run_id": 7})) == "wrong_run"
    assert reason(make(meta={**GOOD_META, "stage": "zero"})) == "stale_stage"
    assert reason(make(meta={**GOOD_META, "train_loss": "low"})) == "bad_metrics"
    assert reason(make(meta={**GOOD_META, "n_train": -1}, round_=2)) == "stale_round"
    assert check(make(meta={k: v for k, v in GOOD_META.items() if k != "stage"})).stage == 0  # as the intake always read it
