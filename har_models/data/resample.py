"""Streaming resampling of two irregular sensor streams onto one exact 50 Hz grid.

Devices deliver accelerometer and gyroscope events at a rate that is only a hint, with jitter,
duplicated and out-of-order stamps and gaps. This module emits the grid points ``k * period``
(absolute time, independent of chunking) that both streams cover, by linear interpolation
between the bracketing samples. Every rule gives bit-identical output whether samples are
streamed one by one, in random chunks, or all at once:

* **Reordering.** A sample older than ``reorder_ns`` before its stream's newest is late and
  dropped; accepted ones are released in time order once the stream is ``reorder_ns`` past them.
* **Duplicates.** Of accepted samples with one stamp, the first to arrive wins.
* **Gaps.** Grid points whose bracketing samples are more than ``max_gap_ns`` apart are skipped
  (counted, not generated), so no window spans a gap.
* **Clock jumps and steps** (``jump_ns``, 1 s): the rules of :mod:`har_models.data.clock`.
* **Non-finite values** count as missing.
* **Anti-aliasing.** A stream faster than :data:`~har_models.data.anti_alias.ANTI_ALIAS_RATIO`
  times the grid rate, measured once on its first :data:`RATE_PROBE_INTERVALS` spacings
  (median), is low-passed by :class:`~har_models.data.anti_alias.AntiAliasDecimator`; 50 Hz
  input passes through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from har_models.data.anti_alias import AntiAliasDecimator, anti_alias_factor, interpolate, join_parts
from har_models.data.clock import CLOCK_JUMP_NS, CONFIRM_SAMPLES, ClockRules, ResampleStats, agree_steps, known_shift

log = logging.getLogger(__name__)

PERIOD_50HZ_NS = 20_000_000
"""Grid period for 50 Hz, nanoseconds."""

RATE_PROBE_INTERVALS = 50
"""Sample spacings (the first ones of a stream, after reordering) whose median sets the stream's rate (1 s at 50 Hz)."""

MAX_STEP_LINES = 10
"""Backward clock steps logged per resampler (one line each); later ones are only counted."""

_INT64_MIN = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)


