"""The home server's database ``<data>/server.sqlite``: devices, epochs, model versions, participation.

``devices`` keeps every enrolled name for good once revoked or forgotten (a forgotten one keeps only
its name and times), so nothing it sends later is taken; ``epochs`` has one row per start of
``serve``; ``versions`` the numbered global models with their figures; ``participation`` one row per
(device, round) contributed. The run's rounds stay in :class:`coordinator.state.RunState`.

Every method raises :class:`RegistryDamaged` (failed ``PRAGMA integrity_check``, naming the file and
the fix; a whole file that cannot be used is said so, not called damaged), DatabaseBusy (another
program held the file past the logged wait) or StorageFull (a full disk) when the database cannot
be read or written. A file of a newer schema (``meta.schema_version``) is refused unchanged.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from coordinator.server.registry_rows import DeviceRow, DeviceState, ParticipationRow, ParticipationSummary, VersionRow
from coordinator.server.sqlite_faults import BUSY_WAIT_S, TRY_S, integrity_problem, wait_for
from coordinator.state import StateDamaged, connect
from har_models.wire.topics import check_client_id

__all__ = ["DB_NAME", "SCHEMA_VERSION", "DeviceRow", "ParticipationRow", "ParticipationSummary", "Registry", "RegistryDamaged",
           "VersionRow"]

T = TypeVar("T")

SCHEMA_VERSION = 1
"""Version of the tables below; a file with a higher one was written by a newer fedhar."""

DB_NAME = "server.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    name TEXT PRIMARY KEY, owner TEXT, enrolled_unix REAL NOT NULL, revoked_unix REAL, forgotten_unix REAL
);
CREATE TABLE IF NOT EXISTS epochs (epoch INTEGER PRIMARY KEY AUTOINCREMENT, started_unix REAL NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
    version INTEGER PRIMARY KEY, round INTEGER NOT NULL, created_unix REAL NOT NULL,
    arch_version INTEGER NOT NULL, path TEXT NOT NULL, figures TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS participation (
    name TEXT NOT NULL, round INTEGER NOT NULL, t REAL NOT NULL, accuracy REAL, macro_f1 REAL,
    PRIMARY KEY (name, round)
);
"""


class RegistryDamaged(StateDamaged):
    """``server.sqlite`` cannot be read or written (cut short, a damaged page, not a database, too new)."""


def _check_name(name: str) -> str:
    """``name`` if it is a valid device name (a client id); ValueError naming it and the allowed characters."""
    try:
        return check_client_id(name)
    except ValueError as exc:
        raise ValueError(f"device name {name!r}: {exc}") from None


