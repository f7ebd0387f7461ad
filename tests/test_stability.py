"""The stability table's measures (simulation.stability): falls from the best round, divergence, by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.stability import cell_of, max_drop, summarise


def test_max_drop_is_the_largest_fall_from_the_best_so_far():
    # best so far 0.5, 0.9, 0.9, 0.9, 0.95: falls 0, 0, 0.3, 0.1, 0 -> 0.3 (not 0.95 - 0.6 = 0.35: 0.95 comes later)
    assert max_drop([0.5, 0.9, 0.6, 0.8, 0.95]) == pytest.approx(0.3)
    assert max_drop([0.1, 0.2, 0.3]) == 0.0 and max_drop([]) == 0.0


def test_summarise_flags_a_fall_of_more_than_10_points_and_a_cut_curve():
    rows = [{"test_f1": t, "val_f1": v} for t, v in zip([0.4, 0.8, 0.85, 0.8, 0.82, 0.7, 0.86], [0.5] * 7, strict=True)]
    s = summarise(rows, 7)
    # worst of rounds 5+: 0.7; fall 0.85 - 0.7 = 0.15 > 0.10
    assert (s["final"], s["worst"], s["drop"], s["diverged"]) == (0.86, 0.7, pytest.approx(0.15), True)
    assert s["end_fall"] == 0.0  # it ends at its best: the fall was a dip
    calm = summarise(rows[:5], 5)
    assert calm["drop"] == pytest.approx(0.05) and not calm["diverged"]
    assert summarise(rows[:5], 15)["diverged"]  # stopped before its 15 rounds: non-finite weights


def test_a_file_name_gives_its_cell_or_a_clear_error():
    assert cell_of(Path("runs/paper_skew_n30_s2.json")) == ("paper", "skew", 30, "2")
    with pytest.raises(ValueError, match="MODEL_SPLIT_nN_sSEED"):
        cell_of(Path("two-devices-15-rounds.report.json"))
