"""Raw sensor recordings as they come off a device or out of a dataset file.

A recording is two independent sample streams (accelerometer and gyroscope, each with
its own timestamps, as Android's ``SensorEvent`` and REALWORLD's CSV files deliver them)
plus a label track that says which activity was performed when.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SensorStream:
    """Timestamped 3-axis samples of one sensor.

    Parameters
    ----------
    t_ns : ndarray of shape (n,), int64
        Sample timestamps in nanoseconds (any epoch; only differences matter). Need not be
        sorted or unique: the resampler handles out-of-order and duplicated stamps.
    xyz : ndarray of shape (n, 3), float64
        Samples: m/s^2 for an accelerometer (gravity included), rad/s for a gyroscope.

    Raises
    ------
    ValueError
        If the shapes disagree or ``xyz`` is not (n, 3).
    """

    t_ns: np.ndarray
    xyz: np.ndarray

    def __post_init__(self) -> None:
        t = np.asarray(self.t_ns, dtype=np.int64)
        v = np.asarray(self.xyz, dtype=np.float64)
        if t.ndim != 1 or v.ndim != 2 or v.shape != (t.shape[0], 3):
            raise ValueError(f"SensorStream: expected t_ns of shape (n,) and xyz of shape (n, 3), got {t.shape} and {v.shape}")
        object.__setattr__(self, "t_ns", t)
        object.__setattr__(self, "xyz", v)

    def __len__(self) -> int:
        return int(self.t_ns.shape[0])


@dataclass(frozen=True)
class LabelTrack:
    """Piecewise-constant activity label over time.

    The label at time ``t`` is ``labels[i]`` for the last change point ``starts_ns[i] <= t``;
    before the first change point, and wherever the label is negative, there is no label.

    Parameters
    ----------
    starts_ns : ndarray of shape (k,), int64, strictly increasing
        Times (ns) at which the label changes.
    labels : ndarray of shape (k,), int64
        Class index from each change point on; -1 means "unlabelled".

    Raises
    ------
    ValueError
        If the arrays differ in length or ``starts_ns`` is not strictly increasing.
    """

    starts_ns: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        s = np.asarray(self.starts_ns, dtype=np.int64)
        y = np.asarray(self.labels, dtype=np.int64)
        if s.ndim != 1 or s.shape != y.shape:
            raise ValueError(f"LabelTrack: starts_ns {s.shape} and labels {y.shape} must be equal 1-D shapes")
        if s.size > 1 and np.any(np.diff(s) <= 0):
            raise ValueError("LabelTrack: starts_ns must be strictly increasing")
        object.__setattr__(self, "starts_ns", s)
        object.__setattr__(self, "labels", y)

    @classmethod
    def constant(cls, label: int, start_ns: int = np.iinfo(np.int64).min) -> LabelTrack:
        """One label for all times from ``start_ns`` on (a REALWORLD recording has one activity)."""
        return cls(np.array([start_ns], dtype=np.int64), np.array([label], dtype=np.int64))

    @classmethod
    def from_samples(cls, t_ns: np.ndarray, labels: np.ndarray) -> LabelTrack:
        """Compress per-sample labels (HAPT style) into change points.

        Parameters
        ----------
        t_ns : ndarray of shape (n,), int64, strictly increasing
        labels : ndarray of shape (n,), int
        """
        t = np.asarray(t_ns, dtype=np.int64)
        y = np.asarray(labels, dtype=np.int64)
        if t.shape != y.shape or t.ndim != 1:
            raise ValueError(f"LabelTrack.from_samples: t_ns {t.shape} and labels {y.shape} must match")
        if t.size == 0:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64))
        change = np.r_[True, y[1:] != y[:-1]]
        return cls(t[change], y[change])

    def at(self, t_ns: np.ndarray) -> np.ndarray:
        """Labels at times ``t_ns`` (shape (m,)), -1 where unlabelled."""
        t = np.asarray(t_ns, dtype=np.int64)
        idx = np.searchsorted(self.starts_ns, t, side="right") - 1
        out = np.full(t.shape, -1, dtype=np.int64)
        ok = idx >= 0
        out[ok] = self.labels[idx[ok]]
        return out


@dataclass(frozen=True)
class Recording:
    """One continuous recording session of one subject.

    Parameters
    ----------
    subject : str
        Subject (client) identifier, e.g. ``"hapt-01"`` or ``"proband1"``.
    session : str
        Name of the session within the subject (``"exp0"``, ``"walking/shin"``).
    acc : SensorStream
        Accelerometer, m/s^2 with gravity.
    gyro : SensorStream
        Gyroscope, rad/s.
    labels : LabelTrack
        Activity over time.
    """

    subject: str
    session: str
    acc: SensorStream
    gyro: SensorStream
    labels: LabelTrack
    notes: tuple[str, ...] = field(default=())

    @property
    def duration_s(self) -> float:
        """Span covered by both streams, seconds (0 if they do not overlap)."""
        if len(self.acc) == 0 or len(self.gyro) == 0:
            return 0.0
        lo = max(int(self.acc.t_ns.min()), int(self.gyro.t_ns.min()))
        hi = min(int(self.acc.t_ns.max()), int(self.gyro.t_ns.max()))
        return max(0.0, (hi - lo) / 1e9)
