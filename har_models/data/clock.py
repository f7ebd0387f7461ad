"""Clock rules of one sensor stream: which stamps are its clock, and where that clock steps.

A device clock can be wrong for one sample, start wrong, or step (an NTP correction or a
boot-clock reset moves every later stamp by the same amount). The resampler judges each stream
with :class:`ClockRules`, in arrival order only, so decisions do not depend on chunking:

* **Suspects.** A sample more than ``jump_ns`` (:data:`CLOCK_JUMP_NS`, 1 s) ahead of or behind
  the stream's newest is held in a *suspect group* with the samples that follow within
  ``jump_ns`` of the group's newest. Samples ``reorder_ns`` to ``jump_ns`` behind are late.
* **The threshold.** If the clock gets ``confirm_samples`` (:data:`CONFIRM_SAMPLES`, 25: 0.5 s
  at 50 Hz) more samples first, a group ahead is dropped as outliers, a group behind as late;
  if the group gets them first, the clock stepped.
* **A forward step** (``clock_steps``) is a gap wider than ``max_gap_ns``; old-clock stragglers are late.
* **A backward step** (``clock_steps_back``) starts a new *segment*: the old one releases what it
  holds, the new one is re-based by a whole number of grid periods to at least ``2 * jump_ns``
  after the old one's newest stamp (:func:`step_shift`), so the output clock only moves forward
  and nothing is dropped or counted twice. The two streams agree the shift
  (:func:`agree_steps`); a segment waits for it (0.5 s latency on the stream that steps first).
* **The start** is judged the same way: a wrong first stamp is dropped, not taken as the clock.
* **At close** an undecided group ahead is taken if it outnumbers what its stream received
  since it opened, else dropped; a group behind is dropped as late; at the start the largest wins.

Label tracks are in the resampler's output clock (:meth:`ClockRules.clock_ns`).
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
    """Counters of what the resampler did, for logs and tests (raw samples of both streams unless said).

    Attributes
    ----------
    accepted : int
        Samples used for interpolation.
    late_dropped : int
        Samples ``reorder_ns`` or more before their stream's newest, and groups far behind that too few followed.
    duplicates_dropped : int
        Samples whose stamp an earlier arrival of the stream had.
    grid_points : int
        Grid samples emitted.
    gap_points_skipped : int
        Grid points in the streams' common span that fell into a gap.
    nonfinite_dropped : int
    outliers_dropped : int
        Samples far from their stream's clock that too few later samples followed.
    clock_steps, clock_steps_back : int
        Confirmed forward steps (taken as gaps) and backward steps (re-based), per stream.
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

    ``top``: newest stamp, ns; ``behind``: opened more than ``jump_ns`` behind a known clock;
    ``t``, ``v``: stamps and (3,) values in arrival order; ``seen``: samples the clock got since.
    """

    top: int
    behind: bool = False
    t: list[int] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)
    seen: int = 0


@dataclass
class Segment:
    """One stretch of a stream on one clock, between backward steps (stamps and shifts in ns).

    ``top``: the previous segment's newest stamp (0 for the first); ``first``: smallest opening
    stamp; ``proposal``: the shift this stream asks for (:func:`step_shift`); ``rel``: the agreed
    shift relative to the previous segment; ``shift``: re-based minus raw stamp, once it and every
    earlier one are agreed (None until then).
    """

    top: int
    first: int
    proposal: int
    rel: int | None = None
    shift: int | None = None


def step_shift(top_ns: int, first_ns: int, period_ns: int, jump_ns: int) -> int:
    """Shift (ns, > ``top_ns - first_ns``) of a new segment after a backward step.

    ``ceil((top_ns - first_ns) / period_ns) * period_ns + ceil(2 * jump_ns / period_ns) * period_ns``:
    whole grid periods keep the grid's phase, and ``2 * jump_ns`` exceeds ``reorder_ns + max_gap_ns``,
    so even a sample accepted ``reorder_ns`` early lands more than ``max_gap_ns`` past the old segment.
    """
    p = int(period_ns)
    return -(-(int(top_ns) - int(first_ns)) // p) * p + -(-2 * int(jump_ns) // p) * p


class ClockRules:
    """Routing of one stream's arrivals between its clock and suspect groups (module rules).

    A subclass supplies :meth:`_accept` (must advance :attr:`newest`) and :meth:`_end_segment`.
    ``warned``: warning kinds already logged, shared by a resampler's streams.
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

        While a new segment's shift is not agreed, the end of the last agreed segment.
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

    Segment k of one stream: if the other has a segment k opened at the same place (tops and
    firsts within ``jump_ns``), both take the larger proposal, else each its own; if the other is
    still on k - 1 and ran more than ``jump_ns`` past this step, this one takes its own; otherwise
    it waits, until ``final``. Independent of how the streams' arrivals interleave.
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
