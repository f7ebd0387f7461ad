"""The server database (coordinator/server/registry.py): what goes in comes out, a revoked name stays
refused for good, and a damaged file is an error naming the file and the fix, never an empty registry."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.server.registry import SCHEMA_VERSION, Registry, RegistryDamaged
from coordinator.state import StateDamaged


def test_devices_round_trip_through_a_reopen(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    before = time.time()
    reg.enrol("phone-anna", "Anna")
    reg.enrol("pi-kitchen", None)
    reg.revoke("pi-kitchen")
    reg.close()
    reg = Registry(tmp_path)
    rows = {d.name: d for d in reg.devices()}
    assert set(rows) == {"phone-anna", "pi-kitchen"}
    assert rows["phone-anna"].owner == "Anna" and rows["phone-anna"].state == "enrolled"
    assert rows["phone-anna"].revoked_unix is None and rows["phone-anna"].enrolled_unix >= before
    assert rows["pi-kitchen"].state == "revoked" and rows["pi-kitchen"].revoked_unix is not None
    assert reg.is_revoked("pi-kitchen") and not reg.is_revoked("phone-anna") and not reg.is_revoked("never-seen")
    assert reg.is_enrolled("phone-anna") and not reg.is_enrolled("pi-kitchen") and not reg.is_enrolled("never-seen")
    assert reg.revoked_names() == frozenset({"pi-kitchen"})
    assert reg.schema_version() == SCHEMA_VERSION == 1


def test_a_revoked_name_is_never_enrolled_again(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.enrol("phone-ben", "Ben")
    with pytest.raises(ValueError, match="'phone-ben' is already enrolled"):
        reg.enrol("phone-ben", "Ben")
    reg.revoke("phone-ben")
    first = reg.devices()[0].revoked_unix
    reg.revoke("phone-ben")  # a second revoke keeps the first time
    assert reg.devices()[0].revoked_unix == first
    with pytest.raises(ValueError, match="enrol it under a new name"):
        reg.enrol("phone-ben", "Ben")
    with pytest.raises(ValueError, match="device name ' x'"):
        reg.enrol(" x", None)
    # The one client-id rule (check_client_id), not a looser one of its own: a name the broker's ACL
    # and the topics could not carry is refused here too.
    for bad in ("phone/anna", "phone+", "a" * 65, "anna's phone"):
        with pytest.raises(ValueError, match=r"device name .*: client id .* is invalid: use 1-64 letters, digits, '_', '.' or '-'"):
            reg.enrol(bad, None)
        with pytest.raises(ValueError, match="is invalid"):
            reg.revoke(bad)
    reg.enrol("a" * 64, None)


def test_forget_keeps_only_the_name_so_it_stays_refused(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.enrol("a", "Anna")
    reg.enrol("b", "Ben")
    reg.note_participation(0, "a", 0.5, 0.25)
    reg.note_participation(0, "b", 0.75, None)
    reg.note_participation(1, "a", 0.625, 0.5)
    reg.forget("a")
    (row,) = [d for d in reg.devices() if d.name == "a"]
    assert row.state == "forgotten" and row.owner is None and row.revoked_unix is not None
    assert reg.is_revoked("a")
    assert [(p.name, p.round, p.accuracy, p.macro_f1) for p in reg.participation()] == [("b", 0, 0.75, None)]
    reg.note_participation(2, "a", 0.9, 0.9)  # a late record of a forgotten device is not kept
    assert reg.participation("a") == []
    with pytest.raises(ValueError, match="revoked"):
        reg.enrol("a", "Anna")


def test_participation_one_row_per_device_and_round(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.note_participation(3, "b", 0.5, 0.5)
    reg.note_participation(1, "b", 0.25, 0.125)
    reg.note_participation(1, "a", None, None)
    reg.note_participation(1, "b", 0.375, 0.25)  # replaces (b, 1)
    rows = reg.participation()
    assert [(p.round, p.name, p.accuracy, p.macro_f1) for p in rows] == [(1, "a", None, None), (1, "b", 0.375, 0.25), (3, "b", 0.5, 0.5)]
    assert [p.round for p in reg.participation("b")] == [1, 3]


def test_epochs_count_up_from_one_across_reopens(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    assert reg.current_epoch() == 0
    assert reg.new_epoch() == 1
    assert reg.new_epoch() == 2
    reg.close()
    reg = Registry(tmp_path)
    assert reg.current_epoch() == 2
    assert reg.new_epoch() == 3


def test_versions_round_trip_with_their_figures(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.add_version(1, 0, 1, tmp_path / "versions" / "v000001.safetensors", {"personalization_macro_f1": 0.5, "global_accuracy": None})
    reg.add_version(2, 1, 2, tmp_path / "versions" / "v000002.safetensors", {"personalization_macro_f1": 0.625})
    reg.close()
    reg = Registry(tmp_path)
    v = reg.versions()
    got = [(r.version, r.round, r.arch_version, r.path.name) for r in v]
    assert got == [(1, 0, 1, "v000001.safetensors"), (2, 1, 2, "v000002.safetensors")]
    assert v[0].figures == {"personalization_macro_f1": 0.5, "global_accuracy": None}
    reg.delete_version(1)
    assert [r.version for r in reg.versions()] == [2]
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        reg.add_version(0, 0, 1, tmp_path / "x", {})
    with pytest.raises(ValueError, match="not JSON"):
        reg.add_version(3, 2, 1, tmp_path / "x", {"f1": float("nan")})


def test_an_empty_file_is_damage_and_is_left_alone(tmp_path: Path) -> None:
    Registry(tmp_path).close()
    db = tmp_path / "server.sqlite"
    db.write_bytes(b"")
    with pytest.raises(RegistryDamaged, match=r"server\.sqlite is damaged \(it is empty \(0 bytes\)\).*Restore the file from a backup"):
        Registry(tmp_path)
    assert db.stat().st_size == 0
    assert issubclass(RegistryDamaged, StateDamaged)


def test_a_file_that_is_not_a_database_is_damage(tmp_path: Path) -> None:
    db = tmp_path / "server.sqlite"
    db.write_bytes(b"this is a text file, not SQLite\n" * 200)
    with pytest.raises(RegistryDamaged, match=r"server\.sqlite is damaged"):
        Registry(tmp_path)
    assert db.read_bytes().startswith(b"this is a text file")


def test_a_garbage_page_is_caught_at_open(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    for i in range(300):  # names of 64 characters, the longest client id
        reg.enrol(f"device-{i:03d}-" + "x" * 53, "owner " * 10)
        reg.note_participation(i, f"device-{i:03d}-" + "x" * 53, 0.5, 0.5)
    reg.close()
    db = tmp_path / "server.sqlite"
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) >= 6 * page
    data[2 * page : 3 * page] = bytes((i * 7 + 3) % 256 for i in range(page))
    db.write_bytes(bytes(data))
    with pytest.raises(RegistryDamaged, match="move it away to start a new device registry"):
        Registry(tmp_path)
    assert db.read_bytes() == bytes(data)


def test_every_read_and_write_after_open_is_guarded(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.enrol("a", None)
    with sqlite3.connect(tmp_path / "server.sqlite") as other:  # the file changes under the running server
        for table in ("devices", "epochs", "versions", "participation"):
            other.execute(f"DROP TABLE {table}")
    calls: list[Callable[[], Any]] = [
        lambda: reg.enrol("b", None),
        lambda: reg.revoke("a"),
        lambda: reg.forget("a"),
        lambda: reg.is_revoked("a"),
        lambda: reg.is_enrolled("a"),
        reg.revoked_names,
        reg.devices,
        reg.new_epoch,
        reg.current_epoch,
        lambda: reg.add_version(1, 0, 1, tmp_path / "v", {}),
        reg.versions,
        lambda: reg.delete_version(1),
        lambda: reg.note_participation(0, "a", 0.5, 0.5),
        reg.participation,
    ]
    for call in calls:
        with pytest.raises(RegistryDamaged, match="no such table"):
            call()


def test_a_row_that_does_not_decode_is_damage(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.add_version(1, 0, 1, tmp_path / "v", {"f1": 0.5})
    with sqlite3.connect(tmp_path / "server.sqlite") as other:
        other.execute("UPDATE versions SET figures = '{not json' WHERE version = 1")
    with pytest.raises(RegistryDamaged, match="a row does not decode"):
        reg.versions()


def test_a_newer_schema_is_refused_unchanged(tmp_path: Path) -> None:
    Registry(tmp_path).close()
    db = tmp_path / "server.sqlite"
    with sqlite3.connect(db) as other:
        other.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    before = db.read_bytes()
    with pytest.raises(RegistryDamaged, match=r"schema version 99, this fedhar reads up to 1.*upgrade fedhar"):
        Registry(tmp_path)
    assert db.read_bytes() == before


def test_two_handles_see_each_others_writes(tmp_path: Path) -> None:
    serving = Registry(tmp_path)
    serving.enrol("a", None)
    cli = Registry(tmp_path)  # `fedhar-coordinator revoke` while serve runs
    cli.revoke("a")
    cli.close()
    assert serving.is_revoked("a")


def test_a_registry_of_the_previous_release_is_upgraded_in_place_and_a_rename_keeps_the_history(tmp_path: Path) -> None:
    # server.sqlite as the release before renames wrote it: schema 1, no renamed_to column
    db = sqlite3.connect(tmp_path / "server.sqlite")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE devices (name TEXT PRIMARY KEY, owner TEXT, enrolled_unix REAL NOT NULL, revoked_unix REAL, forgotten_unix REAL);"
        "CREATE TABLE epochs (epoch INTEGER PRIMARY KEY AUTOINCREMENT, started_unix REAL NOT NULL);"
        "CREATE TABLE versions (version INTEGER PRIMARY KEY, round INTEGER NOT NULL, created_unix REAL NOT NULL,"
        " arch_version INTEGER NOT NULL, path TEXT NOT NULL, figures TEXT NOT NULL);"
        "CREATE TABLE participation (name TEXT NOT NULL, round INTEGER NOT NULL, t REAL NOT NULL, accuracy REAL, macro_f1 REAL,"
        " PRIMARY KEY (name, round));"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "INSERT INTO devices VALUES ('phone-anna', 'Anna', 1000.0, NULL, NULL);"
        "INSERT INTO participation VALUES ('phone-anna', 0, 1001.0, 0.8, 0.7), ('phone-anna', 1, 1002.0, 0.82, 0.71);"
    )
    db.commit()
    db.close()
    reg = Registry(tmp_path)
    assert [(d.name, d.owner, d.state, d.renamed_to) for d in reg.devices()] == [("phone-anna", "Anna", "enrolled", None)]
    reg.rename("phone-anna", "phone-anna2")
    rows = {d.name: d for d in reg.devices()}
    assert rows["phone-anna"].state == "revoked" and rows["phone-anna"].renamed_to == "phone-anna2"
    assert rows["phone-anna2"].state == "enrolled" and rows["phone-anna2"].owner == "Anna" and rows["phone-anna2"].enrolled_unix == 1000.0
    assert [(p.round, p.accuracy) for p in reg.participation("phone-anna2")] == [(0, 0.8), (1, 0.82)]
    assert reg.participation("phone-anna") == [] and reg.is_revoked("phone-anna") and reg.schema_version() == 1
    with pytest.raises(ValueError, match="taken already"):
        reg.rename("phone-anna2", "phone-anna")  # an old name is never taken again
    with pytest.raises(ValueError, match="is not enrolled"):
        reg.rename("phone-anna", "phone-x")
    reg.close()
