"""The start measure: each client's model as it starts local training (FedALA's protocol), on its own test split.

Hand-computed from known confusion matrices, recorded next to the three FedDist measures, written and read back
by the report, absent (and still readable) in reports of the earlier release, and summarised by the study.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.config import CoordinatorConfig
from coordinator.record import Evaluation, Metrics, RoundRecord
from coordinator.report import best_and_final, write_report
from coordinator.round import evaluate_round, summary_line
from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec
from simulation.study_cells import Cell, StudySettings
from simulation.study_report import markdown, summarise

SPEC = ArchSpec(n_classes=3, conv_filters=4, dense_units=8)

# Client a's model at the start of training: 17 of 20 right; F1 of class 0 = 2*8/(16+1+2) = 16/19, class 1 = 18/21.
A_INIT = np.array([[8, 2, 0], [1, 9, 0], [0, 0, 0]])
# Client b's: 8 of 10 right; F1 of class 0 = 8/(8+2) = 0.8, class 2 = 8/(8+2) = 0.8; class 1 occurs nowhere.
B_INIT = np.array([[4, 0, 0], [0, 0, 0], [2, 0, 4]])
A_F1, B_F1 = (16 / 19 + 18 / 21) / 2, 0.8


def _update(cid: str, confusion: dict[str, np.ndarray]) -> ClientUpdate:
    return ClientUpdate(cid, 0, 0, 10, int(next(iter(confusion.values())).sum()), {"w": torch.zeros(1)}, None,
                        {k: np.asarray(v, np.int64) for k, v in confusion.items()}, size=1)  # fmt: skip


def _evaluate(results: list[ClientUpdate]) -> Evaluation:
    fed = Federation(SPEC, SPEC, {"w": torch.zeros(1)})
    return evaluate_round(0, fed, SPEC, results, None, CoordinatorConfig(run_dir=Path("."), rounds=1))


def test_start_is_the_mean_over_clients_of_the_initial_models() -> None:
    eye = np.eye(3, dtype=np.int64) * 5  # the trained models: every window right
    ev = _evaluate([
        _update("a", {"received": A_INIT[::-1], "initial": A_INIT, "trained": eye}),
        _update("b", {"received": B_INIT, "initial": B_INIT, "trained": eye}),
    ])  # fmt: skip
    assert ev.start is not None
    assert ev.start.accuracy == pytest.approx((17 / 20 + 8 / 10) / 2)
    assert ev.start.macro_f1 == pytest.approx((A_F1 + B_F1) / 2)
    assert ev.start.clients == 2 and ev.start.accuracy_weighted == pytest.approx(25 / 30)
    assert ev.start_clients["a"].accuracy == pytest.approx(0.85) and ev.start_clients["a"].macro_f1 == pytest.approx(A_F1)
    assert ev.start_clients["b"].macro_f1 == pytest.approx(0.8) and ev.start_clients["b"].n == 10
    # personalisation is still the trained models', not the initial ones'
    assert ev.personalisation is not None and ev.personalisation.accuracy == 1.0


def test_a_client_that_sends_no_initial_matrix_is_left_out_and_none_gives_no_start() -> None:
    ev = _evaluate([_update("a", {"initial": A_INIT, "trained": A_INIT}), _update("b", {"trained": B_INIT})])
    assert ev.start is not None and ev.start.clients == 1 and set(ev.start_clients) == {"a"}
    assert ev.start.accuracy == pytest.approx(0.85)
    assert _evaluate([_update("b", {"trained": B_INIT})]).start is None


def _record(rnd: int, start: float | None) -> RoundRecord:
    pers = Metrics(0.9, 0.8, 0.85, None, 0.9, 2)
    ev = Evaluation(personalisation=pers, personalisation_clients={"a": Metrics(0.9, 0.8, 0.85, 10)})
    if start is not None:
        ev = Evaluation(personalisation=pers, personalisation_clients=ev.personalisation_clients,
                        start=Metrics(start, start - 0.1, start, None, start, 2),
                        start_clients={"a": Metrics(start, start - 0.1, start, 10)})  # fmt: skip
    return RoundRecord(rnd, evaluation=ev, seconds=1.0)


def test_the_record_writes_start_last_and_reads_it_back() -> None:
    rec = _record(3, 0.6)
    d = json.loads(json.dumps(rec.to_json()))
    assert list(d)[-2:] == ["start", "start_clients"] and d["start_clients"]["a"]["accuracy"] == 0.6
    back = RoundRecord.from_json(d)
    assert back == rec and back.measure("start") == rec.evaluation.start
    assert back.without_details().evaluation.start_clients == {}
    # without the measure: no key written, and a row of the earlier release (no start key) reads as None
    old = _record(3, None).to_json()
    assert "start" not in old and "start_clients" not in old
    assert RoundRecord.from_json(old).evaluation.start is None


def test_the_report_round_trips_with_and_without_the_start_measure(tmp_path: Path) -> None:
    new = write_report(tmp_path / "new", {"run_id": "x"}, [_record(0, 0.5), _record(1, 0.7)], plot=False)
    assert new["final"]["start"] == {"round": 1, "accuracy": 0.7, "macro_f1": pytest.approx(0.6)}
    assert new["best"]["start"]["accuracy"] == {"round": 1, "value": 0.7}
    assert "start" in new["models_evaluated"]
    doc = json.loads((tmp_path / "new" / "report.json").read_text())
    assert [RoundRecord.from_json(r) for r in doc["rounds"]] == [_record(0, 0.5), _record(1, 0.7)]
    md = (tmp_path / "new" / "report.md").read_text()
    assert "| start acc | start F1 |" in md and "| 50.0 | 40.0 |" in md and "| start | 70.0 | 60.0 |" in md
    # a report of the earlier release: no start anywhere, and it is written back without one
    old = write_report(tmp_path / "old", {"run_id": "y"}, [_record(0, None).to_json()], plot=False)
    assert "start" not in old["final"] and "start" not in old["models_evaluated"]
    assert "start acc" not in (tmp_path / "old" / "report.md").read_text()
    assert best_and_final([RoundRecord.from_json(r) for r in old["rounds"]]) == {k: old[k] for k in ("final", "best")}


def test_the_round_line_shows_start_only_when_measured() -> None:
    assert ", start acc 60.0% F1 50.0%; up" in summary_line(_record(2, 0.6))
    assert "start" not in summary_line(_record(2, None))


def _cell_report(folder: Path, starts: list[float] | None, summarised: bool = True) -> None:
    recs = [_record(i, None if starts is None else s) for i, s in enumerate(starts or [0.5])]
    doc = write_report(folder, {"run_id": "r", "final": True, "wall_seconds": 1.0, "config": {"rounds": len(recs)}},
                       recs, plot=False)  # fmt: skip
    if not summarised:  # as a report of a release that did not summarise "start" itself
        doc = json.loads((folder / "report.json").read_text())
        doc["final"].pop("start"), doc["best"].pop("start")
        (folder / "report.json").write_text(json.dumps(doc))


def test_the_study_summarises_the_start_measure_over_seeds(tmp_path: Path) -> None:
    cells = [Cell("blocks+label_skew2", "fedavg+ala", k) for k in (1, 2)] + [Cell("blocks", "fedavg", 1)]
    _cell_report(cells[0].folder(tmp_path), [0.5, 0.6])
    _cell_report(cells[1].folder(tmp_path), [0.9, 0.8], summarised=False)  # taken from its rounds
    _cell_report(cells[2].folder(tmp_path), None)  # an earlier release's cell: no start figures
    rows = {r["strategy"]: r for r in summarise(cells, tmp_path)}
    ala = rows["fedavg+ala"]["final"]["start"]
    assert ala["accuracy"] == pytest.approx([0.7, math.sqrt(0.02)])  # mean and sd of 0.6 and 0.8
    assert ala["macro_f1"] == pytest.approx([0.6, math.sqrt(0.02)])
    assert rows["fedavg+ala"]["best"]["start"]["accuracy"] == pytest.approx([0.75, math.sqrt(0.045)])  # 0.6, 0.9
    assert all(math.isnan(v) for v in rows["fedavg"]["final"]["start"]["accuracy"])
    text = markdown(list(rows.values()), StudySettings(), [], [])
    assert "| start acc | start F1 |" in text
    assert "| fedavg+ala | 2 | n/a | n/a | 90.0 ± 0.0 | 80.0 ± 0.0 | n/a | n/a | 70.0 ± 14.1 | 60.0 ± 14.1 |" in text
    # a study without any start figures keeps its earlier table
    old = markdown([rows["fedavg"]], StudySettings(), [], [])
    assert "start" not in old and "| gen. acc | gen. F1 |\n" in old
