"""Clock rules of one sensor stream: which stamps are its clock, and where that clock steps.

A sensor stamps its samples with a device clock (Android's boot clock, a board's host
clock). That clock can be wrong for one sample (a garbage stamp), can start wrong (a bad
first stamp), and can step: an NTP correction or a boot-clock reset moves every later stamp
forward or back by the same amount, after which the clock advances normally again. The
resampler (:class:`har_models.data.resample.Resampler`) judges each of its two streams with
:class:`ClockRules`, in arrival order only, so streaming sample by sample, in any chunking or
all at once gives the same decisions bit for bit:

* **Suspects.** A sample stamped more than ``jump_ns`` (default :data:`CLOCK_JUMP_NS`, 1 s)
  ahead of the stream's newest sample, or more than ``jump_ns`` behind it, is not believed at
  once. It is held in a *suspect group* with the samples that follow it within ``jump_ns`` of
  the group's newest stamp. Samples behind the newest by ``reorder_ns`` up to ``jump_ns`` are
  not suspects: they are late and dropped at once, as any out-of-order sample past the
  reorder horizon.
* **The threshold.** If the stream's own clock gets ``confirm_samples`` (default
  :data:`CONFIRM_SAMPLES`, 25: 0.5 s at 50 Hz) more samples first, the group was no step: a
  group ahead is dropped as outliers (``outliers_dropped``, one warning per resampler), a
  group behind is dropped as late (``late_dropped``, as before this rule). If the group gets
  ``confirm_samples`` samples first, the clock really stepped. So a step is at least 25
  consecutive samples, all more than 1 s off the clock and within 1 s of each other; 24 such
  samples, or any number of samples less than 1 s behind, are late samples.
* **A forward step** is taken as the stream's continuation on its stamps (``clock_steps``):
  a gap wider than ``max_gap_ns``, so no window spans it; samples of the old clock that still
  arrive are late.
* **A backward step** (``clock_steps_back``) starts a new *segment* of the stream. The old
  segment ends there: everything it still holds is released. The new segment's stamps are
  re-based, moved by a shift that is a whole number of grid periods and puts the segment's
  first stamp at least ``2 * jump_ns`` (2 s) after the old segment's newest one
  (:func:`step_shift`), so the output clock of the resampler only moves forward, no window
  spans the step and no sample is dropped as late or counted twice. Both streams share the
  device clock and must stay aligned, so the shift is agreed between them
  (:func:`agree_steps`): when both streams stepped at the same place (newest stamps before,
  and first stamps after, within ``jump_ns`` of each other) both take the larger of their two
  shifts; a stream that steps alone (the other one's clock ran on more than ``jump_ns`` past
  the step, or the recording ended) takes its own. A segment's samples wait until its shift
  is agreed, which is one confirmation (0.5 s) of latency on the stream that steps first.
  The step is logged once, with its size (the newest stamp before it minus the first after).
* **The start** of a stream is judged the same way: until one group of mutually close
  stamps has ``confirm_samples`` samples, the first stamp is no reference, so a wrong first
  stamp (far ahead or far behind the rest) is dropped as an outlier, not taken as the clock.
* **At close** an undecided group ahead is taken if it has more samples than its stream
  received since it opened (a forward step near the end of a recording), else dropped; an
  undecided group behind is dropped as late (fewer than 25 samples cannot fill a window);
  at the start the largest group wins.

Label tracks are in the same clock as the resampler's output: the sensor's stamps up to the
first backward step, re-based after it (see :meth:`ClockRules.clock_ns`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("har_models.data.resample")  # the resampler's logger: one place to watch

CLOCK_JUMP_NS = 1_000_000_000
"""Default ``jump_ns``: a stamp this far (1 s) ahead of or behind its stream's newest sample is suspect until decided."""

CONFIRM_SAMPLES = 25
"""Default ``confirm_samples``: samples (0.5 s at 50 Hz) that decide between a clock step and an outlier or late samples."""

MAX_SUSPECT_GROUPS = 8
"""Suspect groups held at once per stream; opening one more drops the oldest."""

_INT64_MIN = int(np.iinfo(np.int64).min)


