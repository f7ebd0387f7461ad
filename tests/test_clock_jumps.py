"""Clock jumps of a sensor stream: a lone future stamp is dropped, a real forward step becomes a gap.

Every case is run offline (all of one sensor, then the other) and streamed in arrival order in
chunks of 1, 7 and 64 events; the windows must be equal bit for bit.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from har_models.data.labels import REALWORLD_LABELS
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack

P = 20_000_000  # 50 Hz
S = 1_000_000_000
T0 = 10**12  # a boot clock 1000 s after boot, a multiple of P
N = 3000  # 60 s per stream: 45 windows of 128 with step 64 when nothing is lost


def windows_of(acc_t, gyr_t, chunk=None):
    """Windows of two streams with values from their index; offline (chunk None) or streamed in arrival order."""
    rng = np.random.default_rng(0)
    acc_v, gyr_v = rng.normal(size=(acc_t.size, 3)), rng.normal(size=(gyr_t.size, 3))
    pipe = SensorPipeline(REALWORLD_LABELS, LabelTrack(np.array([0]), np.array([7])))
    if chunk is None:
        parts = [pipe.push("acc", acc_t, acc_v), pipe.push("gyro", gyr_t, gyr_v)]
    else:
        parts = []
        for a in range(0, max(acc_t.size, gyr_t.size), chunk):
            parts.append(pipe.push("acc", acc_t[a : a + chunk], acc_v[a : a + chunk]))
            parts.append(pipe.push("gyro", gyr_t[a : a + chunk], gyr_v[a : a + chunk]))
    parts.append(pipe.close())
    x = np.concatenate([p.x for p in parts])
    t0 = np.concatenate([p.t_start_ns for p in parts])
    return x, t0, pipe.stats


def check_all_chunkings(acc_t, gyr_t):
    ref = windows_of(acc_t, gyr_t)
    for chunk in (1, 7, 64):
        x, t0, stats = windows_of(acc_t, gyr_t, chunk)
        assert np.array_equal(x, ref[0]) and np.array_equal(t0, ref[1]), chunk
        assert stats == ref[2], chunk
    return ref


def clean():
    return T0 + P * np.arange(N)


@pytest.mark.slow
def test_clean_stream_keeps_every_window():
    _, t0, stats = check_all_chunkings(clean(), clean())
    assert t0.size == 45 and stats.outliers_dropped == 0 and stats.clock_steps == 0


@pytest.mark.slow
@pytest.mark.parametrize("ahead_ns", [3600 * S, 10**9 * S, 2 * S])
def test_one_future_stamp_costs_only_its_sample(ahead_ns, caplog):
    acc = clean()
    acc[1500] += ahead_ns  # one acc sample stamped far ahead (its neighbours are 40 ms apart: still interpolated)
    gyr = clean()
    gyr[2200] += ahead_ns
    with caplog.at_level(logging.WARNING, "har_models.data.resample"):
        _, t0, stats = check_all_chunkings(acc, gyr)
    assert t0.size == 45  # every window kept: the two samples' neighbours bridge them
    assert stats.outliers_dropped == 2 and stats.late_dropped == 0 and stats.clock_steps == 0
    assert stats.grid_points == N


@pytest.mark.slow
def test_several_outliers_each_dropped_and_warned_once(caplog):
    acc, gyr = clean(), clean()
    for i, ahead in zip([100, 900, 1700, 2500], [3600 * S, 5 * S, 86_400 * S, 10**9 * S], strict=True):
        acc[i] += ahead
        gyr[i + 3] += ahead
    with caplog.at_level(logging.WARNING, "har_models.data.resample"):
        _, t0, stats = windows_of(acc, gyr)
    assert t0.size == 45 and stats.outliers_dropped == 8 and stats.late_dropped == 0
    assert sum("clock outlier" in r.getMessage() for r in caplog.records) == 1
    check_all_chunkings(acc, gyr)


@pytest.mark.slow
def test_two_adjacent_future_stamps_are_still_outliers():
    acc, gyr = clean(), clean()
    acc[1000:1002] += 3600 * S  # two in a row: their neighbours are 60 ms apart, still within max_gap (100 ms)
    _, t0, stats = check_all_chunkings(acc, gyr)
    assert stats.outliers_dropped == 2 and t0.size == 45


@pytest.mark.slow
def test_forward_step_of_ten_minutes_is_a_gap():
    step = 600 * S
    t = clean()
    t[1500:] += step  # the clock steps forward by 10 min after 30 s (an NTP step)
    _, t0, stats = check_all_chunkings(t, t.copy())
    # 1500 samples on each side: windows at 0, 64, ..., 1344 (22 per side); none spans the step
    assert t0.size == 44
    before, after = t0[t0 < t[1500]], t0[t0 >= t[1500]]
    assert before.size == 22 and after.size == 22
    assert np.all(before + 128 * P <= t[1499] + P) and after[0] == t[1500]
    assert stats.clock_steps == 2 and stats.outliers_dropped == 0 and stats.late_dropped == 0


@pytest.mark.slow
def test_step_then_stale_samples_of_the_old_clock_are_late():
    t = clean()
    t[1500:] += 600 * S
    acc = np.r_[t, T0 + P * np.arange(1500, 1510)]  # ten samples of the old clock arrive after the step
    _, t0, stats = check_all_chunkings(acc, t)
    assert t0.size == 44 and stats.late_dropped == 10 and stats.clock_steps == 2


@pytest.mark.slow
def test_step_near_the_end_is_kept_at_close():
    t = clean()
    t[-10:] += 600 * S  # fewer than confirm_samples after the step: still a step, decided at close
    _, t0, stats = check_all_chunkings(t, t.copy())
    assert stats.clock_steps == 2 and stats.outliers_dropped == 0 and t0.size == 45


@pytest.mark.slow
@pytest.mark.parametrize("first_ns", [T0 + 3600 * S, 0, T0 - 7200 * S])
def test_wrong_first_stamp_is_dropped(first_ns):
    acc, gyr = clean(), clean()
    acc[0] = first_ns
    gyr[0] = first_ns
    _, t0, stats = check_all_chunkings(acc, gyr)
    # the first grid sample is lost on both streams, so runs start at T0 + P: 45 windows still fit in 2999 samples
    assert stats.outliers_dropped == 2 and stats.late_dropped == 0
    assert t0.size == 45 and t0[0] == T0 + P


@pytest.mark.slow
def test_backlog_after_silence_is_taken_in_stamp_order():
    """Doze: 300 s of silence in arrival, then the FIFO's old events (stamped over the 300 s), then live ones."""
    live1 = T0 + P * np.arange(1500)  # 30 s live
    backlog = live1[-1] + P * np.arange(1, 15_001)  # 15,000 events per stream over the next 300 s, delivered late at once
    live2 = backlog[-1] + P * np.arange(1, 1501)
    t = np.r_[live1, backlog, live2]
    _, t0, stats = check_all_chunkings(t, t.copy())
    n = t.size
    assert stats.late_dropped == 0 and stats.duplicates_dropped == 0 and stats.outliers_dropped == 0
    assert stats.accepted == 2 * n and stats.grid_points == n  # each event once, nothing twice
    assert t0.size == (n - 128) // 64 + 1 and np.unique(t0).size == t0.size


