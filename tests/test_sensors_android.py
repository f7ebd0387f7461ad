"""Android listener events -> samples -> the shared pipeline, against recorded-style event streams.

The streams mimic what phones deliver for a 20,000 µs request: periods jittered between 5
and 40 ms, duplicated and out-of-order timestamps, a 2 s pause (screen off without a wake
lock) and a 200 Hz burst, for accelerometer and gyroscope independently. Ground truth is a
known smooth signal; the windows must equal the resampled ground truth.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.sensors.android import TYPE_ACCELEROMETER, TYPE_GYROSCOPE, events_to_chunks
from har_models.data.labels import HAPT_LABELS
from har_models.data.pipeline import SensorPipeline, windows_from_recording
from har_models.data.recording import LabelTrack, Recording, SensorStream
from har_models.data.windowing import WindowSet

MS = 1_000_000
T0 = 123_456_789_012_345  # boot-clock nanoseconds: a phone up for about 34 hours

# (amplitude, frequency Hz, phase) per axis: acc in m/s^2 around gravity, gyro in rad/s.
ACC = [[(2.0, 0.7, 0.1), (0.5, 1.9, 1.0)], [(1.0, 1.1, 2.0)], [(3.0, 0.5, 0.3), (0.8, 2.3, 0.0)]]
GYR = [[(0.6, 0.9, 0.4)], [(0.3, 1.7, 1.2), (0.2, 0.4, 0.0)], [(1.1, 0.6, 2.5)]]
OFFSET = {"acc": np.array([0.0, 0.0, 9.81]), "gyro": np.zeros(3)}


def truth(sensor: str, t_ns: np.ndarray) -> np.ndarray:
    """The true signal at ``t_ns``, shape (n, 3)."""
    s = (np.asarray(t_ns, np.int64) - T0).astype(np.float64) / 1e9
    spec = ACC if sensor == "acc" else GYR
    cols = [sum(a * np.sin(2 * np.pi * f * s + p) for a, f, p in axis) for axis in spec]
    return np.stack(cols, axis=1) + OFFSET[sensor]


def max_second_derivative(sensor: str) -> float:
    spec = ACC if sensor == "acc" else GYR
    return max(sum(a * (2 * np.pi * f) ** 2 for a, f, _ in axis) for axis in spec)


def sample_times(rng: np.random.Generator) -> np.ndarray:
    """One sensor's sorted event stamps: 10 s jittered 5-40 ms, a 2 s pause, 3 s at 200 Hz, 8 s jittered."""
    parts, t = [], T0 + int(rng.integers(0, 20 * MS))
    segments: list[tuple[int, int, int] | None] = [(10_000 * MS, 5, 40), None, (3_000 * MS, 5, 5), (8_000 * MS, 5, 40)]
    for segment in segments:  # (duration ns, shortest and longest period ms), or None for the pause
        if segment is None:
            t += 2_000 * MS
            continue
        duration_ns, lo, hi = segment
        end = t + duration_ns
        while t < end:
            parts.append(t)
            t += int(rng.uniform(lo, hi) * MS) if hi != lo else lo * MS
    return np.array(parts, np.int64)


