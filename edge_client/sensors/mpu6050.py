"""InvenSense MPU-6050 accelerometer + gyroscope over I2C (Raspberry Pi), read through its FIFO at 50 Hz.

Registers and conversions: :mod:`edge_client.sensors.mpu6050_registers` (re-exported here). The
chip's sample clock spaces the samples; the stamps are disciplined against the host clock
(:class:`~har_models.data.sample_clock.SampleClock`: within 100 ms of it, following the measured
rate once 30 s of reads span it). Data that cannot be read back in order (a failed transfer
mid-FIFO, an overflow, a partial frame that stays) is a *gap*: logged, counted, the FIFO reset and
the stamps restarted, so no window spans it; a failed read never produces a zero sample. Busy-bus
errors (errno 121) are retried; timeouts (errno 110) are counted apart, and after
:data:`TIMEOUTS_BEFORE_RECONFIGURE` in a row the chip is configured again. ``smbus2`` is imported
only by :func:`open_bus`, so the driver runs against any object with its methods.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_client.sensors.base import SensorSource, SensorUnavailable
from edge_client.sensors.mpu6050_registers import (
    ACCEL_CONFIG,
    ACCEL_LSB_PER_G,
    COMPATIBLE_WHO_AM_I,
    FIFO_COUNTH,
    FIFO_R_W,
    FIFO_SIZE,
    FRAME_BYTES,
    GYRO_CONFIG,
    GYRO_LSB_PER_DPS,
    INT_FIFO_OFLOW,
    INT_STATUS,
    MAX_BLOCK,
    PWR_MGMT_1,
    PWR_MGMT_1_RESET,
    USER_CTRL,
    USER_CTRL_FIFO_EN,
    USER_CTRL_FIFO_RESET,
    WHO_AM_I,
    WHO_AM_I_VALUE,
    Mpu6050Config,
    SMBusLike,
    counts_to_si,
)
from edge_client.sensors.replay import SensorChunk
from har_io.install_hints import install_hint
from har_models.data.sample_clock import SampleClock

log = logging.getLogger("fedhar.client.sensors.mpu6050")

PLAUSIBLE_G = (9.81 - 1.5, 9.81 + 1.5)
"""Median |a| (m/s^2) over the first seconds outside this range raises a health warning (wrong scale, bad chip, moving)."""
PLAUSIBILITY_WINDOW_S = 2.0
"""Seconds of samples after the start that the plausibility check looks at."""
TIMEOUTS_BEFORE_RECONFIGURE = 3
"""Timeouts (errno 110) in a row after which the chip is configured again (one that browned out answers as after power-on)."""


@dataclass
class Mpu6050Stats:
    """What the driver has read and lost: samples delivered, gaps (each restarts the stamps), retried I/O errors,
    FIFO overflows (over 1024 bytes, about 1.7 s, behind), timeouts (errno 110), partial frames, the chip's
    rate measured by the host clock (None before 30 s), the latest error, and health warnings in words."""

    samples: int = 0
    gaps: int = 0
    io_errors: int = 0
    overflows: int = 0
    timeouts: int = 0
    partial_frames: int = 0
    measured_rate_hz: float | None = None
    last_error: str = ""
    health: list[str] = field(default_factory=list)


@dataclass
class Mpu6050:
    """Driver of one MPU-6050 on an SMBus; ``clock_ns`` anchors the stamps, ``sleep`` waits after the reset."""

    bus: SMBusLike
    config: Mpu6050Config = field(default_factory=Mpu6050Config)
    clock_ns: Callable[[], int] = time.monotonic_ns
    sleep: Callable[[float], None] = time.sleep
    stats: Mpu6050Stats = field(default_factory=Mpu6050Stats)

    def __post_init__(self) -> None:
        self._clock = SampleClock(self.config.period_ns)
        self._needs_reset = False  # a FIFO reset failed: try it again before reading
        self.needs_configure = False  # the chip stopped answering (timeouts in a row): configure it again
        self._timeouts_in_row = 0
        self._remainder = 0  # bytes of a partial frame left in the FIFO at the last read
        self._rate_logged = False
        # The ranges the chip reports after configure(): what its counts are decoded with.
        self.accel_range_g = self.config.accel_range_g
        self.gyro_range_dps = self.config.gyro_range_dps
        self._at_rest: list[np.ndarray] = []  # |a| of the first seconds, for the plausibility check
        self._at_rest_n = 0

    def _warn(self, text: str) -> None:
        self.stats.health.append(text)
        log.warning("MPU-6050 at 0x%02x: %s", self.config.address, text)

    def configure(self) -> None:
        """Reset the chip, start 50 Hz sampling into the FIFO, and read the ranges back.

        ``WHO_AM_I`` 0x68 is an MPU-6050; :data:`COMPATIBLE_WHO_AM_I` and ``config.extra_who_am_i``
        are accepted with a health warning. Counts are decoded with the ranges the chip reports
        (register map 4.4-4.5), so one that ignores a range write still gives right units
        (ElectronicCats/mpu6050 #87, #93; jrowberg/i2cdevlib #151).

        Raises
        ------
        RuntimeError
            If ``WHO_AM_I`` is not a known-compatible value (another chip or a wrong address).
        OSError
            If the bus fails (the caller retries).
        """
        addr = self.config.address
        who = self.bus.read_byte_data(addr, WHO_AM_I)
        if who != WHO_AM_I_VALUE:
            known = COMPATIBLE_WHO_AM_I.get(who) or ("a chip you listed as compatible" if who in self.config.extra_who_am_i else None)
            if known is None:
                raise RuntimeError(
                    f"MPU-6050 at 0x{addr:02x}: WHO_AM_I reads 0x{who:02x}, expected 0x{WHO_AM_I_VALUE:02x} "
                    f"(or a compatible {', '.join(f'0x{k:02x}' for k in sorted(COMPATIBLE_WHO_AM_I))}); check the wiring "
                    "and the address (0x68 with AD0 low, 0x69 high). For a register-compatible chip that is not "
                    "known here, list its id in Mpu6050Config(extra_who_am_i=(...))"
                )
            self._warn(f"WHO_AM_I reads 0x{who:02x}, not an MPU-6050's 0x{WHO_AM_I_VALUE:02x}: {known}; read as an MPU-6050")
        self.bus.write_byte_data(addr, PWR_MGMT_1, PWR_MGMT_1_RESET)
        self.sleep(0.1)
        for reg, value in self.config.register_writes():
            self.bus.write_byte_data(addr, reg, value)
        self._read_back_ranges()
        self._restart_clock()
        log.info(
            "MPU-6050 at 0x%02x: %d Hz (SMPLRT_DIV %d, DLPF %d), ±%d g, ±%d °/s through the FIFO",
            addr,
            self.config.sample_rate_hz,
            self.config.smplrt_div,
            self.config.dlpf_cfg,
            self.accel_range_g,
            self.gyro_range_dps,
        )

    def _read_back_ranges(self) -> None:
        """Decode with the ranges the chip reports, warning where they differ from what was written."""
        addr = self.config.address
        accel = sorted(ACCEL_LSB_PER_G)[(self.bus.read_byte_data(addr, ACCEL_CONFIG) >> 3) & 0x03]
        gyro = sorted(GYRO_LSB_PER_DPS)[(self.bus.read_byte_data(addr, GYRO_CONFIG) >> 3) & 0x03]
        if accel != self.config.accel_range_g:
            self._warn(f"ACCEL_CONFIG reads back ±{accel} g after ±{self.config.accel_range_g} g was written; decoding with ±{accel} g")
        if gyro != self.config.gyro_range_dps:
            self._warn(f"GYRO_CONFIG reads back ±{gyro} °/s after ±{self.config.gyro_range_dps} °/s was written; decoding with ±{gyro} °/s")
        self.accel_range_g, self.gyro_range_dps = accel, gyro
        self._at_rest, self._at_rest_n = [], 0

    def _check_plausible(self, acc: np.ndarray) -> None:
        """Median |a| over the first :data:`PLAUSIBILITY_WINDOW_S` seconds against 9.81 ± 1.5 m/s^2 (once)."""
        need = int(PLAUSIBILITY_WINDOW_S * self.config.sample_rate_hz)
        if self._at_rest_n >= need:
            return
        mag = np.sqrt((acc * acc).sum(axis=1))[: need - self._at_rest_n]
        self._at_rest.append(mag)
        self._at_rest_n += mag.size
        if self._at_rest_n < need:
            return
        median = float(np.median(np.concatenate(self._at_rest)))
        self._at_rest = []
        lo, hi = PLAUSIBLE_G
        if not lo <= median <= hi:
            self._warn(
                f"median |a| over the first {PLAUSIBILITY_WINDOW_S:g} s is {median:.2f} m/s^2, outside {lo:.2f}..{hi:.2f}: "
                "a wrong range or scale, a faulty chip, or a device that was moving from the start"
            )

    def _restart_clock(self) -> None:
        # Never before the last stamp given out (SampleClock.restart): the chip's clock may have run ahead of the host's.
        self._clock.restart(self.clock_ns())
        self._remainder = 0

    def _reset_fifo(self) -> None:
        """Empty the FIFO and restart the timestamps (after lost data). A failure here is retried on the next read."""
        addr = self.config.address
        try:
            self.bus.write_byte_data(addr, USER_CTRL, USER_CTRL_FIFO_RESET)
            self.bus.write_byte_data(addr, USER_CTRL, USER_CTRL_FIFO_EN)
        except OSError as exc:
            self._io_error("FIFO reset", exc)
            self._needs_reset = True
            return
        self._needs_reset = False
        self._restart_clock()

    def _io_error(self, what: str, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.stats.last_error = f"{what}: {name} {exc}"
        if exc.errno == errno.ETIMEDOUT:
            self.stats.timeouts += 1
            self._timeouts_in_row += 1
            log.warning("MPU-6050: %s timed out (ETIMEDOUT: the chip did not answer in time; a stretched clock or a loose wire), "
                        "%d in a row", what, self._timeouts_in_row)  # fmt: skip
            if self._timeouts_in_row >= TIMEOUTS_BEFORE_RECONFIGURE:
                log.warning("MPU-6050: %d timeouts in a row; configuring the chip again", self._timeouts_in_row)
                self.needs_configure = True
            return
        self.stats.io_errors += 1
        log.warning("MPU-6050: %s failed (%s: %s); retrying", what, name, exc)

    def _gap(self, why: str) -> None:
        self.stats.gaps += 1
        log.warning("MPU-6050: gap in the data (%s) after %d samples; FIFO reset", why, self.stats.samples)
        self._reset_fifo()

    def read(self) -> list[SensorChunk]:
        """Read every complete sample waiting in the FIFO: ``[("acc", t_ns, m/s^2), ("gyro", t_ns, rad/s)]``, or ``[]``
        when nothing is waiting or the bus failed (logged, counted, retried on the next call)."""
        addr = self.config.address
        if self._needs_reset:
            self._reset_fifo()
            return []
        try:
            status = self.bus.read_byte_data(addr, INT_STATUS)
            hi, lo = self.bus.read_i2c_block_data(addr, FIFO_COUNTH, 2)
        except OSError as exc:  # nothing was taken out of the FIFO: no data lost
            self._io_error("status read", exc)
            return []
        self._timeouts_in_row = 0
        count = (hi << 8) | lo
        if status & INT_FIFO_OFLOW or count >= FIFO_SIZE:
            self.stats.overflows += 1
            self._gap(f"FIFO overflow, {count} bytes waiting")
            return []
        remainder = count % FRAME_BYTES
        if remainder and remainder == self._remainder:
            # A frame being written when the count is read completes by the next read; one that stays partial lost
            # bytes, and every frame after it would be read shifted: drop them all.
            self.stats.partial_frames += 1
            self._gap(f"a partial frame of {remainder} bytes stayed in the FIFO (bytes were lost)")
            return []
        self._remainder = remainder
        n_bytes = (count // FRAME_BYTES) * FRAME_BYTES
        if n_bytes == 0:
            return []
        data = bytearray()
        while len(data) < n_bytes:
            try:
                data += bytes(self.bus.read_i2c_block_data(addr, FIFO_R_W, min(MAX_BLOCK, n_bytes - len(data))))
            except OSError as exc:
                # The chip may or may not have popped the bytes of the failed transfer: the frame
                # boundaries are lost. Keep the complete frames read so far, then start again.
                self._io_error("FIFO read", exc)
                data = data[: (len(data) // FRAME_BYTES) * FRAME_BYTES]
                chunks = self._convert(bytes(data), whole=False)
                self._gap("FIFO read failed mid-stream")
                return chunks
        return self._convert(bytes(data))

    def _convert(self, data: bytes, whole: bool = True) -> list[SensorChunk]:
        """Frames to chunks; ``whole`` False for part of what the FIFO held (the read's time then says nothing of them)."""
        if not data:
            return []
        raw = np.frombuffer(data, dtype=">i2").reshape(-1, 6)
        n = raw.shape[0]
        t = self._clock.stamps(n, self.clock_ns(), whole=whole)
        self.stats.samples += n
        rate = self._clock.measured_rate_hz
        if rate is not None:
            self.stats.measured_rate_hz = rate
            if not self._rate_logged and abs(rate / self.config.sample_rate_hz - 1) > 0.005:
                self._rate_logged = True
                log.info("MPU-6050 at 0x%02x samples at %.2f Hz by the host clock (%d Hz asked): the stamps follow the measured rate",
                         self.config.address, rate, self.config.sample_rate_hz)  # fmt: skip
        acc, gyro = counts_to_si(raw, self.accel_range_g, self.gyro_range_dps)
        self._check_plausible(acc)
        return [("acc", t, acc), ("gyro", t.copy(), gyro)]


def open_bus(bus_number: int = 1) -> Any:
    """Open ``/dev/i2c-<bus_number>`` with smbus2 (bus 1 on a Raspberry Pi's header pins 3 and 5).

    Raises SensorUnavailable, with the fix, without smbus2 (the ``[pi]`` extra), without the bus
    device (enable I2C) or without read access (group ``i2c``).
    """
    try:
        from smbus2 import SMBus
    except ImportError as exc:
        raise SensorUnavailable(f"the MPU-6050 source needs smbus2, which is not installed: {install_hint('pi')}") from exc
    path = f"/dev/i2c-{bus_number}"
    try:
        return SMBus(bus_number)
    except FileNotFoundError as exc:
        raise SensorUnavailable(f"{path} does not exist: enable I2C (sudo raspi-config nonint do_i2c 0) and reboot, "
                                f"or choose another bus with --sensor mpu6050:BUS") from exc  # fmt: skip
    except PermissionError as exc:
        raise SensorUnavailable(f"{path} is not readable by this user: add it to group i2c (sudo usermod -aG i2c $USER), "
                                f"then log in again") from exc  # fmt: skip
    except OSError as exc:
        raise SensorUnavailable(f"{path} cannot be opened: {exc.strerror or exc}") from exc


class Mpu6050Source(SensorSource):
    """An MPU-6050 as a :class:`~edge_client.sensors.base.SensorSource`, polled every ``poll_s``.

    ``bus`` defaults to :func:`open_bus` of ``bus_number`` at start; ``poll_s`` 0.2 s is 10 samples
    (the FIFO holds about 1.7 s); ``retry_s`` is the wait before configuring again after a failure.
    """

    def __init__(
        self,
        bus: SMBusLike | None = None,
        config: Mpu6050Config | None = None,
        bus_number: int = 1,
        poll_s: float = 0.2,
        retry_s: float = 1.0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ):
        super().__init__()
        self.config = config or Mpu6050Config()
        self.name = f"mpu6050@{bus_number}:0x{self.config.address:02x}"
        self._bus = bus
        self.bus_number = bus_number
        self.poll_s = float(poll_s)
        self.retry_s = float(retry_s)
        self.clock_ns = clock_ns
        self.driver: Mpu6050 | None = None

    def open(self) -> None:
        """Open the I2C bus now (:func:`open_bus`, SensorUnavailable); :meth:`chunks` opens it itself otherwise."""
        if self._bus is None:
            self._bus = open_bus(self.bus_number)

    def chunks(self, stop_event: threading.Event) -> Iterator[SensorChunk]:
        """Configure the chip (retrying on I/O errors), then yield its samples every ``poll_s``."""
        self.open()
        bus = self._bus
        assert bus is not None  # open() set it or raised

        def wait(seconds: float) -> None:
            stop_event.wait(seconds)

        self.driver = drv = Mpu6050(bus, self.config, clock_ns=self.clock_ns, sleep=wait)
        while not stop_event.is_set():
            try:
                drv.configure()
                break
            except OSError as exc:
                drv._io_error("configuration", exc)
                stop_event.wait(self.retry_s)
        while not stop_event.wait(self.poll_s):
            if drv.needs_configure:
                try:
                    drv.configure()
                    drv.needs_configure = False
                except OSError as exc:
                    drv._io_error("configuration", exc)
                    continue
            yield from drv.read()
