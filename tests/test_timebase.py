"""Each sensor stream's time base (boot clock, wall clock, a fixed offset) is established from when its samples arrive, and its
stamps are mapped to the boot clock before the accelerometer and gyroscope are paired; a stream without one is refused.
A perfect stream is established whatever the drain period and the sample rate, within one window."""

from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest
from support import android_standin

from edge_client.sensors.android import TYPE_ACCELEROMETER, TYPE_GYROSCOPE, AndroidSensorSource
from har_models.data.labels import HAPT_LABELS
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack
from har_models.data.timebase import StreamTimeBase, TimeBaseRefused

PERIOD = 20_000_000  # 50 Hz
DRAIN = 250_000_000  # the source collects every 0.25 s
BOOT0 = 3_600_000_000_000  # an hour after boot
WALL_MINUS_BOOT = 1_764_620_000_000_000_000  # the wall clock (2025-12) minus the boot clock


def _deliveries(seconds: float, clock: str, sleep_s: float = 0.0, latency_ns: int = 3_000_000):
    """(true boot stamps, stamps as the sensor gives them, arrival on the boot clock) per drain, for ``seconds`` of 50 Hz.

    ``clock``: "boot", "wall", or "paused" (a clock that stood still through a deep sleep of ``sleep_s`` before the
    recording, so it runs that much behind the boot clock).
    """
    n_per = DRAIN // PERIOD
    k = 0
    out = []
    for d in range(int(seconds * 1e9 / DRAIN)):
        true = BOOT0 + (k + np.arange(n_per, dtype=np.int64)) * PERIOD
        k += n_per
        given = {"boot": true, "wall": true + WALL_MINUS_BOOT, "paused": true - int(sleep_s * 1e9)}[clock]
        arrival = int(true[-1]) + latency_ns + (d % 3) * 40_000_000  # latency varies by a few tens of ms
        out.append((true, given.copy(), arrival))
    return out


def _map(tb: StreamTimeBase, deliveries) -> tuple[np.ndarray, np.ndarray]:
    got_t, truth = [], []
    for true, given, arrival in deliveries:
        t, _ = tb.push(given, np.zeros((len(given), 3)), arrival, WALL_MINUS_BOOT)
        got_t.append(t)
        truth.append(true)
    return np.concatenate(got_t), np.concatenate(truth)


@pytest.mark.parametrize(("clock", "base"), [("boot", "boot"), ("wall", "wall")])
def test_boot_and_wall_clock_stamps_map_exactly_onto_the_boot_clock(clock, base):
    tb = StreamTimeBase("gyro")
    t, truth = _map(tb, _deliveries(5, clock))
    assert tb.base is not None and tb.base.base == base
    np.testing.assert_array_equal(t, truth)  # every sample, the held ones included, exactly
    assert tb.dropped == 0


def test_a_clock_that_paused_in_deep_sleep_is_a_fixed_offset_mapped_within_a_delivery_latency():
    tb = StreamTimeBase("acc")
    t, truth = _map(tb, _deliveries(5, "paused", sleep_s=5400))
    assert tb.base is not None and tb.base.base == "offset"
    err = t - truth
    assert np.all(err == err[0]) and 0 <= err[0] <= 10_000_000  # one shift for all; off by the fastest delivery's latency


def test_streams_on_different_clocks_are_paired_once_mapped():
    def windows(acc_clock: str, gyro_clock: str, mapped: bool) -> int:
        pipe = SensorPipeline(HAPT_LABELS, LabelTrack.constant(0))
        bases = {"acc": StreamTimeBase("acc"), "gyro": StreamTimeBase("gyro")}
        n = 0
        rng = np.random.default_rng(0)
        for (_, acc, arr_a), (_, gyro, arr_g) in zip(_deliveries(20, acc_clock), _deliveries(20, gyro_clock), strict=True):
            for name, t, arrival in (("acc", acc, arr_a), ("gyro", gyro, arr_g)):
                xyz = rng.normal(size=(len(t), 3))
                if mapped:
                    t, xyz = bases[name].push(t, xyz, arrival, WALL_MINUS_BOOT)
                n += len(pipe.push(name, t, xyz))
        return n

    reference = windows("boot", "boot", mapped=True)
    assert reference >= 12  # 20 s of 50 Hz: 2.56 s windows every 1.28 s
    assert windows("boot", "wall", mapped=True) == reference
    assert windows("wall", "boot", mapped=True) == reference
    assert windows("boot", "wall", mapped=False) < reference  # paired on raw stamps, 56 years apart