@dataclass
class ResampleStats:
    """Counters of what the resampler did, for logs and tests.

    Attributes
    ----------
    accepted : int
        Raw samples (both streams) used for interpolation.
    late_dropped : int
        Raw samples stamped ``reorder_ns`` or more before their stream's newest earlier
        arrival, including groups far behind that too few samples followed
        (:mod:`har_models.data.clock`).
    duplicates_dropped : int
        Raw samples whose timestamp an earlier arrival of the same stream already had.
    grid_points : int
        Grid samples emitted.
    gap_points_skipped : int
        Grid points inside the common span of the streams that fell into a gap.
    nonfinite_dropped : int
        Raw samples with a NaN or infinite value.
    outliers_dropped : int
        Raw samples stamped more than ``jump_ns`` ahead of their stream's clock, or far from
        its first settled stamps, that too few later samples followed.
    clock_steps : int
        Forward steps of a stream's clock that were confirmed and taken as a gap (per stream).
    clock_steps_back : int
        Backward steps of a stream's clock that were confirmed and re-based as a new segment (per stream).
    """

    accepted: int = 0
    late_dropped: int = 0
    duplicates_dropped: int = 0
    grid_points: int = 0
    gap_points_skipped: int = 0
    nonfinite_dropped: int = 0
    outliers_dropped: int = 0
    clock_steps: int = 0
    clock_steps_back: int = 0


@dataclass
class SuspectGroup:
    """Samples held because their stamps are far from the stream's clock.

    Attributes
    ----------
    top : int
        Newest stamp of the group, ns.
    behind : bool
        The group opened more than ``jump_ns`` behind a known clock (a backward step or late samples).
    t, v : list
        Stamps (ns) and (3,) values in arrival order.
    seen : int
        Samples the stream's own clock received since the group opened.
    """

    top: int
    behind: bool = False
    t: list[int] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)
    seen: int = 0


@dataclass
class Segment:
    """One stretch of a stream on one clock, between backward steps.

    Attributes
    ----------
    top : int
        Newest stamp of the previous segment when this one opened, ns (0 for the first).
    first : int
        Smallest stamp of the samples that opened it, ns.
    proposal : int
        Shift relative to the previous segment this stream asks for (:func:`step_shift`), ns.
    rel : int or None
        Agreed shift relative to the previous segment, ns; None until agreed.
    shift : int or None
        Re-based stamp minus raw stamp in this segment, ns; None until it and every earlier one are agreed.
    """

    top: int
    first: int
    proposal: int
    rel: int | None = None
    shift: int | None = None