class _StreamBuffer(ClockRules):
    """Per-sensor clock rules, reorder buffer, re-basing, rate probe, optional anti-alias stage and released history (internal)."""

    def __init__(
        self,
        reorder_ns: int,
        period_ns: int,
        max_gap_ns: int,
        jump_ns: int = CLOCK_JUMP_NS,
        confirm: int = CONFIRM_SAMPLES,
        name: str = "stream",
        warned: set[str] | None = None,
    ) -> None:
        super().__init__(period_ns, jump_ns, confirm, name, warned)
        self.reorder_ns = reorder_ns
        self.max_gap_ns = max_gap_ns
        self.last_raw = _INT64_MIN  # newest raw sample of the current segment released so far
        self.pending_t = np.empty(0, np.int64)  # accepted, not yet released (arrival order)
        self.pending_v = np.empty((0, 3), np.float64)
        self._held: list[tuple[int, np.ndarray, np.ndarray]] = []  # released, raw, of segments whose shift is not agreed
        self.factor: int | None = None  # oversampling factor once the rate is known (1: passed through)
        self._probe_t = np.empty(0, np.int64)  # released samples held until the rate is known
        self._probe_v = np.empty((0, 3), np.float64)
        self._decimator: AntiAliasDecimator | None = None
        self.released_t = np.empty(0, np.int64)  # what the grid interpolates from: re-based, time-sorted, unique
        self.released_v = np.empty((0, 3), np.float64)
        self.on_accepted: Callable[[str, np.ndarray], None] | None = None  # observer of accepted stamps (Resampler.watch_accepted)

    def _accept(self, t: np.ndarray, v: np.ndarray, stats: ResampleStats) -> None:
        if t.size == 0:
            return
        # A sample is late when it is not newer than (running max of earlier arrivals - reorder).
        prev_max = np.maximum.accumulate(np.concatenate([np.array([self.newest], np.int64), t[:-1]]))
        late = t + self.reorder_ns <= prev_max  # written this way round: no int64 underflow
        # Also late if it is not newer than what was already released.
        if self.last_raw != _INT64_MIN:
            late |= t <= self.last_raw
        stats.late_dropped += int(late.sum())
        self.newest = max(self.newest, int(t.max()))
        keep = ~late
        self.pending_t = np.concatenate([self.pending_t, t[keep]])
        self.pending_v = np.vstack([self.pending_v, v[keep]])

    def _end_segment(self, stats: ResampleStats) -> None:
        """A backward step: the old segment releases everything it holds; the new one starts with nothing released."""
        self._release(True, stats)
        self.last_raw = _INT64_MIN

    def release(self, final: bool, stats: ResampleStats) -> None:
        """Release what the reorder horizon (or, when ``final``, the end of the recording) lets go."""
        if final:
            self.settle(stats)
        self._release(final, stats)

    def _release(self, everything: bool, stats: ResampleStats) -> None:
        if not self.pending_t.size:
            return
        cutoff = _INT64_MAX if everything else self.newest - self.reorder_ns
        ready = self.pending_t <= cutoff
        if not ready.any():
            return
        t, v = self.pending_t[ready], self.pending_v[ready]
        self.pending_t, self.pending_v = self.pending_t[~ready], self.pending_v[~ready]
        order = np.argsort(t, kind="stable")  # stable: first arrival first among equal stamps
        t, v = t[order], v[order]
        first = np.concatenate([[True], t[1:] != t[:-1]])
        first &= t != self.last_raw
        stats.duplicates_dropped += int((~first).sum())
        stats.accepted += int(first.sum())
        t, v = t[first], v[first]
        if t.size:
            self.last_raw = int(t[-1])
            self._held.append((len(self.segments) - 1, t, v))
            self.drain(False)

    def drain(self, final: bool) -> None:
        """Re-base the released samples whose segment's shift is agreed and pass them on, in order."""
        while self._held:
            k, t, v = self._held[0]
            shift = self.segments[k].shift
            if shift is None:
                break
            self._held.pop(0)
            if shift:
                t = t + shift
            if self.on_accepted is not None and t.size:
                self.on_accepted(self.name, t)
            self._condition(t, v, False)
        if final:
            self._condition(np.empty(0, np.int64), np.empty((0, 3), np.float64), True)

    def _condition(self, t: np.ndarray, v: np.ndarray, final: bool) -> None:
        """Pass released (re-based) samples on to the grid, through the anti-alias stage if the stream is fast."""
        if self.factor is None:
            self._probe_t = np.concatenate([self._probe_t, t])
            self._probe_v = np.vstack([self._probe_v, v])
            if self._probe_t.size <= RATE_PROBE_INTERVALS and not final:
                return
            # Exactly the first RATE_PROBE_INTERVALS spacings, never "all held so far": how many
            # samples one release brings depends on the chunking (one push of a whole recording
            # releases it all at once), and so would the decision.
            first = self._probe_t[: RATE_PROBE_INTERVALS + 1]
            spacing = float(np.median(np.diff(first))) if first.size > 1 else 0.0
            self.factor = anti_alias_factor(spacing, self.period_ns)
            if self.factor > 1:
                self._decimator = AntiAliasDecimator(self.period_ns, self.factor, self.max_gap_ns)
            t, v = self._probe_t, self._probe_v
            self._probe_t, self._probe_v = np.empty(0, np.int64), np.empty((0, 3), np.float64)
        if self._decimator is not None:
            parts = [self._decimator.push(t, v)]
            if final:
                parts.append(self._decimator.close())
            t, v = join_parts(parts)
        if t.size:
            self.released_t = np.concatenate([self.released_t, t])
            self.released_v = np.vstack([self.released_v, v])

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
        Grid period, ns (20 ms = 50 Hz).
    max_gap_ns : int
        Longest spacing of one stream interpolated across, ns (100 ms); longer gaps split the output.
    reorder_ns : int
        How far back a late sample is still accepted, ns (200 ms); also the output latency (plus
        the rate probe and, for a fast stream, the filter's delay of about 0.12 s).
    jump_ns : int, optional
        A stamp this far from its stream's newest is suspect (:mod:`har_models.data.clock`);
        default ``max(CLOCK_JUMP_NS, max_gap_ns, reorder_ns)``, and at least both.
    confirm_samples : int
        Samples that decide between a clock step and an outlier (25); the extra latency after a
        gap longer than ``jump_ns`` and after a backward step.

    Output of :meth:`push` and :meth:`close`: ``(t_ns (m,), values (m, 6))``, acc x, y, z (m/s^2)
    then gyro x, y, z (rad/s), float64; times are increasing multiples of ``period_ns`` (re-based
    after a backward clock step, :attr:`clock_ns`); a jump of more than one period marks a gap.

    Raises
    ------
    ValueError
        On non-positive settings, an unknown sensor name, or mis-shaped input.
    """

    SENSORS = ("acc", "gyro")

    def __init__(
        self,
        period_ns: int = PERIOD_50HZ_NS,
        max_gap_ns: int = 100_000_000,
        reorder_ns: int = 200_000_000,
        jump_ns: int | None = None,
        confirm_samples: int = CONFIRM_SAMPLES,
    ):
        if period_ns <= 0 or max_gap_ns <= 0 or reorder_ns < 0:
            raise ValueError(
                f"Resampler: period_ns ({period_ns}) and max_gap_ns ({max_gap_ns}) must be > 0, reorder_ns ({reorder_ns}) >= 0"
            )
        if jump_ns is None:
            jump_ns = max(CLOCK_JUMP_NS, int(max_gap_ns), int(reorder_ns))
        if jump_ns < reorder_ns or jump_ns < max_gap_ns or jump_ns <= 0 or confirm_samples < 1:
            raise ValueError(
                f"Resampler: jump_ns ({jump_ns}) must be > 0 and >= reorder_ns ({reorder_ns}) and max_gap_ns ({max_gap_ns}), "
                f"confirm_samples ({confirm_samples}) >= 1; the defaults (1 s, 25) suit 50 Hz sensors"
            )
        self.period_ns = int(period_ns)
        self.max_gap_ns = int(max_gap_ns)
        self.jump_ns, self.confirm_samples = int(jump_ns), int(confirm_samples)
        self.stats = ResampleStats()
        warned: set[str] = set()  # clock warnings are logged once per resampler
        self._streams = {
            s: _StreamBuffer(int(reorder_ns), self.period_ns, self.max_gap_ns, self.jump_ns, self.confirm_samples, s, warned)
            for s in self.SENSORS
        }
        self._next_grid: int | None = None  # next grid time to consider
        self._closed = False
        self._step_lines = 0

    def watch_accepted(self, observer: Callable[[str, np.ndarray], None] | None) -> None:
        """Call ``observer(sensor, t_ns (k,) int64)`` with the stamps counted in ``stats.accepted``.

        The stamps are in the output clock and increase; None removes the observer.
        """
        for buf in self._streams.values():
            buf.on_accepted = observer

    @property
    def clock_ns(self) -> int | None:
        """Newest sample stamp on either stream, in the output clock (ns); None before a clock is known.

        The output clock is the sensors' own, re-based after a backward step so it never goes back
        (:mod:`har_models.data.clock`). A label change "from now on" belongs at ``clock_ns + 1``.
        """
        known = [c for c in (buf.clock_ns() for buf in self._streams.values()) if c is not None]
        return max(known) if known else None

    @property
    def clock_shift_ns(self) -> int:
        """Output clock minus the sensors' clock now, ns: 0 until a backward step, then the agreed shift of the newest segment."""
        return max(known_shift(buf.segments) for buf in self._streams.values())

    @property
    def factors(self) -> dict[str, int | None]:
        """Oversampling factor per sensor: 1 = passed through, M >= 2 = low-passed on a period/M grid, None = rate not yet known."""
        return {s: buf.factor for s, buf in self._streams.items()}

    def push(self, sensor: str, t_ns: np.ndarray, xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add samples of one sensor (``"acc"`` or ``"gyro"``); return the grid samples that became final.

        ``t_ns`` (n,) int64 ns in arrival order (floats only if whole); ``xyz`` (n, 3) m/s^2 or rad/s.
        Returns ``(t_ns (m,), values (m, 6))`` as described in the class.

        Raises
        ------
        ValueError
            After :meth:`close`, for an unknown sensor, mis-shaped samples, or stamps that are not integer ns.
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
        self._agree(False)
        return self._emit()

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """End of the recording: release everything still held and return the last grid samples."""
        if self._closed:
            return np.empty(0, np.int64), np.empty((0, 6))
        for buf in self._streams.values():
            buf.release(True, self.stats)
        self._agree(True)
        out = self._emit()
        self._closed = True
        return out

    def _agree(self, final: bool) -> None:
        """Agree the shifts of new segments after backward steps; pass on what they held."""
        bufs = list(self._streams.values())
        if any(len(b.segments) > 1 for b in bufs):
            for line in agree_steps(bufs, final):
                self._step_lines += 1
                if self._step_lines <= MAX_STEP_LINES:
                    log.warning("%s", line)
                elif self._step_lines == MAX_STEP_LINES + 1:
                    log.warning("more backward clock steps; they are only counted in clock_steps_back")
        for b in bufs:
            b.drain(final)

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
        va, ok_a = interpolate(acc.released_t, acc.released_v, grid, self.max_gap_ns)
        vg, ok_g = interpolate(gyr.released_t, gyr.released_v, grid, self.max_gap_ns)
        ok = ok_a & ok_g  # all True by construction of the grid; kept as a guard
        self._next_grid += n_range * p
        acc.trim_before(self._next_grid)
        gyr.trim_before(self._next_grid)
        self.stats.grid_points += int(ok.sum())
        self.stats.gap_points_skipped += int(n_range - ok.sum())
        return grid[ok], np.hstack([va[ok], vg[ok]])


def _grid_outside_gaps(lo: int, hi: int, p: int, streams: list[np.ndarray], max_gap_ns: int) -> np.ndarray:
    """Multiples of ``p`` in ``[lo, hi]`` not strictly inside a gap (consecutive samples more than ``max_gap_ns`` apart) of any stream.

    Costs the points returned plus the gaps, not the length of the range.
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
