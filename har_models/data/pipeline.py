"""The sensor pipeline: a sample stream in, labelled windows out.

One code path for live sensors, replay and dataset readers: :class:`~har_models.data.resample.Resampler`
onto the 50 Hz grid, each grid sample labelled by the activity in force, then
:class:`~har_models.data.windowing.Windower`. Label and window times are in the resampler's
output clock (:attr:`SensorPipeline.clock_ns`), which never goes back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from har_models.data.clock import CONFIRM_SAMPLES
from har_models.data.labels import LabelSet
from har_models.data.recording import LabelTrack, Recording
from har_models.data.resample import PERIOD_50HZ_NS, Resampler, ResampleStats
from har_models.data.windowing import N_CHANNELS, STEP, WINDOW, Windower, WindowSet


class SensorPipeline:
    """Streaming pipeline for one recording session.

    ``label_track`` is in the output clock (more change points with :meth:`set_label`); the other
    settings are :class:`~har_models.data.resample.Resampler`'s and the windower's (128, 64).
    """

    def __init__(
        self,
        labels: LabelSet,
        label_track: LabelTrack | None = None,
        window: int = WINDOW,
        step: int = STEP,
        period_ns: int = PERIOD_50HZ_NS,
        max_gap_ns: int = 100_000_000,
        reorder_ns: int = 200_000_000,
        jump_ns: int | None = None,
        confirm_samples: int = CONFIRM_SAMPLES,
    ):
        self.labels = labels
        self.reorder_ns = int(reorder_ns)
        self._track = label_track or LabelTrack(np.empty(0, np.int64), np.empty(0, np.int64))
        self._resampler = Resampler(period_ns, max_gap_ns, reorder_ns, jump_ns, confirm_samples)
        self._windower = Windower(window, step, period_ns)

    @property
    def stats(self) -> ResampleStats:
        """What the resampler accepted, dropped and skipped so far."""
        return self._resampler.stats

    def watch_accepted(self, observer: Callable[[str, np.ndarray], None] | None) -> None:
        """Call ``observer(sensor, t_ns (k,) int64)`` with every sample the resampler accepts; None removes it."""
        self._resampler.watch_accepted(observer)

    @property
    def clock_ns(self) -> int | None:
        """Newest sample stamp taken so far, in the output clock (ns); None before the sensors' clock is known.

        A label "from the next sample on" belongs at ``clock_ns + 1``.
        """
        return self._resampler.clock_ns

    @property
    def clock_shift_ns(self) -> int:
        """Output clock minus the sensors' own clock now, ns (0 until a backward step of the sensor clock)."""
        return self._resampler.clock_shift_ns

    def set_label(self, t_ns: int, label: int) -> None:
        """From ``t_ns`` (output clock, ns) on, samples carry ``label`` (-1: unlabelled).

        ValueError if not after the last change or out of range.
        """
        if label >= len(self.labels) or label < -1:
            raise ValueError(f"SensorPipeline.set_label: label {label} outside [-1, {len(self.labels)})")
        s = self._track.starts_ns
        if s.size and t_ns <= s[-1]:
            raise ValueError(f"SensorPipeline.set_label: change at {t_ns} ns is not after the previous one ({s[-1]} ns)")
        self._track = LabelTrack(np.r_[s, t_ns], np.r_[self._track.labels, label])

    def push(self, sensor: str, t_ns: np.ndarray, xyz: np.ndarray) -> WindowSet:
        """Feed raw samples of ``sensor`` ("acc" m/s^2 or "gyro" rad/s), (n,) and (n, 3); return the windows completed (possibly none)."""
        return self._windows(*self._resampler.push(sensor, t_ns, xyz))

    def close(self) -> WindowSet:
        """End of the session: flush the resampler and return the last windows."""
        return self._windows(*self._resampler.close())

    def _windows(self, t: np.ndarray, v: np.ndarray) -> WindowSet:
        if t.size == 0:
            return WindowSet(np.empty((0, N_CHANNELS, self._windower.window), np.float32), np.empty(0, np.int64), self.labels)
        x, y, ts = self._windower.push(t, v, self._track.at(t))
        return WindowSet(x, y, self.labels, ts)


def windows_from_recording(rec: Recording, labels: LabelSet, **pipeline_kwargs: int) -> WindowSet:
    """All windows of one recording through :class:`SensorPipeline` (bit-identical to streaming it in any chunking)."""
    pipe = SensorPipeline(labels, rec.labels, **pipeline_kwargs)
    parts = [pipe.push("acc", rec.acc.t_ns, rec.acc.xyz), pipe.push("gyro", rec.gyro.t_ns, rec.gyro.xyz), pipe.close()]
    return WindowSet.concat(parts, labels)
