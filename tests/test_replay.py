"""Replay of recordings as a sensor driver: pacing, batching, stopping, and the same windows in every mode."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edge_client.sensors.replay import ReplaySource, replay_windows
from har_models.data.labels import REALWORLD_LABELS
from har_models.data.pipeline import SensorPipeline, windows_from_recording
from har_models.data.realworld import recording_from_csv_files
from har_models.data.recording import LabelTrack, Recording, SensorStream

MS = 1_000_000
ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "datasets" / "realworld" / "sample" / "proband1"


def regular_recording(seconds: float, start_ns: int = 10**18) -> Recording:
    t = start_ns + 20 * MS * np.arange(int(seconds * 50) + 1)
    rng = np.random.default_rng(0)
    return Recording(
        "s1",
        "regular",
        SensorStream(t, rng.normal(size=(t.size, 3))),
        SensorStream(t + 3 * MS, rng.normal(size=(t.size, 3))),
        LabelTrack.constant(7),
    )


def messy_recording(seconds: float = 12.0, seed: int = 1) -> Recording:
    """Jitter, a gap, out-of-order and repeated stamps, a late sample, different rates."""
    rng = np.random.default_rng(seed)

    def stream(period_ms: int, offset_ms: int):
        n = int(seconds * 1000 / period_ms)
        t = 10**18 + offset_ms * MS + period_ms * MS * np.arange(n) + rng.integers(-3, 4, size=n) * MS
        t[n // 3 :] += 400 * MS  # a 400 ms gap
        t[[50, 51]] = t[[51, 50]]
        t[80] = t[79]
        t[120] = t[119] - 300 * MS  # late: dropped by the resampler
        return SensorStream(t, rng.normal(size=(n, 3)))

    track = LabelTrack(np.array([0, 10**18 + 6 * 10**9]), np.array([2, 5]))
    return Recording("s1", "messy", stream(20, 0), stream(7, 2), track)


def same_windows(a, b) -> bool:
    return np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y) and np.array_equal(a.t_start_ns, b.t_start_ns)


@pytest.fixture(scope="module")
def real():
    rec, _ = recording_from_csv_files(
        SAMPLE / "acc_walking_shin.csv", SAMPLE / "Gyroscope_walking_shin.csv", 1, "walking", "shin"
    )
    return rec


@pytest.mark.slow  # five seconds of real time
def test_real_time_delivers_50hz_for_5_seconds_and_stops_by_itself():
    rec = regular_recording(60.0)
    source = ReplaySource(rec, speed=1.0)
    pipe = SensorPipeline(REALWORLD_LABELS, rec.labels)
    got = []
    start = time.monotonic()
    progress = source.run(pipe, got.append, max_wall_s=5.0)
    wall = time.monotonic() - start
    expected = 251 + 250  # events due by 5.0 s: acc stamped 0, 20, .., 5000 ms; gyro 3, 23, .., 4983 ms
    assert abs(progress.samples_delivered - expected) <= 0.01 * expected
    assert 5.0 <= wall < 5.5
    assert progress.stopped and not progress.finished
    # 250 grid points in 5 s -> windows at 128 and 192 samples
    assert progress.windows_emitted == sum(len(w) for w in got) == 2


@pytest.mark.parametrize("speed", [None, 40.0])
def test_accelerated_and_unpaced_give_the_offline_windows(speed):
    rec = messy_recording()
    offline = windows_from_recording(rec, REALWORLD_LABELS)
    assert len(offline) > 0 and set(offline.y.tolist()) == {2, 5}
    start = time.monotonic()
    assert same_windows(replay_windows(rec, REALWORLD_LABELS, speed), offline)
    if speed is not None:
        span = ReplaySource(rec).span_s
        assert span / speed <= time.monotonic() - start < span / speed + 1.0


def test_real_recording_replays_to_the_offline_windows(real):
    offline = windows_from_recording(real, REALWORLD_LABELS)
    assert len(offline) == 417
    assert same_windows(replay_windows(real, REALWORLD_LABELS, None), offline)
    # at 10 000x the 640 s recording takes 64 ms of wall clock
    assert same_windows(replay_windows(real, REALWORLD_LABELS, 10_000.0), offline)


def test_chunks_look_like_a_sensor_driver(real):
    source = ReplaySource(real, speed=None, fast_batch_s=0.5)
    per_sensor = {"acc": [], "gyro": []}
    newest = {"acc": -1, "gyro": -1}
    for sensor, t, xyz in source:
        assert t.dtype == np.int64 and xyz.shape == (t.size, 3) and t.size > 0
        per_sensor[sensor].append(t)
        newest[sensor] = max(newest[sensor], int(t.max()))
    # each sensor's events arrive complete and in their recorded order
    assert np.array_equal(np.concatenate(per_sensor["acc"]), real.acc.t_ns)
    assert np.array_equal(np.concatenate(per_sensor["gyro"]), real.gyro.t_ns)
    p = source.progress
    assert p.finished and not p.stopped
    assert p.samples_delivered == len(real.acc) + len(real.gyro) == len(source)
    assert p.recording_s == pytest.approx(source.span_s) and p.lag_s == 0.0


class FakeClock:
    """A clock that moves only when the replay sleeps; every sleep overshoots by 3 ms."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += max(seconds, 0.0) + 0.003


