"""The global model's figures taken from the next round's client start measures (``[evaluation] global_from =
"clients"``, the default) are the coordinator's own evaluation on the union test set, to the last digit; where that
is not exact (a client missing, another backend, an operator's rollback, personalised models) the coordinator
evaluates G itself, and a run stopped between rounds gets the figure after ``--resume``.

Three HAPT devices (subjects 1-3) really train with the client's own code (support/hapt_devices.py) over an
in-memory grid; the union test set is their three test splits, built as ``fedhar-simulate`` builds it. Every
comparison is between two runs of the same seeded federation, one with ``global_from = "central"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.configs import config
from support.hapt_devices import HAPT, HaptDevices
from support.inmemory_grid import InMemoryGrid

from coordinator.evaluation import Evaluator
from coordinator.global_measure import GlobalMeasure
from coordinator.record import Metrics
from coordinator.runner import FederationRunner
from coordinator.state import RunState
from coordinator.updates import ClientUpdate
from har_models.data.splits import SplitSpec
from har_models.data.subjects import union_test_set

pytestmark = pytest.mark.slow  # federations of 3 devices that really train: a few seconds of CPU each

SUBJECTS = {"hapt-01": 1, "hapt-02": 2, "hapt-03": 3}
ROUNDS = 5
Twist = Callable[[FederationRunner, InMemoryGrid, int], None]
"""What a test does before round r (the same in both runs compared)."""


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    sources = {cid: f"hapt:{HAPT / f'user{s:02d}.npz'}" for cid, s in SUBJECTS.items()}
    return Evaluator(union_test_set(sources, split=SplitSpec(kind="blocks")), clients=sources)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _runner(folder: Path, evaluator: Evaluator, global_from: str, devices: HaptDevices, aggregation: str = "fedavgm",
            wrap: Callable[[ClientUpdate], ClientUpdate] = lambda u: u) -> tuple[FederationRunner, InMemoryGrid]:  # fmt: skip
    grid = InMemoryGrid({cid: devices.status(cid) for cid in SUBJECTS},
                        trainer=lambda *a: wrap(devices(*a)))  # fmt: skip
    cfg = config(dict(run_dir=folder / "run", run_id="gm", rounds=ROUNDS, aggregation=aggregation,
                      model={"conv_filters": 4, "dense_units": 8}, evaluation={"global_from": global_from}))  # fmt: skip
    return FederationRunner(cfg, grid, evaluator=evaluator), grid


def _federation(folder: Path, evaluator: Evaluator, global_from: str, twist: Twist | None = None, **kw: Any
                ) -> tuple[list[dict[str, Any]], GlobalMeasure, list[int]]:  # fmt: skip
    """The records of ROUNDS rounds (as report.json holds them, :func:`_figures`), the run's measure, and the rounds of
    the progress messages the grid published, in order."""
    devices = HaptDevices(folder / "devices", SUBJECTS, run_id="gm")
    try:
        runner, grid = _runner(folder, evaluator, global_from, devices, **kw)
        runner.start(resume=False)
        for r in range(ROUNDS):
            if twist is not None:
                twist(runner, grid, r)
            assert runner.run_round(r) is not None, f"round {r}: {runner.last_failure}"
            grid.silent.clear()
        runner.measure_last()
        return [_figures(rec.to_json()) for rec in runner.records()], runner.measure, grid.progress
    finally:
        devices.close()


def _figures(doc: dict[str, Any]) -> dict[str, Any]:
    """A record without what varies between two runs of the same federation: its duration, and the update bytes (the
    envelope carries each device's training seconds, so its length moves by a byte or two)."""
    return {k: v for k, v in doc.items() if k not in ("seconds", "bytes_up", "bytes_up_by_encoding")}


def test_the_clients_measures_give_the_union_evaluation_to_the_last_digit(tmp_path: Path, evaluator: Evaluator) -> None:
    central, by_union, progress_central = _federation(tmp_path / "central", evaluator, "central")
    clients, by_clients, progress = _federation(tmp_path / "clients", evaluator, "clients")
    assert all("global" in rec for rec in clients)
    assert json.dumps(clients) == json.dumps(central)  # every figure of every round, global included
    # G_0..G_3 measured by the clients of rounds 1..4; only the last round's G was evaluated by the coordinator
    assert (by_clients.from_clients_rounds, by_clients.central_rounds) == (ROUNDS - 1, 1)
    assert (by_union.from_clients_rounds, by_union.central_rounds) == (0, ROUNDS)
    # observers get each round when it completes and again when the next round's clients added its global figure
    assert progress_central == [0, 1, 2, 3, 4] and progress == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    # and the figures are not a constant: the federation learns
    assert clients[-1]["global"]["macro_f1"] > clients[0]["global"]["macro_f1"] + 0.1


def _silent_in_round_2(runner: FederationRunner, grid: InMemoryGrid, r: int) -> None:
    if r == 2:
        grid.silent.add("hapt-02")  # G_1 is measured by two of the three devices only


def _rollback_before_round_3(runner: FederationRunner, grid: InMemoryGrid, r: int) -> None:
    if r == 3:
        runner.adopt(*runner.model())  # an operator's pin of the version in force: a copy, not G_2 itself


def _executorch(u: ClientUpdate) -> ClientUpdate:
    return replace(u, meta={**u.meta, "backend": "executorch"}) if u.client_id == "hapt-03" else u


@pytest.mark.parametrize(
    ("twist", "kw", "from_clients"),
    [
        (_silent_in_round_2, {}, ROUNDS - 2),
        (_rollback_before_round_3, {}, ROUNDS - 2),
        (None, {"wrap": _executorch}, 0),
        (None, {"aggregation": "feddwa"}, 0),
    ],
    ids=["a-device-missing", "operator-rollback", "another-backend", "personalised-models"],
)
def test_where_the_clients_measures_are_not_exact_the_coordinator_evaluates(
    tmp_path: Path, evaluator: Evaluator, twist: Twist | None, kw: dict[str, Any], from_clients: int
) -> None:
    central, _, _ = _federation(tmp_path / "central", evaluator, "central", twist, **kw)
    clients, measure, _ = _federation(tmp_path / "clients", evaluator, "clients", twist, **kw)
    assert all("global" in rec for rec in clients)
    assert [rec["global"] for rec in clients] == [rec["global"] for rec in central]
    assert (measure.from_clients_rounds, measure.central_rounds) == (from_clients, ROUNDS - from_clients)


def test_a_run_stopped_between_rounds_gets_the_figure_after_resume(tmp_path: Path, evaluator: Evaluator) -> None:
    devices = HaptDevices(tmp_path / "devices", SUBJECTS, run_id="gm")
    try:
        first, _ = _runner(tmp_path, evaluator, "clients", devices)
        first.start(resume=False)
        for r in range(3):
            first.run_round(r)
        spec, g2 = first.model()
        expected = Metrics.from_json(evaluator.global_metrics(spec, g2)).to_json()
        first.state.close()  # the process stops here: G_2 still waits for round 3's clients
        state = RunState(tmp_path / "run")
        assert "global" not in state.rounds()[2] and "global" in state.rounds()[1]
        state.close()
        again, _ = _runner(tmp_path, evaluator, "clients", devices)
        assert again.start(resume=True) == 2
        assert again.run_round(3) is not None
        assert again.records()[2].to_json()["global"] == expected
        assert again.measure.from_clients_rounds == 1  # round 3's clients measured the resumed G_2
    finally:
        devices.close()


def test_a_round_that_could_not_be_saved_keeps_the_figure_waiting(tmp_path: Path, evaluator: Evaluator,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    devices = HaptDevices(tmp_path / "devices", SUBJECTS, run_id="gm")
    try:
        runner, _ = _runner(tmp_path, evaluator, "clients", devices)
        runner.start(resume=False)
        runner.run_round(0)
        runner.run_round(1)
        spec, g1 = runner.model()
        expected = Metrics.from_json(evaluator.global_metrics(spec, g1)).to_json()
        real = runner.state.complete_round

        def full_disk(*a: Any, **kw: Any) -> None:
            monkeypatch.setattr(runner.state, "complete_round", real)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(runner.state, "complete_round", full_disk)
        with pytest.raises(OSError):
            runner.run_round(2)
        assert runner.measure.pending is not None and runner.measure.pending.round == 1
        assert runner.run_round(2) is not None  # the next attempt of the same round
        assert runner.records()[1].to_json()["global"] == expected
        assert len(runner.records()) == 3
    finally:
        devices.close()


def test_the_summed_matrices_are_the_metrics_of_the_union() -> None:
    """By hand: two clients' matrices, summed, against the metrics of their windows pooled."""
    from har_models.nn.metrics import summarise

    a = np.array([[3, 1], [0, 2]])
    b = np.array([[1, 0], [2, 5]])
    pooled = summarise(a + b)
    # pooled: 4 + 7 right of 14; class 0: tp 4, fp 2, fn 1 -> F1 8/11; class 1: tp 7, fp 1, fn 2 -> F1 14/17
    assert pooled["accuracy"] == pytest.approx(11 / 14)
    assert pooled["macro_f1"] == pytest.approx((8 / 11 + 14 / 17) / 2)
    assert pooled["n"] == 14


def test_amending_a_round_without_a_record_is_refused(tmp_path: Path) -> None:
    state = RunState(tmp_path)
    try:
        with pytest.raises(KeyError, match="round 4 has no record"):
            state.amend_round(4, {"global": {}})
    finally:
        state.close()


def test_the_setting_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\[evaluation\] global_from = 'sometimes': must be 'clients' or 'central'"):
        config({"run_dir": tmp_path, "evaluation": {"global_from": "sometimes"}})
    assert config({"run_dir": tmp_path}).evaluation.global_from == "clients"
