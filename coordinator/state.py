"""Persistent run state of the coordinator: SQLite for rounds and events, safetensors for models.

Layout of a run folder::

    state.sqlite                  meta (config, run id, architecture), rounds, events
    models/r0005/global.safetensors
    models/r0005/personal/<client>.safetensors

A round's models go into their own folder first; only then does the SQLite transaction
that marks the round completed commit. A crash at any moment therefore leaves the last
completed round intact, and a restart resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from har_models.files import atomic_write, fsync_dir
from har_models.nn.model import ArchSpec, check_state

log = logging.getLogger("fedhar.coordinator.state")


class StateDamaged(sqlite3.DatabaseError):
    """The run folder's database cannot be read or written (cut short, a damaged page, not a database).

    Raised by every :class:`RunState` method instead of sqlite3's errors, naming the file and the fix;
    a damaged database is never read as an empty one.
    """


class StorageFull(OSError):
    """A write failed for want of space: ``folder`` has ``free`` bytes, ``needed`` were asked for.

    Not damage: earlier files are untouched (atomic writes) and the write succeeds once space returns.
    ``str()`` reads ``disk full: <folder>, <free> of <needed>``.
    """

    def __init__(self, folder: Path, free: int, needed: int):
        super().__init__(28, f"disk full: {folder}, {_mb(free)} free of {_mb(needed)} needed")
        self.folder, self.free, self.needed = folder, free, needed

    def __str__(self) -> str:
        return str(self.strerror)


class StateLocked(OSError):
    """The run's database stayed locked by another program for longer than :data:`LOCK_WAIT_S` (not damage)."""


LOCK_WAIT_S = 60.0
"""How long a read or write waits for another program's lock before :class:`StateLocked` (s)."""


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def is_out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError, or safetensors' error, which carries the OS message) says the disk is full."""
    if isinstance(exc, OSError) and exc.errno in (28, 122):  # ENOSPC, EDQUOT
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def storage_full(folder: Path, needed: int) -> StorageFull:
    """A :class:`StorageFull` for ``folder`` with its free space now."""
    try:
        free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    except OSError:
        free = 0
    return StorageFull(folder, free, needed)


def connect(path: Path, timeout: float, damaged: Callable[[str], Exception],
            unusable: Callable[[str], Exception] | None = None) -> sqlite3.Connection:  # fmt: skip
    """A connection to the SQLite file ``path``: ``damaged(why)`` for a file cut to 0 bytes, ``unusable(why)`` (default
    ``damaged``) for one SQLite cannot open. SQLite always writes a header page, so 0 bytes is never a new database."""
    if path.is_file() and path.stat().st_size == 0:
        raise damaged("it is empty (0 bytes)")
    try:
        return sqlite3.connect(path, timeout=timeout, check_same_thread=False)
    except sqlite3.Error as exc:
        raise (unusable or damaged)(str(exc)) from None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (round INTEGER PRIMARY KEY, completed REAL NOT NULL, summary TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, t REAL NOT NULL, round INTEGER, client TEXT, kind TEXT NOT NULL, detail TEXT
);
"""


def save_state_file(
    path: Path, spec: ArchSpec, state: Mapping[str, torch.Tensor], extra: Mapping[str, str] | None = None
) -> None:
    """Write parameters (C-contiguous float32) with their architecture to ``path``, atomically and durably (fsynced)."""
    _save_tensors(path, state, {"arch": spec.to_json(), **(extra or {})})


def _save_tensors(path: Path, state: Mapping[str, torch.Tensor], meta: Mapping[str, str]) -> None:
    """Tensors as C-contiguous float32 safetensors with ``meta``, written atomically and durably."""
    arrays = {k: np.ascontiguousarray(v.detach().cpu().numpy(), dtype=np.float32) for k, v in state.items()}
    try:
        atomic_write(path, lambda tmp: save_file(arrays, str(tmp), metadata=dict(meta)))
    except Exception as exc:
        if is_out_of_space(exc):
            raise storage_full(path.parent, sum(a.nbytes for a in arrays.values())) from None
        raise


def load_state_file(path: Path) -> tuple[ArchSpec, dict[str, torch.Tensor]]:
    """Read :func:`save_state_file` output; ValueError if it lacks an architecture or its tensors do not match it."""
    spec, state, _ = load_state_with_meta(path)
    return spec, state


def load_state_with_meta(path: Path) -> tuple[ArchSpec, dict[str, torch.Tensor], dict[str, str]]:
    """:func:`load_state_file` and the file's metadata (what ``extra`` of :func:`save_state_file` added)."""
    meta, state = _load_tensors(path)
    if "arch" not in meta:
        raise ValueError(f"{path}: no architecture in the file's metadata")
    spec = ArchSpec.from_json(meta["arch"])
    check_state(spec, state)
    return spec, state, meta