def test_schedule_is_absolute_so_sleep_errors_do_not_accumulate():
    rec = regular_recording(20.0)
    clock = FakeClock()
    source = ReplaySource(rec, speed=1.0, clock=clock, sleep=clock.sleep)
    delivered = []
    for _sensor, t, _ in source:
        delivered.append((clock.now - 100.0, int(t[-1] - rec.acc.t_ns[0]) / 1e9))
    wall, due = np.array(delivered).T
    # every batch is delivered at most 3 ms after its newest event was due: no drift over ~1 000 sleeps
    assert clock.sleeps > 900
    assert np.all(wall - due >= -1e-9) and np.max(wall - due) <= 0.0031
    assert source.progress.max_lag_s == pytest.approx(0.003, abs=1e-4)
    assert wall[-1] == pytest.approx(20.0 + 0.003, abs=1e-4)


def test_speed_scales_the_schedule():
    rec = regular_recording(20.0)
    clock = FakeClock()
    source = ReplaySource(rec, speed=4.0, clock=clock, sleep=clock.sleep)
    n = sum(t.size for _, t, _ in source.chunks(max_wall_s=2.0))
    # 2 s of wall clock at 4x: 8 s of recording, 401 acc stamps (0 .. 8 s) and 400 gyro (3 ms later)
    assert n == 401 + 400
    assert source.progress.stopped and clock.now - 100.0 == pytest.approx(2.0, abs=0.004)


def test_stop_event_from_a_callback_and_from_another_thread(real):
    stop = threading.Event()
    source = ReplaySource(real, speed=None, fast_batch_s=0.2)
    seen = []

    def on_windows(ws):
        seen.append(len(ws))
        stop.set()

    progress = source.run(SensorPipeline(REALWORLD_LABELS, real.labels), on_windows, stop_event=stop)
    assert progress.stopped and progress.samples_delivered < len(source) // 10
    assert progress.windows_emitted == sum(seen)

    stop = threading.Event()
    source = ReplaySource(regular_recording(60.0), speed=1.0)
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(p=source.run(SensorPipeline(REALWORLD_LABELS), stop_event=stop)), daemon=True
    )
    start = time.monotonic()
    worker.start()
    time.sleep(0.3)
    assert source.progress.samples_delivered > 0  # counters are live
    stop.set()
    worker.join(timeout=2.0)
    assert not worker.is_alive() and time.monotonic() - start < 1.0
    assert result["p"].stopped and 0.2 < result["p"].recording_s < 0.6


def test_validation_and_empty_streams():
    rec = regular_recording(1.0)
    with pytest.raises(ValueError, match="speed must be a positive number or None"):
        ReplaySource(rec, speed=0.0)
    with pytest.raises(ValueError, match="fast_batch_s must be > 0"):
        ReplaySource(rec, speed=None, fast_batch_s=0.0)
    empty = SensorStream(np.empty(0, np.int64), np.empty((0, 3)))
    only_acc = Recording("s", "acc only", rec.acc, empty, rec.labels)
    source = ReplaySource(only_acc, speed=None)
    assert {s for s, _, _ in source} == {"acc"} and source.progress.finished
    assert len(replay_windows(only_acc, REALWORLD_LABELS)) == 0


def test_edge_client_does_not_import_coordinator():
    code = "import sys, edge_client.sensors.replay; sys.exit(any(m.split('.')[0] == 'coordinator' for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_a_slow_consumer_shows_as_lag_and_the_schedule_catches_up():
    rec = regular_recording(10.0)
    clock = FakeClock()
    source = ReplaySource(rec, speed=1.0, clock=clock, sleep=clock.sleep)
    lags, sizes, stalled = [], [], False
    for _sensor, t, _ in source:
        if source.progress.batches_delivered == 100 and not stalled:
            clock.now += 0.5  # the consumer stalls for half a second once
            stalled = True
        if source.progress.batches_delivered > 100:
            lags.append(source.progress.lag_s)
            sizes.append(t.size)
    # batch 100 went out at 1.963 s; the next event (1.980 s) is delivered at 2.463 s
    assert lags[0] == pytest.approx(0.483, abs=1e-6)
    assert max(sizes) >= 24  # the backlog goes out in one batch, not one event per wake-up
    assert max(lags[-100:]) <= 0.0031  # and afterwards the replay is back on schedule
