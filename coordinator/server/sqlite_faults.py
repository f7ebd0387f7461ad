"""Faults of a SQLite file on the home server told apart: held by another program, a full disk, no access, damage.

A *held* file (a backup, ``sqlite3`` at the shell) is fine: :func:`wait_for` waits, logging each try,
and gives up with :class:`DatabaseBusy`. A full disk is StorageFull; no access is
:class:`DatabaseAccess`, naming the ``chown``. Only a file failing ``PRAGMA integrity_check`` is
called damaged (:func:`integrity_problem`), so no advice throws away a whole file.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from coordinator.state import StorageFull, storage_full

log = logging.getLogger("fedhar.server.sqlite")

T = TypeVar("T")

BUSY_WAIT_S = 120.0
"""Longest wait (s) for a database another program holds (a backup takes seconds to a minute); then DatabaseBusy."""
TRY_S = 5.0
"""SQLite's busy timeout (s) of one try; a warning is logged after each try that found the file held."""
FULL_MARGIN_BYTES = 1_000_000
"""What a database write asks of the disk, said in the "disk full" message (a journal and a few pages)."""

Kind = Literal["busy", "full", "access", "other"]

_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
_FULL = (13,)  # SQLITE_FULL
_ACCESS = (3, 8, 14, 23)  # SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_AUTH


class DatabaseBusy(RuntimeError):
    """Another program held the database for longer than the wait (:data:`BUSY_WAIT_S`); the file is fine."""


class DatabaseAccess(PermissionError):
    """The database (or its folder) cannot be read or written by this account; the message names the file and the fix."""


def kind(exc: sqlite3.Error) -> Kind:
    """What ``exc`` says of the file: ``busy`` (held by another program), ``full`` (no space), ``access``, or ``other``."""
    code = getattr(exc, "sqlite_errorcode", None)
    text = str(exc).lower()
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in _BUSY or "database is locked" in text or "database table is locked" in text:
        return "busy"
    if primary in _FULL or "database or disk is full" in text:
        return "full"
    if primary in _ACCESS or "readonly database" in text or "unable to open database file" in text:
        return "access"
    return "other"


def integrity_problem(path: Path) -> str | None:
    """What ``PRAGMA integrity_check`` finds wrong with ``path`` (or why it cannot be checked); None when whole or merely held."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=TRY_S)
        try:
            rows = db.execute("PRAGMA integrity_check").fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        if kind(exc) == "busy":
            return None  # held, not damaged: it was readable before it was held
        return str(exc)
    return None if rows == [("ok",)] else " ".join("; ".join(str(r[0]) for r in rows[:3]).split())


def access_message(path: Path, why: str) -> str:
    """The words for a database this account cannot use: the file, the reason and the ``chown`` that fixes it."""
    import getpass

    try:
        who = getpass.getuser()
    except (KeyError, OSError):
        who = "the server's account"
    folder = Path(path).parent
    return (f"{path} cannot be written by {who} ({why}): the file and its folder must belong to the account serve runs as: "
            f"sudo chown -R {who}: {folder} (with the unit: sudo chown -R fedhar:fedhar {folder})")  # fmt: skip


def wait_for(path: Path, work: Callable[[], T], busy_wait_s: float = BUSY_WAIT_S, what: str = "") -> T:
    """Run ``work`` (one SQLite read or transaction on ``path``), trying again while another program holds the file.

    Each try waits :data:`TRY_S` inside SQLite and is logged (``what`` names the work). Raises
    DatabaseBusy after ``busy_wait_s`` (nothing changed), StorageFull for a full disk, DatabaseAccess when
    this account may not write, and any other sqlite3.Error for the caller to judge.
    """
    start = time.monotonic()
    tries = 0
    while True:
        try:
            return work()
        except sqlite3.Error as exc:
            k = kind(exc)
            if k == "full":
                raise storage_full(Path(path).parent, FULL_MARGIN_BYTES) from None
            if k == "access":
                raise DatabaseAccess(access_message(path, str(exc))) from None
            if k != "busy":
                raise
            tries += 1
            waited = time.monotonic() - start
            if waited >= busy_wait_s:
                raise DatabaseBusy(
                    f"{path} was held by another program for {waited:.0f} s{' (' + what + ')' if what else ''}; nothing was "
                    "changed. The file is fine: let the other program finish (a backup, sqlite3 at the shell) and start again"
                ) from None
            log.warning("%s is held by another program (a backup, sqlite3 at the shell?); waiting for it%s (%.0f s of at most "
                        "%.0f s)", path, f" to {what}" if what else "", waited, busy_wait_s)  # fmt: skip
            time.sleep(min(0.2 * tries, 1.0))
        except OSError as exc:
            if getattr(exc, "errno", None) in (28, 122) and not isinstance(exc, StorageFull):
                raise storage_full(Path(path).parent, FULL_MARGIN_BYTES) from None
            raise