def _load_tensors(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A safetensors file's metadata and its tensors as float32."""
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {}), {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 (no iterator)


_REWRITES_KEY = "rounds_rewrites"
"""Meta key of :meth:`RunState.rounds_version`'s rewrite counter."""

STRATEGY_STATE_FILE = "strategy_state.safetensors"
"""A round's strategy state beside its models (``models/rNNNN/``); its metadata names the strategy."""
LEGACY_SERVER_OPT_FILE = "server_opt.safetensors"
"""What older run folders hold instead of :data:`STRATEGY_STATE_FILE`: a server optimiser's moments."""


class RunState:
    """The SQLite database and model folders of one run; ``keep_rounds`` completed rounds' model folders are kept."""

    def __init__(self, folder: Path, keep_rounds: int = 2):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "models").mkdir(exist_ok=True)
        self.keep_rounds = keep_rounds
        self.path = self.folder / "state.sqlite"
        self._db = connect(self.path, LOCK_WAIT_S, lambda why: StateDamaged(self._damaged(why)))
        with self._guard():
            check = self._db.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                raise sqlite3.DatabaseError("; ".join(str(r[0]) for r in check[:3]))
            self._db.executescript(_SCHEMA)

    def _damaged(self, why: str) -> str:
        return (
            f"{self.path} is damaged ({why}); nothing was read from it. Restore the file from a backup, "
            f"or move it away to start a new run (the completed rounds' models stay in {self.folder / 'models'})"
        )

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """sqlite3's errors as :class:`StateDamaged`; a held lock is :class:`StateLocked`, a full disk :class:`StorageFull`."""
        try:
            yield
        except StateDamaged:
            raise
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "locked" in text or "busy" in text:
                raise StateLocked(f"{self.path} stayed locked by another program for {LOCK_WAIT_S:.0f} s (a backup, sqlite3 at "
                                  f"a shell?); nothing is wrong with it: it is used again once that program lets go") from None
            if "full" in text or is_out_of_space(exc):
                raise storage_full(self.folder, 1 << 20) from None
            raise StateDamaged(self._damaged(text)) from None
        except sqlite3.Error as exc:
            raise StateDamaged(self._damaged(str(exc))) from None
        except (json.JSONDecodeError, TypeError) as exc:  # a row whose text is not what was written
            raise StateDamaged(self._damaged(f"a row does not decode: {exc}")) from None

    def close(self) -> None:
        self._db.close()

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (JSON), or ``default``. Raises :class:`StateDamaged`."""
        with self._guard():
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            return default if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) under ``key``. Raises :class:`StateDamaged`."""
        with self._guard(), self._db:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def event(self, round_: int | None, client: str | None, kind: str, detail: str = "") -> None:
        """Record something that happened (a rejected update, a growth, a failure). Raises :class:`StateDamaged`."""
        with self._guard(), self._db:
            self._db.execute(
                "INSERT INTO events (t, round, client, kind, detail) VALUES (?, ?, ?, ?, ?)",
                (time.time(), round_, client, kind, detail),
            )

    def events(self, kind: str | tuple[str, ...] | None = None) -> list[tuple[int | None, str | None, str, str]]:
        """``(round, client, kind, detail)`` rows of one kind, several (a tuple) or all, oldest first. Raises :class:`StateDamaged`."""
        kinds = (kind,) if isinstance(kind, str) else tuple(kind or ())
        where = f" WHERE kind IN ({', '.join('?' * len(kinds))})" if kinds else ""
        with self._guard():
            rows = self._db.execute(f"SELECT round, client, kind, detail FROM events{where} ORDER BY id", kinds).fetchall()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def count_events(self, kind: str) -> int:
        """How many events of ``kind`` were recorded (one query, no rows read out). Raises :class:`StateDamaged`."""
        with self._guard():
            return int(self._db.execute("SELECT COUNT(*) FROM events WHERE kind = ?", (kind,)).fetchone()[0])

    def amend_round(self, round_: int, keys: Mapping[str, Any]) -> None:
        """Add ``keys`` to the summary of completed round ``round_`` (KeyError if it has none). Raises :class:`StateDamaged`."""
        with self._guard(), self._db:
            self._amend(round_, keys)

    def _amend(self, round_: int, keys: Mapping[str, Any]) -> None:
        row = self._db.execute("SELECT summary FROM rounds WHERE round = ?", (round_,)).fetchone()
        if row is None:
            raise KeyError(f"round {round_} has no record to amend")
        self._db.execute("UPDATE rounds SET summary = ? WHERE round = ?", (json.dumps({**json.loads(row[0]), **keys}), round_))
        self._count_rewrite()

    def rounds(self, after: int = -1, limit: int | None = None) -> list[dict[str, Any]]:
        """Summaries of completed rounds above ``after``, in order, at most ``limit``. Raises :class:`StateDamaged`."""
        with self._guard():
            q = "SELECT summary FROM rounds WHERE round > ? ORDER BY round LIMIT ?"
            return [json.loads(r[0]) for r in self._db.execute(q, (after, -1 if limit is None else max(0, limit)))]

    def completed_unix(self, round_: int) -> float | None:
        """When round ``round_`` was recorded (UNIX s), None if it was not. Raises :class:`StateDamaged`."""
        with self._guard():
            row = self._db.execute("SELECT completed FROM rounds WHERE round = ?", (round_,)).fetchone()
        return None if row is None else float(row[0])

    def rounds_version(self) -> tuple[int, int]:
        """``(rewrites, last completed round)``: while ``rewrites`` stays the same, only rounds above a reader's last are new.

        Both are index look-ups. Raises :class:`StateDamaged`.
        """
        with self._guard():
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (_REWRITES_KEY,)).fetchone()
            last = self._db.execute("SELECT MAX(round) FROM rounds").fetchone()[0]
        return (0 if row is None else int(json.loads(row[0]))), (-1 if last is None else int(last))

    def _count_rewrite(self) -> None:
        """Add one to the rewrite counter of :meth:`rounds_version` (inside the caller's transaction)."""
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, '1') ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
            (_REWRITES_KEY,),
        )

    def rewrite_client(self, client: str, scrub: Callable[[Any], Any]) -> int:
        """Remove ``client`` from the run's records in one transaction (``forget``); the number of rounds changed.

        Every summary and meta value goes through ``scrub`` (JSON in, JSON out); the client's events are
        deleted; ``secure_delete`` zeroes the freed pages; a change counts as a rewrite. Raises :class:`StateDamaged`.
        """
        changed = 0
        with self._guard():
            self._db.execute("PRAGMA secure_delete = ON")
        with self._guard(), self._db:
            for rnd, text in self._db.execute("SELECT round, summary FROM rounds").fetchall():
                old = json.loads(text)
                new = scrub(old)
                if new != old:
                    self._db.execute("UPDATE rounds SET summary = ? WHERE round = ?", (json.dumps(new), rnd))
                    changed += 1
            self._db.execute("DELETE FROM events WHERE client = ?", (client,))
            for key, text in self._db.execute("SELECT key, value FROM meta").fetchall():
                old = json.loads(text)
                new = scrub(old)
                if new != old:
                    self._db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(new), key))
            if changed:
                self._count_rewrite()
        return changed

    def last_completed_round(self) -> int:
        """Index of the last completed round, -1 if none. Raises :class:`StateDamaged`."""
        with self._guard():
            row = self._db.execute("SELECT MAX(round) FROM rounds").fetchone()
        return -1 if row[0] is None else int(row[0])

    def complete_round(
        self,
        round_: int,
        spec: ArchSpec,
        global_state: Mapping[str, torch.Tensor],
        personal: Mapping[str, Mapping[str, torch.Tensor]],
        summary: dict[str, Any],
        extra_meta: Mapping[str, Any] | None = None,
        strategy_state: tuple[str, Mapping[str, torch.Tensor]] | None = None,
        amend: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> None:
        """Persist a completed round: models first, then the SQLite row (one transaction), so a crash keeps the last round.

        ``strategy_state`` is ``(name, Strategy.state_dict())``, saved as :data:`STRATEGY_STATE_FILE` when not empty.
        ``amend``: keys added to earlier rounds' summaries in the same transaction (a figure measured a round later).
        """
        folder = self.folder / "models" / f"r{round_:04d}"
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "personal").mkdir(parents=True)
        fsync_dir(folder.parent)
        save_state_file(folder / "global.safetensors", spec, global_state)
        for cid, st in personal.items():
            save_state_file(folder / "personal" / f"{cid}.safetensors", spec, st)
        if strategy_state is not None and strategy_state[1]:
            name, tensors = strategy_state
            _save_tensors(folder / STRATEGY_STATE_FILE, tensors, {"round": str(round_), "strategy": name})
        with self._guard(), self._db:
            newest = self._db.execute("SELECT MAX(round) FROM rounds").fetchone()[0]
            if newest is not None and round_ <= newest:
                self._count_rewrite()
            self._db.execute(
                "INSERT OR REPLACE INTO rounds (round, completed, summary) VALUES (?, ?, ?)",
                (round_, time.time(), json.dumps(summary)),
            )
            for key, value in (extra_meta or {}).items():
                self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))
            for earlier, keys in (amend or {}).items():
                self._amend(earlier, keys)
        done = sorted(p for p in (self.folder / "models").glob("r[0-9][0-9][0-9][0-9]") if p.is_dir())
        for old in done[: max(0, len(done) - self.keep_rounds)]:
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def load_latest_intact(self) -> tuple[int, ArchSpec, dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]] | None:
        """``(round, spec, global, personal)`` of the newest completed round whose files all load, or None.

        Rounds recorded after it (files lost to a crash or a full disk) are forgotten so they run again;
        each damaged file is logged.
        """
        with self._guard():
            recorded = [r for (r,) in self._db.execute("SELECT round FROM rounds")]
        for round_ in sorted(recorded, reverse=True):
            try:
                spec, g, personal = self.load_round_models(round_)
            except Exception as exc:  # any unreadable file: safetensors, OS and shape errors alike
                log.error("round %d's saved models are unusable (%s: %s); trying the round before", round_, type(exc).__name__, exc)
                continue
            with self._guard(), self._db:
                if self._db.execute("DELETE FROM rounds WHERE round > ?", (round_,)).rowcount:
                    self._count_rewrite()
            return round_, spec, g, personal
        return None

    def load_strategy_state(self, round_: int, strategy: str) -> dict[str, torch.Tensor] | None:
        """The state ``strategy`` saved with ``round_`` (float32 tensors), or None; reads :data:`LEGACY_SERVER_OPT_FILE` if needed.

        Raises ValueError if the file is unreadable or was saved by another strategy.
        """
        folder = self.folder / "models" / f"r{round_:04d}"
        path = folder / STRATEGY_STATE_FILE
        if not path.exists():
            path = folder / LEGACY_SERVER_OPT_FILE
            if not path.exists():
                return None
        try:
            meta, out = _load_tensors(path)
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
        saved_by = meta.get("strategy")
        if saved_by is not None and saved_by != strategy:
            raise ValueError(f"{path}: state of strategy {saved_by!r}, this run aggregates with {strategy!r}")
        return out

    def load_round_models(self, round_: int) -> tuple[ArchSpec, dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """``(spec, global_state, personal_states)`` saved for ``round_``.

        Raises FileNotFoundError if they are not on disk, ValueError if a file does not match its architecture.
        """
        folder = self.folder / "models" / f"r{round_:04d}"
        spec, global_state = load_state_file(folder / "global.safetensors")
        personal = {}
        for path in sorted((folder / "personal").glob("*.safetensors")):
            pspec, st = load_state_file(path)
            if pspec.shapes() != spec.shapes():
                raise ValueError(f"{path}: architecture differs from the global model's")
            personal[path.stem] = st
        return spec, global_state, personal
