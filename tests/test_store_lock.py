"""A state folder has one owner at a time: a second client on it is refused and changes nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_client import cli
from edge_client.store import LOCK_FILE, ClientStore, StoreInUseError
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet

ROOT = Path(__file__).resolve().parents[1]
USER05 = ROOT / "datasets" / "hapt" / "user05.npz"

HOLDER = """
import sys
from edge_client.store import ClientStore
from har_models.data.labels import HAPT_LABELS
store = ClientStore(sys.argv[1], HAPT_LABELS, owner="dev-a")
print("ready", flush=True)
sys.stdin.readline()
store.close()
"""


def _windows(n: int = 40) -> WindowSet:
    rng = np.random.default_rng(3)
    return WindowSet(rng.normal(size=(n, 6, 128)).astype(np.float32), np.arange(n) % 6, HAPT_LABELS, np.arange(n) * 7)


def _stored_rows(folder: Path) -> list[tuple]:
    """Read the database directly (independent of ClientStore, which the holder keeps locked)."""
    with sqlite3.connect(f"file:{folder / 'store.sqlite'}?mode=ro", uri=True) as db:
        return db.execute("SELECT source, t_start_ns, label, split, x FROM windows ORDER BY id").fetchall()


def _start_holder(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"  # EOF (holder died) fails here
    return proc


def test_second_process_is_refused_with_folder_pid_and_client_id(tmp_path, capsys):
    store = ClientStore(tmp_path, HAPT_LABELS, owner="dev-a")
    store.replace_windows("source-of-dev-a", _windows())
    store.close()
    before = _stored_rows(tmp_path)
    assert len(before) == 40
    holder = _start_holder(tmp_path)
    try:
        assert json.loads((tmp_path / LOCK_FILE).read_text()) == {"pid": holder.pid, "client_id": "dev-a"}
        with pytest.raises(StoreInUseError) as err:
            ClientStore(tmp_path, HAPT_LABELS, owner="dev-b")
        assert (err.value.folder, err.value.pid, err.value.owner) == (tmp_path, holder.pid, "dev-a")
        assert str(err.value) == (
            f"state folder {tmp_path} is in use by a running fedhar client (pid {holder.pid}, client id dev-a); "
            "nothing was changed. Stop that client first, or give this one its own --state-dir"
        )
        # the real program: a second fedhar-client with another id on the same --state-dir
        rc = cli.main(["--client-id", "dev-b", "--source", f"hapt:{USER05}", "--state-dir", str(tmp_path), "--broker", "127.0.0.1:1"])
        assert rc == 6  # the folder cannot be used (har_io.exit_codes.Exit.FOLDER_UNUSABLE)
        assert f"state folder {tmp_path} is in use" in capsys.readouterr().err
        assert _stored_rows(tmp_path) == before  # nothing overwritten
        assert json.loads((tmp_path / LOCK_FILE).read_text())["client_id"] == "dev-a"
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    again = ClientStore(tmp_path, HAPT_LABELS, owner="dev-b")  # free once the owner closed it
    assert len(again.windows("train")) + len(again.windows("test")) == 40
    again.close()


def test_a_killed_owner_leaves_no_stale_lock(tmp_path):
    holder = _start_holder(tmp_path)
    with pytest.raises(StoreInUseError):
        ClientStore(tmp_path, HAPT_LABELS)
    holder.kill()  # SIGKILL: no close(), no cleanup
    holder.wait(timeout=60)
    ClientStore(tmp_path, HAPT_LABELS, owner="dev-c").close()


def test_one_owner_within_a_process_too(tmp_path):
    first = ClientStore(tmp_path, HAPT_LABELS, owner="a")
    with pytest.raises(StoreInUseError, match="client id a"):
        ClientStore(tmp_path, HAPT_LABELS, owner="b")
    first.close()
    second = ClientStore(tmp_path, HAPT_LABELS, owner="b")
    second.close()
    second.close()  # closing twice is harmless


def test_a_refused_label_set_releases_the_folder(tmp_path):
    from har_models.data.labels import REALWORLD_LABELS

    ClientStore(tmp_path, HAPT_LABELS).close()
    with pytest.raises(ValueError, match="realworld8"):
        ClientStore(tmp_path, REALWORLD_LABELS)
    ClientStore(tmp_path, HAPT_LABELS).close()  # the failed open did not keep the lock


def test_a_client_with_nothing_to_train_on_says_so_and_exits(tmp_path, capsys, monkeypatch):
    from test_realworld import standard_archives, write_dataset

    from har_models.data.labels import REALWORLD_LABELS

    monkeypatch.setenv("FEDHAR_CACHE_DIR", str(tmp_path / "cache"))
    gyro_only = {name: data for name, data in standard_archives().items() if name.startswith("gyr_")}
    root = write_dataset(tmp_path / "data", {2: gyro_only}, zipped=False)
    source = f"realworld:{root}:proband2:chest,shin"
    rc = cli.main(["--client-id", "proband2", "--source", source, "--state-dir", str(tmp_path / "state"), "--broker", "127.0.0.1:1"])
    assert rc == 3
    err = capsys.readouterr().err
    assert f"fedhar-client: proband2: {source} gives no labelled training window" in err and "nothing to train on" in err
    ClientStore(tmp_path / "state", REALWORLD_LABELS).close()  # and it released its state folder
