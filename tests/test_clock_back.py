"""A sensor clock that steps back: a new segment, re-based past the old one; a few late samples stay late.

The stream is 50 Hz with stamps on the 20 ms grid, so every expected window start and value is
known by hand. Rules under test: har_models/data/clock.py (threshold: 25 samples more than 1 s
behind the clock; shift ceil(top - first) + 2 s). Every batch case is also streamed in arrival
order in chunks of 1, 7 and 64 events and must give equal windows bit for bit.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from edge_client.freshness import SensingFreshness
from edge_client.recorder import Recorder
from edge_client.sensors.base import ReplaySensor
from edge_client.sensors.replay import ReplaySource, arrival_stamps
from edge_client.window_log import WindowLog
from har_models.data.clock import step_shift
from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS
from har_models.data.pipeline import SensorPipeline, windows_from_recording
from har_models.data.recording import LabelTrack, Recording, SensorStream

P = 20_000_000  # 50 Hz
S = 1_000_000_000
T0 = 10**12  # a boot clock 1000 s after boot, a multiple of P
N = 3000  # 60 s per stream
STEP_AT = 1500  # samples 0..1499 on the old clock, 1500.. stamped 120 s behind
BACK = 120 * S
SHIFT = 121_980_000_000  # ceil_P(top - first) + 2 s = (1499 P - (1500 P - 120 s)) + 2 s = 119.98 s + 2 s
NEW_START = T0 + 1499 * P + 2 * S  # first re-based stamp: 2 s after the old segment's newest (29.98 s -> 31.98 s)


def stepped() -> np.ndarray:
    t = T0 + P * np.arange(N, dtype=np.int64)
    t[STEP_AT:] -= BACK
    return t


def values(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 3))


def windows_of(acc_t, gyr_t, chunk=None, track=None, acc_v=None, gyr_v=None):
    """Windows of two streams (values from seeds 0 and 1 unless given); offline (chunk None) or streamed in arrival order."""
    acc_v = values(acc_t.size, 0) if acc_v is None else acc_v
    gyr_v = values(gyr_t.size, 1) if gyr_v is None else gyr_v
    pipe = SensorPipeline(REALWORLD_LABELS, track or LabelTrack.constant(7))
    if chunk is None:
        parts = [pipe.push("acc", acc_t, acc_v), pipe.push("gyro", gyr_t, gyr_v)]
    else:
        parts = []
        for a in range(0, max(acc_t.size, gyr_t.size), chunk):
            parts.append(pipe.push("acc", acc_t[a : a + chunk], acc_v[a : a + chunk]))
            parts.append(pipe.push("gyro", gyr_t[a : a + chunk], gyr_v[a : a + chunk]))
    parts.append(pipe.close())
    return (
        np.concatenate([p.x for p in parts]),
        np.concatenate([p.y for p in parts]),
        np.concatenate([p.t_start_ns for p in parts]),
        pipe,
    )


def check_all_chunkings(acc_t, gyr_t, track=None):
    ref = windows_of(acc_t, gyr_t, track=track)
    for chunk in (1, 7, 64):
        x, y, t0, pipe = windows_of(acc_t, gyr_t, chunk, track)
        assert np.array_equal(x, ref[0]) and np.array_equal(y, ref[1]) and np.array_equal(t0, ref[2]), chunk
        assert pipe.stats == ref[3].stats, chunk
    return ref


def test_shift_rule_by_hand():
    assert step_shift(T0 + 1499 * P, T0 + 1500 * P - BACK, P, S) == SHIFT
    assert step_shift(10, 0, P, S) == P + 2 * S  # a part of a period rounds up: the grid's phase is kept


@pytest.mark.slow
def test_backward_step_of_two_minutes_is_a_new_segment(caplog):
    t = stepped()
    with caplog.at_level(logging.WARNING, "har_models.data.resample"):
        x, _, t0, pipe = windows_of(t, t.copy())
    # 1500 samples on each side: windows at 0, 64, ..., 1344 (22 per side); none spans the step
    assert t0.size == 44
    before, after = t0[:22], t0[22:]
    assert np.array_equal(before, T0 + 64 * P * np.arange(22))
    assert np.array_equal(after, NEW_START + 64 * P * np.arange(22))
    assert np.all(np.diff(t0) > 0)  # monotone within each segment and across the step (re-based)
    assert before[-1] + 127 * P <= T0 + 1499 * P and after[0] == NEW_START  # no window spans the step
    st = pipe.stats
    assert st.clock_steps_back == 2 and st.clock_steps == 0  # one per stream
    assert st.late_dropped == 0 and st.outliers_dropped == 0 and st.duplicates_dropped == 0
    assert st.accepted == 2 * N and st.grid_points == N  # every sample once: none lost, none twice
    assert st.gap_points_skipped == 99  # the 2 s between 29.98 s and 31.98 s
    assert pipe.clock_shift_ns == SHIFT and pipe.clock_ns == T0 + (N - 1) * P - BACK + SHIFT
    # the windows after the step hold exactly the samples after it
    acc_v, gyr_v = values(N, 0), values(N, 1)
    for j in (0, 21):
        k = STEP_AT + 64 * j
        assert np.array_equal(x[22 + j, :3], acc_v[k : k + 128].T.astype(np.float32))
        assert np.array_equal(x[22 + j, 3:], gyr_v[k : k + 128].T.astype(np.float32))
    steps = [r.getMessage() for r in caplog.records if "stepped back" in r.getMessage()]
    assert len(steps) == 1 and "119.980 s on acc" in steps[0] and "+121.980 s" in steps[0]
    check_all_chunkings(t, t.copy())


@pytest.mark.slow
def test_labels_across_a_backward_step_follow_the_re_based_clock():
    """A label track in the pipeline's clock: walking (1), then standing (2) from 10 s into the new segment."""
    t = stepped()
    change = NEW_START + 500 * P
    track = LabelTrack(np.array([T0, change]), np.array([1, 2]))
    _, y, t0, _ = check_all_chunkings(t, t.copy(), track)
    new = NEW_START + 64 * P * np.arange(22)
    walk_after = new[new + 127 * P < change]  # starts 0, 64, ..., 320: 6 windows end before the change
    stand = new[new >= change]  # starts 512, ..., 1344: 14 windows
    assert walk_after.size == 6 and stand.size == 14  # the windows at 384 and 448 span the change: dropped
    assert np.array_equal(t0, np.r_[T0 + 64 * P * np.arange(22), walk_after, stand])
    assert np.array_equal(y, np.r_[np.ones(28, np.int64), np.full(14, 2)])


