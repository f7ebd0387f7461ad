"""The day as recognised activity: per-window predictions smoothed into stretches, minutes per day.

Pure functions over plain arrays, for the timeline store and the Today screen. The smoothing rule
(:func:`smooth_stretches`): (1) each window takes the most frequent activity among the ``k`` windows
centred on it (5, 6.4 s; a tie keeps its own if tied, else the lowest class); (2) consecutive
windows of one activity form a stretch from the first start to the last start plus one step, and
windows more than ``max_gap_ns`` apart end it (no activity is invented); (3) a stretch shorter than
``min_ns`` (10 s) touching a neighbour is absorbed, shortest first: into both when they carry the
same activity, else into the longer one; a short stretch alone between gaps is kept.
"""

from __future__ import annotations

import csv
import heapq
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STEP_NS = 1_280_000_000
"""Time between window starts (64 samples at 50 Hz), ns: the length one window stands for."""

ACTIVE_WORDS = ("walk", "run", "stair", "cycl", "bik", "jump")
"""An activity whose name contains one of these counts toward the weekly goal of active minutes."""

DEFAULT_WEEKLY_GOAL_MIN = 150
"""Active minutes a week, as WHO/AHA and Google Fit's Heart Points target."""


@dataclass(frozen=True)
class Stretch:
    """One stretch of one activity: wall-clock start and end (ns since the epoch, ``end_ns > start_ns``), class index,
    and whether the person relabelled it."""

    start_ns: int
    end_ns: int
    label: int
    corrected: bool = False

    @property
    def minutes(self) -> float:
        """Length in minutes."""
        return (self.end_ns - self.start_ns) / 60e9


def majority(labels: np.ndarray, k: int = 5) -> np.ndarray:
    """Each label (>= 0) replaced by the most frequent one among the ``k`` labels centred on it (odd ``k``; 1: no change).

    Raises ValueError if ``k`` is not a positive odd number or a label is negative.
    """
    y = np.asarray(labels, np.int64).reshape(-1)
    if k < 1 or k % 2 == 0:
        raise ValueError(f"majority: k must be a positive odd number, got {k}")
    if y.size and y.min() < 0:
        raise ValueError(f"majority: labels must be >= 0, got {int(y.min())}")
    if y.size == 0:
        return y.copy()
    h, n = k // 2, y.size
    # Counts per class over each centred window, from cumulative sums of one-hot rows: (N, C) at once.
    cs = np.zeros((n + 1, int(y.max()) + 1), np.int64)
    np.cumsum(np.eye(cs.shape[1], dtype=np.int64)[y], axis=0, out=cs[1:])
    i = np.arange(n)
    counts = cs[np.minimum(n, i + h + 1)] - cs[np.maximum(0, i - h)]
    own = counts[i, y] == counts.max(axis=1)
    return np.where(own, y, counts.argmax(axis=1))  # argmax: the lowest index among the tied


def _runs(t_ns: np.ndarray, y: np.ndarray, step_ns: int, max_gap_ns: int) -> list[list[int]]:
    """[start_ns, end_ns, label, touches_previous] for each run of equal labels without a gap."""
    if y.size == 0:
        return []
    gap = np.diff(t_ns) > max_gap_ns
    first = np.flatnonzero(np.concatenate([[True], (y[1:] != y[:-1]) | gap]))
    last = np.concatenate([first[1:] - 1, [y.size - 1]])
    runs: list[list[int]] = []
    for a, b in zip(first.tolist(), last.tolist(), strict=True):
        touches = a > 0 and not bool(gap[a - 1])
        if touches:
            runs[-1][1] = min(runs[-1][1], int(t_ns[a]))  # the next activity starts where its first window starts
        runs.append([int(t_ns[a]), int(t_ns[b]) + step_ns, int(y[a]), int(touches)])
    return runs


def smooth_stretches(
    t_ns: np.ndarray,
    labels: np.ndarray,
    k: int = 5,
    step_ns: int = STEP_NS,
    max_gap_ns: int = 5_000_000_000,
    min_ns: int = 10_000_000_000,
) -> list[Stretch]:
    """Per-window predictions (starts ``t_ns`` increasing) smoothed into stretches, in time order (the module's rule).

    ``step_ns``: the time one window stands for (1.28 s). Raises ValueError if the arrays differ in
    length or the times do not increase.
    """
    t = np.asarray(t_ns, np.int64).reshape(-1)
    y = np.asarray(labels, np.int64).reshape(-1)
    if t.shape != y.shape:
        raise ValueError(f"smooth_stretches: t_ns {t.shape} and labels {y.shape} must have the same length")
    if t.size > 1 and np.any(np.diff(t) <= 0):
        raise ValueError("smooth_stretches: t_ns must increase strictly (sort the windows by start time)")
    runs = _runs(t, majority(y, k), step_ns, max_gap_ns)
    return [Stretch(r[0], r[1], r[2]) for r in _merge_blips(runs, min_ns)]


