"""The home server's database ``<data>/server.sqlite``: devices, epochs, model versions, participation.

What the server knows beyond one run's rounds (those stay in :class:`coordinator.state.RunState`
under ``<data>/run/``):

* ``devices``: every enrolled name with its owner and when it was enrolled, revoked or forgotten.
  A revoked or forgotten name stays in the table for good, so nothing it sends later is taken
  (a forgotten device keeps only its name and the times, nothing else);
* ``epochs``: one row per start of ``fedhar-coordinator serve``; clients see the number in every
  announcement and drop work of an older one;
* ``versions``: each completed round's global model kept as a numbered file, with its figures;
* ``participation``: one row per (device, round) a device contributed to, with its local figures.

Every read and write is guarded: a database cut short, with a damaged page, or not a database at
all raises :class:`RegistryDamaged` (a :class:`coordinator.state.StateDamaged`) naming the file and
the fix; it is never read as an empty one. The schema carries its version (``meta.schema_version``);
a file written by a newer fedhar is refused instead of being changed.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from coordinator.state import StateDamaged
from har_models.wire.topics import check_client_id

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

DeviceState = Literal["enrolled", "revoked", "forgotten"]


class RegistryDamaged(StateDamaged):
    """``server.sqlite`` cannot be read or written (cut short, a damaged page, not a database, too new).

    Raised by every :class:`Registry` method instead of sqlite3's own errors; the message names
    the file and what to do.
    """


@dataclass(frozen=True)
class DeviceRow:
    """One device of the registry.

    ``enrolled_unix``, ``revoked_unix``, ``forgotten_unix`` are UNIX times in seconds (None when
    that has not happened); ``state`` is the latest of them; ``renamed_to`` is the name a renamed
    device carries now (its old name is revoked).
    """

    name: str
    owner: str | None
    enrolled_unix: float
    revoked_unix: float | None
    forgotten_unix: float | None
    state: DeviceState
    renamed_to: str | None = None


@dataclass(frozen=True)
class VersionRow:
    """One kept model version: ``version`` (1, 2, ...), the round (0-based) whose global model it is,
    when it was written (UNIX s), the architecture version, the file, and the round's figures
    (e.g. ``{"personalisation_accuracy": 0.71, ...}``; releases before wrote ``personalization_*``:
    read them through :func:`coordinator.server.figures.read_figures`)."""

    version: int
    round: int
    created_unix: float
    arch_version: int
    path: Path
    figures: dict[str, Any]


@dataclass(frozen=True)
class ParticipationRow:
    """Device ``name`` contributed to round ``round`` (0-based) at ``t`` (UNIX s) with these local figures (0..1 or None)."""

    name: str
    round: int
    t: float
    accuracy: float | None
    macro_f1: float | None


@dataclass(frozen=True)
class ParticipationSummary:
    """A device's participation in short: ``rounds`` contributed to, its newest contribution's time
    ``last_t`` (UNIX s) and its newest row ``last``."""

    rounds: int
    last_t: float
    last: ParticipationRow


def _check_name(name: str) -> str:
    """``name`` if it is a valid device name: a client id (:func:`~har_models.wire.topics.check_client_id`, the one rule).

    Raises
    ------
    ValueError
        Naming the device name and the allowed characters.
    """
    try:
        return check_client_id(name)
    except ValueError as exc:
        raise ValueError(f"device name {name!r}: {exc}") from None


class Registry:
    """The server database in ``data_dir / "server.sqlite"`` (created with the folder if missing).

    Safe to share between threads (one connection behind a lock) and to open from several
    processes at once (``fedhar-coordinator revoke`` while ``serve`` runs): SQLite's own locking,
    with a 10 s busy timeout.

    Raises
    ------
    RegistryDamaged
        If the file is empty (0 bytes), damaged, not a database, or of a newer schema.
    """

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / DB_NAME
        self._lock = threading.RLock()
        if self.path.is_file() and self.path.stat().st_size == 0:
            # SQLite always writes a header page; 0 bytes is a file cut short, never a new database.
            raise RegistryDamaged(self._damaged("it is empty (0 bytes)"))
        try:
            self._db = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False)
        except sqlite3.Error as exc:
            raise RegistryDamaged(self._damaged(str(exc))) from None
        with self._guard():
            check = self._db.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                raise sqlite3.DatabaseError("; ".join(str(r[0]) for r in check[:3]))
            with self._db:
                self._db.executescript(_SCHEMA)
                row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                    found = SCHEMA_VERSION
                else:
                    found = int(row[0])
                columns = {r[1] for r in self._db.execute("PRAGMA table_info(devices)")}
                if "renamed_to" not in columns:
                    # Added beside schema 1 (an older fedhar reads the file as before: it names its columns).
                    self._db.execute("ALTER TABLE devices ADD COLUMN renamed_to TEXT")
        if found > SCHEMA_VERSION:
            self._db.close()
            raise RegistryDamaged(
                f"{self.path} has schema version {found}, this fedhar reads up to {SCHEMA_VERSION}; "
                "it was written by a newer fedhar: upgrade fedhar (nothing was changed in the file)"
            )

    def _damaged(self, why: str) -> str:
        return (
            f"{self.path} is damaged ({why}); nothing was read from it. Restore the file from a backup, "
            f"or move it away to start a new device registry (enrol the devices again; the run's rounds in "
            f"{self.data_dir / 'run'} and the versions in {self.data_dir / 'versions'} are kept)"
        )

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Hold the lock; turn sqlite3's errors and undecodable rows into :class:`RegistryDamaged`."""
        with self._lock:
            try:
                yield
            except StateDamaged:
                raise
            except sqlite3.Error as exc:
                raise RegistryDamaged(self._damaged(str(exc))) from None
            except (json.JSONDecodeError, TypeError) as exc:
                raise RegistryDamaged(self._damaged(f"a row does not decode: {exc}")) from None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._db.close()

    def schema_version(self) -> int:
        """The file's schema version (:data:`SCHEMA_VERSION`). Raises :class:`RegistryDamaged`."""
        with self._guard():
            return int(self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])

    # ----------------------------------------------------------------------------- devices
    def enrol(self, name: str, owner: str | None) -> None:
        """Record ``name`` as enrolled now, owned by ``owner`` (a person's name or None).

        Raises
        ------
        ValueError
            If ``name`` is already enrolled, or was revoked or forgotten: a revoked name is never
            taken again (anything still carrying it would come back); enrol the device under a new name.
        RegistryDamaged
            If the database cannot be read or written.
        """
        _check_name(name)
        with self._guard(), self._db:
            row = self._db.execute("SELECT revoked_unix, forgotten_unix FROM devices WHERE name = ?", (name,)).fetchone()
            if row is not None:
                if row[0] is not None or row[1] is not None:
                    raise ValueError(f"device {name!r} was revoked; a revoked name is not enrolled again: enrol it under a new name")
                raise ValueError(f"device {name!r} is already enrolled; revoke it first to replace it, under a new name")
            self._db.execute("INSERT INTO devices (name, owner, enrolled_unix) VALUES (?, ?, ?)", (name, owner, time.time()))

    def revoke(self, name: str) -> None:
        """Mark ``name`` revoked now (kept for good); revoking a revoked device keeps the first time.

        A name that was never enrolled is recorded as revoked too, so that a stray client using
        it is refused as well.

        Raises
        ------
        RegistryDamaged
            If the database cannot be read or written.
        """
        _check_name(name)
        now = time.time()
        with self._guard(), self._db:
            self._db.execute("INSERT OR IGNORE INTO devices (name, owner, enrolled_unix) VALUES (?, NULL, ?)", (name, now))
            self._db.execute("UPDATE devices SET revoked_unix = ? WHERE name = ? AND revoked_unix IS NULL", (now, name))

    def forget(self, name: str) -> None:
        """Revoke ``name`` and delete what the registry holds of it: its owner and participation rows.

        Only the name and its times stay, so the name is still refused.

        Raises
        ------
        RegistryDamaged
            If the database cannot be read or written.
        """
        self.revoke(name)
        now = time.time()
        with self._guard():
            self._db.execute("PRAGMA secure_delete = ON")  # the deleted rows are zeroed, not left in free pages
        with self._guard(), self._db:
            self._db.execute("UPDATE devices SET owner = NULL, forgotten_unix = COALESCE(forgotten_unix, ?) WHERE name = ?", (now, name))
            self._db.execute("DELETE FROM participation WHERE name = ?", (name,))

    def rename(self, old: str, new: str) -> None:
        """Give enrolled device ``old`` the name ``new``, keeping its owner, enrolment time and participation.

        In one transaction: a row for ``new`` (``old``'s owner and enrolment time), ``old``'s
        participation rows moved to ``new``, and ``old`` recorded as revoked with ``renamed_to =
        new``: the old name stays refused for good (a device still using it is not this one any
        more), and :meth:`devices` shows where it went.

        Raises
        ------
        ValueError
            If a name is invalid, ``old`` is not enrolled, or ``new`` is in the table already
            (enrolled, revoked or forgotten: a name is never taken twice).
        RegistryDamaged
            If the database cannot be read or written.
        """
        _check_name(old)
        _check_name(new)
        if old == new:
            raise ValueError(f"rename {old!r} to itself: give a different new name")
        now = time.time()
        with self._guard(), self._db:
            row = self._db.execute(
                "SELECT owner, enrolled_unix, revoked_unix, forgotten_unix FROM devices WHERE name = ?", (old,)
            ).fetchone()
            if row is None or row[2] is not None or row[3] is not None:
                raise ValueError(f"device {old!r} is not enrolled (see fedhar-coordinator devices); only an enrolled device is renamed")
            if self._db.execute("SELECT 1 FROM devices WHERE name = ?", (new,)).fetchone() is not None:
                raise ValueError(f"the name {new!r} is taken already (enrolled, revoked or forgotten): choose another new name")
            self._db.execute("INSERT INTO devices (name, owner, enrolled_unix) VALUES (?, ?, ?)", (new, row[0], row[1]))
            self._db.execute("UPDATE participation SET name = ? WHERE name = ?", (new, old))
            self._db.execute("UPDATE devices SET revoked_unix = ?, renamed_to = ? WHERE name = ?", (now, new, old))

    def is_revoked(self, name: str) -> bool:
        """True if ``name`` was revoked or forgotten. Raises :class:`RegistryDamaged`."""
        with self._guard():
            row = self._db.execute("SELECT revoked_unix, forgotten_unix FROM devices WHERE name = ?", (name,)).fetchone()
        return row is not None and (row[0] is not None or row[1] is not None)

    def is_enrolled(self, name: str) -> bool:
        """True if ``name`` is enrolled and not revoked. Raises :class:`RegistryDamaged`."""
        with self._guard():
            row = self._db.execute("SELECT revoked_unix, forgotten_unix FROM devices WHERE name = ?", (name,)).fetchone()
        return row is not None and row[0] is None and row[1] is None

    def revoked_names(self) -> frozenset[str]:
        """Every revoked or forgotten name. Raises :class:`RegistryDamaged`."""
        with self._guard():
            rows = self._db.execute("SELECT name FROM devices WHERE revoked_unix IS NOT NULL OR forgotten_unix IS NOT NULL").fetchall()
        return frozenset(r[0] for r in rows)

    def devices(self) -> list[DeviceRow]:
        """Every device, in order of enrolment. Raises :class:`RegistryDamaged`."""
        with self._guard():
            rows = self._db.execute(
                "SELECT name, owner, enrolled_unix, revoked_unix, forgotten_unix, renamed_to FROM devices ORDER BY enrolled_unix, name"
            ).fetchall()
            out = []
            for name, owner, enrolled, revoked, forgotten, renamed_to in rows:
                state: DeviceState = "forgotten" if forgotten is not None else "revoked" if revoked is not None else "enrolled"
                out.append(DeviceRow(str(name), owner, float(enrolled), revoked, forgotten, state, renamed_to))
        return out

    # ----------------------------------------------------------------------------- epochs
    def new_epoch(self) -> int:
        """Record a start of ``serve`` now and return its epoch (1, 2, ...; never 0, the "no epoch" of the wire).

        Raises
        ------
        RegistryDamaged
            If the database cannot be read or written.
        """
        with self._guard(), self._db:
            cur = self._db.execute("INSERT INTO epochs (started_unix) VALUES (?)", (time.time(),))
            return int(cur.lastrowid or 0)

    def current_epoch(self) -> int:
        """The newest epoch, 0 if ``serve`` never started. Raises :class:`RegistryDamaged`."""
        with self._guard():
            row = self._db.execute("SELECT MAX(epoch) FROM epochs").fetchone()
        return 0 if row[0] is None else int(row[0])

    # ----------------------------------------------------------------------------- versions
    def add_version(self, version: int, round_: int, arch_version: int, path: Path, figures: dict[str, Any]) -> None:
        """Record model version ``version`` (>= 1): the global model of round ``round_`` in ``path``.

        ``figures`` is a JSON-able mapping (the round's accuracy and macro-F1, ...).

        Raises
        ------
        ValueError
            If ``version`` < 1 or ``figures`` is not JSON-able.
        RegistryDamaged
            If the database cannot be read or written.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"model version {version!r}: must be an integer >= 1")
        try:
            text = json.dumps(figures, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"figures of model version {version}: not JSON ({exc}); give numbers, strings or None") from None
        with self._guard(), self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO versions (version, round, created_unix, arch_version, path, figures) VALUES (?, ?, ?, ?, ?, ?)",
                (version, int(round_), time.time(), int(arch_version), str(path), text),
            )

    def delete_version(self, version: int) -> None:
        """Forget version ``version``'s row (the caller deletes the file). Raises :class:`RegistryDamaged`."""
        with self._guard(), self._db:
            self._db.execute("DELETE FROM versions WHERE version = ?", (int(version),))

    def versions(self, newest: int | None = None) -> list[VersionRow]:
        """Every kept version, or only the ``newest`` ones, oldest first. Raises :class:`RegistryDamaged`."""
        with self._guard():
            q = "SELECT version, round, created_unix, arch_version, path, figures FROM versions ORDER BY version DESC"
            rows = self._db.execute(q + " LIMIT ?", (-1 if newest is None else max(0, newest),)).fetchall()
            return [VersionRow(int(v), int(r), float(c), int(a), Path(p), json.loads(f)) for v, r, c, a, p, f in reversed(rows)]

    # ----------------------------------------------------------------------------- participation
    def note_participation(self, round_: int, name: str, accuracy: float | None, macro_f1: float | None, t: float | None = None) -> None:
        """Record that ``name`` contributed to round ``round_`` with these local figures (0..1, or None).

        ``t`` (UNIX s, default now) is the row's time: ``serve`` gives the time the round opened, so
        that a row never looks newer than an enrolment bundle written while the round was open (its
        update may have come with the old password: the device has not shown that it loaded the
        bundle, and :func:`coordinator.server.lifecycle.prune_bundles` keeps it).
        Writing the same (device, round) again replaces the row. A forgotten device's participation
        is not recorded (the server holds nothing of it). A renamed device's is recorded under its
        new name (an update sent under the old name in the round open during ``rename``), so its
        history stays in one piece.

        Raises
        ------
        RegistryDamaged
            If the database cannot be read or written.
        """
        _check_name(name)
        acc = None if accuracy is None else float(accuracy)
        f1 = None if macro_f1 is None else float(macro_f1)
        with self._guard(), self._db:
            for _ in range(16):  # a name renamed while its round was open: the row goes to the name it has now
                row = self._db.execute("SELECT forgotten_unix, renamed_to FROM devices WHERE name = ?", (name,)).fetchone()
                if row is None or row[1] is None:
                    break
                name = str(row[1])
            if row is not None and row[0] is not None:
                return
            self._db.execute(
                "INSERT OR REPLACE INTO participation (name, round, t, accuracy, macro_f1) VALUES (?, ?, ?, ?, ?)",
                (name, int(round_), time.time() if t is None else float(t), acc, f1),
            )

    def participation_summary(self) -> dict[str, ParticipationSummary]:
        """Per device: how many rounds it contributed to, and its newest row. Raises :class:`RegistryDamaged`.

        One grouped query, so the status page does not read every row of every round it renders.
        """
        q = ("SELECT p.name, c.n, c.t, p.round, p.t, p.accuracy, p.macro_f1 FROM participation p JOIN "
             "(SELECT name, COUNT(*) AS n, MAX(round) AS r, MAX(t) AS t FROM participation GROUP BY name) c "
             "ON p.name = c.name AND p.round = c.r")  # fmt: skip
        with self._guard():
            rows = self._db.execute(q).fetchall()
        return {str(n): ParticipationSummary(int(k), float(t), ParticipationRow(str(n), int(r), float(rt), a, f))
                for n, k, t, r, rt, a, f in rows}  # fmt: skip

    def participation(self, name: str | None = None) -> list[ParticipationRow]:
        """Participation rows (of ``name`` only, when given), by round then name. Raises :class:`RegistryDamaged`."""
        q = "SELECT name, round, t, accuracy, macro_f1 FROM participation"
        with self._guard():
            rows = self._db.execute(q + (" WHERE name = ?" if name else "") + " ORDER BY round, name", (name,) if name else ()).fetchall()
        return [ParticipationRow(str(n), int(r), float(t), a, f) for n, r, t, a, f in rows]