@pytest.mark.slow
def test_out_of_order_samples_below_the_threshold_stay_late():
    """24 samples 120 s behind (an old burst) are late; the windows are those of the clean stream."""
    clean = T0 + P * np.arange(N, dtype=np.int64)
    old = T0 - BACK + P * np.arange(24, dtype=np.int64)
    t = np.r_[clean[:STEP_AT], old, clean[STEP_AT:]]
    burst = np.arange(STEP_AT, STEP_AT + 24)
    ref = windows_of(clean, clean.copy(), acc_v=np.delete(values(N + 24, 0), burst, 0), gyr_v=np.delete(values(N + 24, 1), burst, 0))
    x, _, t0, pipe = check_all_chunkings(t, t.copy())
    assert np.array_equal(x, ref[0]) and np.array_equal(t0, ref[2]) and t0.size == 45
    st = pipe.stats
    assert st.late_dropped == 48 and st.clock_steps_back == 0 and st.outliers_dropped == 0 and st.accepted == 2 * N


@pytest.mark.slow
def test_twenty_five_samples_behind_are_a_step():
    """25 samples 120 s behind are a step back; the old clock then returning is a forward step of that segment."""
    clean = T0 + P * np.arange(N, dtype=np.int64)
    old = T0 - BACK + P * np.arange(25, dtype=np.int64)
    t = np.r_[clean[:STEP_AT], old, clean[STEP_AT:]]
    _, _, t0, pipe = check_all_chunkings(t, t.copy())
    st = pipe.stats
    assert st.clock_steps_back == 2 and st.clock_steps == 2 and st.late_dropped == 0 and st.outliers_dropped == 0
    assert st.accepted == 2 * (N + 25)
    # segment 0: 1500 samples, 22 windows; the 25-sample segment holds none; after the forward step 1500 samples, 22
    shift = step_shift(T0 + 1499 * P, T0 - BACK, P, S)
    assert np.array_equal(t0[:22], T0 + 64 * P * np.arange(22))
    assert np.array_equal(t0[22:], T0 + STEP_AT * P + shift + 64 * P * np.arange(22))


