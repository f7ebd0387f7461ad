"""MPU-6050 driver against an emulated bus with the chip's register map."""

from __future__ import annotations

import logging
import math
import threading

import numpy as np
import pytest
from support.mpu6050_emulator import EmulatedMpu6050Bus

from edge_client.sensors.mpu6050 import Mpu6050, Mpu6050Config, Mpu6050Source, counts_to_si
from har_models.data.labels import HAPT_LABELS
from har_models.data.pipeline import SensorPipeline

G = 9.80665


class FakeClock:
    def __init__(self, t: int = 5_000_000_000):
        self.t = t

    def __call__(self) -> int:
        return self.t


def _driver(bus: EmulatedMpu6050Bus, **cfg) -> tuple[Mpu6050, FakeClock]:
    clock = FakeClock()
    drv = Mpu6050(bus, Mpu6050Config(**cfg), clock_ns=clock, sleep=lambda s: None)
    drv.configure()
    return drv, clock


def test_configuration_writes_are_the_datasheet_values_for_50hz():
    bus = EmulatedMpu6050Bus()
    _driver(bus, accel_range_g=8, gyro_range_dps=1000)
    assert bus.writes == [
        (0x6B, 0x80),  # PWR_MGMT_1: DEVICE_RESET
        (0x6B, 0x01),  # wake, CLKSEL = PLL with X gyro
        (0x19, 19),  # SMPLRT_DIV: 1 kHz / (1 + 19) = 50 Hz
        (0x1A, 0x04),  # CONFIG: DLPF_CFG 4 (21/20 Hz)
        (0x1B, 0x10),  # GYRO_CONFIG: FS_SEL 2 = ±1000 °/s
        (0x1C, 0x10),  # ACCEL_CONFIG: AFS_SEL 2 = ±8 g
        (0x38, 0x10),  # INT_ENABLE: FIFO_OFLOW_EN
        (0x23, 0x00),
        (0x6A, 0x04),  # USER_CTRL: FIFO_RESET
        (0x6A, 0x40),  # USER_CTRL: FIFO_EN
        (0x23, 0x78),  # FIFO_EN: XG, YG, ZG, ACCEL
    ]
    assert bus.sample_rate_hz() == 50.0
    assert not bus.regs[0x6B] & 0x40  # awake


