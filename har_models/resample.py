"""Streaming resampling of two irregular sensor streams onto one exact 50 Hz grid.

Phones and boards deliver accelerometer and gyroscope events at a rate that is only a
hint (Android's requested 20 ms period often yields 10-20 ms), with jitter, duplicated
and out-of-order timestamps and gaps. The model needs one exact grid. This module keeps
both streams, and emits the grid points ``k * period`` (absolute time, so the grid does
not depend on where a stream starts or how it is chunked) that both streams cover, by
linear interpolation between the two samples that bracket each grid point.

Rules, each chosen so that streaming sample by sample, in random chunks, or all at once
gives bit-identical output:

* **Reordering.** A sample is accepted only if it is newer than ``reorder_ns`` before the
  newest sample seen so far on its stream (judged in arrival order); older ones are late
  and dropped. Accepted samples are released in time order once the stream's newest
  timestamp is ``reorder_ns`` past them.
* **Duplicates.** Of several accepted samples with the same timestamp, the first to arrive
  wins.
* **Gaps.** A grid point whose bracketing samples on either stream are more than
  ``max_gap_ns`` apart is not invented: it is skipped, which the windower sees as a break
  in the grid (timestamps jump), so no window spans a gap. Skipped points are counted, not
  generated, so a gap of any length (a phone clock jumping by days) costs nothing.
* **Non-finite values.** A sample with a NaN or infinite value is treated as missing (it
  does not count as the stream's newest sample either).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERIOD_50HZ_NS = 20_000_000
"""Grid period for 50 Hz, nanoseconds."""

_INT64_MIN = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass
class ResampleStats:
    """Counters of what the resampler did, for logs and tests.

    Attributes
    ----------
    accepted : int
        Raw samples (both streams) used for interpolation.
    late_dropped : int
        Raw samples stamped ``reorder_ns`` or more before their stream's newest earlier arrival.
    duplicates_dropped : int
        Raw samples whose timestamp an earlier arrival of the same stream already had.
    grid_points : int
        Grid samples emitted.
    gap_points_skipped : int
        Grid points inside the common span of the streams that fell into a gap.
    nonfinite_dropped : int
        Raw samples with a NaN or infinite value.
    """

    accepted: int = 0
    late_dropped: int = 0
    duplicates_dropped: int = 0
    grid_points: int = 0
    gap_points_skipped: int = 0
    nonfinite_dropped: int = 0


class _StreamBuffer:
    """Per-sensor reorder buffer and released history (internal)."""

    def __init__(self, reorder_ns: int) -> None:
        self.reorder_ns = reorder_ns
        self.newest = _INT64_MIN  # newest timestamp seen (accepted or not)
        self.pending_t = np.empty(0, np.int64)  # accepted, not yet released (arrival order)
        self.pending_v = np.empty((0, 3), np.float64)
        self.released_t = np.empty(0, np.int64)  # released, time-sorted, unique
        self.released_v = np.empty((0, 3), np.float64)

    def push(self, t: np.ndarray, v: np.ndarray, stats: ResampleStats) -> None:
        if t.size == 0:
            return
        # A sample is late when it is not newer than (running max of earlier arrivals - reorder).
        prev_max = np.maximum.accumulate(np.concatenate([np.array([self.newest], np.int64), t[:-1]]))
        late = t + self.reorder_ns <= prev_max  # written this way round: no int64 underflow
        # Also late if it is not newer than what was already released.
        if self.released_t.size:
            late |= t <= self.released_t[-1]
        stats.late_dropped += int(late.sum())
        self.newest = max(self.newest, int(t.max()))
        keep = ~late
        self.pending_t = np.concatenate([self.pending_t, t[keep]])
        self.pending_v = np.vstack([self.pending_v, v[keep]])

    def release(self, final: bool, stats: ResampleStats) -> None:
        if self.pending_t.size == 0:
            return
        cutoff = _INT64_MAX if final else self.newest - self.reorder_ns
        ready = self.pending_t <= cutoff
        if not ready.any():
            return
        t, v = self.pending_t[ready], self.pending_v[ready]
        self.pending_t, self.pending_v = self.pending_t[~ready], self.pending_v[~ready]
        order = np.argsort(t, kind="stable")  # stable: first arrival first among equal stamps
        t, v = t[order], v[order]
        first = np.concatenate([[True], t[1:] != t[:-1]])
        if self.released_t.size:
            first &= t != self.released_t[-1]
        stats.duplicates_dropped += int((~first).sum())
        stats.accepted += int(first.sum())
        self.released_t = np.concatenate([self.released_t, t[first]])
        self.released_v = np.vstack([self.released_v, v[first]])

    def trim_before(self, t_keep: int) -> None:
        """Forget released samples that can no longer bracket a grid point >= t_keep."""
        if self.released_t.size < 2:
            return
        j = int(np.searchsorted(self.released_t, t_keep, side="right")) - 1
        if j > 0:
            self.released_t = self.released_t[j:]
            self.released_v = self.released_v[j:]


class Resampler:
    """Two sensor streams in, one exact-grid 6-channel stream out.

    Parameters
    ----------
    period_ns : int
        Grid period in nanoseconds (default 20 ms = 50 Hz).
    max_gap_ns : int
        Longest spacing between two samples of one stream that may be interpolated across
        (default 100 ms = 5 grid periods). Longer gaps split the output.
    reorder_ns : int
        How far back in time a late sample may still be accepted (default 200 ms); this is
        also the output latency.

    Output of :meth:`push` and :meth:`close`: ``(t_ns (m,), values (m, 6))`` with values
    ordered acc x, y, z (m/s^2) then gyro x, y, z (rad/s), float64; grid times increase and
    are multiples of ``period_ns``; a jump larger than one period marks a gap.

    Raises
    ------
    ValueError
        On non-positive settings, an unknown sensor name, or mis-shaped input.
    """

    SENSORS = ("acc", "gyro")

    def __init__(self, period_ns: int = PERIOD_50HZ_NS, max_gap_ns: int = 100_000_000, reorder_ns: int = 200_000_000):
        if period_ns <= 0 or max_gap_ns <= 0 or reorder_ns < 0:
            raise ValueError(
                f"Resampler: period_ns ({period_ns}) and max_gap_ns ({max_gap_ns}) must be > 0, reorder_ns ({reorder_ns}) >= 0"
            )
        self.period_ns = int(period_ns)
        self.max_gap_ns = int(max_gap_ns)
        self.stats = ResampleStats()
        self._streams = {s: _StreamBuffer(int(reorder_ns)) for s in self.SENSORS}
        self._next_grid: int | None = None  # next grid time to consider
        self._closed = False

    def push(self, sensor: str, t_ns: np.ndarray, xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add samples of one sensor; return the grid samples that became final.

        Parameters
        ----------
        sensor : {"acc", "gyro"}
        t_ns : array of shape (n,), int64 nanoseconds, in arrival order
            Any order and repeats are allowed (see the module rules). Float arrays are
            accepted only if every value is a whole number.
        xyz : array of shape (n, 3): m/s^2 (acc) or rad/s (gyro)

        Returns
        -------
        t_ns : ndarray of shape (m,), int64
            Grid times, multiples of ``period_ns``, increasing across calls.
        values : ndarray of shape (m, 6), float64
            acc x, y, z (m/s^2) then gyro x, y, z (rad/s).

        Raises
        ------
        ValueError
            After :meth:`close`, for an unknown sensor, mis-shaped samples, or timestamps
            that are not integer nanoseconds.
        """
        if self._closed:
            raise ValueError("Resampler: push() after close(); create a new Resampler for a new recording")
        if sensor not in self._streams:
            raise ValueError(f"Resampler: unknown sensor {sensor!r}; expected one of {self.SENSORS}")
        t = _as_ns(t_ns, sensor)
        v = np.asarray(xyz, dtype=np.float64)
        if v.shape != (t.shape[0], 3):
            raise ValueError(f"Resampler: {sensor} samples must have shape ({t.shape[0]}, 3), got {v.shape}")
        finite = np.isfinite(v).all(axis=1)
        if not finite.all():  # a non-finite sample is treated as missing, i.e. a possible gap
            self.stats.nonfinite_dropped += int((~finite).sum())
            t, v = t[finite], v[finite]
        buf = self._streams[sensor]
        buf.push(t, v, self.stats)
        buf.release(False, self.stats)
        return self._emit()

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """End of the recording: release everything still held and return the last grid samples."""
        if self._closed:
            return np.empty(0, np.int64), np.empty((0, 6))
        for buf in self._streams.values():
            buf.release(True, self.stats)
        out = self._emit()
        self._closed = True
        return out

    def _emit(self) -> tuple[np.ndarray, np.ndarray]:
        acc, gyr = self._streams["acc"], self._streams["gyro"]
        if acc.released_t.size == 0 or gyr.released_t.size == 0:
            return np.empty(0, np.int64), np.empty((0, 6))
        p = self.period_ns
        if self._next_grid is None:
            start = max(int(acc.released_t[0]), int(gyr.released_t[0]))
            self._next_grid = -(-start // p) * p  # first multiple of p at or after start
        end = min(int(acc.released_t[-1]), int(gyr.released_t[-1]))
        if end < self._next_grid:
            return np.empty(0, np.int64), np.empty((0, 6))
        # Only grid points outside every gap are generated: materialising the whole range
        # would cost memory and time proportional to a gap's length (a phone clock jump of
        # days would mean billions of points).
        n_range = (end - self._next_grid) // p + 1
        grid = _grid_outside_gaps(self._next_grid, end, p, [acc.released_t, gyr.released_t], self.max_gap_ns)
        if grid.size == 0:
            self._next_grid += n_range * p
            acc.trim_before(self._next_grid)
            gyr.trim_before(self._next_grid)
            self.stats.gap_points_skipped += int(n_range)
            return np.empty(0, np.int64), np.empty((0, 6))
        va, ok_a = _interpolate(acc.released_t, acc.released_v, grid, self.max_gap_ns)
        vg, ok_g = _interpolate(gyr.released_t, gyr.released_v, grid, self.max_gap_ns)
        ok = ok_a & ok_g  # all True by construction of the grid; kept as a guard
        self._next_grid += n_range * p
        acc.trim_before(self._next_grid)
        gyr.trim_before(self._next_grid)
        self.stats.grid_points += int(ok.sum())
        self.stats.gap_points_skipped += int(n_range - ok.sum())
        return grid[ok], np.hstack([va[ok], vg[ok]])


def _grid_outside_gaps(lo: int, hi: int, p: int, streams: list[np.ndarray], max_gap_ns: int) -> np.ndarray:
    """Multiples of ``p`` in ``[lo, hi]`` not strictly inside a gap of any stream.

    A gap is a pair of consecutive samples ``(a, b)`` of one (sorted, unique) stream with
    ``b - a > max_gap_ns``; the grid points ``a < g < b`` cannot be interpolated. ``lo``
    is a multiple of ``p``. Cost is proportional to the number of points returned plus the
    number of gaps, not to the length of the range.
    """
    starts, stops = [], []  # excluded ranges of grid indices, inclusive
    for t in streams:
        big = np.flatnonzero(np.diff(t) > max_gap_ns)
        a, b = t[big], t[big + 1]
        starts.append(a // p + 1)  # first multiple strictly after a
        stops.append(-(-b // p) - 1)  # last multiple strictly before b
    k_lo, k_hi = lo // p, hi // p
    if not any(s.size for s in starts):
        return np.arange(k_lo, k_hi + 1, dtype=np.int64) * p
    ex_start, ex_stop = np.concatenate(starts), np.concatenate(stops)
    order = np.argsort(ex_start, kind="stable")
    segments, k = [], k_lo
    for s, e in zip(ex_start[order].tolist(), ex_stop[order].tolist(), strict=True):
        if e < k or s > e:
            continue
        if s > k_hi:
            break
        if s > k:
            segments.append(np.arange(k, s, dtype=np.int64))
        k = max(k, e + 1)
    if k <= k_hi:
        segments.append(np.arange(k, k_hi + 1, dtype=np.int64))
    if not segments:
        return np.empty(0, np.int64)
    return np.concatenate(segments) * p


def _as_ns(t_ns: np.ndarray, sensor: str) -> np.ndarray:
    """Timestamps as a flat int64 array; floats are accepted only when they are whole numbers."""
    raw = np.asarray(t_ns)
    if raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw)):
            raise ValueError(
                f"Resampler: {sensor} timestamps must be integer nanoseconds; got non-integer floats "
                "(seconds or milliseconds?); convert with (t_s * 1e9).astype(np.int64)"
            )
    elif raw.dtype.kind not in "iu" and raw.size:
        raise ValueError(f"Resampler: {sensor} timestamps must be integer nanoseconds, got dtype {raw.dtype}")
    return raw.astype(np.int64).reshape(-1)


def _interpolate(t: np.ndarray, v: np.ndarray, grid: np.ndarray, max_gap_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation at ``grid`` from sorted unique samples ``(t, v)``.

    Returns ``(values (m, 3), ok (m,))``; ``ok`` is False where the bracketing samples are
    more than ``max_gap_ns`` apart. A grid point that coincides with a sample gets that
    sample's value exactly.
    """
    j = np.searchsorted(t, grid, side="right") - 1  # t[j] <= g
    j = np.clip(j, 0, t.size - 1)
    exact = t[j] == grid
    k = np.minimum(j + 1, t.size - 1)
    t0, t1 = t[j], t[k]
    span = (t1 - t0).astype(np.float64)
    frac = np.divide((grid - t0).astype(np.float64), span, out=np.zeros_like(span), where=span > 0)
    vals = v[j] + (v[k] - v[j]) * frac[:, None]
    vals[exact] = v[j[exact]]
    ok = exact | ((t1 > grid) & (t0 <= grid) & (t1 - t0 <= max_gap_ns))
    return vals, ok
