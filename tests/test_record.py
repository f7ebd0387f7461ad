"""The typed round record: exact JSON round trips, the report's old per-round form, refusals with the key named."""

from __future__ import annotations

import json
import math

import pytest

from coordinator.record import (
    Architecture,
    Evaluation,
    FedDwaWeights,
    GrowthLog,
    LayerGrowth,
    Metrics,
    Participation,
    RecordError,
    Rejection,
    RoundRecord,
    Traffic,
    records,
)

M4 = {"accuracy": 0.5857142857142857, "macro_f1": 0.5520050125313283, "weighted_f1": 0.5273791621911923, "n": 70}
MEAN = {"accuracy": 0.5524035184352097, "macro_f1": 0.5159347869231754, "weighted_f1": 0.5058625180824081,
        "accuracy_weighted": 0.5551181102362205, "clients": 2}  # fmt: skip

# A round as report.json held it before the record existed (FedDWA + FedDist, evaluated with a union test set).
OLD_ROW = {
    "round": 2,
    "selected": 3,
    "updates": 2,
    "rejected": 0,
    "missing": ["c3"],
    "arch_version": 1,
    "conv_filters": 9,
    "dense_units": 32,
    "bytes_up": 152268,
    "bytes_down": 151376,
    "growth": {"k": 3.0, "n_clients": 2, "layers": {"conv": {"added": 1, "per_client": {"c1": 1}}}, "growth_possible": True},
    "feddwa_weights": {"clients": ["c1", "c2"], "p": [[0.501214, 0.498786], [0.158901, 0.841099]]},
    "personalisation": MEAN,
    "personalisation_clients": {"c1": M4, "c2": {**M4, "n": 58}},
    "received_union": {**M4, "n": 128},
    "global": {**M4, "n": 254},
    "generalisation": MEAN,
    "generalisation_clients": {"c1": {**M4, "n": 254}, "c2": {**M4, "n": 254}},
    "seconds": 1.888624926000034,
}


def test_an_old_report_row_reads_and_writes_back_byte_for_byte() -> None:
    rec = RoundRecord.from_json(json.loads(json.dumps(OLD_ROW)))
    assert json.dumps(rec.to_json()) == json.dumps(OLD_ROW)  # same keys, same order, same values
    assert rec.participation == Participation(3, 2, 0, ("c3",))
    assert rec.arch == Architecture(1, 9, 32)
    assert rec.traffic == Traffic(152268, 151376, {"float32": 152268})
    assert rec.growth == GrowthLog(3.0, 2, {"conv": LayerGrowth(1, {"c1": 1})}, True)
    assert rec.feddwa_weights is not None and rec.feddwa_weights.p[1] == (0.158901, 0.841099)
    assert rec.measure("global") == Metrics(M4["accuracy"], M4["macro_f1"], M4["weighted_f1"], 254)
    assert [c.client_id for c in rec.evaluation.clients()] == ["c1", "c2"]
    assert rec.evaluation.clients()[1].personalisation.n == 58  # type: ignore[union-attr]


def test_a_full_record_round_trips_exactly() -> None:
    rec = RoundRecord(
        round=4,
        participation=Participation(
            selected=3, updates=1, rejected=5, missing=("b", "c"), failures={"b": "offline", "c": "sha256_mismatch"},
            rejections=(Rejection("c", "sha256_mismatch", 4), Rejection("x", "not_selected", 1)),
        ),
        arch=Architecture(0, 8, 32),
        traffic=Traffic(3000, 9000, {"float16": 1000, "int8_delta": 2000}),
        feddwa_weights=FedDwaWeights(("a",), ((1.0,),)),
        evaluation=Evaluation(
            personalisation=Metrics(0.5, 0.25, 0.3, None, 0.5, 1), personalisation_clients={"a": Metrics(0.5, 0.25, 0.3, 10)}
        ),
        seconds=0.125,
    )
    d = rec.to_json()
    assert RoundRecord.from_json(json.loads(json.dumps(d))) == rec
    assert d["failures"] == {"b": "offline", "c": "sha256_mismatch"}
    assert d["rejections"] == [["c", "sha256_mismatch", 4], ["x", "not_selected", 1]]
    assert d["bytes_up_by_encoding"] == {"float16": 1000, "int8_delta": 2000}
    assert d["received_union"] is None and "global" not in d and "growth" not in d
    assert list(d)[-4:] == ["seconds", "failures", "rejections", "bytes_up_by_encoding"]  # new keys after the old ones


def test_a_fault_free_float32_round_writes_no_new_keys() -> None:
    rec = RoundRecord(0, Participation(2, 2), Architecture(0, 8, 32), Traffic(10, 20, {"float32": 10}))
    assert list(rec.to_json()) == ["round", "selected", "updates", "rejected", "missing", "arch_version", "conv_filters",
                                   "dense_units", "bytes_up", "bytes_down", "received_union", "seconds"]  # fmt: skip
    assert RoundRecord.from_json(rec.to_json()) == rec


def test_nan_figures_survive_the_round_trip() -> None:
    rec = RoundRecord(0, evaluation=Evaluation(personalisation=Metrics(math.nan, math.nan, math.nan, None, math.nan, 0)))
    back = RoundRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert back.evaluation.personalisation is not None and back.evaluation.personalisation.same_as(rec.evaluation.personalisation)  # type: ignore[arg-type]
    assert json.dumps(back.to_json()) == json.dumps(rec.to_json())


def test_a_baseline_row_reads_with_defaults() -> None:
    row = {"round": 0, "global": M4, "personalisation": MEAN, "generalisation": M4, "updates": 3, "selected": 3,
           "seconds": 1.0, "conv_filters": 8, "dense_units": 32, "arch_version": 0}  # fmt: skip
    rec = RoundRecord.from_json(row)
    assert rec.traffic is None and rec.participation.missing == () and rec.evaluation.received_union is None
    assert rec.measure("generalisation") == Metrics.from_json(M4)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"bytes_up": "many"}, "'bytes_up' must be an integer"),
        ({"colour": "red"}, r"unknown key\(s\) \['colour'\]"),
        ({"global": {"accuracy": 0.5}}, "'macro_f1' must be a number"),
        ({"missing": "c3"}, "'missing' must be a list"),
        ({"feddwa_weights": {"clients": ["a", "b"], "p": [[1.0]]}}, "p must be 2 x 2"),
        ({"rejections": [["c", 3]]}, r"\[client id, reason, count\]"),
        ({"bytes_up_by_encoding": {"float16": 5}}, "do not sum to bytes_up"),
    ],
)
def test_malformed_rows_are_refused_naming_the_key(change: dict, match: str) -> None:
    with pytest.raises(RecordError, match=match):
        RoundRecord.from_json({**OLD_ROW, **change})


def test_records_accepts_records_and_rows_alike() -> None:
    rec = RoundRecord.from_json(OLD_ROW)
    assert records([rec, OLD_ROW]) == [rec, rec]
    with pytest.raises(RecordError, match="round record must be a JSON object"):
        records([[1, 2]])


def test_without_details_drops_what_grows_with_the_clients() -> None:
    small = RoundRecord.from_json(OLD_ROW).without_details()
    d = small.to_json()
    assert "feddwa_weights" not in d and d["personalisation_clients"] == {} and d["generalisation_clients"] == {}
    assert d["global"] == OLD_ROW["global"] and d["growth"] == OLD_ROW["growth"]