def step_shift(top_ns: int, first_ns: int, period_ns: int, jump_ns: int) -> int:
    """Shift of a new segment after a backward step: a multiple of ``period_ns`` that puts it at least ``2 * jump_ns`` after the old one.

    ``ceil((top_ns - first_ns) / period_ns) * period_ns + ceil(2 * jump_ns / period_ns) * period_ns``.
    A whole number of grid periods keeps the grid's phase, so the re-based samples are
    interpolated exactly as their raw stamps would be. The gap of at least ``2 * jump_ns``
    exceeds ``reorder_ns + max_gap_ns`` (both at most ``jump_ns``), so even a sample accepted
    ``reorder_ns`` before ``first_ns`` lands past the old segment by more than ``max_gap_ns``.
    Example: top = T0 + 59.98 s, first = T0 - 60 s, 20 ms grid, 1 s jump: 119.98 s + 2 s = 121.98 s.

    Parameters
    ----------
    top_ns : int
        Newest stamp of the old segment, ns.
    first_ns : int
        Smallest stamp of the new segment's first samples, ns (< ``top_ns``).
    period_ns, jump_ns : int
        Grid period and jump threshold, ns (> 0).

    Returns
    -------
    int
        Shift, ns, > ``top_ns - first_ns``.
    """
    p = int(period_ns)
    return -(-(int(top_ns) - int(first_ns)) // p) * p + -(-2 * int(jump_ns) // p) * p


class ClockRules:
    """Routing of one stream's arrivals between its clock and suspect groups (module rules).

    A subclass supplies what happens to samples on the clock (:meth:`_accept`, which must
    advance :attr:`newest`) and how a segment ends at a backward step (:meth:`_end_segment`).

    Parameters
    ----------
    period_ns, jump_ns, confirm : int
        Grid period, jump threshold (ns) and samples that decide a group.
    name : str
        Stream name for log lines ("acc", "gyro").
    warned : set of str, optional
        Warning kinds already logged (shared by a resampler's streams: one warning each).
    """

    def __init__(self, period_ns: int, jump_ns: int, confirm: int, name: str = "stream", warned: set[str] | None = None) -> None:
        self.period_ns = int(period_ns)
        self.jump_ns, self.confirm, self.name = int(jump_ns), int(confirm), name
        self._warned = warned if warned is not None else set()
        self.clock_known = False  # False until one group of close stamps has `confirm` samples
        self.groups: list[SuspectGroup] = []  # held samples far from the stream's clock, oldest first
        self.newest = _INT64_MIN  # newest stamp on the current segment's clock (accepted or late)
        self.segments: list[Segment] = []  # one per clock, from the moment the clock is known

    def _accept(self, t: np.ndarray, v: np.ndarray, stats: ResampleStats) -> None:
        raise NotImplementedError

    def _end_segment(self, stats: ResampleStats) -> None:
        raise NotImplementedError

    def push(self, t: np.ndarray, v: np.ndarray, stats: ResampleStats) -> None:
        """Route samples (int64 ns (n,), values (n, 3), arrival order) to the clock or to suspect groups."""
        i, n = 0, t.size
        while i < n:
            if self.clock_known and not self.groups:
                # Fast path: everything up to the first stamp far ahead of or behind the running maximum.
                prev = np.maximum.accumulate(np.concatenate([np.array([self.newest], np.int64), t[i : n - 1]]))
                far = np.flatnonzero((t[i:] - prev > self.jump_ns) | (prev - t[i:] > self.jump_ns))  # prev is a real stamp
                j = n if far.size == 0 else i + int(far[0])
                self._accept(t[i:j], v[i:j], stats)
                i = j
                if i < n:
                    self._suspect(int(t[i]), v[i], stats)
                    i += 1
            else:
                x = int(t[i])
                if self.clock_known and self.newest - self.jump_ns <= x <= self.newest + self.jump_ns:
                    self._accept(t[i : i + 1], v[i : i + 1], stats)
                    for g in self.groups:
                        g.seen += 1
                    for g in [g for g in self.groups if g.seen >= self.confirm]:
                        self._drop(g, stats)
                else:
                    self._suspect(x, v[i], stats)
                i += 1

    def _suspect(self, x: int, v: np.ndarray, stats: ResampleStats) -> None:
        """Hold a sample far from the stream's clock in the first group it fits, or a new one."""
        g = next((g for g in self.groups if abs(x - g.top) <= self.jump_ns), None)
        if g is None:
            if len(self.groups) >= MAX_SUSPECT_GROUPS:
                self._drop(self.groups[0], stats)
            g = SuspectGroup(x, behind=self.clock_known and x < self.newest)
            self.groups.append(g)
        g.t.append(x)
        g.v.append(np.array(v, np.float64))
        g.top = max(g.top, x)
        if len(g.t) >= self.confirm:
            self._take(g, stats)

    def _take(self, g: SuspectGroup, stats: ResampleStats) -> None:
        """Group ``g`` is the stream's clock from now on; every other held group was not."""
        for other in [o for o in self.groups if o is not g]:
            self._drop(other, stats)
        self.groups = []
        t, v = np.array(g.t, np.int64), np.array(g.v, np.float64).reshape(-1, 3)
        if not self.clock_known:
            self.clock_known = True
            self.segments.append(Segment(0, int(t.min()), 0, 0, 0))
        elif g.behind:
            stats.clock_steps_back += 1
            top = self.newest
            self._end_segment(stats)
            self.newest = _INT64_MIN
            self.segments.append(Segment(top, int(t.min()), step_shift(top, int(t.min()), self.period_ns, self.jump_ns)))
        else:
            stats.clock_steps += 1
            self._warn_once(
                "step", "%s clock stepped forward by %.3f s; taken as a gap (no window spans it)", self.name, (g.t[0] - self.newest) / 1e9
            )
        self._accept(t, v, stats)

    def _drop(self, g: SuspectGroup, stats: ResampleStats) -> None:
        self.groups = [o for o in self.groups if o is not g]
        if g.behind:  # a few samples far behind the clock: late, as the reorder rule has always said
            stats.late_dropped += len(g.t)
            return
        stats.outliers_dropped += len(g.t)
        where = "far from the stream's first settled stamps"
        if self.clock_known:
            where = f"{(g.t[0] - self.newest) / 1e9:+.3f} s from the stream's clock"
        self._warn_once(
            "outlier",
            "%s: dropped %d sample(s) stamped %s (a clock outlier); later ones are only counted in outliers_dropped",
            self.name,
            len(g.t),
            where,
        )

    def _warn_once(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(msg, *args)

    def settle(self, stats: ResampleStats) -> None:
        """End of the recording: decide the groups still held (module rule "At close")."""
        if not self.groups:
            return
        if not self.clock_known:  # the start never settled: the largest group (first among equals) is the clock
            self._take(max(self.groups, key=lambda g: len(g.t)), stats)
            return
        for g in list(self.groups):
            if g in self.groups:
                if len(g.t) > g.seen and not g.behind:
                    self._take(g, stats)
                else:
                    self._drop(g, stats)

    def clock_ns(self) -> int | None:
        """Newest stamp on the stream's clock, in the re-based output clock (ns); None before the clock is known.

        While a new segment's shift is not agreed yet, the newest stamp of the last segment
        whose shift is (its end): the new segment will lie after it.
        """
        if not self.segments:
            return None
        seg = self.segments[-1]
        if seg.shift is not None:
            return self.newest + seg.shift
        k = len(self.segments) - 1
        while self.segments[k - 1].shift is None:
            k -= 1
        prev_shift = self.segments[k - 1].shift
        assert prev_shift is not None  # segment 0 has shift 0
        return self.segments[k].top + prev_shift


def known_shift(segments: Sequence[Segment]) -> int:
    """Shift (re-based minus raw stamp, ns) of the newest segment whose shift is agreed; 0 without a step."""
    return next((seg.shift for seg in reversed(segments) if seg.shift is not None), 0)


def agree_steps(streams: Sequence[ClockRules], final: bool) -> list[str]:
    """Agree the shifts of the two streams' new segments (module rule "A backward step"); return a log line per step decided.

    For segment k of one stream, not yet agreed: if the other stream has a segment k too and
    both opened at the same place (tops and firsts within ``jump_ns``), both take the larger
    proposal; if they opened elsewhere, each its own. If the other stream is still on segment
    k - 1 and its clock ran more than ``jump_ns`` past this step, it did not step here: this
    stream takes its own proposal. Otherwise the segment waits, until ``final``. Every
    condition is a function of the two streams' arrivals, not of how they interleave.

    Parameters
    ----------
    streams : two ClockRules
        The resampler's streams (acc, gyro).
    final : bool
        End of the recording: every open segment is decided.

    Returns
    -------
    list of str
        One line per step whose shift became known, for the log.
    """
    a, b = streams
    lines: list[str] = []
    for s, o in ((a, b), (b, a)):
        for k in range(1, len(s.segments)):
            seg = s.segments[k]
            if seg.rel is not None:
                continue
            if len(o.segments) > k:
                other = o.segments[k]
                if abs(other.top - seg.top) <= s.jump_ns and abs(other.first - seg.first) <= s.jump_ns:
                    seg.rel = max(seg.proposal, other.proposal if other.rel is None else other.rel)
                    if other.rel is None:
                        other.rel = seg.rel
                        lines.append(
                            f"the sensor clock stepped back by {(seg.top - seg.first) / 1e9:.3f} s on {s.name} and "
                            f"{(other.top - other.first) / 1e9:.3f} s on {o.name} (newest stamp before the step minus the first "
                            f"after it); the samples after it are kept, re-based by +{seg.rel / 1e9:.3f} s as a new segment "
                            "(no window spans the step)"
                        )
                        continue
                else:
                    seg.rel = seg.proposal
            elif (len(o.segments) == k and o.newest > seg.top + s.jump_ns) or final:
                seg.rel = seg.proposal
            else:
                break
            lines.append(
                f"the {s.name} clock stepped back by {(seg.top - seg.first) / 1e9:.3f} s (newest stamp before the step minus "
                f"the first after it); the samples after it are kept, re-based by +{seg.rel / 1e9:.3f} s as a new segment "
                "(no window spans the step)"
            )
    for s in streams:
        for k in range(1, len(s.segments)):
            seg, prev = s.segments[k], s.segments[k - 1]
            if seg.shift is None and seg.rel is not None and prev.shift is not None:
                seg.shift = prev.shift + seg.rel
    return lines
