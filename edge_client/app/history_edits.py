"""A history a person can correct: relabel a stretch, undo it, delete a stretch or a recording, set how long things are kept.

Every change goes to the timeline and the recorded-window log, then to the store's training and
test windows (:func:`~edge_client.recorder.sync_to_store`), so the next round trains on what the
person kept; each returns an :class:`~edge_client.history.Edit`. Rounds already taken part in keep
what they learnt.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_client.app.config import AppConfig
from edge_client.app.round_notes import QUALITY_KEY
from edge_client.app.words import clock_words, pretty
from edge_client.history import Edit, RecordingGroup, recording_groups, storage_lines
from edge_client.recorder import RECORDED_LOG, sync_to_store
from edge_client.store import ClientStore
from edge_client.timeline_store import Correction, TimelineStore
from edge_client.window_log import WindowLog

log = logging.getLogger("fedhar.app")

RECORDINGS_SHOWN = 20
"""Recordings the History screen lists (the newest)."""


@dataclass
class HistoryView:
    """What the History screen shows besides the timeline (which it reads itself).

    ``recordings``: the newest first, with ``label``, ``t_first_ns``/``t_last_ns`` (their windows'
    clock, as :meth:`HistoryEdits.delete_recording` takes them), ``windows`` and
    ``wall_first_ns``/``wall_last_ns`` (0 when older than the notes); ``quality``: the kept rounds'
    confusion matrices, oldest first; ``storage``: :func:`edge_client.history.storage_lines`.
    """

    recordings: list[dict[str, int]] = field(default_factory=list)
    quality: list[dict[str, Any]] = field(default_factory=list)
    storage: list[str] = field(default_factory=list)
    keep_days: float = 90.0
    keep_raw_days: float = 2.0


def _folder_bytes(folder: os.PathLike[str]) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # deleted while walking
                total += os.stat(os.path.join(root, name)).st_size
    return total


class HistoryEdits:
    """The history half of :class:`~edge_client.app.controller.DeviceController` (it holds the stores named below)."""

    cfg: AppConfig
    store: ClientStore
    window_log: WindowLog
    timeline: TimelineStore
    _on_counts: Callable[[dict[str, int]], None]

    def counts(self) -> dict[str, int]:
        """Recorded windows per activity (the recorded-window log's, relabelled stretches included)."""
        return {name: int(n) for name, n in zip(self.cfg.labels.names, self.window_log.counts(), strict=True)}

    def _split(self) -> tuple[int, int]:
        """The store's training and test windows after taking the log's windows (the 80/20 split)."""
        n_train, n_test = sync_to_store(self.window_log, self.store, self.cfg.split_seed, emptied=True)
        self._on_counts(self.counts())
        return n_train, n_test

    def _drop_correction_windows(self, c: Correction) -> int:
        """Delete from the log the training windows a correction made: its class, starting inside its span, newest first."""
        t, y = self.window_log.index()
        hits = np.flatnonzero((y == c.label) & (t >= c.start_ns) & (t < c.end_ns))
        drop = np.zeros(t.size, bool)
        drop[hits[len(hits) - min(c.windows, len(hits)) :]] = True
        return self.window_log.remove(drop)

    def _span_words(self, label: int, start_ns: int, end_ns: int) -> str:
        return f"{pretty(self.cfg.labels.names[label])} {clock_words(start_ns)}-{clock_words(end_ns)}"

    def relabel(self, start_ns: int, end_ns: int, activity: str) -> Edit:
        """Relabel a stretch of the timeline as ``activity`` (KeyError outside the label set); its raw samples become
        training and test windows for the next round (``windows``: 0 once they are older than the keep period)."""
        before = self._split()
        ws = self.timeline.relabel(start_ns, end_ns, activity)
        if len(ws):
            self.window_log.append(ws)
        after = self._split()
        log.info("relabelled %.1f min as %s: %d windows (%d training, %d test)", (end_ns - start_ns) / 60e9, activity, len(ws),
                 after[0] - before[0], after[1] - before[1])  # fmt: skip
        return Edit("relabel", self._span_words(self.cfg.labels.index(activity), start_ns, end_ns), len(ws), before, after)

    def undo_relabel(self, correction_id: int | None = None) -> Edit:
        """Undo a correction (default: the newest): the stretch shows the model's own activity again, its windows are deleted.

        Raises LookupError if there is no such correction (none made, or older than the keep period).
        """
        rows = self.timeline.correction_list(1) if correction_id is None else [c for c in self.timeline.correction_list(10**6)
                                                                              if c.id == correction_id]  # fmt: skip
        if not rows:
            raise LookupError("nothing to undo: no correction is kept" if correction_id is None else f"correction {correction_id} is gone")
        before = self._split()
        c = self.timeline.drop_correction(rows[0].id)
        assert c is not None
        removed = self._drop_correction_windows(c)
        return Edit("undo", self._span_words(c.label, c.start_ns, c.end_ns), removed, before, self._split())

    def delete_span(self, start_ns: int, end_ns: int) -> Edit:
        """Delete a stretch from the timeline: its activity, raw samples, and the corrections inside it with their training
        windows (ValueError if ``end_ns <= start_ns``)."""
        before = self._split()
        _, gone = self.timeline.delete_span(start_ns, end_ns)
        removed = sum(self._drop_correction_windows(c) for c in gone)
        detail = f"{clock_words(start_ns)}-{clock_words(end_ns)}"
        return Edit("delete_span", detail, removed, before, self._split())

    def _groups(self) -> list[RecordingGroup]:
        t, y = self.window_log.index()
        fixes = self.timeline.correction_list(10**6)
        return [g for g in recording_groups(t, y)
                if not any(c.label == g.label and c.start_ns <= g.t_first_ns and g.t_last_ns < c.end_ns for c in fixes)]  # fmt: skip

    def delete_recording(self, t_first_ns: int, t_last_ns: int, label: int) -> Edit:
        """Delete one recording (as :meth:`history` lists it) and its windows; LookupError if the log no longer holds it."""
        t, y = self.window_log.index()
        found = [g for g in recording_groups(t, y) if (g.label, g.t_first_ns, g.t_last_ns) == (label, t_first_ns, t_last_ns)]
        if not found:
            raise LookupError("that recording is no longer kept")
        g = found[0]
        before = self._split()
        drop = np.zeros(t.size, bool)
        drop[g.start : g.stop] = True
        removed = self.window_log.remove(drop)
        notes = [n for n in self.timeline.recording_notes() if n.label == label and n.t_first_ns <= t_last_ns and n.t_last_ns >= t_first_ns]
        for n in notes:
            self.timeline.forget_recording(n.id)
        when = f" of {clock_words(notes[-1].wall_first_ns)}" if notes else ""
        return Edit("delete_recording", f"{pretty(self.cfg.labels.names[label])}{when}", removed, before, self._split())

    def note_recorded(self, label: int, t_ns: np.ndarray, wall_ns: int) -> None:
        """Note when recorded windows came (:meth:`~edge_client.timeline_store.TimelineStore.note_recorded`); a failure is logged."""
        try:
            self.timeline.note_recorded(label, int(t_ns[0]), int(t_ns[-1]), len(t_ns), wall_ns)
        except Exception as exc:  # a full or read-only folder: recording goes on, only the note's time is lost
            log.error("timeline: cannot note a recording: %s", exc)

    def set_keep(self, keep_days: float, keep_raw_days: float) -> None:
        """Keep predictions ``keep_days`` and raw samples ``keep_raw_days``, deleting older ones at once (ValueError outside
        :data:`edge_client.timeline_store.KEEP_LIMITS`)."""
        self.timeline.set_keep(keep_days, keep_raw_days)

    def history(self) -> HistoryView:
        """The recordings, the quality of the kept rounds, the storage used and the keep periods."""
        notes = self.timeline.recording_notes()
        rows = []
        for g in reversed(self._groups()[-RECORDINGS_SHOWN:]):
            n = [x for x in notes if x.label == g.label and x.t_first_ns <= g.t_last_ns and x.t_last_ns >= g.t_first_ns]
            rows.append({"label": g.label, "t_first_ns": g.t_first_ns, "t_last_ns": g.t_last_ns, "windows": g.windows,
                         "wall_first_ns": n[-1].wall_first_ns if n else 0, "wall_last_ns": n[0].wall_last_ns if n else 0})  # fmt: skip
        folder = self.cfg.state_dir
        log_bytes = (folder / RECORDED_LOG).stat().st_size if (folder / RECORDED_LOG).exists() else 0
        usage = self.timeline.usage()
        other = max(0, _folder_bytes(folder) - log_bytes - usage["bytes"])
        storage = storage_lines(log_bytes, len(self.window_log), usage, other)
        quality = list(self.store.get_meta(QUALITY_KEY, []))
        return HistoryView(rows, quality, storage, self.timeline.retention_days, self.timeline.raw_days)

