"""A person's history on the device, in words: weeks and months with trends, recordings, edits, quality over rounds, storage.

Pure functions over plain values, for the History screen (:mod:`edge_client.app.screens.history`)
and its controller (:mod:`edge_client.app.history_edits`). A week runs Monday to Sunday; a period
still running is compared with the same days of the one before. Consecutive windows of one
activity less than ten seconds apart are one recording. Quality comes from the confusion matrices
of the start and personalised models on the device's own test windows over the last rounds.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from har_models.nn.metrics import macro_f1

RECORDING_GAP_NS = 10 * 10**9
"""Windows of one activity less than this apart (ns) are one recording."""

CONFUSED_SHARE = 0.15
"""A class "often taken for" another when at least this share of its test windows is predicted as that one."""

QUALITY_ROUNDS = 5
"""Rounds whose test windows the per-activity quality line sums."""


@dataclass(frozen=True)
class Period:
    """A week (Monday to Sunday) or a calendar month: ``kind`` and its first and last day (inclusive)."""

    kind: str
    first: dt.date
    last: dt.date

    @property
    def label(self) -> str:
        """``"week of 2 Mar 2026"`` or ``"March 2026"``."""
        if self.kind == "week":
            return f"week of {self.first.day} {self.first:%b %Y}"
        return f"{self.first:%B %Y}"

    def days(self, until: dt.date | None = None) -> list[dt.date]:
        """The period's days, up to ``until`` (inclusive) when given."""
        end = self.last if until is None else min(self.last, until)
        return [self.first + dt.timedelta(days=i) for i in range((end - self.first).days + 1)]

    def step(self, n: int) -> Period:
        """The period ``n`` periods later (``-1``: the one before)."""
        if self.kind == "week":
            return period_of("week", self.first + dt.timedelta(weeks=n))
        month = self.first.year * 12 + self.first.month - 1 + n
        return period_of("month", dt.date(month // 12, month % 12 + 1, 1))


def period_of(kind: str, day: dt.date) -> Period:
    """The week or month holding ``day``; ValueError for a kind other than "week" or "month"."""
    if kind == "week":
        first = day - dt.timedelta(days=day.weekday())
        return Period("week", first, first + dt.timedelta(days=6))
    if kind == "month":
        first = day.replace(day=1)
        nxt = (first + dt.timedelta(days=32)).replace(day=1)
        return Period("month", first, nxt - dt.timedelta(days=1))
    raise ValueError(f"period {kind!r}: use 'week' or 'month'")


def compare_periods(period: Period, today: dt.date, day_minutes: Callable[[dt.date], np.ndarray]) -> tuple[np.ndarray, np.ndarray, bool]:
    """Minutes per activity (C,) in ``period`` up to ``today``, in the matching days of the period before, and whether the
    period is still running (``before`` then covers only as many of its days as have passed); ``day_minutes`` gives a day's."""
    days = period.days(today)
    prev = period.step(-1)
    partial = today < period.last
    prev_days = prev.days()[: len(days)] if partial else prev.days()
    n = len(day_minutes(period.first))
    now = np.sum([day_minutes(d) for d in days], axis=0) if days else np.zeros(n)
    before = np.sum([day_minutes(d) for d in prev_days], axis=0) if prev_days else np.zeros(n)
    return now, before, partial


def duration_words(minutes: float) -> str:
    """``"45 min"``, ``"3 h 10 min"``, ``"under a minute"``."""
    m = round(minutes)
    if m < 1:
        return "under a minute"
    return f"{m} min" if m < 60 else f"{m // 60} h {m % 60} min"


def change_words(now: float, before: float) -> str:
    """``"+25 min (+15 %)"``, ``"-10 min (-8 %)"``, ``"no change"``, ``"+25 min (none before)"``."""
    diff = round(now - before)
    if diff == 0:
        return "no change"
    sign = "+" if diff > 0 else "-"
    pct = f"{sign}{abs(diff) / before * 100:.0f} %" if before >= 1 else "none before"
    return f"{sign}{duration_words(abs(diff))} ({pct})"


def trend_lines(names: Sequence[str], now: np.ndarray, before: np.ndarray, active: np.ndarray, period: Period,
                partial: bool) -> list[str]:  # fmt: skip
    """The period's minutes per activity (names by class) with the change against the period before, then the active
    minutes (``active``: :func:`edge_client.timeline.active_classes`), e.g. ``"Active: 3 h 10 min, +25 min (+15 %) against
    the same days of the week before"``."""
    against = f"the same days of the {period.kind} before" if partial else f"the {period.kind} before"
    lines = [f"{n.replace('_', ' ')}: {duration_words(now[k])}, {change_words(now[k], before[k])}"
             for k, n in enumerate(names) if now[k] >= 0.5 or before[k] >= 0.5]  # fmt: skip
    a_now, a_before = float(now[active].sum()), float(before[active].sum())
    lines.append(f"Active: {duration_words(a_now)}, {change_words(a_now, a_before)} against {against}")
    return lines


@dataclass(frozen=True)
class RecordingGroup:
    """One recording in the recorded-window log: its activity, its windows' positions ``[start, stop)`` in the log, and the
    first and last window's start (ns, the clock the windows were stamped in)."""

    label: int
    start: int
    stop: int
    t_first_ns: int
    t_last_ns: int

    @property
    def windows(self) -> int:
        return self.stop - self.start


def recording_groups(t_ns: np.ndarray, y: np.ndarray, gap_ns: int = RECORDING_GAP_NS) -> list[RecordingGroup]:
    """The log's recordings, oldest first: runs of consecutive windows of one activity, each less than ``gap_ns`` after the
    one before (``t_ns``, ``y``: :meth:`edge_client.window_log.WindowLog.index`)."""
    t, y = np.asarray(t_ns, np.int64), np.asarray(y, np.int64)
    if t.size == 0:
        return []
    dt_ns = np.diff(t)
    cut = np.flatnonzero((np.diff(y) != 0) | (dt_ns <= 0) | (dt_ns > gap_ns)) + 1
    bounds = [0, *cut.tolist(), t.size]
    return [RecordingGroup(int(y[a]), a, b, int(t[a]), int(t[b - 1])) for a, b in itertools.pairwise(bounds)]


def windows_words(train: int, test: int) -> str:
    """``"45 training and 11 test windows"`` (``"3 training and 1 test window"``)."""
    return f"{train} training and {test} test window{'s' if test != 1 else ''}"


def quality_lines(entries: Sequence[dict[str, Any]], names: Sequence[str], rounds: int = QUALITY_ROUNDS) -> list[str]:
    """How well the device's own model knows each activity over the last ``rounds`` kept rounds (``personal`` confusion
    matrices, :data:`edge_client.app.round_notes.QUALITY_KEY`): ``"walking upstairs: 71 % recognised, often taken for
    walking (24 test windows)"``; empty without any round."""
    cms = [np.asarray(e["personal"], np.int64) for e in entries[-rounds:] if e.get("personal")]
    cms = [m for m in cms if m.shape == (len(names), len(names))]
    if not cms:
        return []
    cm = np.sum(cms, axis=0)
    out = []
    for k, name in enumerate(names):
        row = int(cm[k].sum())
        if row == 0:
            continue
        line = f"{name.replace('_', ' ')}: {cm[k, k] / row * 100:.0f} % recognised"
        others = cm[k].copy()
        others[k] = -1
        j = int(np.argmax(others))
        if others[j] >= CONFUSED_SHARE * row:
            line += f", often taken for {names[j].replace('_', ' ')}"
        out.append(f"{line} ({row} test windows)")
    return out


def f1_curve(entries: Sequence[dict[str, Any]]) -> list[tuple[int, float | None, float | None]]:
    """``(round, start macro-F1, personalised macro-F1)`` per kept round, oldest first (None where a matrix is missing or empty)."""

    def f1(cm: Any) -> float | None:
        if not cm or not np.asarray(cm).sum():
            return None
        v = macro_f1(np.asarray(cm))
        return None if np.isnan(v) else v

    return [(int(e["round"]), f1(e.get("start")), f1(e.get("personal"))) for e in entries]


def size_words(n_bytes: float) -> str:
    """``"820 kB"``, ``"12.3 MB"``, ``"1.2 GB"``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}" if n_bytes < 100 * scale else f"{n_bytes / scale:.0f} {unit}"
    return f"{int(n_bytes)} B"


def storage_lines(recorded_bytes: float, windows: int, timeline: dict[str, float], other_bytes: float) -> list[str]:
    """What the app keeps on the device and its size: the recorded-window log, the timeline
    (:meth:`~edge_client.timeline_store.TimelineStore.usage`) and everything else (models, training state, exports)."""
    total = recorded_bytes + timeline["bytes"] + other_bytes
    raw = duration_words(timeline["raw_s"] / 60)
    return [
        f"Recorded activity: {size_words(recorded_bytes)} ({windows} windows)",
        f"Timeline: {size_words(timeline['bytes'])} ({raw} of raw samples, {int(timeline['predictions'])} recognised windows)",
        f"Models, training state and exports: {size_words(other_bytes)}",
        f"In all: {size_words(total)}",
    ]


@dataclass(frozen=True)
class Edit:
    """What one change to the history ("relabel", "undo", "delete_span", "delete_recording"; ``detail`` in words) did:
    windows added to or removed from the recorded-window log, the store's (training, test) windows before and after."""

    what: str
    detail: str
    windows: int
    before: tuple[int, int]
    after: tuple[int, int]


def edit_words(edit: Edit, min_train: int) -> str:
    """The change in words, with its effect on the next round (``min_train``: :data:`edge_client.app.config.MIN_TRAIN_WINDOWS`)."""
    d_train, d_test = edit.after[0] - edit.before[0], edit.after[1] - edit.before[1]
    n_train, n_test = edit.after
    if edit.what == "relabel":
        if not edit.windows:
            return "relabelled; its raw samples are no longer kept, so it gives no training windows"
        return f"{windows_words(d_train, d_test)} from this stretch ({n_train} training windows in all); the next round trains on them"
    head = {"undo": f"undid the correction {edit.detail}", "delete_span": f"deleted {edit.detail} from the timeline",
            "delete_recording": f"deleted the recording {edit.detail}"}.get(edit.what, edit.what)  # fmt: skip
    if not edit.windows:
        return f"{head}; no training windows came from it"
    gone = windows_words(-d_train, -d_test)
    out = f"{head}: {gone} fewer; the next round trains on {n_train} and tests on {n_test} (rounds already done keep what they learnt)"
    if n_train < min_train:
        out += f"; too few to take part until {min_train - n_train} more training windows are recorded"
    return out
