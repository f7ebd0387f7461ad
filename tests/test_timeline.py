"""The Today screen's arithmetic: smoothing predictions into stretches, corrections, minutes, guidance, CSV."""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.timeline import (
    STEP_NS,
    Stretch,
    active_classes,
    apply_corrections,
    day_csv,
    guidance,
    majority,
    minutes_per_activity,
    smooth_stretches,
)

S = 10**9


def test_majority_removes_a_single_window_blip_and_keeps_ties_as_they_are():
    np.testing.assert_array_equal(majority(np.array([0, 0, 0, 3, 0, 0, 0]), 5), [0, 0, 0, 0, 0, 0, 0])
    # Ends: the cut window; a 2-2 tie keeps each window's own label.
    np.testing.assert_array_equal(majority(np.array([1, 1, 2, 2]), 3), [1, 1, 2, 2])
    np.testing.assert_array_equal(majority(np.array([4, 5]), 1), [4, 5])
    with pytest.raises(ValueError, match="odd"):
        majority(np.array([0]), 4)


def test_majority_equals_the_rule_written_as_a_loop():
    y = np.random.default_rng(0).integers(0, 4, 300)
    for k in (1, 3, 5, 7):
        ref = y.copy()
        for i in range(y.size):
            counts = np.bincount(y[max(0, i - k // 2) : i + k // 2 + 1])
            best = np.flatnonzero(counts == counts.max())
            ref[i] = y[i] if y[i] in best else best[0]
        np.testing.assert_array_equal(majority(y, k), ref)


def test_a_walk_with_a_blip_becomes_one_stretch_and_a_gap_splits_it():
    # 20 windows walking (0), one misread as sitting (3) in the middle, then 10 s of nothing, then 10 windows sitting.
    t = np.arange(20) * STEP_NS
    y = np.zeros(20, int)
    y[9] = 3
    t2 = t[-1] + 10 * S + np.arange(10) * STEP_NS
    out = smooth_stretches(np.concatenate([t, t2]), np.concatenate([y, np.full(10, 3)]))
    assert out == [Stretch(0, 20 * STEP_NS, 0), Stretch(int(t2[0]), int(t2[0]) + 10 * STEP_NS, 3)]


def test_a_short_stretch_between_two_different_neighbours_goes_to_the_longer_one():
    # 30 standing (4), 4 walking (5.12 s < 10 s, survives the 5-majority), 12 sitting (3).
    y = np.array([4] * 30 + [0] * 4 + [3] * 12)
    t = np.arange(y.size) * STEP_NS
    out = smooth_stretches(t, y)
    assert [(s.label, round(s.minutes * 60 / 1.28)) for s in out] == [(4, 34), (3, 12)]
    assert out[0].end_ns == out[1].start_ns == 34 * STEP_NS


def test_a_short_stretch_alone_between_gaps_is_kept():
    out = smooth_stretches(np.array([0, STEP_NS]), np.array([2, 2]))
    assert out == [Stretch(0, 2 * STEP_NS, 2)]
    with pytest.raises(ValueError, match="increase"):
        smooth_stretches(np.array([5, 5]), np.array([0, 0]))


def test_corrections_cut_stretches_and_minutes_clip_to_the_day():
    st = [Stretch(0, 600 * S, 3), Stretch(600 * S, 1200 * S, 0)]
    fixed = apply_corrections(st, [Stretch(300 * S, 900 * S, 4, True)])
    assert fixed == [Stretch(0, 300 * S, 3), Stretch(300 * S, 900 * S, 4, True), Stretch(900 * S, 1200 * S, 0)]
    np.testing.assert_allclose(minutes_per_activity(fixed, 6, 60 * S, 1200 * S), [5, 0, 0, 4, 10, 0])


def test_guidance_names_the_shortest_activity_first_in_windows_and_minutes():
    assert guidance({"walking": 40, "sitting": 10, "laying": 30}, target=40) == [
        "sitting: 30 more windows (about 0.6 min of recording)",
        "laying: 10 more windows (about 0.2 min of recording)",
    ]
    assert guidance({"walking": 41}) == []


def test_active_classes_and_csv():
    names = ("walking", "walking_upstairs", "walking_downstairs", "sitting", "standing", "laying")
    np.testing.assert_array_equal(active_classes(names), [1, 1, 1, 0, 0, 0])
    text = day_csv([Stretch(0, 90 * S, 0), Stretch(90 * S, 150 * S, 3, True)], names, tz_offset_s=3600)
    assert text.splitlines() == [
        "start,end,activity,minutes,corrected",
        "1970-01-01T01:00:00+01:00,1970-01-01T01:01:30+01:00,walking,1.50,0",
        "1970-01-01T01:01:30+01:00,1970-01-01T01:02:30+01:00,sitting,1.00,1",
    ]


def _merge_by_rescanning(t, y, min_ns=10 * S):
    """The blip rule as first written: rescan all stretches for the shortest short one after each merge."""
    from edge_client.timeline import _runs

    runs = _runs(t, majority(y, 5), STEP_NS, 5 * S)
    while True:
        short = [i for i, r in enumerate(runs) if r[1] - r[0] < min_ns and (r[3] or (i + 1 < len(runs) and runs[i + 1][3]))]
        if not short:
            return [Stretch(r[0], r[1], r[2]) for r in runs]
        i = min(short, key=lambda j: (runs[j][1] - runs[j][0], j))
        prev = runs[i - 1] if i > 0 and runs[i][3] else None
        nxt = runs[i + 1] if i + 1 < len(runs) and runs[i + 1][3] else None
        if prev is not None and nxt is not None and prev[2] == nxt[2]:
            prev[1] = nxt[1]
            del runs[i : i + 2]
        elif prev is not None and (nxt is None or prev[1] - prev[0] >= nxt[1] - nxt[0]):
            prev[1] = runs[i][1]
            del runs[i]
        else:
            nxt[0], nxt[3] = runs[i][0], runs[i][3]
            del runs[i]


def test_the_heap_merge_equals_the_rescanning_one_on_noisy_predictions_with_gaps():
    rng = np.random.default_rng(1)
    for _ in range(20):
        y = np.repeat(rng.integers(0, 6, 200), rng.integers(1, 12, 200))
        t = np.cumsum(np.where(rng.random(y.size) < 0.02, 8 * S, STEP_NS)).astype(np.int64)
        assert smooth_stretches(t, y) == _merge_by_rescanning(t, y)