def deliver(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    """Delivery order of a stream: 3 % duplicated, 3 % swapped with the next one (out of order)."""
    order = list(range(t.size))
    for i in range(0, t.size - 1):
        if rng.random() < 0.03:
            order[i], order[i + 1] = order[i + 1], order[i]
    out = []
    for i in order:
        out.append(i)
        if rng.random() < 0.03:
            out.append(i)
    return np.array(out)


def make_events(seed: int) -> tuple[list[tuple[int, int, float, float, float]], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    events_by_sensor: list[list[tuple[int, tuple[int, int, float, float, float]]]] = []
    clean: dict[str, np.ndarray] = {}
    for sensor, typ in (("acc", TYPE_ACCELEROMETER), ("gyro", TYPE_GYROSCOPE)):
        t = sample_times(rng)
        clean[sensor] = t
        idx = deliver(rng, t)
        v = truth(sensor, t)
        # Arrival time: the newest stamp so far plus a small delivery delay.
        arrival = np.maximum.accumulate(t[idx]) + rng.integers(0, 3 * MS, idx.size)
        events_by_sensor.append(
            [(int(arrival[k]), (typ, int(t[i]), float(v[i, 0]), float(v[i, 1]), float(v[i, 2]))) for k, i in enumerate(idx)]
        )
    merged = sorted(events_by_sensor[0] + events_by_sensor[1], key=lambda e: e[0])
    return [e for _, e in merged], clean


def run_live(events, seed: int) -> tuple:
    """Events drained in random batches (as the listener's buffer is), converted, through the pipeline."""
    rng = np.random.default_rng(seed + 1000)
    pipe = SensorPipeline(HAPT_LABELS, LabelTrack.constant(2))
    parts: list[WindowSet] = []
    i = 0
    while i < len(events):
        j = i + int(rng.integers(1, 60))
        for chunk in events_to_chunks(events[i:j]):
            parts.append(pipe.push(*chunk))
        i = j
    parts.append(pipe.close())
    xs, ys = [ws.x for ws in parts], [ws.y for ws in parts]
    ts = [ws.t_start_ns for ws in parts if ws.t_start_ns is not None]
    assert len(ts) == len(parts)  # the live pipeline stamps every window
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ts), pipe.stats


def expected_starts(clean: dict[str, np.ndarray], max_gap_ns: int = 100 * MS, period: int = 20 * MS) -> list[int]:
    """Window starts from first principles: grid points bracketed on both streams by samples <= max_gap apart."""
    lo = max(t[0] for t in clean.values())
    hi = min(t[-1] for t in clean.values())
    grid = np.arange(-(-lo // period), hi // period + 1, dtype=np.int64) * period
    ok = np.ones(grid.size, bool)
    for t in clean.values():
        j = np.searchsorted(t, grid, side="right") - 1
        exact = t[j] == grid
        span = t[np.minimum(j + 1, t.size - 1)] - t[j]
        ok &= exact | (span <= max_gap_ns)
    starts = []
    run: list[int] = []
    for g, good in zip(grid.tolist(), ok.tolist(), strict=True):
        if good and (not run or g - run[-1] == period):
            run.append(g)
            continue
        starts += run[: max(0, len(run) - 128 + 1) : 64]
        run = [g] if good else []
    starts += run[: max(0, len(run) - 128 + 1) : 64]
    return starts


def test_events_to_chunks_splits_by_sensor_keeping_arrival_order():
    ev = [(4, 30, 0.1, 0.2, 0.3), (1, 10, 1.0, 2.0, 3.0), (1, 5, 4.0, 5.0, 6.0), (8, 1, 0, 0, 0), (1, 10, 7.0, 8.0, 9.0)]
    chunks = events_to_chunks(ev)
    assert [c[0] for c in chunks] == ["gyro", "acc"]  # gyro's event came first; the proximity sensor (8) is ignored
    assert chunks[1][1].tolist() == [10, 5, 10] and chunks[1][1].dtype == np.int64
    assert chunks[1][2].tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert events_to_chunks([]) == []
    big = 2**62 + 1  # boot-clock ns stay exact (no float detour)
    assert events_to_chunks([(1, big, 0, 0, 0)])[0][1][0] == big


def test_events_to_chunks_rejects_malformed_events():
    with pytest.raises(ValueError, match="timestamp_ns"):
        events_to_chunks([(1, 2, 3.0)])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_jittered_bursty_streams_give_the_resampled_ground_truth(seed):
    events, clean = make_events(seed)
    x, y, t_start, stats = run_live(events, seed)
    assert stats.duplicates_dropped > 0 and stats.late_dropped == 0  # duplicates seen; every swap within 200 ms kept

    # 1. The window starts are the runs of the exact 50 Hz grid on either side of the 2 s pause.
    starts = expected_starts(clean)
    assert t_start.tolist() == starts
    assert len(starts) >= 6 and set(y.tolist()) == {2}
    pause = [g for g in np.diff(t_start).tolist() if g != 64 * 20 * MS]
    assert len(pause) == 1 and pause[0] > 2_000 * MS  # one break: at the pause, nowhere else

    # 2. The same samples, cleaned (sorted, unique) and windowed offline: bit-identical.
    rec = Recording(
        "phone",
        "s",
        SensorStream(clean["acc"], truth("acc", clean["acc"])),
        SensorStream(clean["gyro"], truth("gyro", clean["gyro"])),
        LabelTrack.constant(2),
    )
    offline = windows_from_recording(rec, HAPT_LABELS)
    np.testing.assert_array_equal(offline.t_start_ns, t_start)
    np.testing.assert_array_equal(offline.x, x)

    # 3. Against the true signal on the grid: linear interpolation errs by at most h^2/8 * max|f''|
    # with h <= 40 ms the longest spacing, plus float32 rounding of the stored window.
    grid = t_start[:, None] + np.arange(128)[None, :] * 20 * MS
    for ch, sensor in ((slice(0, 3), "acc"), (slice(3, 6), "gyro")):
        want = truth(sensor, grid.reshape(-1)).reshape(grid.shape[0], 128, 3).transpose(0, 2, 1)
        bound = (0.040**2) / 8 * max_second_derivative(sensor) + 1e-5 * (np.abs(want).max() + 1)
        err = np.abs(x[:, ch, :] - want).max()
        assert 0 < err <= bound, (sensor, err, bound)
