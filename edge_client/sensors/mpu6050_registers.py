"""The MPU-6050's register map as fedhar uses it: addresses, the configuration written, counts to SI units.

Register values are from the *MPU-6000 and MPU-6050 Register Map and Descriptions*,
revision 4.2 (RM-MPU-6000A-00), sections 4.2 (SMPLRT_DIV), 4.3 (CONFIG), 4.4 (GYRO_CONFIG),
4.5 (ACCEL_CONFIG), 4.6 (FIFO_EN), 4.15-4.16 (INT_ENABLE, INT_STATUS), 4.26 (USER_CTRL),
4.28 (PWR_MGMT_1), 4.30-4.32 (FIFO_COUNT, FIFO_R_W, WHO_AM_I):

* ``PWR_MGMT_1`` = 0x80 resets the chip, then 0x01 wakes it (SLEEP = 0) with the X-gyro
  PLL as clock (CLKSEL = 1, steadier than the internal 8 MHz oscillator);
* ``CONFIG`` DLPF_CFG = 4: accelerometer 21 Hz / gyroscope 20 Hz bandwidth, below the
  25 Hz Nyquist limit of 50 Hz output, so the chip itself anti-aliases; with the DLPF on
  the gyroscope output rate is 1 kHz;
* ``SMPLRT_DIV`` = 19: sample rate = 1 kHz / (1 + 19) = 50 Hz;
* ``GYRO_CONFIG`` FS_SEL and ``ACCEL_CONFIG`` AFS_SEL in bits 4:3 select the full-scale
  range; sensitivities 131 / 65.5 / 32.8 / 16.4 LSB per °/s and 16384 / 8192 / 4096 /
  2048 LSB per g;
* ``FIFO_EN`` = 0x78 (XG, YG, ZG and ACCEL): each 50 Hz sample puts 12 bytes in the
  1024-byte FIFO, accel X, Y, Z then gyro X, Y, Z, big-endian signed 16-bit;
* ``USER_CTRL`` bit 2 resets the FIFO, bit 6 enables it; ``INT_ENABLE`` bit 4 flags
  overflow in ``INT_STATUS`` bit 4 (cleared by reading it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# Register addresses (register map rev 4.2).
SMPLRT_DIV = 0x19
CONFIG = 0x1A
GYRO_CONFIG = 0x1B
ACCEL_CONFIG = 0x1C
FIFO_EN = 0x23
INT_ENABLE = 0x38
INT_STATUS = 0x3A
ACCEL_XOUT_H = 0x3B
GYRO_XOUT_H = 0x43
USER_CTRL = 0x6A
PWR_MGMT_1 = 0x6B
FIFO_COUNTH = 0x72
FIFO_R_W = 0x74
WHO_AM_I = 0x75

WHO_AM_I_VALUE = 0x68
"""``WHO_AM_I`` of an MPU-6050 (bits 6:1 of the I2C address, whatever AD0 is)."""
COMPATIBLE_WHO_AM_I = {
    0x70: "an MPU-6500 in MPU-6050 compatibility mode (GY-521 boards sold as MPU-6050)",
    0x98: "an MPU-6050 clone (its raw registers work; its DMP does not, and fedhar does not use it)",
}
"""Other ``WHO_AM_I`` values of chips that read the registers this driver uses like an MPU-6050:
accepted with a warning. Sources: ElectronicCats/mpu6050 #21 (13 of 20 modules answered 0x98),
danjperron/mpu6050TestInC #4 and adafruit/Adafruit_MPU6050 #47 (0x70), jrowberg/i2cdevlib #636."""
DEFAULT_ADDRESS = 0x68
"""I2C address with AD0 low (0x69 with AD0 high)."""
FIFO_SIZE = 1024
"""FIFO capacity, bytes."""
FRAME_BYTES = 12
"""Bytes per sample in the FIFO: accel X, Y, Z then gyro X, Y, Z, int16 big-endian."""
FIFO_EN_ACCEL_GYRO = 0x78
"""``FIFO_EN`` bits XG_FIFO_EN (6), YG_FIFO_EN (5), ZG_FIFO_EN (4), ACCEL_FIFO_EN (3)."""
USER_CTRL_FIFO_EN = 0x40
USER_CTRL_FIFO_RESET = 0x04
PWR_MGMT_1_RESET = 0x80
PWR_MGMT_1_WAKE_PLL_X = 0x01
INT_FIFO_OFLOW = 0x10
GYRO_RATE_DLPF_HZ = 1000
"""Gyroscope output rate with the DLPF on (DLPF_CFG 1-6), Hz."""
MAX_BLOCK = 32
"""Largest SMBus block read, bytes."""

STANDARD_GRAVITY = 9.80665
"""m/s^2 per g."""
ACCEL_LSB_PER_G = {2: 16384.0, 4: 8192.0, 8: 4096.0, 16: 2048.0}
"""Accelerometer sensitivity per full-scale range (±g -> LSB/g), register map 4.17."""
GYRO_LSB_PER_DPS = {250: 131.0, 500: 65.5, 1000: 32.8, 2000: 16.4}
"""Gyroscope sensitivity per full-scale range (±°/s -> LSB/(°/s)), register map 4.19."""


