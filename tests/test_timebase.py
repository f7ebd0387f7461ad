"""Each sensor stream's time base (boot clock, wall clock, a fixed offset) is established from when its samples arrive, and its
stamps are mapped to the boot clock before the accelerometer and gyroscope are paired; a stream without one is refused."""

from __future__ import annotations

import logging
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
