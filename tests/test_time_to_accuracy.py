"""The time-to-accuracy table finds each target's first crossing, with the seconds and client-epochs spent until then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulation.time_to_accuracy import Crossing, crossings, main, table


def _row(r: int, f1: float, seconds: float, updates: int = 30) -> dict[str, object]:
    return {"round": r, "updates": updates, "seconds": seconds, "global": {"accuracy": f1, "macro_f1": f1}}


FED = {"config": {"local_epochs": 3}, "wall_seconds": 99.5,
       "rounds": [_row(0, 0.80, 10.0), _row(1, 0.86, 12.0, updates=29), _row(2, 0.84, 11.0), _row(3, 0.905, 9.0)]}
CENTRAL = {"wall_seconds": 40.0, "rounds": [_row(0, 0.91, 4.0), _row(1, 0.95, 5.0)]}


def test_first_crossings_by_hand() -> None:
    got = crossings(FED, [85, 90, 94])
    # 85 first in round 1 (not again in round 3): 10 + 12 s; (30 + 29) updates x E = 3.
    assert got[85] == Crossing(1, 22.0, 177)
    assert got[90] == Crossing(3, 42.0, 357)  # round 2 dips below 85; round 3 passes 90
    assert got[94] is None
    central = crossings(CENTRAL, [85, 90, 94])  # no config: one pass is one epoch of each of the 30 subjects
    assert central == {85: Crossing(0, 4.0, 30), 90: Crossing(0, 4.0, 30), 94: Crossing(1, 9.0, 60)}


def test_a_target_met_exactly_counts_and_the_table_says_what_was_not_reached() -> None:
    assert crossings(FED, [90.5])[90.5] == Crossing(3, 42.0, 357)
    text = table([("fed", FED), ("central", CENTRAL)], [85, 94])
    assert text.splitlines()[2] == "| fed | 1, 22, 177 | not reached | 90.5 | 99.5 |"
    assert text.splitlines()[3] == "| central | 0, 4, 30 | 1, 9, 60 | 95.0 | 40.0 |"


def test_command_line_reads_reports_and_refuses_a_bad_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f.json").write_text(json.dumps(FED))
    (tmp_path / "c.json").write_text(json.dumps(CENTRAL))
    assert main([f"fed={tmp_path / 'f.json'}", f"central={tmp_path / 'c.json'}", "--targets", "90"]) == 0
    assert "| fed | 3, 42, 357 | 90.5 | 99.5 |" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text(json.dumps({"rounds": [{"round": 0, "global": {"macro_f1": 0.5}}]}))
    assert main([str(tmp_path / "bad.json")]) == 3
    assert "round row 0 needs numeric 'seconds' and 'updates'" in capsys.readouterr().err
    assert main([str(tmp_path / "f.json"), "--targets", "ninety"]) == 2