class Registry:
    """The server database in ``data_dir / "server.sqlite"`` (created with the folder if missing).

    Thread-safe (one connection behind a lock) and shared between processes by SQLite's locking; while
    another program holds the file, each call waits ``try_s`` at a time for ``busy_wait_s`` in all.
    Raises :class:`RegistryDamaged` for an empty, damaged, unusable or newer file; DatabaseBusy,
    DatabaseAccess or StorageFull as the module docstring says.
    """

    def __init__(self, data_dir: Path, busy_wait_s: float = BUSY_WAIT_S, try_s: float = TRY_S):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / DB_NAME
        self.busy_wait_s = busy_wait_s
        self._lock = threading.RLock()
        self._db = connect(self.path, try_s, lambda why: RegistryDamaged(self._damaged(why)),
                           lambda why: RegistryDamaged(self._judged(why)))  # fmt: skip
        try:
            found = self._write(self._open_schema, "open it")
        except BaseException:
            self._db.close()
            raise
        if found > SCHEMA_VERSION:
            self._db.close()
            raise RegistryDamaged(
                f"{self.path} has schema version {found}, this fedhar reads up to {SCHEMA_VERSION}; "
                "it was written by a newer fedhar: upgrade fedhar (nothing was changed in the file)"
            )

    def _open_schema(self, db: sqlite3.Connection) -> int:
        check = db.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            raise sqlite3.DatabaseError("; ".join(str(r[0]) for r in check[:3]))
        db.executescript(_SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        columns = {r[1] for r in db.execute("PRAGMA table_info(devices)")}
        if "renamed_to" not in columns:
            # Added beside schema 1 (an older fedhar reads the file as before: it names its columns).
            db.execute("ALTER TABLE devices ADD COLUMN renamed_to TEXT")
        return SCHEMA_VERSION if row is None else int(row[0])

    def _damaged(self, why: str) -> str:
        return (
            f"{self.path} is damaged ({why}); nothing was read from it. Restore the file from a backup, "
            f"or move it away to start a new device registry (enrol the devices again; the run's rounds in "
            f"{self.data_dir / 'run'} and the versions in {self.data_dir / 'versions'} are kept)"
        )

    def _judged(self, why: str) -> str:
        """The words for an error ``why`` of SQLite: damage only when ``PRAGMA integrity_check`` fails."""
        why = " ".join(why.split())  # SQLite's messages may hold line breaks
        problem = integrity_problem(self.path) if self.path.exists() else None
        if problem is not None:
            return self._damaged(why if problem == why else f"{why}; integrity check: {problem}")
        return (
            f"{self.path} cannot be used ({why}), though PRAGMA integrity_check finds the file whole: another program changed "
            "its tables or rows, or it is not a fedhar registry. Nothing was changed; keep the file and restore the registry "
            "from a backup (fedhar-coordinator restore)"
        )

    def _run(self, work: Callable[[sqlite3.Connection], T], write: bool, what: str) -> T:
        """``work(connection)`` under the lock (one transaction when ``write``), waiting out another program's hold; errors in words."""

        def once() -> T:
            with self._lock:
                if not write:
                    return work(self._db)
                with self._db:
                    return work(self._db)

        try:
            return wait_for(self.path, once, self.busy_wait_s, what)
        except sqlite3.Error as exc:
            raise RegistryDamaged(self._judged(str(exc))) from None
        except (json.JSONDecodeError, TypeError) as exc:
            raise RegistryDamaged(self._judged(f"a row does not decode: {exc}")) from None

    def _read(self, work: Callable[[sqlite3.Connection], T], what: str = "read it") -> T:
        return self._run(work, False, what)

    def _write(self, work: Callable[[sqlite3.Connection], T], what: str = "write it") -> T:
        return self._run(work, True, what)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._db.close()

    def schema_version(self) -> int:
        """The file's schema version (:data:`SCHEMA_VERSION`)."""
        return self._read(lambda db: int(db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]))

    # ----------------------------------------------------------------------------- devices
    def enrol(self, name: str, owner: str | None) -> None:
        """Record ``name`` as enrolled now, owned by ``owner`` (a person's name or None).

        Raises ValueError if ``name`` is enrolled, revoked or forgotten already: a revoked name is never taken again.
        """
        _check_name(name)

        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT revoked_unix, forgotten_unix FROM devices WHERE name = ?", (name,)).fetchone()
            if row is not None:
                if row[0] is not None or row[1] is not None:
                    raise ValueError(f"device {name!r} was revoked; a revoked name is not enrolled again: enrol it under a new name")
                raise ValueError(f"device {name!r} is already enrolled; revoke it first to replace it, under a new name")
            db.execute("INSERT INTO devices (name, owner, enrolled_unix) VALUES (?, ?, ?)", (name, owner, time.time()))

        self._write(work, f"enrol {name}")

    def revoke(self, name: str) -> None:
        """Mark ``name`` revoked now, for good (the first time is kept); a never-enrolled name is recorded revoked too."""
        _check_name(name)
        now = time.time()

        def work(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR IGNORE INTO devices (name, owner, enrolled_unix) VALUES (?, NULL, ?)", (name, now))
            db.execute("UPDATE devices SET revoked_unix = ? WHERE name = ? AND revoked_unix IS NULL", (now, name))

        self._write(work, f"revoke {name}")

    def forget(self, name: str) -> None:
        """Revoke ``name`` and delete its owner and participation rows (zeroed); only the name and its times stay."""
        self.revoke(name)
        now = time.time()
        self._read(lambda db: db.execute("PRAGMA secure_delete = ON"))  # the deleted rows are zeroed, not left in free pages

        def work(db: sqlite3.Connection) -> None:
            db.execute("UPDATE devices SET owner = NULL, forgotten_unix = COALESCE(forgotten_unix, ?) WHERE name = ?", (now, name))
            db.execute("DELETE FROM participation WHERE name = ?", (name,))

        self._write(work, f"forget {name}")

    def rename(self, old: str, new: str) -> None:
        """Give enrolled device ``old`` the name ``new``, keeping its owner, enrolment time and participation.

        In one transaction; ``old`` stays refused for good (revoked with ``renamed_to = new``).
        Raises ValueError if a name is invalid, ``old`` is not enrolled, or ``new`` was ever taken.
        """
        _check_name(old)
        _check_name(new)
        if old == new:
            raise ValueError(f"rename {old!r} to itself: give a different new name")
        now = time.time()

        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT owner, enrolled_unix, revoked_unix, forgotten_unix FROM devices WHERE name = ?", (old,)).fetchone()
            if row is None or row[2] is not None or row[3] is not None:
                raise ValueError(f"device {old!r} is not enrolled (see fedhar-coordinator devices); only an enrolled device is renamed")
            if db.execute("SELECT 1 FROM devices WHERE name = ?", (new,)).fetchone() is not None:
                raise ValueError(f"the name {new!r} is taken already (enrolled, revoked or forgotten): choose another new name")
            db.execute("INSERT INTO devices (name, owner, enrolled_unix) VALUES (?, ?, ?)", (new, row[0], row[1]))
            db.execute("UPDATE participation SET name = ? WHERE name = ?", (new, old))
            db.execute("UPDATE devices SET revoked_unix = ?, renamed_to = ? WHERE name = ?", (now, new, old))

        self._write(work, f"rename {old}")

    def _times(self, name: str) -> tuple[Any, Any] | None:
        return self._read(lambda db: db.execute("SELECT revoked_unix, forgotten_unix FROM devices WHERE name = ?", (name,)).fetchone())

    def is_revoked(self, name: str) -> bool:
        """True if ``name`` was revoked or forgotten."""
        row = self._times(name)
        return row is not None and (row[0] is not None or row[1] is not None)

    def is_enrolled(self, name: str) -> bool:
        """True if ``name`` is enrolled and not revoked."""
        row = self._times(name)
        return row is not None and row[0] is None and row[1] is None

    def revoked_names(self) -> frozenset[str]:
        """Every revoked or forgotten name."""
        q = "SELECT name FROM devices WHERE revoked_unix IS NOT NULL OR forgotten_unix IS NOT NULL"
        return frozenset(r[0] for r in self._read(lambda db: db.execute(q).fetchall()))

    def devices(self) -> list[DeviceRow]:
        """Every device, in order of enrolment."""
        q = "SELECT name, owner, enrolled_unix, revoked_unix, forgotten_unix, renamed_to FROM devices ORDER BY enrolled_unix, name"

        def work(db: sqlite3.Connection) -> list[DeviceRow]:
            out = []
            for name, owner, enrolled, revoked, forgotten, renamed_to in db.execute(q).fetchall():
                state: DeviceState = "forgotten" if forgotten is not None else "revoked" if revoked is not None else "enrolled"
                out.append(DeviceRow(str(name), owner, float(enrolled), revoked, forgotten, state, renamed_to))
            return out

        return self._read(work)

    # ----------------------------------------------------------------------------- epochs
    def new_epoch(self) -> int:
        """Record a start of ``serve`` now and return its epoch (1, 2, ...; never 0, the "no epoch" of the wire)."""
        return self._write(lambda db: int(db.execute("INSERT INTO epochs (started_unix) VALUES (?)", (time.time(),)).lastrowid or 0),
                           "record the new epoch")  # fmt: skip

    def current_epoch(self) -> int:
        """The newest epoch, 0 if ``serve`` never started."""
        row = self._read(lambda db: db.execute("SELECT MAX(epoch) FROM epochs").fetchone())
        return 0 if row[0] is None else int(row[0])

    # ----------------------------------------------------------------------------- versions
    def add_version(self, version: int, round_: int, arch_version: int, path: Path, figures: dict[str, Any]) -> None:
        """Record model version ``version`` (>= 1): the global model of round ``round_`` in ``path``, with JSON ``figures``.

        Raises ValueError if ``version`` < 1 or ``figures`` is not JSON-able.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"model version {version!r}: must be an integer >= 1")
        try:
            text = json.dumps(figures, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"figures of model version {version}: not JSON ({exc}); give numbers, strings or None") from None
        q = "INSERT OR REPLACE INTO versions (version, round, created_unix, arch_version, path, figures) VALUES (?, ?, ?, ?, ?, ?)"
        self._write(lambda db: db.execute(q, (version, int(round_), time.time(), int(arch_version), str(path), text)),
                    f"record model version {version}")  # fmt: skip

    def delete_version(self, version: int) -> None:
        """Forget version ``version``'s row (the caller deletes the file)."""
        self._write(lambda db: db.execute("DELETE FROM versions WHERE version = ?", (int(version),)), f"forget version {version}")

    def versions(self, newest: int | None = None) -> list[VersionRow]:
        """Every kept version, or only the ``newest`` ones, oldest first."""
        q = "SELECT version, round, created_unix, arch_version, path, figures FROM versions ORDER BY version DESC LIMIT ?"
        rows = self._read(lambda db: db.execute(q, (-1 if newest is None else max(0, newest),)).fetchall())
        try:
            return [VersionRow(int(v), int(r), float(c), int(a), Path(p), json.loads(f)) for v, r, c, a, p, f in reversed(rows)]
        except (json.JSONDecodeError, TypeError) as exc:
            raise RegistryDamaged(self._judged(f"a row does not decode: {exc}")) from None

    # ----------------------------------------------------------------------------- participation
    def note_participation(self, round_: int, name: str, accuracy: float | None, macro_f1: float | None, t: float | None = None) -> None:
        """Record that ``name`` contributed to round ``round_`` with these local figures (0..1, or None); replaces a row.

        ``t`` (UNIX s, default now): ``serve`` gives the round's opening time, so a row never looks newer
        than a bundle written while the round was open (:func:`coordinator.server.lifecycle.prune_bundles`).
        A forgotten device is not recorded; a renamed one is recorded under its new name.
        """
        _check_name(name)
        acc = None if accuracy is None else float(accuracy)
        f1 = None if macro_f1 is None else float(macro_f1)

        def work(db: sqlite3.Connection) -> None:
            who = name
            for _ in range(16):  # a name renamed while its round was open: the row goes to the name it has now
                row = db.execute("SELECT forgotten_unix, renamed_to FROM devices WHERE name = ?", (who,)).fetchone()
                if row is None or row[1] is None:
                    break
                who = str(row[1])
            if row is not None and row[0] is not None:
                return
            db.execute("INSERT OR REPLACE INTO participation (name, round, t, accuracy, macro_f1) VALUES (?, ?, ?, ?, ?)",
                       (who, int(round_), time.time() if t is None else float(t), acc, f1))  # fmt: skip

        self._write(work, f"record round {round_} of {name}")

    def participation_summary(self) -> dict[str, ParticipationSummary]:
        """Per device: rounds contributed and its newest row, in one grouped query."""
        q = ("SELECT p.name, c.n, c.t, p.round, p.t, p.accuracy, p.macro_f1 FROM participation p JOIN "
             "(SELECT name, COUNT(*) AS n, MAX(round) AS r, MAX(t) AS t FROM participation GROUP BY name) c "
             "ON p.name = c.name AND p.round = c.r")  # fmt: skip
        rows = self._read(lambda db: db.execute(q).fetchall())
        return {str(n): ParticipationSummary(int(k), float(t), ParticipationRow(str(n), int(r), float(rt), a, f))
                for n, k, t, r, rt, a, f in rows}  # fmt: skip

    def participation(self, name: str | None = None) -> list[ParticipationRow]:
        """Participation rows (of ``name`` only, when given), by round then name."""
        q = "SELECT name, round, t, accuracy, macro_f1 FROM participation" + (" WHERE name = ?" if name else "") + " ORDER BY round, name"
        rows = self._read(lambda db: db.execute(q, (name,) if name else ()).fetchall())
        return [ParticipationRow(str(n), int(r), float(t), a, f) for n, r, t, a, f in rows]
