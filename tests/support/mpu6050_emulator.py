"""An MPU-6050 on an emulated I2C bus, with the chip's register map, for driver tests.

Same method names as ``smbus2.SMBus``. Behaviour taken from the register map (rev 4.2):
power-on values (PWR_MGMT_1 = 0x40 asleep, WHO_AM_I = 0x68), DEVICE_RESET and FIFO_RESET
bits that clear themselves, INT_STATUS cleared by reading, FIFO_COUNT, FIFO_R_W popping
bytes, 1024-byte FIFO that drops its oldest bytes on overflow and flags it, frames in
register order (accel X, Y, Z, then temperature if enabled, then gyro X, Y, Z).
"""

from __future__ import annotations

import errno
import os

import numpy as np

FIFO_SIZE = 1024


class EmulatedMpu6050Bus:
    """One MPU-6050 at ``address`` on a bus; writes are logged in :attr:`writes`."""

    def __init__(self, address: int = 0x68):
        self.address = address
        self.regs = bytearray(128)
        self.fifo = bytearray()
        self.writes: list[tuple[int, int]] = []
        self.fail_reads: list[int] = []  # register numbers whose next read fails (with fail_errno)
        self.fail_errno = errno.EREMOTEIO  # 121 on a busy bus; errno.ETIMEDOUT (110) for a chip that does not answer in time
        self.fail_read_pops = True  # a failed FIFO block read still pops its bytes (worst case)
        self.produce_on_count: tuple[np.ndarray, np.ndarray] | None = None  # frames appended at each FIFO_COUNT read
        self._cursor = 0
        self.frames_per_count_read = 0
        self.who_am_i = 0x68  # a clone answers another id (0x70, 0x98, ...)
        self.ignore_writes: set[int] = set()  # registers that keep their power-on value (a chip that ignores a range write)
        self.constant: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None  # raw (accel, gyro) of a chip at rest
        self._power_on()

    def _power_on(self) -> None:
        self.regs[:] = bytes(128)
        self.regs[0x6B] = 0x40  # PWR_MGMT_1: SLEEP
        self.regs[0x75] = getattr(self, "who_am_i", 0x68)  # WHO_AM_I
        self.fifo.clear()

    # -- smbus2.SMBus methods ----------------------------------------------------------
    def _check(self, addr: int) -> None:
        if addr != self.address:
            raise OSError(errno.EREMOTEIO, "Remote I/O error")

    def write_byte_data(self, i2c_addr: int, register: int, value: int) -> None:
        self._check(i2c_addr)
        self.writes.append((register, value))
        if register == 0x6B and value & 0x80:  # DEVICE_RESET: all registers to power-on values
            self._power_on()
            return
        if register in self.ignore_writes:
            return
        if register == 0x6A and value & 0x04:  # FIFO_RESET, self-clearing
            self.fifo.clear()
            value &= ~0x04
        self.regs[register] = value & 0xFF

    def read_byte_data(self, i2c_addr: int, register: int) -> int:
        self._check(i2c_addr)
        if register in self.fail_reads:
            self.fail_reads.remove(register)
            raise OSError(self.fail_errno, os.strerror(self.fail_errno))
        return self._read(register)

    def read_i2c_block_data(self, i2c_addr: int, register: int, length: int) -> list[int]:
        self._check(i2c_addr)
        if length > 32:
            raise ValueError("smbus2: block reads are at most 32 bytes")
        if register in self.fail_reads:
            self.fail_reads.remove(register)
            if register == 0x74 and self.fail_read_pops:
                del self.fifo[:length]
            raise OSError(self.fail_errno, os.strerror(self.fail_errno))
        if register == 0x74:
            out = list(self.fifo[:length])
            del self.fifo[:length]
            return out + [0] * (length - len(out))
        if register == 0x72 and self.frames_per_count_read:
            self.tick(self.frames_per_count_read)
        return [self._read(register + i) for i in range(length)]

    def close(self) -> None:
        pass

    def _read(self, register: int) -> int:
        if register == 0x3A:  # INT_STATUS, cleared by reading
            v = self.regs[0x3A]
            self.regs[0x3A] = 0
            return v
        if register == 0x72:
            return (len(self.fifo) >> 8) & 0xFF
        if register == 0x73:
            return len(self.fifo) & 0xFF
        if register == 0x74:
            if not self.fifo:
                return 0
            v = self.fifo[0]
            del self.fifo[:1]
            return v
        return self.regs[register]

    # -- the chip's side -----------------------------------------------------------------
    def signal(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw counts of sample index ``k``: accel (n, 3) and gyro (n, 3), int16, never all zero."""
        k = np.asarray(k, dtype=np.float64)
        if self.constant is not None:
            a, g = (np.tile(np.array(v, dtype=np.int16), (k.size, 1)) for v in self.constant)
            return a, g
        acc = np.stack([1000 * np.sin(2 * np.pi * k / 50), 500 + 0 * k, 8192 + 100 * np.cos(2 * np.pi * k / 25)], axis=1)
        gyr = np.stack([300 * np.sin(2 * np.pi * k / 40), -200 + 0 * k, 50 * np.cos(2 * np.pi * k / 10) + 7], axis=1)
        return np.round(acc).astype(np.int16), np.round(gyr).astype(np.int16)

    def tick(self, n: int) -> None:
        """The chip takes ``n`` samples; enabled sources go into the FIFO."""
        if self.regs[0x6B] & 0x40 or not self.regs[0x6A] & 0x40:
            self._cursor += n
            return
        en = self.regs[0x23]
        acc, gyr = self.signal(np.arange(self._cursor, self._cursor + n))
        self._cursor += n
        for i in range(n):
            frame = b""
            if en & 0x08:
                frame += acc[i].astype(">i2").tobytes()
            if en & 0x80:
                frame += b"\x00\x00"
            for bit, axis in ((0x40, 0), (0x20, 1), (0x10, 2)):
                if en & bit:
                    frame += gyr[i, axis : axis + 1].astype(">i2").tobytes()
            self.fifo += frame
        if len(self.fifo) > FIFO_SIZE:
            del self.fifo[: len(self.fifo) - FIFO_SIZE]
            if self.regs[0x38] & 0x10:
                self.regs[0x3A] |= 0x10

    def run_for(self, seconds: float, real_rate_hz: float) -> None:
        """Let ``seconds`` of host time pass on a chip whose oscillator really samples at ``real_rate_hz``."""
        self._elapsed = getattr(self, "_elapsed", 0.0) + seconds
        due = int(self._elapsed * real_rate_hz) - getattr(self, "_ran", 0)
        self._ran = getattr(self, "_ran", 0) + due
        self.tick(due)

    def sample_rate_hz(self) -> float:
        """Output rate the registers select (register map 4.2): gyro rate / (1 + SMPLRT_DIV)."""
        dlpf = self.regs[0x1A] & 0x07
        gyro_rate = 8000 if dlpf in (0, 7) else 1000
        return gyro_rate / (1 + self.regs[0x19])