class SMBusLike(Protocol):
    """The part of ``smbus2.SMBus`` the driver uses."""

    def read_byte_data(self, i2c_addr: int, register: int) -> int: ...

    def write_byte_data(self, i2c_addr: int, register: int, value: int) -> None: ...

    def read_i2c_block_data(self, i2c_addr: int, register: int, length: int) -> list[int]: ...


@dataclass(frozen=True)
class Mpu6050Config:
    """Settings of the MPU-6050: I2C ``address`` (0x68 with AD0 low, 0x69 high), full-scale ranges (±g, ±°/s),
    ``dlpf_cfg`` (4: 21 Hz accel, 20 Hz gyro bandwidth), ``sample_rate_hz`` (a divisor of 1 kHz), and
    ``extra_who_am_i`` values to accept for a register-compatible chip this driver does not know (with a warning).

    Raises ValueError on a range the chip does not have, a DLPF setting outside 1..6 (0 and 7 run the
    gyroscope at 8 kHz), or a rate that 1 kHz is not a whole multiple of.
    """

    address: int = DEFAULT_ADDRESS
    accel_range_g: int = 4
    gyro_range_dps: int = 500
    dlpf_cfg: int = 4
    sample_rate_hz: int = 50
    extra_who_am_i: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.accel_range_g not in ACCEL_LSB_PER_G:
            raise ValueError(f"Mpu6050Config: accel_range_g must be one of {sorted(ACCEL_LSB_PER_G)}, got {self.accel_range_g}")
        if self.gyro_range_dps not in GYRO_LSB_PER_DPS:
            raise ValueError(f"Mpu6050Config: gyro_range_dps must be one of {sorted(GYRO_LSB_PER_DPS)}, got {self.gyro_range_dps}")
        if not 1 <= self.dlpf_cfg <= 6:
            raise ValueError(f"Mpu6050Config: dlpf_cfg must be 1..6 (the DLPF on, 1 kHz gyro rate), got {self.dlpf_cfg}")
        if self.sample_rate_hz <= 0 or GYRO_RATE_DLPF_HZ % self.sample_rate_hz or GYRO_RATE_DLPF_HZ // self.sample_rate_hz > 256:
            raise ValueError(f"Mpu6050Config: sample_rate_hz must divide 1000 Hz into 1..256, got {self.sample_rate_hz}")

    @property
    def smplrt_div(self) -> int:
        """``SMPLRT_DIV`` for :attr:`sample_rate_hz`: 1 kHz / (1 + div) = rate."""
        return GYRO_RATE_DLPF_HZ // self.sample_rate_hz - 1

    @property
    def period_ns(self) -> int:
        """Sample period, nanoseconds."""
        return 1_000_000_000 // self.sample_rate_hz

    def register_writes(self) -> list[tuple[int, int]]:
        """``(register, value)`` writes that configure the chip, in order (after the reset write)."""
        afs = sorted(ACCEL_LSB_PER_G).index(self.accel_range_g)
        fs = sorted(GYRO_LSB_PER_DPS).index(self.gyro_range_dps)
        return [(PWR_MGMT_1, PWR_MGMT_1_WAKE_PLL_X), (SMPLRT_DIV, self.smplrt_div), (CONFIG, self.dlpf_cfg), (GYRO_CONFIG, fs << 3),
                (ACCEL_CONFIG, afs << 3), (INT_ENABLE, INT_FIFO_OFLOW), (FIFO_EN, 0x00), (USER_CTRL, USER_CTRL_FIFO_RESET),
                (USER_CTRL, USER_CTRL_FIFO_EN), (FIFO_EN, FIFO_EN_ACCEL_GYRO)]  # fmt: skip


def counts_to_si(raw: np.ndarray, accel_range_g: int, gyro_range_dps: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw FIFO counts ``(n, 6)`` (accel X, Y, Z then gyro X, Y, Z) to acc ``(n, 3)`` m/s^2 and gyro ``(n, 3)`` rad/s
    at the given full-scale ranges; ValueError on a mis-shaped array or an unknown range."""
    r = np.asarray(raw)
    if r.ndim != 2 or r.shape[1] != 6:
        raise ValueError(f"counts_to_si: raw counts must have shape (n, 6), got {r.shape}")
    if accel_range_g not in ACCEL_LSB_PER_G or gyro_range_dps not in GYRO_LSB_PER_DPS:
        raise ValueError(f"counts_to_si: unknown range ±{accel_range_g} g / ±{gyro_range_dps} °/s")
    r64 = r.astype(np.float64)
    acc = r64[:, :3] * (STANDARD_GRAVITY / ACCEL_LSB_PER_G[accel_range_g])
    gyro = r64[:, 3:] * (math.pi / 180.0 / GYRO_LSB_PER_DPS[gyro_range_dps])
    return acc, gyro