@pytest.mark.parametrize(
    "stamps",
    [
        lambda k, n: np.zeros(n, np.int64),  # a sensor that stamps nothing
        lambda k, n: np.random.default_rng(k).integers(0, 10**15, n),  # garbage
        lambda k, n: BOOT0 + (k * n + np.arange(n)) * PERIOD * 2,  # a clock running at twice the rate
    ],
)
def test_a_stream_without_an_established_base_is_refused_with_a_message_and_nothing_windowed(stamps):
    tb = StreamTimeBase("gyro")
    released = 0
    with pytest.raises(TimeBaseRefused) as exc:
        for k, (_, given, arrival) in enumerate(_deliveries(60, "boot")):
            t, _ = tb.push(stamps(k, len(given)), np.zeros((len(given), 3)), arrival, WALL_MINUS_BOOT)
            released += len(t)
    assert released == 0 and tb.base is None
    assert str(exc.value).startswith("the gyroscope's timestamps keep no fixed relation to the boot clock or the wall clock")
    assert str(exc.value).endswith("the gyroscope is refused; restart sensing, or the device")
    assert re.search(r"over 10\.\d s of deliveries they advanced -?\d+\.\d s", str(exc.value))  # what its stamps did, in its time


def test_a_base_that_stops_fitting_is_established_again(caplog):
    tb = StreamTimeBase("acc")
    first = _deliveries(4, "boot")
    _map(tb, first)
    assert tb.base is not None and tb.base.base == "boot"
    # The sensor's clock then stands still through a 10-minute deep sleep: its stamps run on from where they stopped.
    later = [(true + 600_000_000_000, given, arrival + 600_000_000_000) for true, given, arrival in _deliveries(4, "boot")]
    later = [(true, given + int(first[-1][1][-1] - BOOT0) + PERIOD, arrival) for true, given, arrival in later]
    caplog.set_level(logging.INFO, "har_models.data.timebase")
    t, truth = _map(tb, later)
    assert tb.base is not None and tb.base.base == "offset"
    assert "its stamps left the boot clock" in caplog.text
    err = t - truth
    assert len(t) == len(truth) and np.all(err == err[0]) and 0 <= err[0] <= 10_000_000


def test_the_android_source_maps_each_sensor_to_the_boot_clock(monkeypatch):
    now = {"boot": BOOT0}
    manager = android_standin.install(monkeypatch, boot_ns=lambda: now["boot"])
    src = AndroidSensorSource(drain_s=0.01, wall_clock_ns=lambda: now["boot"] + WALL_MINUS_BOOT)
    got: list = []
    src.start(got.append)
    try:
        deadline = time.monotonic() + 5
        while manager.listener is None and time.monotonic() < deadline:
            time.sleep(0.01)
        k = 0
        for _ in range(20):  # 4.8 s, one batch a quarter second
            now["boot"] = BOOT0 + (k + 11) * PERIOD + 5_000_000  # the batch arrives just after its newest event
            for _ in range(12):
                stamp = BOOT0 + k * PERIOD
                manager.emit(TYPE_ACCELEROMETER, stamp)  # on the boot clock, as documented
                manager.emit(TYPE_GYROSCOPE, stamp + WALL_MINUS_BOOT)  # this phone's gyroscope: the wall clock
                k += 1
            while src._events and time.monotonic() < deadline:  # drained at that arrival time
                time.sleep(0.005)
            time.sleep(0.02)
    finally:
        src.stop()
    assert src.fault() == "" and src.time_bases["acc"].base.base == "boot" and src.time_bases["gyro"].base.base == "wall"
    acc = np.concatenate([t for name, t, _ in got if name == "acc"])
    gyro = np.concatenate([t for name, t, _ in got if name == "gyro"])
    assert len(acc) == len(gyro) == 240
    np.testing.assert_array_equal(gyro, acc)  # the same instants, on one clock
    assert acc[0] == BOOT0 and acc[-1] == BOOT0 + 239 * PERIOD


WINDOW_NS = 2_560_000_000


