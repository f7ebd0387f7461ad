"""A history a person can correct: weeks and months with trends, recordings, undo and delete with their effect on the next
round, per-activity quality and the F1 curve over rounds, storage and keep periods."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import numpy as np
import pytest

from edge_client.history import (
    Edit,
    compare_periods,
    edit_words,
    f1_curve,
    period_of,
    quality_lines,
    recording_groups,
    size_words,
    storage_lines,
    trend_lines,
    windows_words,
)
from edge_client.timeline import active_classes
from edge_client.timeline_store import PERIOD_NS, TimelineStore
from edge_client.window_log import WindowLog
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet

NAMES = HAPT_LABELS.names  # walking, walking_upstairs, walking_downstairs, sitting, standing, laying


def test_weeks_run_monday_to_sunday_and_months_step_across_years():
    wk = period_of("week", dt.date(2026, 3, 4))
    assert (wk.first, wk.last, wk.label) == (dt.date(2026, 3, 2), dt.date(2026, 3, 8), "week of 2 Mar 2026")
    assert wk.step(-1).first == dt.date(2026, 2, 23)
    mo = period_of("month", dt.date(2026, 1, 31))
    assert (mo.first, mo.last, mo.label) == (dt.date(2026, 1, 1), dt.date(2026, 1, 31), "January 2026")
    assert mo.step(-1) == period_of("month", dt.date(2025, 12, 5)) and mo.step(1).last == dt.date(2026, 2, 28)
    assert len(wk.days(dt.date(2026, 3, 4))) == 3
    with pytest.raises(ValueError, match="'week' or 'month'"):
        period_of("year", dt.date(2026, 1, 1))


def test_a_running_week_is_compared_with_the_same_days_of_the_week_before():
    def day_minutes(d: dt.date) -> np.ndarray:  # 10 min walking a day in this week, 8 before; 30 min sitting on Mondays
        out = np.zeros(6)
        out[0] = 10.0 if d >= dt.date(2026, 3, 2) else 8.0
        out[3] = 30.0 if d.weekday() == 0 else 0.0
        return out

    wk = period_of("week", dt.date(2026, 3, 4))
    now, before, partial = compare_periods(wk, dt.date(2026, 3, 4), day_minutes)  # Monday to Wednesday of both weeks
    assert partial and now[0] == 30 and before[0] == 24 and now[3] == before[3] == 30
    assert trend_lines(NAMES, now, before, active_classes(NAMES), wk, partial) == [
        "walking: 30 min, +6 min (+25 %)",
        "sitting: 30 min, no change",
        "Active: 30 min, +6 min (+25 %) against the same days of the week before",
    ]
    now, before, partial = compare_periods(wk, dt.date(2026, 3, 20), day_minutes)  # a finished week: whole weeks
    assert not partial and (now[0], before[0]) == (70, 56)
    assert trend_lines(NAMES, now, before, active_classes(NAMES), wk, partial)[-1] == (
        "Active: 1 h 10 min, +14 min (+25 %) against the week before"
    )


def test_recordings_are_runs_of_one_activity_and_words_name_training_and_test_windows():
    step = 1_280_000_000
    t = np.array([0, 1, 2, 30, 31, 32, 33, 100], np.int64) * step  # a gap of 28 windows cuts a recording
    y = np.array([0, 0, 0, 0, 3, 3, 3, 3])
    groups = recording_groups(t, y)
    assert [(g.label, g.start, g.stop) for g in groups] == [(0, 0, 3), (0, 3, 4), (3, 4, 7), (3, 7, 8)]
    assert groups[2].t_first_ns == 31 * step and groups[2].t_last_ns == 33 * step and groups[2].windows == 3
    assert windows_words(45, 11) == "45 training and 11 test windows"
    assert windows_words(3, 1) == "3 training and 1 test window"


def test_quality_per_activity_and_the_f1_curve_come_from_the_test_windows_of_the_last_rounds():
    stairs = [[10, 0, 0, 0, 0, 0], [6, 17, 1, 0, 0, 0], [0, 0, 5, 0, 0, 0], [0] * 6, [0] * 6, [0] * 6]
    entries = [{"round": r, "start": [[5, 5], [5, 5]], "personal": stairs} for r in range(3)]
    lines = quality_lines(entries, NAMES)
    assert lines == [
        "walking: 100 % recognised (30 test windows)",
        "walking upstairs: 71 % recognised, often taken for walking (72 test windows)",
        "walking downstairs: 100 % recognised (15 test windows)",
    ]
    curve = f1_curve([{"round": 4, "start": [[3, 1], [1, 3]], "personal": [[4, 0], [0, 4]]}, {"round": 5, "start": None, "personal": []}])
    assert curve == [(4, 0.75, 1.0), (5, None, None)]
    assert quality_lines([], NAMES) == []


def test_storage_and_edits_in_words():
    assert [size_words(n) for n in (800, 1234, 12_300_000, 150e6, 1.2e9)] == ["800 B", "1.2 kB", "12.3 MB", "150 MB", "1.2 GB"]
    lines = storage_lines(1.5e6, 480, {"bytes": 40e6, "raw_s": 7200.0, "predictions": 5000.0, "oldest_ns": 0.0}, 2e6)
    assert lines == ["Recorded activity: 1.5 MB (480 windows)", "Timeline: 40.0 MB (2 h 0 min of raw samples, 5000 recognised windows)",
                     "Models, training state and exports: 2.0 MB", "In all: 43.5 MB"]  # fmt: skip
    made = Edit("relabel", "walking 14:02-14:10", 56, (200, 50), (245, 61))
    assert edit_words(made, 10) == (
        "45 training and 11 test windows from this stretch (245 training windows in all); the next round trains on them"
    )
    assert edit_words(Edit("relabel", "x", 0, (1, 1), (1, 1)), 10).endswith("so it gives no training windows")
    undo = Edit("undo", "walking 14:02-14:10", 56, (245, 61), (200, 50))
    assert edit_words(undo, 10) == ("undid the correction walking 14:02-14:10: 45 training and 11 test windows fewer; the next round "
                                    "trains on 200 and tests on 50 (rounds already done keep what they learnt)")  # fmt: skip
    gone = edit_words(Edit("delete_recording", "sitting of 09:15", 20, (24, 6), (8, 2)), 10)
    assert gone.startswith("deleted the recording sitting of 09:15: 16 training and 4 test windows fewer")
    assert gone.endswith("; too few to take part until 2 more training windows are recorded")
    assert edit_words(Edit("delete_span", "14:02-14:10", 0, (8, 2), (8, 2)), 10) == (
        "deleted 14:02-14:10 from the timeline; no training windows came from it"
    )


def _windows(n: int, label: int, t0: int) -> WindowSet:
    rng = np.random.default_rng(label)
    return WindowSet(rng.normal(size=(n, 6, 128)).astype(np.float32), np.full(n, label), HAPT_LABELS,
                     t0 + 1_280_000_000 * np.arange(n, dtype=np.int64))  # fmt: skip


def test_the_log_and_the_timeline_delete_what_the_person_deletes_and_keep_the_periods_set(tmp_path):
    wl = WindowLog(tmp_path / "w.log", HAPT_LABELS)
    wl.append(_windows(5, 0, 0))
    wl.append(_windows(3, 3, 10**12))
    t, y = wl.index()
    assert wl.remove(y == 0) == 5
    again = WindowLog(tmp_path / "w.log", HAPT_LABELS)  # rewritten on disk, not only in memory
    assert again.counts().tolist() == [0, 0, 0, 3, 0, 0]
    np.testing.assert_array_equal(again.read().t_start_ns, t[y == 3])
    with pytest.raises(ValueError, match="read the index again"):
        again.remove(np.ones(5, bool))
    tl = TimelineStore(tmp_path / "t.sqlite", HAPT_LABELS)
    t0 = time.time_ns() - 3600 * 10**9
    starts = t0 + 64 * PERIOD_NS * np.arange(20, dtype=np.int64)
    tl.add(starts, np.zeros(20), np.ones(20), np.zeros((20, 6, 128), np.float32), now_ns=t0)
    tl.relabel(int(starts[2]), int(starts[6]), "sitting")
    n, gone = tl.delete_span(int(starts[0]), int(starts[10]))
    assert n == 10 and [(c.label, c.windows) for c in gone] == [(3, 4)] and tl.correction_list() == []
    assert tl.predictions(t0, t0 + 10**12)[0].tolist() == starts[10:].tolist()
    assert tl.raw_samples(int(starts[0]), int(starts[9]))[0].size == 0
    with pytest.raises(ValueError, match=r"keep raw samples for 0\.25 to 30 days"):
        tl.set_keep(90, 60)
    tl.set_keep(30, 1)
    tl.close()
    reopened = TimelineStore(tmp_path / "t.sqlite", HAPT_LABELS)  # the periods set win over the constructor's defaults
    assert (reopened.retention_days, reopened.raw_days) == (30, 1)
    reopened.close()


def test_relabel_undo_and_deletes_change_what_the_next_round_trains_on(tmp_path):
    from edge_client.app.controller import AppConfig, DeviceController
    from edge_client.sensors.base import ReplaySensor
    from har_models.data.hapt import read_hapt_recordings

    root = Path(__file__).resolve().parents[1]
    state = tmp_path / "state"
    WindowLog(state / "recorded_windows.log", HAPT_LABELS).append(_windows(20, 0, 10**9))
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    source = ReplaySensor(read_hapt_recordings(root / "datasets" / "hapt" / "user01.npz")[0], speed=None, loop=False)
    ctl = DeviceController(cfg, source, charging=lambda: False, supervise_s=5.0)
    try:
        ctl.note_recorded(0, np.array([10**9, 20 * 1_280_000_000]), wall_ns=time.time_ns() - 600 * 10**9)
        t0 = time.time_ns() - 1800 * 10**9
        starts = t0 + 64 * PERIOD_NS * np.arange(60, dtype=np.int64)
        x = np.random.default_rng(1).normal(size=(60, 6, 128)).astype(np.float32)
        ctl.timeline.add(starts, np.full(60, 4), np.ones(60), x, now_ns=t0)
        base = ctl._split()
        assert base == (16, 4)
        made = ctl.relabel(int(starts[0]), int(starts[40]), "sitting")
        assert made.windows == 40 and made.before == base and made.after == (48, 12)  # 40 windows: 32 training and 8 test
        assert edit_words(made, 10).startswith("32 training and 8 test windows from this stretch")
        assert ctl.store.window_counts().n_train == 48
        undone = ctl.undo_relabel()
        assert undone.windows == 40 and undone.after == base and ctl.counts()["sitting"] == 0
        assert ctl.timeline.stretches(t0, t0 + 10**13)[0].corrected is False
        with pytest.raises(LookupError):
            ctl.undo_relabel()
        ctl.relabel(int(starts[0]), int(starts[40]), "sitting")
        view = ctl.history()
        # The recording, with when it was made; the correction's windows are not a recording.
        assert [(r["label"], r["windows"], r["wall_first_ns"] > 0) for r in view.recordings] == [(0, 20, True)]
        deleted = ctl.delete_span(int(starts[0]), int(starts[50]))
        assert deleted.windows == 40 and deleted.after == base and ctl.timeline.predictions(t0, t0 + 10**13)[0].size == 10
        rec = view.recordings[0]
        gone = ctl.delete_recording(rec["t_first_ns"], rec["t_last_ns"], rec["label"])
        assert gone.windows == 20 and gone.after == (0, 0) and ctl.store.window_counts().n_train == 0
        assert edit_words(gone, 10).endswith("too few to take part until 10 more training windows are recorded")
        with pytest.raises(LookupError, match="no longer kept"):
            ctl.delete_recording(rec["t_first_ns"], rec["t_last_ns"], rec["label"])
        ctl.set_keep(30, 1)
        view = ctl.history()
        assert (view.keep_days, view.keep_raw_days, view.recordings) == (30, 1, [])
        assert view.storage[0].endswith("(0 windows)") and view.storage[-1].startswith("In all: ")
    finally:
        ctl.close()
