"""benchmarks/machine_load.py: the load average around each side of a benchmark, and when its ratio may count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.script_module import load_script

LoadLog: Any = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "machine_load.py").LoadLog


def _log(readings: list[float], cores: int = 2) -> Any:
    values = iter(readings)
    return LoadLog(cores=cores, read=lambda: next(values))


def test_each_side_is_recorded_before_and_after_and_a_quiet_run_counts() -> None:
    load = _log([0.4, 1.1, 1.1, 2.0])
    with load.around("fedhar"):
        pass
    with load.around("baseline"):
        pass
    assert load.samples == [("fedhar", 0.4, 1.1), ("baseline", 1.1, 2.0)]
    assert load.overloaded() == []  # 2.0 on 2 cores is not above the core count
    assert load.lines() == [
        "load average (1 min) around fedhar: 0.40 -> 1.10 (2 cores)",
        "load average (1 min) around baseline: 1.10 -> 2.00 (2 cores)",
        "the load average stayed at or below the core count around every side: the ratio counts for its goal",
    ]


def test_a_side_above_the_core_count_before_or_after_marks_the_ratio() -> None:
    load = _log([1.0, 2.5, 2.5, 1.5, 3.0, 0.5])
    for side in ("flower run 0", "fedhar run 0", "fedhar run 1"):
        with load.around(side):
            pass
    assert load.overloaded() == ["flower run 0", "fedhar run 0", "fedhar run 1"]
    assert load.verdict() == ("the load average exceeded the 2 cores around flower run 0, fedhar run 0, fedhar run 1: "
                              "the ratio is reported as measured on a loaded machine and is not used for a goal")  # fmt: skip


def test_a_side_that_raises_is_still_recorded() -> None:
    load = _log([0.5, 9.0], cores=4)
    with pytest.raises(RuntimeError), load.around("broken"):
        raise RuntimeError("the side failed")
    assert load.samples == [("broken", 0.5, 9.0)] and load.overloaded() == ["broken"]