def _phone(drain_s: float, rate_hz: int, seconds: float, seed: int = 0):
    """Drains of a phone whose accelerometer stamps on the boot clock and gyroscope on the wall clock, both at ``rate_hz``.

    Yields (arrival on the boot clock, events drained then, true boot stamps of those events). Each event reaches the
    listener 2-15 ms after it was taken; the drain loop wakes 0-3 ms late.
    """
    rng = np.random.default_rng(seed)
    period = round(1e9 / rate_hz)
    n = int(seconds * rate_hz)
    true = BOOT0 + np.arange(1, n + 1, dtype=np.int64) * period
    delivered = true + rng.integers(2_000_000, 15_000_000, n)
    drains = BOOT0 + np.arange(1, int(seconds / drain_s) + 1, dtype=np.int64) * round(drain_s * 1e9)
    drains = drains + rng.integers(0, 3_000_000, len(drains))
    taken = 0
    for arrival in drains.tolist():
        upto = int(np.searchsorted(delivered[taken:], arrival, side="right")) + taken
        stamps = true[taken:upto]
        events = [e for s in stamps.tolist()
                  for e in ((TYPE_ACCELEROMETER, s, 0.0, 0.0, 9.8), (TYPE_GYROSCOPE, s + WALL_MINUS_BOOT, 0.0, 0.0, 0.1))]  # fmt: skip
        taken = upto
        yield arrival, events, stamps


@pytest.mark.parametrize("drain_s", [0.01, 0.02, 0.05, 0.07, 0.1, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("rate_hz", [50, 100, 200, 400])
def test_a_perfect_stream_is_established_whatever_the_drain_period_and_rate_and_held_back_less_than_a_window(drain_s, rate_hz):
    now = {"boot": BOOT0}
    src = AndroidSensorSource(drain_s=drain_s, boot_clock_ns=lambda: now["boot"], wall_clock_ns=lambda: now["boot"] + WALL_MINUS_BOOT)
    src.time_bases = src.new_time_bases()
    released: dict[str, list[np.ndarray]] = {"acc": [], "gyro": []}
    truth: list[np.ndarray] = []
    waiting: list[tuple[int, int]] = []  # (arrival, samples delivered up to it) of drains not released yet
    delivered = out = longest_hold = 0
    for arrival, events, stamps in _phone(drain_s, rate_hz, seconds=6.0):
        now["boot"] = arrival
        truth.append(stamps)
        if len(stamps):
            delivered += len(stamps)
            waiting.append((arrival, delivered))
        for name, t, _ in src.on_boot_clock(events):
            released[name].append(t)
            out += len(t) if name == "acc" else 0
        while waiting and waiting[0][1] <= out:  # this drain's samples are out: held from its arrival until now
            longest_hold = max(longest_hold, arrival - waiting.pop(0)[0])
    assert src.time_bases["acc"].base.base == "boot" and src.time_bases["gyro"].base.base == "wall"
    expected = np.concatenate(truth)
    for name in ("acc", "gyro"):
        np.testing.assert_array_equal(np.concatenate(released[name]), expected)  # every sample, exactly, on the boot clock
        assert src.time_bases[name].dropped == 0
    assert not waiting and longest_hold <= WINDOW_NS, longest_hold / 1e9


def test_a_stream_that_pauses_while_its_base_is_established_is_not_refused_for_the_pause():
    tb = StreamTimeBase("acc")
    before = _deliveries(0.5, "paused", sleep_s=30)  # two deliveries, then the phone sleeps a minute and its clock stands still
    minute = 60_000_000_000
    after = [(true + minute, given + minute, arrival + minute) for true, given, arrival in _deliveries(3, "paused", sleep_s=40)]
    t, truth = _map(tb, before + after)
    assert tb.base is not None and tb.base.base == "offset" and tb.dropped == 2 * len(before[0][0])
    err = t - truth[tb.dropped :]  # the deliveries after the pause, each on the boot clock within a delivery latency
    assert np.all(err == err[0]) and 0 <= err[0] <= 10_000_000


def test_with_batched_delivery_a_stream_whose_clock_stands_still_is_still_refused():
    tb = StreamTimeBase("gyro", batching_ns=1_000_000_000)  # Android may hold events up to 1 s (maxReportLatencyUs)
    with pytest.raises(TimeBaseRefused):
        for k in range(30):  # one batch a second, every stamp the same
            t, _ = tb.push(np.full(50, BOOT0, np.int64), np.zeros((50, 3)), BOOT0 + k * 1_000_000_000, WALL_MINUS_BOOT)
            assert len(t) == 0
    good = StreamTimeBase("acc", batching_ns=1_000_000_000)
    released = sum(len(good.push(BOOT0 + (k * 50 + np.arange(50)) * PERIOD, np.zeros((50, 3)), BOOT0 + (k + 1) * 1_000_000_000 +
                                 5_000_000, WALL_MINUS_BOOT)[0]) for k in range(6))  # fmt: skip
    assert good.base is not None and good.base.base == "boot" and released == 300
