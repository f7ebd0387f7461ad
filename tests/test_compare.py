"""fedhar-compare: one table row per run from its report's final figures and round records; unreadable reports exit 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulation.compare import main, row

ROUND = {"round": 0, "selected": 2, "updates": 2, "rejected": 0, "missing": [], "arch_version": 0, "conv_filters": 8,
         "dense_units": 32, "bytes_up": 3_000_000, "bytes_down": 5_000_000, "received_union": None, "seconds": 1.0}  # fmt: skip


def _doc(**extra: object) -> dict:
    rounds = [ROUND, {**ROUND, "round": 1, "arch_version": 1, "conv_filters": 10, "bytes_up": 1_000_000}]
    final = {"global": {"round": 1, "accuracy": 0.8125, "macro_f1": 0.75}}
    return {"strategy": "fedavg", "wall_seconds": 42.4, "rounds": rounds, "final": final, **extra}


def test_a_row_holds_the_final_figures_the_last_widths_and_the_mean_traffic() -> None:
    assert row(_doc(), "fedavg") == ["fedavg", "2", "81.2", "75.0", "n/a", "n/a", "n/a", "n/a", "10, 32", "2", "5", "42"]


def test_a_baseline_without_traffic_says_n_a() -> None:
    rounds = [{"round": 0, "global": {"accuracy": 0.5, "macro_f1": 0.5}, "conv_filters": 8, "dense_units": 32}]
    assert row({"rounds": rounds, "final": {}}, "centralised")[8:11] == ["8, 32", "n/a", "n/a"]


def test_the_table_and_a_damaged_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "report.json").write_text(json.dumps(_doc()))
    assert main([str(good)]) == 0
    assert "| fedavg | 2 | 81.2 | 75.0 |" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(rounds=[{**ROUND, "bytes_up": "lots"}])))
    assert main([str(good), str(bad)]) == 3
    assert "'bytes_up' must be an integer" in capsys.readouterr().err