@pytest.mark.slow
def test_backlog_with_lost_head_leaves_a_gap_no_window_spans():
    """The FIFO overflowed: only the last 100 s of the 300 s silence come back; the first 200 s are a gap."""
    live1 = T0 + P * np.arange(1500)
    backlog = live1[-1] + 200 * S + P * np.arange(5000)
    t = np.r_[live1, backlog]
    _, t0, stats = check_all_chunkings(t, t.copy())
    assert stats.clock_steps == 2 and stats.late_dropped == 0 and stats.outliers_dropped == 0
    gap_lo, gap_hi = live1[-1], backlog[0]
    assert not np.any((t0 < gap_hi) & (t0 + 127 * P > gap_lo))  # no window spans the silence
    assert t0.size == 22 + (5000 - 128) // 64 + 1


def test_settings_are_checked():
    from har_models.data.resample import Resampler

    with pytest.raises(ValueError, match="jump_ns"):
        Resampler(jump_ns=10, reorder_ns=200)
    with pytest.raises(ValueError, match="confirm_samples"):
        Resampler(confirm_samples=0)


def test_paced_replay_does_not_wait_for_a_future_stamp():
    from edge_client.sensors.replay import ReplaySource, arrival_stamps
    from har_models.data.recording import Recording, SensorStream

    t = clean()
    assert np.array_equal(arrival_stamps(t), t)  # clean input: the running maximum
    spiky = t.copy()
    spiky[1500] += 3600 * S
    a = arrival_stamps(spiky)
    assert a[1500] == t[1499] and np.array_equal(np.delete(a, 1500), np.delete(t, 1500))
    first = t.copy()
    first[0] += 3600 * S
    assert arrival_stamps(first)[0] == t[1] and np.array_equal(arrival_stamps(first)[1:], t[1:])
    stepped = t.copy()
    stepped[1500:] += 600 * S  # a real step still takes its time
    assert np.array_equal(arrival_stamps(stepped), stepped)
    v = np.zeros((N, 3))
    rec = Recording("s", "spiky", SensorStream(spiky, v), SensorStream(t, v), LabelTrack(np.array([0]), np.array([7])))
    assert ReplaySource(rec, speed=1.0).span_s == pytest.approx((N - 1) * 0.02)  # 59.98 s, not an hour
