"""fedhar-study: strategy names, and a real tiny grid end to end (2 strategies x 2 seeds x 1 split), resumed."""

from __future__ import annotations

import json
import re
import statistics

import numpy as np
import pytest
from support.small_federation import model_args

from coordinator import strategies
from har_models.data.splits import SplitSpec
from har_models.data.subjects import DEFAULT_HAPT, subject_sources, union_test_set
from simulation.study import Cell, StudyInterrupted, StudySettings, finished, main, run_grid, strategy_args


def test_strategy_names_become_simulate_switches():
    assert strategy_args("fedavg") == ["--aggregation", "fedavg"]
    assert strategy_args("feddwa+feddist+ala") == [
        "--aggregation", "feddwa", "--growth", "feddist", "--client-init", "ala"
    ]
    assert strategy_args("feddist") == ["--aggregation", "fedavg", "--growth", "feddist"]  # not the simulation's default
    known = "fedadam|fedavg|fedavgm|feddwa|fedexp|fedper|fedprox|fedyogi"
    with pytest.raises(ValueError, match=re.escape(f"unknown part 'fedsgd'; use {known}")):
        strategy_args("fedsgd")
    for name in strategies.names():  # the registry's names, nothing of the study's own
        assert strategy_args(f"{name}+ala") == ["--aggregation", name, "--client-init", "ala"]


@pytest.mark.slow  # a grid of eight runs, then resumed
def test_study_end_to_end_and_resume(tmp_path):
    out = tmp_path / "study"
    argv = [
        "--out", str(out), "--strategies", "fedavg,feddwa", "--seeds", "1,2", "--splits", "blocks",
        "--rounds", "2", "--clients", "3", *model_args(dense_units=16),
        "--results", str(tmp_path / "results.md"), "--", "--workers", "1",
    ]
    assert main(argv) == 0
    cells = [Cell("blocks", s, k) for s in ("fedavg", "feddwa", "centralised", "local-only") for k in (1, 2)]
    reports = {c: json.loads((c.folder(out) / "report.json").read_text()) for c in cells}
    for c in cells:
        assert reports[c]["seed"] == c.seed
        if c.strategy not in ("centralised", "local-only"):
            assert len(reports[c]["rounds"]) == 2
    assert "--split blocks" in reports[cells[0]]["command"]
    # the table's mean and standard deviation are those of the two seeds' final figures
    doc = json.loads((out / "study.json").read_text())
    row = next(r for r in doc["rows"] if r["strategy"] == "fedavg")
    finals = [reports[Cell("blocks", "fedavg", k)]["final"]["global"]["macro_f1"] for k in (1, 2)]
    assert row["final"]["global"]["macro_f1"] == pytest.approx([statistics.fmean(finals), statistics.stdev(finals)])
    assert row["seeds"] == [1, 2]
    text = (out / "study.md").read_text()
    for name in ("| fedavg | 2 |", "| feddwa | 2 |", "| centralised | 2 |", "| local-only | 2 |"):
        assert name in text
    assert (tmp_path / "results.md").read_text().count("| fedavg | 2 |") == 2  # final and best tables
    for png in ("rounds-blocks.png", "clients-blocks.png", "confusion-blocks.png", "feddwa-weights-blocks.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the heat map is of seed 1's last round, whose p_ij rows the report holds
    p = np.array(reports[Cell("blocks", "feddwa", 1)]["rounds"][-1]["feddwa_weights"]["p"])
    assert p.shape == (3, 3) and np.allclose(p.sum(axis=1), 1.0, atol=1e-5)
    assert f"FedDWA p_ij, feddwa seed 1 round 1; mean self-weight p_ii = {np.mean(np.diag(p)):.2f}" in text
    # the confusion matrix covers exactly the union test set of the 3 clients under the blocks split
    sources = dict(list(subject_sources("hapt", DEFAULT_HAPT).items())[:3])
    n_union = len(union_test_set(sources, split=SplitSpec.parse("blocks")))
    assert f"{n_union} union test windows" in text

    # resume: finished cells are not run again; a cell without its report is
    stamps = {c: (c.folder(out) / "report.json").stat().st_mtime_ns for c in cells}
    redo = Cell("blocks", "feddwa", 2)
    (redo.folder(out) / "report.json").unlink()
    assert main(argv) == 0
    for c in cells:
        now = (c.folder(out) / "report.json").stat().st_mtime_ns
        assert (now != stamps[c]) == (c == redo), c
    again = json.loads((redo.folder(out) / "report.json").read_text())
    # same seed, same split, same settings: the rerun reproduces the figures
    assert np.isclose(again["final"]["global"]["macro_f1"], reports[redo]["final"]["global"]["macro_f1"])


def test_bad_names_are_usage_errors(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--strategies", "fedsgd"]) == 2
    assert main(["--out", str(tmp_path), "--splits", "random"]) == 2
    assert "fedhar-study" in capsys.readouterr().err


def test_a_signal_stops_the_grid_not_just_the_cell(tmp_path):
    """A cell stopped by SIGTERM (exit 143) ends the study; the cells after it are not started."""
    cells = [Cell("blocks", "fedavg", k) for k in (1, 2, 3)]
    started: list[int] = []

    def runner(cell: Cell, argv: list[str]) -> int:
        started.append(cell.seed)
        return 143 if cell.seed == 2 else 1

    s = StudySettings(2, 1, 0.01, 8, 16, 3, "hapt", None, 1, ())
    with pytest.raises(StudyInterrupted) as stop:
        run_grid(cells, s, tmp_path, runner=runner)
    assert stop.value.status == 143 and started == [1, 2]


def test_a_run_stopped_before_its_last_round_is_not_finished(tmp_path):
    """A simulation stopped by a signal writes a report with a wall time after fewer rounds: the cell runs again."""
    rounds = [{"round": r} for r in range(2)]
    doc = {"final": {"global": {}}, "wall_seconds": 12.0, "config": {"rounds": 10}, "rounds": rounds}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert finished(tmp_path) is None
    doc["config"]["rounds"] = 2
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert finished(tmp_path) == doc
    del doc["config"]  # a baseline's report has no federation configuration
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert finished(tmp_path) == doc