@pytest.mark.slow
def test_a_step_back_under_one_second_costs_its_overlap():
    """0.5 s back is below the 1 s size threshold: 15 samples late, 10 repeat stamps already taken, no segment."""
    t = T0 + P * np.arange(N, dtype=np.int64)
    t[STEP_AT:] -= 500_000_000
    _, _, t0, pipe = check_all_chunkings(t, t.copy())
    st = pipe.stats
    assert st.clock_steps_back == 0 and st.late_dropped == 30 and st.duplicates_dropped == 20
    assert st.grid_points == N - 25 and t0.size == (N - 25 - 128) // 64 + 1


@pytest.mark.slow
def test_streams_stepping_a_sample_apart_agree_on_one_shift():
    """The gyro's first stamp after the step is 5 ms early: its own shift would be 122.00 s, the acc's 121.98 s.

    Both take 122.00 s, so the two stay aligned as their raw stamps are; each on its own would
    put the gyro one sample (20 ms) off the accelerometer."""
    acc = stepped()
    gyr = stepped()
    gyr[STEP_AT] -= 5_000_000
    x, _, t0, pipe = check_all_chunkings(acc, gyr)
    assert pipe.clock_shift_ns == 122 * S
    new = T0 + STEP_AT * P - BACK + 122 * S  # the acc's first re-based stamp, on the grid
    assert t0.size == 44 and np.array_equal(t0[22:], new + 64 * P * np.arange(22))
    acc_v, gyr_v = values(N, 0), values(N, 1)
    k = STEP_AT + 64  # the second window of the new segment: clear of the jittered sample
    assert np.array_equal(x[23, :3], acc_v[k : k + 128].T.astype(np.float32))
    assert np.array_equal(x[23, 3:], gyr_v[k : k + 128].T.astype(np.float32))


def test_a_stream_stepping_alone_does_not_stall_the_other():
    """Only the accelerometer's clock steps: once the gyroscope's clock is 1 s past the step, the acc takes its own shift."""
    acc = stepped()
    gyr = T0 + P * np.arange(N, dtype=np.int64)
    pipe = SensorPipeline(REALWORLD_LABELS, LabelTrack.constant(7))
    acc_v, gyr_v = values(N, 0), values(N, 1)
    early = 0
    for a in range(0, N, 10):  # live: 200 ms batches of each sensor
        early += len(pipe.push("acc", acc[a : a + 10], acc_v[a : a + 10]))
        early += len(pipe.push("gyro", gyr[a : a + 10], gyr_v[a : a + 10]))
    assert pipe.stats.clock_steps_back == 1 and pipe.clock_shift_ns == SHIFT
    assert early > 22  # windows after the step came out live, not only at close


