"""The device's timeline on disk: each classified window, the raw samples behind it, the person's corrections.

``timeline.sqlite`` in the client's state folder (it never leaves the device): ``predictions``
(window start ns, class, confidence; about 26 bytes a row, 1.8 MB a day, kept ``retention_days``),
``raw`` (the 50 Hz grid samples, each once: 1,200 bytes a second, about 100 MB a day, kept
``raw_days``, as long as a stretch can become training windows), ``corrections`` (relabelled spans
and their training windows, kept as the predictions) and ``recordings``. Old rows are pruned at
most every ``prune_every_s``; one connection with a lock serves the sensing and screen threads.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_client.history import RECORDING_GAP_NS
from edge_client.timeline import Stretch, apply_corrections, smooth_stretches
from har_models.data.labels import LabelSet
from har_models.data.windowing import N_CHANNELS, STEP, WINDOW, Windower, WindowSet

TIMELINE_FILE = "timeline.sqlite"
"""File name of the timeline inside a device's state folder."""

PERIOD_NS = 20_000_000
"""Grid period of the raw samples (50 Hz), ns."""

DAY_NS = 86_400 * 10**9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS predictions (t_ns INTEGER PRIMARY KEY, label INTEGER NOT NULL, confidence REAL NOT NULL);
CREATE TABLE IF NOT EXISTS raw (t0_ns INTEGER PRIMARY KEY, n INTEGER NOT NULL, x BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS corrections (
    id INTEGER PRIMARY KEY, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    label INTEGER NOT NULL, windows INTEGER NOT NULL, made_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS recordings (
    id INTEGER PRIMARY KEY, label INTEGER NOT NULL, t_first_ns INTEGER NOT NULL, t_last_ns INTEGER NOT NULL,
    windows INTEGER NOT NULL, wall_first_ns INTEGER NOT NULL, wall_last_ns INTEGER NOT NULL
);
"""

KEEP_LIMITS = {"retention_days": (1.0, 3650.0), "raw_days": (0.25, 30.0)}
"""Allowed keep periods (days): predictions and corrections 1 day to 10 years; raw samples 6 hours to 30 days."""

_CORRECTIONS = "SELECT id, start_ns, end_ns, label, windows, made_ns FROM corrections"


@dataclass(frozen=True)
class Correction:
    """A stretch the person relabelled: its row id, span (wall clock ns), class, the training windows it made, when it was made."""

    id: int
    start_ns: int
    end_ns: int
    label: int
    windows: int
    made_ns: int


@dataclass(frozen=True)
class RecordingNote:
    """When a recording was made: its row id, class, first and last window start (sensor clock ns), windows, wall-clock span (ns)."""

    id: int
    label: int
    t_first_ns: int
    t_last_ns: int
    windows: int
    wall_first_ns: int
    wall_last_ns: int


class TimelineStore:
    """Classified windows, their raw samples and the corrections of one device, in ``path`` (created with its folder).

    Kept ``retention_days`` (predictions, corrections) and ``raw_days`` (raw samples: how long a
    stretch can teach the model), pruned at most every ``prune_every_s``. ValueError if a retention is not positive.
    """

    def __init__(self, path: Path, labels: LabelSet, retention_days: float = 90.0, raw_days: float = 2.0, prune_every_s: float = 600.0):
        if retention_days <= 0 or raw_days <= 0:
            raise ValueError(f"TimelineStore: retention_days ({retention_days}) and raw_days ({raw_days}) must be > 0")
        self.path = Path(path)
        self.labels = labels
        self.retention_days = float(retention_days)
        self.raw_days = float(raw_days)
        self.prune_every_s = float(prune_every_s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._last_raw_t: int | None = None
        self._last_prune = 0.0
        self.retention_days = float(self.get("keep_days", str(self.retention_days)))
        self.raw_days = float(self.get("keep_raw_days", str(self.raw_days)))

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()


    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _commit(self, sql: str, args: tuple[object, ...] = ()) -> None:
        with self._lock:
            self._db.execute(sql, args)
            self._db.commit()
    # -- writing ---------------------------------------------------------------------------
    def add(self, t_ns: np.ndarray, labels: np.ndarray, confidence: np.ndarray, x: np.ndarray, now_ns: int | None = None) -> None:
        """Store classified windows (start ``t_ns`` (N,) wall clock ns increasing, class, confidence 0..1, x ``(N, 6, T)``
        m/s^2 and rad/s on the 50 Hz grid) and their samples not stored yet; ValueError on mis-shaped arguments."""
        t = np.asarray(t_ns, np.int64).reshape(-1)
        y = np.asarray(labels, np.int64).reshape(-1)
        c = np.asarray(confidence, np.float64).reshape(-1)
        x = np.asarray(x, np.float32)
        if not (t.shape == y.shape == c.shape) or x.ndim != 3 or x.shape[:2] != (t.size, N_CHANNELS):
            raise ValueError(
                f"TimelineStore.add: expected t, labels, confidence (N,) and x (N, 6, T); got {t.shape}, {y.shape}, {c.shape}, {x.shape}"
            )
        raws = []
        for i in range(t.size):
            ts = int(t[i]) + PERIOD_NS * np.arange(x.shape[2], dtype=np.int64)
            new = ts > (self._last_raw_t if self._last_raw_t is not None else -(2**62))
            if new.any():
                k = int(np.argmax(new))
                raws.append((int(ts[k]), int(x.shape[2] - k), np.ascontiguousarray(x[i, :, k:].T).tobytes()))
                self._last_raw_t = int(ts[-1])
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO predictions VALUES (?, ?, ?)", zip(t.tolist(), y.tolist(), c.tolist(), strict=True)
            )
            self._db.executemany("INSERT OR REPLACE INTO raw VALUES (?, ?, ?)", raws)
            self._db.commit()
        now = time.time_ns() if now_ns is None else int(now_ns)
        if now / 1e9 - self._last_prune >= self.prune_every_s:
            self.prune(now)

    def prune(self, now_ns: int) -> None:
        """Delete predictions and corrections older than ``retention_days``, raw samples older than ``raw_days``."""
        with self._lock:
            self._db.execute("DELETE FROM predictions WHERE t_ns < ?", (now_ns - int(self.retention_days * DAY_NS),))
            self._db.execute("DELETE FROM corrections WHERE end_ns < ?", (now_ns - int(self.retention_days * DAY_NS),))
            self._db.execute("DELETE FROM raw WHERE t0_ns < ?", (now_ns - int(self.raw_days * DAY_NS),))
            self._db.commit()
        self._last_prune = now_ns / 1e9

    # -- reading ---------------------------------------------------------------------------
    def predictions(self, start_ns: int, end_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Window starts (N,) int64 ns and classes (N,) int64 between the two times, in time order."""
        rows = self._query("SELECT t_ns, label FROM predictions WHERE t_ns >= ? AND t_ns < ? ORDER BY t_ns", (start_ns, end_ns))
        a = np.array(rows, np.int64).reshape(-1, 2)
        return a[:, 0], a[:, 1]

    def corrections(self, start_ns: int, end_ns: int) -> list[tuple[Stretch, int]]:
        """The corrections overlapping the span, oldest first, each with its number of training windows."""
        rows = self._query("SELECT start_ns, end_ns, label, windows FROM corrections WHERE end_ns > ? AND start_ns < ? ORDER BY id",
                           (start_ns, end_ns))  # fmt: skip
        return [(Stretch(a, b, y, True), n) for a, b, y, n in rows]

    def stretches(self, start_ns: int, end_ns: int) -> list[Stretch]:
        """The smoothed stretches of the span (:func:`~edge_client.timeline.smooth_stretches`), corrections laid over them."""
        t, y = self.predictions(start_ns - 10 * 10**9, end_ns + 10 * 10**9)  # neighbours across the edges smooth alike
        found = smooth_stretches(t, y)
        found = apply_corrections(found, [c for c, _ in self.corrections(start_ns, end_ns)])
        return [
            Stretch(max(s.start_ns, start_ns), min(s.end_ns, end_ns), s.label, s.corrected)
            for s in found
            if s.end_ns > start_ns and s.start_ns < end_ns
        ]

    def raw_samples(self, start_ns: int, end_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Grid samples between the two times: times (m,) int64 ns and values (m, 6) float32."""
        rows = self._query("SELECT t0_ns, n, x FROM raw WHERE t0_ns < ? AND t0_ns + n * ? > ? ORDER BY t0_ns",
                           (end_ns, PERIOD_NS, start_ns))  # fmt: skip
        if not rows:
            return np.empty(0, np.int64), np.empty((0, N_CHANNELS), np.float32)
        t = np.concatenate([t0 + PERIOD_NS * np.arange(n, dtype=np.int64) for t0, n, _ in rows])
        v = np.concatenate([np.frombuffer(b, np.float32).reshape(n, N_CHANNELS) for _, n, b in rows])
        keep = (t >= start_ns) & (t < end_ns)
        return t[keep], v[keep]

    # -- corrections -----------------------------------------------------------------------
    def relabel(self, start_ns: int, end_ns: int, activity: str, window: int = WINDOW, step: int = STEP) -> WindowSet:
        """Relabel a span (wall clock ns) as ``activity``: its raw samples become labelled windows; the correction is kept.

        The samples of every window starting inside the span go through the recorder's
        :class:`~har_models.data.windowing.Windower` (no window across a gap). Returns the windows
        (empty once the raw samples are older than ``raw_days``), for the caller to add to the
        training windows. Raises KeyError for an unknown activity, ValueError if ``end_ns <= start_ns``.
        """
        label = self.labels.index(activity)
        if end_ns <= start_ns:
            raise ValueError(f"relabel: the span must end after it starts, got {start_ns}..{end_ns}")
        # A stretch runs from its first window's start to its last one's start plus a step; the windows
        # starting inside it reach (window - step) samples further.
        t, v = self.raw_samples(start_ns, end_ns + (window - step) * PERIOD_NS)
        xs, ys, ts = Windower(window, step, PERIOD_NS).push(t, v, np.full(t.shape, label, np.int64))
        with self._lock:
            self._db.execute(
                "INSERT INTO corrections (start_ns, end_ns, label, windows, made_ns) VALUES (?, ?, ?, ?, ?)",
                (int(start_ns), int(end_ns), label, len(ys), time.time_ns()),
            )
            self._db.commit()
        return WindowSet(xs, ys, self.labels, ts)

    def corrected_windows(self) -> int:
        """Training windows made from corrections so far (within the retention)."""
        with self._lock:
            (n,) = self._db.execute("SELECT COALESCE(SUM(windows), 0) FROM corrections").fetchone()
        return int(n)

    # -- settings --------------------------------------------------------------------------
    def get(self, key: str, default: str) -> str:
        """A setting kept with the timeline (the weekly goal)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else default

    def set(self, key: str, value: str) -> None:
        self._commit("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # -- what the person keeps and deletes ---------------------------------------------------
    def set_keep(self, retention_days: float, raw_days: float, now_ns: int | None = None) -> None:
        """Keep predictions and corrections ``retention_days`` and raw samples ``raw_days`` from now on (and prune at once).

        Raises ValueError if a period is outside :data:`KEEP_LIMITS` (naming it and the range).
        """
        for name, value in (("retention_days", retention_days), ("raw_days", raw_days)):
            lo, hi = KEEP_LIMITS[name]
            if not lo <= float(value) <= hi:
                what = "predictions" if name == "retention_days" else "raw samples"
                raise ValueError(f"keep {what} for {lo:g} to {hi:g} days, not {value!r}")
        self.retention_days, self.raw_days = float(retention_days), float(raw_days)
        self.set("keep_days", repr(self.retention_days))
        self.set("keep_raw_days", repr(self.raw_days))
        self.prune(time.time_ns() if now_ns is None else now_ns)

    def correction_list(self, limit: int = 20) -> list[Correction]:
        """The newest ``limit`` corrections, newest first."""
        rows = self._query(f"{_CORRECTIONS} ORDER BY id DESC LIMIT ?", (limit,))
        return [Correction(*r) for r in rows]

    def drop_correction(self, correction_id: int) -> Correction | None:
        """Delete one correction (its stretch shows the model's own activity again); returns it, or None if there is none."""
        with self._lock:
            row = self._db.execute(f"{_CORRECTIONS} WHERE id = ?", (correction_id,)).fetchone()
            self._db.execute("DELETE FROM corrections WHERE id = ?", (correction_id,))
            self._db.commit()
        return Correction(*row) if row else None

    def delete_span(self, start_ns: int, end_ns: int) -> tuple[int, list[Correction]]:
        """Delete a span's predictions, the raw samples reaching into it and the corrections inside it (ValueError if empty).

        Returns the predictions deleted and the corrections deleted (their training windows are the caller's to remove).
        """
        if end_ns <= start_ns:
            raise ValueError(f"delete: the span must end after it starts, got {start_ns}..{end_ns}")
        with self._lock:
            inside = self._db.execute(f"{_CORRECTIONS} WHERE start_ns >= ? AND end_ns <= ?", (start_ns, end_ns)).fetchall()
            n = self._db.execute("DELETE FROM predictions WHERE t_ns >= ? AND t_ns < ?", (start_ns, end_ns)).rowcount
            self._db.execute("DELETE FROM raw WHERE t0_ns < ? AND t0_ns + n * ? > ?", (end_ns, PERIOD_NS, start_ns))
            self._db.execute("DELETE FROM corrections WHERE start_ns >= ? AND end_ns <= ?", (start_ns, end_ns))
            self._db.commit()
        return int(n), [Correction(*r) for r in inside]

    def note_recorded(self, label: int, t_first_ns: int, t_last_ns: int, windows: int, wall_ns: int) -> None:
        """Note recorded windows (sensor clock stamps) arriving at ``wall_ns``: windows of the same activity within
        :data:`RECORDING_GAP_NS` of the newest recording's last one extend it, others start a new one."""
        with self._lock:
            row = self._db.execute("SELECT id, label, t_last_ns FROM recordings ORDER BY id DESC LIMIT 1").fetchone()
            if row is not None and row[1] == label and 0 <= t_first_ns - row[2] <= RECORDING_GAP_NS:
                self._db.execute(
                    "UPDATE recordings SET t_last_ns = ?, windows = windows + ?, wall_last_ns = ? WHERE id = ?",
                    (t_last_ns, windows, wall_ns, row[0]),
                )
            else:
                self._db.execute(
                    "INSERT INTO recordings (label, t_first_ns, t_last_ns, windows, wall_first_ns, wall_last_ns) VALUES (?, ?, ?, ?, ?, ?)",
                    (label, t_first_ns, t_last_ns, windows, wall_ns, wall_ns),
                )
            self._db.commit()

    def recording_notes(self) -> list[RecordingNote]:
        """Every noted recording, newest first."""
        rows = self._query("SELECT * FROM recordings ORDER BY id DESC")
        return [RecordingNote(*r) for r in rows]

    def forget_recording(self, note_id: int) -> None:
        """Delete the note of a recording (its windows are deleted from the recorded-window log by the caller)."""
        self._commit("DELETE FROM recordings WHERE id = ?", (note_id,))

    def usage(self) -> dict[str, float]:
        """What the timeline holds: ``bytes`` (the file with its write-ahead log), ``raw_s`` (seconds of raw samples),
        ``predictions`` (rows) and ``oldest_ns`` (the oldest prediction's start, 0 without any)."""
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")) if p.exists())
        with self._lock:
            (samples,) = self._db.execute("SELECT COALESCE(SUM(n), 0) FROM raw").fetchone()
            n, oldest = self._db.execute("SELECT COUNT(*), COALESCE(MIN(t_ns), 0) FROM predictions").fetchone()
        return {"bytes": float(size), "raw_s": samples * PERIOD_NS / 1e9, "predictions": float(n), "oldest_ns": float(oldest)}
