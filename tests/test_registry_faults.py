"""``server.sqlite`` held by another program, full, or changed by hand: waited for, named, never called damaged when whole.

A second connection holds a write lock (as ``sqlite3`` at the shell in a transaction, or a backup
tool, would) until the registry has logged that it waits; the registry's write then goes through.
Held past the bound, the command stops with :class:`DatabaseBusy`, whose words say the file is
fine. Only a file that fails ``PRAGMA integrity_check`` is called damaged.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from coordinator.server.registry import Registry, RegistryDamaged
from coordinator.server.sqlite_faults import DatabaseBusy, kind, wait_for
from coordinator.state import StorageFull


class _Holder:
    """Another program's connection holding ``server.sqlite`` exclusively until released."""

    def __init__(self, path: Path):
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.db.execute("COMMIT")
        self.db.close()


class _ReleaseOnWait(logging.Handler):
    """Lets the holder go once the registry has logged ``n`` waits: the test waits for the event, not for a time."""

    def __init__(self, holder: _Holder, n: int):
        super().__init__()
        self.holder, self.n, self.seen = holder, n, 0

    def emit(self, record: logging.LogRecord) -> None:
        if "held by another program" in record.getMessage():
            self.seen += 1
            if self.seen == self.n:
                threading.Thread(target=self.holder.release).start()


def test_a_held_registry_is_waited_for_logged_and_then_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    Registry(tmp_path).close()
    holder = _Holder(tmp_path / "server.sqlite")
    handler = _ReleaseOnWait(holder, 2)
    logging.getLogger("fedhar.server.sqlite").addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING, logger="fedhar.server.sqlite"):
            reg = Registry(tmp_path, try_s=0.1)  # opening waits too (its check and schema are a write)
            reg.enrol("phone-anna", "Anna")
    finally:
        logging.getLogger("fedhar.server.sqlite").removeHandler(handler)
    assert reg.is_enrolled("phone-anna")
    reg.close()
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) >= 2 and all("server.sqlite is held by another program" in w for w in waits)
    assert "waiting for it to open it" in waits[0] and not any("damaged" in w for w in waits)


def test_held_past_the_bound_is_busy_not_damaged_and_nothing_changes(tmp_path: Path) -> None:
    reg = Registry(tmp_path, busy_wait_s=0.5, try_s=0.1)
    reg.enrol("phone-anna", "Anna")
    holder = _Holder(tmp_path / "server.sqlite")
    try:
        with pytest.raises(DatabaseBusy) as got:
            reg.revoke("phone-anna")
    finally:
        holder.release()
    text = str(got.value)
    assert "server.sqlite was held by another program" in text and "(revoke phone-anna)" in text and "The file is fine" in text
    assert "damaged" not in text and "move it away" not in text
    assert reg.is_enrolled("phone-anna")  # the write waits for nothing now: nothing was changed before
    reg.close()


def test_a_whole_file_changed_by_hand_is_not_called_damaged(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    with sqlite3.connect(tmp_path / "server.sqlite") as other:
        other.execute("DROP TABLE participation")
    with pytest.raises(RegistryDamaged, match="no such table") as got:
        reg.participation()
    text = str(got.value)
    assert "integrity_check finds the file whole" in text and "keep the file" in text
    assert "is damaged" not in text and "move it away" not in text and "enrol the devices again" not in text
    reg.close()


def test_a_damaged_page_is_called_damaged_after_the_integrity_check(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    for i in range(300):
        reg.enrol(f"device-{i:03d}-" + "x" * 53, "owner " * 10)
    reg.close()
    db = tmp_path / "server.sqlite"
    data = bytearray(db.read_bytes())
    data[2 * 4096 : 3 * 4096] = bytes((i * 7 + 3) % 256 for i in range(4096))
    db.write_bytes(bytes(data))
    with pytest.raises(RegistryDamaged, match=r"server\.sqlite is damaged .*Restore the file from a backup"):
        Registry(tmp_path)


def test_a_full_disk_is_storage_full_with_the_folder_free_and_needed(tmp_path: Path) -> None:
    def full() -> None:
        raise sqlite3.OperationalError("database or disk is full")

    with pytest.raises(StorageFull) as got:
        wait_for(tmp_path / "server.sqlite", full)
    assert str(got.value).startswith(f"disk full: {tmp_path}, ") and " free of 1.0 MB needed" in str(got.value)
    assert kind(sqlite3.OperationalError("database is locked")) == "busy"
    assert kind(sqlite3.OperationalError("attempt to write a readonly database")) == "access"
    assert kind(sqlite3.DatabaseError("file is not a database")) == "other"