@pytest.mark.slow
def test_live_paced_replay_across_a_backward_step():
    """A paced replay (a live source, arrival clock faked) bridges the step: 59.98 s, not 180 s; its windows are the batch ones."""
    t = stepped()
    rec = Recording("me", "back", SensorStream(t, values(N, 0)), SensorStream(t.copy(), values(N, 1)), LabelTrack.constant(7))
    a = arrival_stamps(t)
    assert np.array_equal(a[:STEP_AT], t[:STEP_AT]) and np.array_equal(a[STEP_AT:], t[STEP_AT:] + BACK - P)
    now = [0.0]
    src = ReplaySource(rec, speed=1.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert src.span_s == pytest.approx((N - 2) * 0.02)  # no time passes at the step itself
    pipe = SensorPipeline(REALWORLD_LABELS, rec.labels)
    parts, n_chunks = [], 0
    for sensor, ts, xyz in src.chunks():
        n_chunks += 1
        parts.append(pipe.push(sensor, ts, xyz))
    parts.append(pipe.close())
    assert n_chunks > 1000  # delivered as a sensor delivers: about one event per sensor per wake-up
    want = windows_from_recording(rec, REALWORLD_LABELS)
    got_t = np.concatenate([p.t_start_ns for p in parts])
    assert np.array_equal(got_t, want.t_start_ns) and np.array_equal(np.concatenate([p.x for p in parts]), want.x)
    assert got_t.size == 44


def test_recorder_labels_a_recording_across_a_backward_step(tmp_path):
    """Walking from 5 s, the clock steps back 120 s at 30 s, sitting from 10 s after the step, stop 25 s after it."""
    t = stepped()
    acc_v, gyr_v = values(N, 0), values(N, 1)
    rec = Recording("me", "back", SensorStream(t, acc_v), SensorStream(t.copy(), gyr_v), LabelTrack.constant(0))
    r = Recorder(WindowLog(tmp_path / "w.log", HAPT_LABELS))
    seen = 0  # samples per stream delivered so far (both streams advance together)
    marks: dict[str, int] = {}

    def rebased_newest(n: int) -> int:  # the output clock at the newest delivered sample, by hand
        i = n - 1
        return int(t[i]) + (SHIFT if i >= STEP_AT else 0)

    for sensor, ts, xyz in ReplaySensor(rec, speed=None).chunks(threading.Event()):
        r.push((sensor, ts, xyz))
        if sensor == "gyro":
            seen += ts.size
        else:
            continue
        if "on" not in marks and seen >= 250:
            r.start("walking")
            marks["on"] = rebased_newest(seen) + 1
        if "switch" not in marks and seen >= STEP_AT + 500:
            r.start("sitting")
            marks["switch"] = rebased_newest(seen) + 1
        if "off" not in marks and seen >= STEP_AT + 1250:
            r.stop()
            marks["off"] = rebased_newest(seen) + 1
    r.flush()
    got = r.log.read()
    runs = np.r_[T0 + 64 * P * np.arange(22), NEW_START + 64 * P * np.arange(22)]
    walking = [int(s) for s in runs if s >= marks["on"] and s + 127 * P < marks["switch"]]
    sitting = [int(s) for s in runs if s >= marks["switch"] and s + 127 * P < marks["off"]]
    assert len(walking) >= 20 and len(sitting) >= 8
    assert got.t_start_ns.tolist() == walking + sitting
    assert got.y.tolist() == [HAPT_LABELS.index("walking")] * len(walking) + [HAPT_LABELS.index("sitting")] * len(sitting)
    assert sum(s >= NEW_START for s in walking) >= 4  # walking continued across the step, on both sides
    k = STEP_AT + (walking[-1] - NEW_START) // P  # the last walking window holds the samples after the step
    assert np.array_equal(got.x[len(walking) - 1, :3], acc_v[k : k + 128].T.astype(np.float32))


def test_recorder_labels_a_session_whose_clock_restarted(tmp_path):
    """After a reboot the boot clock restarts near 0: a session started then is labelled (it was not: its label
    change lay at the previous session's newest stamp)."""
    n = 1000
    t = T0 + P * np.arange(n, dtype=np.int64)
    v = values(n, 0)
    r = Recorder(WindowLog(tmp_path / "w.log", HAPT_LABELS))
    r.start("sitting")
    rec = Recording("me", "s1", SensorStream(t, v), SensorStream(t.copy(), v), LabelTrack.constant(0))
    for chunk in ReplaySensor(rec, speed=None).chunks(threading.Event()):
        r.push(chunk)
    r.flush()
    r.start("laying")
    boot = t - T0 + 3 * S
    rec2 = Recording("me", "s2", SensorStream(boot, v), SensorStream(boot.copy(), v), LabelTrack.constant(0))
    for chunk in ReplaySensor(rec2, speed=None).chunks(threading.Event()):
        r.push(chunk)
    r.stop()
    r.flush()
    per = (n - 128) // 64 + 1
    assert r.counts()["sitting"] == per and r.counts()["laying"] == per


def test_freshness_reads_re_based_windows_on_the_sensor_clock():
    t = stepped()
    _, _, t0, pipe = windows_of(t, t.copy())
    from har_models.data.windowing import WindowSet

    ws = WindowSet(np.zeros((t0.size, 6, 128), np.float32), np.zeros(t0.size, np.int64), REALWORLD_LABELS, t0)
    now = [int(t[-1])]  # the sensor clock now: its newest stamp, 120 s behind the old clock
    fresh = SensingFreshness(limit_s=60, clock_ns=lambda: now[0])
    fresh.note(ws, pipe.clock_shift_ns)
    assert fresh.newest_end_ns == int(t0[-1]) + 128 * P - SHIFT == int(t[STEP_AT + 1344 + 127]) + P  # on the sensor clock
    assert fresh.state() == "live"
    now[0] += 61 * S
    assert fresh.state() == "paused"  # without the shift the windows would look 122 s younger: still "live"
    unshifted = SensingFreshness(limit_s=60, clock_ns=lambda: now[0])
    unshifted.note(ws)
    assert unshifted.state() == "live"