def _merge_blips(runs: list[list[int]], min_ns: int) -> list[list[int]]:
    """Step 3 of the rule, shortest first (ties: the earliest), O(R log R) with a heap; a neighbour counts only when it
    touches (``touches_previous`` of the later run)."""
    n = len(runs)
    prev = list(range(-1, n - 1))
    nxt = [*range(1, n), -1]
    alive = [True] * n
    version = [0] * n

    def eligible(i: int) -> bool:
        r = runs[i]
        return r[1] - r[0] < min_ns and (bool(r[3]) or (nxt[i] >= 0 and bool(runs[nxt[i]][3])))

    heap = [(r[1] - r[0], i, 0) for i, r in enumerate(runs) if eligible(i)]
    heapq.heapify(heap)

    def unlink(i: int) -> None:
        alive[i] = False
        p, q = prev[i], nxt[i]
        if p >= 0:
            nxt[p] = q
        if q >= 0:
            prev[q] = p

    def touch(i: int) -> None:
        version[i] += 1
        if eligible(i):
            heapq.heappush(heap, (runs[i][1] - runs[i][0], i, version[i]))

    while heap:
        _, i, v = heapq.heappop(heap)
        if not alive[i] or v != version[i] or not eligible(i):
            continue
        p = prev[i] if runs[i][3] else -1
        q = nxt[i] if nxt[i] >= 0 and runs[nxt[i]][3] else -1
        if p >= 0 and q >= 0 and runs[p][2] == runs[q][2]:
            runs[p][1] = runs[q][1]
            unlink(i)
            unlink(q)
            touch(p)
        elif p >= 0 and (q < 0 or runs[p][1] - runs[p][0] >= runs[q][1] - runs[q][0]):
            runs[p][1] = runs[i][1]
            unlink(i)
            touch(p)
        else:
            runs[q][0], runs[q][3] = runs[i][0], runs[i][3]
            unlink(i)
            touch(q)
            if prev[q] >= 0:
                touch(prev[q])  # its later neighbour now touches it or not as the merged run does
    return [r for i, r in enumerate(runs) if alive[i]]


def apply_corrections(stretches: Sequence[Stretch], corrections: Sequence[Stretch]) -> list[Stretch]:
    """The stretches (time order) with the corrections (in the order made, a later one wins) laid over them, in time
    order; the corrected parts have ``corrected=True``."""
    out = list(stretches)
    for c in corrections:
        cut: list[Stretch] = []
        for s in out:
            if s.end_ns <= c.start_ns or s.start_ns >= c.end_ns:
                cut.append(s)
                continue
            if s.start_ns < c.start_ns:
                cut.append(Stretch(s.start_ns, c.start_ns, s.label, s.corrected))
            if s.end_ns > c.end_ns:
                cut.append(Stretch(c.end_ns, s.end_ns, s.label, s.corrected))
        cut.append(Stretch(c.start_ns, c.end_ns, c.label, True))
        out = sorted(cut, key=lambda s: s.start_ns)
    return out


def minutes_per_activity(stretches: Sequence[Stretch], n_classes: int, start_ns: int, end_ns: int) -> np.ndarray:
    """Minutes of each activity ``(n_classes,)`` between ``start_ns`` and ``end_ns`` (stretches clipped to that span)."""
    out = np.zeros(n_classes)
    for s in stretches:
        a, b = max(s.start_ns, start_ns), min(s.end_ns, end_ns)
        if b > a:
            out[s.label] += (b - a) / 60e9
    return out


def active_classes(names: Sequence[str]) -> np.ndarray:
    """Mask of shape (len(names),), True for activities that count toward the weekly goal (:data:`ACTIVE_WORDS`)."""
    return np.array([any(w in n.lower() for w in ACTIVE_WORDS) for n in names], bool)


def guidance(counts: dict[str, int], target: int = 40) -> list[str]:
    """What to record next: one sentence per activity with fewer than ``target`` training windows (40: about 51 s of
    recording), fewest first; empty when every one has enough."""
    short = sorted((n, a) for a, n in counts.items() if n < target)
    return [
        f"{a.replace('_', ' ')}: {target - n} more windows (about {(target - n) * STEP_NS / 60e9:.1f} min of recording)" for n, a in short
    ]


def day_csv(stretches: Sequence[Stretch], names: Sequence[str], tz_offset_s: int = 0) -> str:
    """A day's stretches as CSV text: ``start,end,activity,minutes,corrected`` (ISO 8601 times at ``tz_offset_s`` from UTC)."""
    import datetime as dt

    tz = dt.timezone(dt.timedelta(seconds=tz_offset_s))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["start", "end", "activity", "minutes", "corrected"])
    for s in stretches:
        w.writerow([dt.datetime.fromtimestamp(s.start_ns / 1e9, tz).isoformat(timespec="seconds"),
                    dt.datetime.fromtimestamp(s.end_ns / 1e9, tz).isoformat(timespec="seconds"),
                    names[s.label], f"{s.minutes:.2f}", int(s.corrected)])  # fmt: skip
    return buf.getvalue()
