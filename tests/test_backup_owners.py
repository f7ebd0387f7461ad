"""Backups record each file's owner, group and mode as they were in the original, and restore gives them back and says
so; scheduled backups (``backup DEST --keep N``) keep the newest N. Owners are set with chown, so the ownership part
runs as root (as ``sudo fedhar-coordinator restore`` does) and is skipped otherwise."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from coordinator.server import backup_cli
from coordinator.server.backup import MANIFEST, BackupError, backup
from coordinator.server.data_lock import DataLock
from coordinator.server.registry import Registry
from coordinator.server.restore import restore

SERVER, GROUP, BROKER_GROUP = 4242, 4343, 4444  # the server's account and group, the broker's group


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    data, broker = tmp_path / "data", tmp_path / "broker"
    Registry(data).close()
    (data / "enrolment").mkdir(mode=0o700)
    (data / "enrolment" / "dev-a.json").write_text("{}")
    (data / "run").mkdir()
    (data / "run" / "config.toml").write_text("aggregation = 'fedavg'\n")
    (data / "server.toml").write_text(f'[server]\nbroker_dir = "{broker}"\n')
    broker.mkdir()
    (broker / "passwd").write_text("dev-a:hash\n")
    (broker / "fedhar-broker.json").write_text("{}")
    return data, broker


def _owned(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files another owner needs root")
def test_restore_gives_back_owners_groups_and_modes_as_recorded(tmp_path: Path) -> None:
    data, broker = _tree(tmp_path)
    for p in [data, *data.rglob("*")]:
        os.chown(p, SERVER, GROUP)
    os.chmod(data, 0o700)
    os.chmod(data / "enrolment" / "dev-a.json", 0o600)
    os.chown(broker, 0, BROKER_GROUP)
    os.chmod(broker, 0o751)
    os.chown(broker / "passwd", 0, BROKER_GROUP)
    os.chmod(broker / "passwd", 0o640)
    bk = tmp_path / "bk"
    manifest = backup(data, bk, data / "server.toml", broker)
    assert manifest["files"]["data/run/config.toml"]["uid"] == SERVER  # the original's, not the copy's (root's)
    assert _owned(bk / "data" / "run" / "config.toml")[0] == 0
    restored = tmp_path / "restored"
    lines = restore(bk, restored, force=True)
    assert lines[0].startswith(f"{restored} restored: ") and "owners, groups and modes as the backup recorded them (4242:4343 " in lines[0]
    assert _owned(restored) == (SERVER, GROUP, 0o700)
    assert _owned(restored / "run" / "config.toml")[:2] == (SERVER, GROUP)
    assert _owned(restored / "enrolment") == (SERVER, GROUP, 0o700)
    assert _owned(restored / "enrolment" / "dev-a.json") == (SERVER, GROUP, 0o600)
    assert _owned(broker) == (0, BROKER_GROUP, 0o751) and _owned(broker / "passwd") == (0, BROKER_GROUP, 0o640)
    assert any("moved aside" in line for line in lines)
    # A backup of an earlier release recorded its copies' owners (root's): the data folder's owner gets the data back,
    # the broker folder's group its group-readable files.
    doc = json.loads((bk / MANIFEST).read_text())
    doc.pop("owners")
    doc.pop("dirs")
    doc["parts"]["data_owner"] = [SERVER, GROUP, 0o700]
    doc["parts"]["broker_owner"] = [0, BROKER_GROUP, 0o751]
    for meta in doc["files"].values():
        meta["uid"] = meta["gid"] = 0
    (bk / MANIFEST).write_text(json.dumps(doc))
    again = tmp_path / "again"
    restore(bk, again, force=True)
    assert _owned(again)[:2] == (SERVER, GROUP) and _owned(again / "run" / "config.toml")[:2] == (SERVER, GROUP)
    assert _owned(broker / "passwd") == (0, BROKER_GROUP, 0o640) and _owned(broker / "fedhar-broker.json")[:2] == (0, BROKER_GROUP)


def test_scheduled_backups_keep_the_newest_n(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, _ = _tree(tmp_path)
    listening = socket.socket(socket.AF_UNIX)  # a running server's operator socket is in the data folder: left out
    listening.bind(str(data / "operator.sock"))
    parent = tmp_path / "backups"
    parent.mkdir()
    for i in range(4):  # four earlier backups, an hour apart
        old = parent / f"fedhar-20260301-0{i}0000"
        old.mkdir()
        (old / MANIFEST).write_text(json.dumps({"created_unix": 1772326800.0 + 3600 * i}))
    (parent / "fedhar-20260301-050000").mkdir()  # a backup stopped while copying: no manifest, never deleted
    (parent / "photos").mkdir()  # not a backup: never touched
    assert backup_cli.keep_newest(parent, 3) == [parent / "fedhar-20260301-000000"]
    for _ in range(2):  # the timer, twice: a new backup each time, the newest 2 kept
        assert backup_cli.main("backup", [str(parent), "--keep", "2", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    left = sorted(p.name for p in parent.iterdir())
    made = [p for p in left if p.startswith("fedhar-") and p[7:15] != "20260301"]
    assert len(made) == 2 and left == sorted(["fedhar-20260301-050000", "photos", *made])
    assert out.count("deleted the older backup") == 3
    assert all((parent / name / MANIFEST).is_file() for name in made)
    # a restore over the folder of a running server is refused
    lock = DataLock(data, "serve")
    assert lock.try_acquire()
    with pytest.raises(BackupError, match=r"is in use by serve pid \d+: stop it first"):
        restore(parent / made[0], data, force=True)
    lock.release()
    with pytest.raises(ValueError, match="keep at least the newest backup"):
        backup_cli.keep_newest(parent, 0)
    assert not (parent / made[0] / "data" / "operator.sock").exists()
    listening.close()