@pytest.mark.parametrize(("rng", "lsb"), [(2, 16384), (4, 8192), (8, 4096), (16, 2048)])
def test_accel_counts_convert_exactly(rng, lsb):
    raw = np.array([[lsb, -lsb, lsb // 2, 0, 0, 0], [-32768, 32767, 1, 0, 0, 0]], np.int16)
    acc, _ = counts_to_si(raw, rng, 250)
    assert acc[0].tolist() == [G, -G, G / 2]
    assert acc[1, 0] == pytest.approx(-32768 / lsb * G, rel=1e-15)
    assert acc[1, 0] == pytest.approx(-rng * G, rel=1e-15)  # full scale is ±rng g
    assert acc[1, 2] == pytest.approx(G / lsb, rel=1e-15)


@pytest.mark.parametrize(("rng", "lsb"), [(250, 131.0), (500, 65.5), (1000, 32.8), (2000, 16.4)])
def test_gyro_counts_convert_exactly(rng, lsb):
    raw = np.zeros((1, 6), np.int16)
    raw[0, 3:] = [round(lsb * 10), -round(lsb * 10), 0]  # ±10 °/s where the count is whole
    _, gyro = counts_to_si(raw, 2, rng)
    want = round(lsb * 10) / lsb * math.pi / 180
    assert gyro[0, 0] == pytest.approx(want, rel=1e-15)
    assert gyro[0, 1] == pytest.approx(-want, rel=1e-15)
    assert gyro[0, 2] == 0.0
    if lsb * 10 == round(lsb * 10):
        assert gyro[0, 0] == pytest.approx(10 * math.pi / 180, rel=1e-15)


def test_fifo_frames_are_read_in_order_with_chip_clock_timestamps():
    bus = EmulatedMpu6050Bus()
    drv, clock = _driver(bus, accel_range_g=4, gyro_range_dps=500)
    t0 = clock.t
    bus.tick(30)  # 360 bytes: more than one 32-byte block, not a multiple of it
    clock.t += 30 * 20_000_000 + 7_000_000  # read 7 ms after the 30th sample: the stamps come from the sample count
    acc, gyr = drv.read()
    assert acc[0] == "acc" and gyr[0] == "gyro"
    assert acc[1].tolist() == [t0 + (k + 1) * 20_000_000 for k in range(30)]
    raw_a, raw_g = bus.signal(np.arange(30))
    np.testing.assert_array_equal(acc[2], raw_a.astype(np.float64) * G / 8192)
    np.testing.assert_allclose(gyr[2], raw_g.astype(np.float64) / 65.5 * math.pi / 180, rtol=1e-14, atol=0)
    bus.tick(5)
    clock.t += 5 * 20_000_000
    acc2, _ = drv.read()
    assert acc2[1][0] == t0 + 31 * 20_000_000  # continuous across reads
    assert drv.read() == []


def test_status_read_error_is_retried_without_losing_or_inventing_data(caplog):
    bus = EmulatedMpu6050Bus()
    drv, clock = _driver(bus)
    t0 = clock.t
    bus.tick(10)
    bus.fail_reads.append(0x72)  # FIFO_COUNT fails once with errno 121
    with caplog.at_level(logging.WARNING):
        assert drv.read() == []
    assert "EREMOTEIO" in caplog.text and drv.stats.io_errors == 1 and drv.stats.gaps == 0
    bus.tick(10)
    clock.t += 20 * 20_000_000 + 5_000_000
    acc, _ = drv.read()
    assert acc[1].tolist() == [t0 + (k + 1) * 20_000_000 for k in range(20)]  # nothing lost, nothing added


def test_fifo_read_error_mid_stream_is_a_gap_never_zeros(caplog):
    bus = EmulatedMpu6050Bus()
    drv, clock = _driver(bus)
    t0 = clock.t
    bus.tick(20)  # 240 bytes: blocks of 32; the third block read fails
    calls = {"n": 0}
    orig = bus.read_i2c_block_data

    def flaky(addr, reg, length):
        if reg == 0x74:
            calls["n"] += 1
            if calls["n"] == 3:
                bus.fail_reads.append(0x74)
        return orig(addr, reg, length)

    bus.read_i2c_block_data = flaky
    clock.t = t0 + 7 * 10**9
    with caplog.at_level(logging.WARNING):
        chunks = drv.read()
    acc = chunks[0]
    assert len(acc[1]) == 5  # 64 bytes read before the failure = 5 whole frames
    assert acc[1].tolist() == [t0 + (k + 1) * 20_000_000 for k in range(5)]
    assert drv.stats.gaps == 1 and drv.stats.io_errors == 1 and "gap" in caplog.text
    assert bus.fifo == bytearray()  # FIFO reset
    restart = clock.t
    bus.tick(3)
    clock.t += 3 * 20_000_000 + 5_000_000
    acc2, _ = drv.read()
    assert acc2[1].tolist() == [restart + (k + 1) * 20_000_000 for k in range(3)]  # restarted from the host clock
    for c in (acc, acc2):
        assert np.all(np.abs(c[2]).sum(axis=1) > 0)  # no zero sample anywhere


def test_overflow_is_a_gap_and_resets_the_fifo():
    bus = EmulatedMpu6050Bus()
    drv, _ = _driver(bus)
    bus.tick(100)  # 1200 bytes > 1024
    assert drv.read() == []
    assert drv.stats.overflows == 1 and drv.stats.gaps == 1 and bus.fifo == bytearray()
    bus.tick(4)
    assert len(drv.read()[0][1]) == 4


def test_an_unknown_chip_is_refused_naming_its_id_and_the_override():
    bus = EmulatedMpu6050Bus()
    bus.who_am_i = bus.regs[0x75] = 0x12
    with pytest.raises(RuntimeError, match=r"WHO_AM_I reads 0x12.*extra_who_am_i"):
        Mpu6050(bus, sleep=lambda s: None).configure()
    driver = Mpu6050(bus, config=Mpu6050Config(extra_who_am_i=(0x12,)), sleep=lambda s: None)
    driver.configure()
    assert any("0x12" in h for h in driver.stats.health)


@pytest.mark.parametrize("who", [0x70, 0x98])
def test_known_compatible_clones_are_accepted_with_a_warning(who, caplog):
    # ElectronicCats/mpu6050 #21 (0x98), adafruit/Adafruit_MPU6050 #47 (0x70): never silently.
    bus = EmulatedMpu6050Bus()
    bus.who_am_i = who
    bus._power_on()
    driver = Mpu6050(bus, sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger="fedhar.client.sensors.mpu6050"):
        driver.configure()
    assert len(driver.stats.health) == 1 and f"0x{who:02x}" in driver.stats.health[0]
    assert f"0x{who:02x}" in caplog.text
    bus.tick(10)
    assert sum(c[2].shape[0] for c in driver.read() if c[0] == "acc") == 10


def _stationary(config: Mpu6050Config, accel_raw=(0, 0, 16384), gyro_raw=(0, 0, 0), ignore=()) -> tuple[Mpu6050, EmulatedMpu6050Bus]:
    bus = EmulatedMpu6050Bus()
    bus.constant = (accel_raw, gyro_raw)
    bus.ignore_writes = set(ignore)
    driver = Mpu6050(bus, config=config, sleep=lambda s: None)
    driver.configure()
    return driver, bus


def _read_n(driver: Mpu6050, bus: EmulatedMpu6050Bus, n: int) -> tuple[np.ndarray, np.ndarray]:
    acc: list[np.ndarray] = []
    gyro: list[np.ndarray] = []
    for _ in range(n // 20):
        bus.tick(20)
        for kind, _, xyz in driver.read():
            (acc if kind == "acc" else gyro).append(xyz)
    return np.concatenate(acc), np.concatenate(gyro)


def test_a_chip_that_ignores_its_range_write_is_decoded_with_the_range_it_reports():
    # ACCEL_CONFIG keeps 0x00 (±2 g) although ±8 g was written; at rest raw z = +16384 is 1 g.
    driver, bus = _stationary(Mpu6050Config(accel_range_g=8), ignore=(0x1C,))
    assert driver.accel_range_g == 2 and driver.gyro_range_dps == 500
    assert any("ACCEL_CONFIG reads back ±2 g" in h for h in driver.stats.health)
    acc, _ = _read_n(driver, bus, 200)
    assert abs(float(acc[:, 2].mean()) - 9.807) < 0.01  # not 39.23 (4 g)
    assert len(driver.stats.health) == 1  # gravity is plausible, so no second warning


def test_gyro_at_250_dps_decodes_131_counts_as_one_degree_per_second():
    driver, bus = _stationary(Mpu6050Config(gyro_range_dps=250), gyro_raw=(131, 0, 0))
    _, gyro = _read_n(driver, bus, 40)
    np.testing.assert_allclose(gyro[:, 0], 0.017453, atol=1e-6)


def test_implausible_gravity_at_rest_raises_a_health_warning():
    # The chip reports ±2 g but its counts say 0.25 g: a faulty chip or a scale no read-back can see.
    driver, bus = _stationary(Mpu6050Config(accel_range_g=2), accel_raw=(0, 0, 4096))
    _read_n(driver, bus, 60)
    assert driver.stats.health == []  # 1.2 s: not yet 2 s of samples
    _read_n(driver, bus, 60)
    assert len(driver.stats.health) == 1 and "2.45 m/s^2" in driver.stats.health[0]
    _read_n(driver, bus, 200)
    assert len(driver.stats.health) == 1  # checked once


def test_source_feeds_the_pipeline_with_50hz_windows():
    """The source thread into the same pipeline as replay: 10 frames per poll, one failed transfer = one gap."""
    bus = EmulatedMpu6050Bus()
    bus.frames_per_count_read = 10
    clock = FakeClock(10**9)
    src = Mpu6050Source(bus, poll_s=0.001, clock_ns=clock)
    pipe = SensorPipeline(HAPT_LABELS)
    pipe.set_label(0, 3)
    parts = []
    done = threading.Event()
    reads = {"n": 0}
    orig = bus.read_i2c_block_data

    def counted(addr, reg, length):
        if reg == 0x72:
            reads["n"] += 1
            clock.t += 200_000_000  # the host's clock moves on by the 10 frames' worth
            if reads["n"] == 40:
                bus.fail_reads.append(0x74)  # the first FIFO transfer of poll 40 fails: its 10 frames are lost
            if reads["n"] == 81:
                bus.frames_per_count_read = 0
            if reads["n"] >= 85:
                done.set()
        return orig(addr, reg, length)

    bus.read_i2c_block_data = counted
    src.start(lambda ch: parts.append(pipe.push(*ch)))
    assert done.wait(60)
    src.stop()
    parts.append(pipe.close())
    drv = src.driver
    assert drv is not None and drv.stats.gaps == 1 and drv.stats.samples == 390 + 400
    x = np.concatenate([p.x for p in parts])
    t = np.concatenate([p.t_start_ns for p in parts])
    y = np.concatenate([p.y for p in parts])
    # 390 contiguous samples, then 400: (390 - 128) // 64 + 1 = 5 and (400 - 128) // 64 + 1 = 5 windows.
    assert len(t) == 10 and set(y.tolist()) == {3}
    first_run_end = 10**9 + 390 * 20_000_000  # the stamp of the last sample of the first run
    assert all(s + 127 * 20_000_000 <= first_run_end or s > first_run_end for s in t.tolist())
    assert np.all(np.abs(x).sum(axis=(1, 2)) > 0)


# ------------------------------------------------------------------ the chip's own clock, timeouts, partial frames
@pytest.mark.slow
@pytest.mark.parametrize("real_hz", [51.5, 48.7])  # 3 % fast, 2.6 % slow
def test_stamps_follow_the_chips_real_rate_and_do_not_drift_from_the_host_clock(real_hz, caplog):
    bus = EmulatedMpu6050Bus()
    drv, clock = _driver(bus)
    start = clock.t
    poll = 200_000_000
    newest_lag, stamps = [], []
    with caplog.at_level(logging.INFO):
        for _ in range(3000):  # ten minutes of reads every 0.2 s
            clock.t += poll
            bus.run_for(poll / 1e9, real_hz)
            chunks = drv.read()
            if chunks:
                t = chunks[0][1]
                stamps.append(t)
                newest_lag.append((clock.t - int(t[-1])) / 1e9)
    t_all = np.concatenate(stamps)
    assert np.all(np.diff(t_all) > 0)  # increasing, never twice
    assert drv.stats.measured_rate_hz == pytest.approx(real_hz, rel=5e-4)
    assert f"samples at {real_hz:.2f} Hz by the host clock (50 Hz asked)" in caplog.text
    # After the first 30 s (the fit's span) the newest stamp stays within a poll period of the read, to the end.
    late = np.array(newest_lag[len(newest_lag) // 10 :])
    assert late.min() >= -0.05 and late.max() <= 0.25, (late.min(), late.max())
    # The nominal 20 ms stamps would be 10 minutes * |rate error| off by now.
    nominal_last = start + len(t_all) * 20_000_000
    assert abs(nominal_last - clock.t) / 1e9 > 10 and abs(int(t_all[-1]) - clock.t) / 1e9 < 0.25


class LateClock:
    """The host clock as the driver reads it: ``t`` plus how late (ns) the read takes it after the chip's count."""

    def __init__(self, t: int = 5_000_000_000):
        self.t, self.late = t, 0

    def __call__(self) -> int:
        return self.t + self.late


@pytest.mark.parametrize("real_hz", [45.5, 48.7, 50.0, 51.5, 54.5])  # 9 % slow .. 9 % fast
def test_stamps_stay_within_100_ms_of_the_host_clock_from_the_first_second(real_hz):
    bus = EmulatedMpu6050Bus()  # a chip whose oscillator is off its 50 Hz, behind the I2C interface the real driver uses
    clock = LateClock()
    drv = Mpu6050(bus, Mpu6050Config(), clock_ns=clock, sleep=lambda s: None)
    drv.configure()
    start, rng = clock.t, np.random.default_rng(7)
    errors, taken = [], 0
    for _ in range(250):  # 50 s of reads every 0.15-0.25 s, each taking the clock 0-8 ms after the chip's count
        dt = int(rng.integers(150_000_000, 250_000_000))
        clock.t += dt
        bus.run_for(dt / 1e9, real_hz)
        clock.late = int(rng.integers(0, 8_000_000))
        chunks = drv.read()
        if chunks:
            t = chunks[0][1]
            true = start + (taken + 1 + np.arange(len(t))) * (1e9 / real_hz)  # sample j after the start is taken at j / rate
            taken += len(t)
            errors.append(np.abs(t - true).max())
    assert taken > 0.95 * 50 * real_hz
    assert max(errors) <= 100_000_000, max(errors) / 1e6  # ms: from the first read on
    assert max(errors[len(errors) // 5 :]) <= 20_000_000, max(errors[len(errors) // 5 :]) / 1e6  # refined later
    assert drv.stats.measured_rate_hz == pytest.approx(real_hz, rel=2e-3)


def test_the_sample_clock_reports_its_rate_once_the_reads_span_its_fit_disciplines_before_and_keeps_its_period_across_a_restart():
    from har_models.data.sample_clock import SampleClock

    sc = SampleClock(20_000_000, fit_span_ns=10_000_000_000)
    h = 1_000_000_000
    sc.restart(h)
    taken = 0
    for i in range(40):  # 8 s at a real 52 Hz (10.4 samples a read): not enough span to report a rate
        h += 200_000_000
        n = 10 + (i % 5 == 0) * 2
        t = sc.stamps(n, h)
        taken += n
    assert sc.measured_rate_hz is None
    assert abs(int(t[-1]) - (h - 10_000_000)) <= 25_000_000  # yet the stamps keep to the reads, not 20 ms apart (8 s * 4 % = 320 ms)
    for i in range(60):
        h += 200_000_000
        sc.stamps(10 + (i % 5 == 0) * 2, h)
    assert sc.measured_rate_hz == pytest.approx(52.0, rel=0.01)
    sc.restart(h + 5_000_000_000)  # after a gap: the count restarts, the oscillator is the same
    t = sc.stamps(3, h + 5_060_000_000)
    assert t[0] == h + 5_000_000_000 + round(1e9 / sc.measured_rate_hz) and sc.measured_rate_hz == pytest.approx(52.0, rel=0.01)


def test_a_timeout_is_its_own_fault_kind_and_repeated_ones_reconfigure_the_chip(caplog):
    import errno

    bus = EmulatedMpu6050Bus()
    drv, _ = _driver(bus)
    bus.fail_errno = errno.ETIMEDOUT
    bus.tick(10)
    bus.fail_reads.append(0x3A)
    with caplog.at_level(logging.WARNING):
        assert drv.read() == []
    assert (drv.stats.timeouts, drv.stats.io_errors, drv.stats.gaps) == (1, 0, 0)
    assert "timed out (ETIMEDOUT: the chip did not answer in time" in caplog.text and "ETIMEDOUT" in drv.stats.last_error
    assert len(drv.read()[0][1]) == 10 and not drv.needs_configure  # nothing lost; a good read ends the run of timeouts
    for _ in range(3):
        bus.fail_reads.append(0x3A)
        drv.read()
    assert drv.stats.timeouts == 4 and drv.needs_configure
    # the source configures it again before its next read
    src = Mpu6050Source(bus=bus, poll_s=0.01, clock_ns=lambda: 10**12)
    stop = threading.Event()
    gen = src.chunks(stop)
    bus.frames_per_count_read = 2  # the chip samples on while the source waits (a configuration empties the FIFO)
    assert next(gen)[0] == "acc"  # configured and read
    next(gen)
    assert src.driver is not None
    src.driver.needs_configure = True  # as after three timeouts
    writes = len(bus.writes)
    assert next(gen)[0] == "acc"
    stop.set()
    assert not src.driver.needs_configure and (0x6B, 0x80) in bus.writes[writes:]  # reset and configured again


def test_a_partial_frame_that_stays_is_a_gap_and_one_being_written_is_not():
    bus = EmulatedMpu6050Bus()
    drv, _ = _driver(bus)
    bus.tick(3)
    bus.fifo += b"\x01\x02\x03\x04\x05"  # a frame being written when the count is read
    assert len(drv.read()[0][1]) == 3
    bus.fifo += b"\x06\x07\x08\x09\x0a\x0b\x0c"  # ... completes
    bus.tick(1)
    assert len(drv.read()[0][1]) == 2 and drv.stats.partial_frames == 0
    bus.tick(2)
    bus.fifo += b"\x01\x02\x03\x04\x05"  # five bytes that never complete: bytes were lost
    assert len(drv.read()[0][1]) == 2
    bus.tick(2)
    assert drv.read() == []
    assert drv.stats.partial_frames == 1 and drv.stats.gaps == 1 and bus.fifo == bytearray()
    bus.tick(2)
    acc = drv.read()[0]
    raw_a, raw_g = bus.signal(np.arange(8, 10))  # samples 6 and 7 went with the gap
    expected, _ = counts_to_si(np.hstack([raw_a, raw_g]), drv.accel_range_g, drv.gyro_range_dps)
    np.testing.assert_array_equal(acc[2], expected)  # frames read whole again
