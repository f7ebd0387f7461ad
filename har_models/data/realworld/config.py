"""Names of the REALWORLD archive (activities, positions, sensor prefixes) and the load settings."""

from __future__ import annotations

from dataclasses import dataclass

from har_models.data.labels import REALWORLD_LABELS
from har_models.data.resample import PERIOD_50HZ_NS
from har_models.data.windowing import STEP, WINDOW

ACTIVITIES: tuple[str, ...] = REALWORLD_LABELS.names
"""The 8 activities, in class-index order of :data:`~har_models.data.labels.REALWORLD_LABELS`."""

POSITIONS: tuple[str, ...] = ("chest", "forearm", "head", "shin", "thigh", "upperarm", "waist")
"""The 7 body positions of the phones."""

SENSORS: tuple[str, ...] = ("acc", "gyro")
"""Sensors read, as named by :class:`~har_models.data.resample.Resampler`."""

ARCHIVE_PREFIX = {"acc": "acc", "gyro": "gyr"}
"""Sensor prefix of the per-activity archives (``acc_walking_csv.zip``, ``gyr_walking_csv.zip``)."""

CSV_PREFIX = {"acc": "acc", "gyro": "Gyroscope"}
"""Sensor prefix of the CSV files inside them (``acc_walking_shin.csv``, ``Gyroscope_walking_shin.csv``)."""

CSV_COLUMNS = ("id", "attr_time", "attr_x", "attr_y", "attr_z")
"""Columns of every CSV file; ``attr_time`` is Unix epoch milliseconds."""

NOMINAL_RATE_HZ = 50.0
"""Sampling rate the recording app asked for, Hz (the streams are irregular around it)."""


@dataclass(frozen=True)
class RealWorldConfig:
    """Preprocessing settings of a REALWORLD load (all of them enter the cache key).

    Parameters
    ----------
    positions : tuple of str
        Body positions to read, a subset of :data:`POSITIONS`. Default: all 7 pooled into
        the subject's data, as in FedDist (Ek et al., PerCom 2021).
    window, step : int
        Window length and step in grid samples (128 = 2.56 s and 64 at 50 Hz).
    period_ns : int
        Grid period, ns (20 ms = 50 Hz).
    max_gap_ns : int
        Longest spacing between two samples of one stream that is interpolated across, ns
        (100 ms); longer gaps split a recording into runs.
    reorder_ns : int
        How far back an out-of-order sample may be stamped and still be used, ns (200 ms).

    Raises
    ------
    ValueError
        On an unknown or repeated position, or a non-positive length.
    """

    positions: tuple[str, ...] = POSITIONS
    window: int = WINDOW
    step: int = STEP
    period_ns: int = PERIOD_50HZ_NS
    max_gap_ns: int = 100_000_000
    reorder_ns: int = 200_000_000

    def __post_init__(self) -> None:
        positions = (self.positions,) if isinstance(self.positions, str) else tuple(self.positions)
        unknown = [p for p in positions if p not in POSITIONS]
        if not positions or unknown or len(set(positions)) != len(positions):
            raise ValueError(f"RealWorldConfig: positions must be distinct names out of {', '.join(POSITIONS)}; got {positions!r}")
        object.__setattr__(self, "positions", positions)
        for name in ("window", "step", "period_ns", "max_gap_ns"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"RealWorldConfig: {name} must be > 0, got {getattr(self, name)}")
        if self.reorder_ns < 0:
            raise ValueError(f"RealWorldConfig: reorder_ns must be >= 0, got {self.reorder_ns}")

    def pipeline_kwargs(self) -> dict[str, int]:
        """Keyword arguments for :class:`~har_models.data.pipeline.SensorPipeline` and ``windows_from_recording``."""
        return {
            "window": self.window,
            "step": self.step,
            "period_ns": self.period_ns,
            "max_gap_ns": self.max_gap_ns,
            "reorder_ns": self.reorder_ns,
        }
