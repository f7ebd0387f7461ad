"""Damaged coordinator state is never read as no state: a cut, garbled or altered database stops
the run with one clear error (exit 6) and leaves the file as it was, at open and at every later read."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator, StateError
from coordinator.state import RunState, StateDamaged
from har_models.nn.model import ArchSpec, init_state

ROOT = Path(__file__).resolve().parents[1]
SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def _run_folder(folder: Path, rounds: int = 3) -> Path:
    st = RunState(folder)
    st.put("run_id", "r1")
    for r in range(rounds):
        st.complete_round(r, SPEC, init_state(SPEC, r), {}, {"round": r, "note": "x" * 2000})
        for i in range(40):
            st.event(r, f"c{i}", "rejected", "y" * 200)
    st.close()
    return folder / "state.sqlite"


def test_an_empty_database_file_is_damage_not_a_new_run(tmp_path: Path) -> None:
    db = _run_folder(tmp_path)
    db.write_bytes(b"")
    with pytest.raises(StateDamaged, match=r"state\.sqlite is damaged \(it is empty \(0 bytes\)\)"):
        RunState(tmp_path)
    with pytest.raises(StateError, match="empty"):
        Coordinator(CoordinatorConfig(run_dir=tmp_path, run_id="r1", resume=True), progress=False)
    assert db.stat().st_size == 0  # not turned into a fresh database


def test_a_garbage_page_is_caught_at_open_and_the_file_is_left_as_it_was(tmp_path: Path) -> None:
    db = _run_folder(tmp_path)
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) >= 4 * page
    data[2 * page : 3 * page] = bytes((i * 7 + 3) % 256 for i in range(page))
    db.write_bytes(bytes(data))
    with pytest.raises(StateDamaged, match="Restore the file from a backup, or move it away"):
        RunState(tmp_path)
    assert db.read_bytes() == bytes(data)


def test_a_row_that_does_not_decode_is_damage(tmp_path: Path) -> None:
    db = _run_folder(tmp_path)
    with sqlite3.connect(db) as other:
        other.execute("UPDATE rounds SET summary = '{not json' WHERE round = 1")
    st = RunState(tmp_path)
    assert st.last_completed_round() == 2
    with pytest.raises(StateDamaged, match="a row does not decode"):
        st.rounds()


def test_every_read_after_open_is_guarded(tmp_path: Path) -> None:
    db = _run_folder(tmp_path)
    st = RunState(tmp_path)
    with sqlite3.connect(db) as other:  # the database changes under the running coordinator
        other.execute("DROP TABLE rounds")
        other.execute("DROP TABLE meta")
    for read in (st.last_completed_round, st.rounds, st.load_latest_intact, lambda: st.get("run_id"), lambda: st.put("k", 1)):
        with pytest.raises(StateDamaged, match="no such table"):
            read()
    with pytest.raises(StateDamaged):
        st.complete_round(3, SPEC, init_state(SPEC, 3), {}, {"round": 3})
    assert isinstance(StateDamaged("x"), sqlite3.DatabaseError)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["empty", "garbage"])
def test_the_coordinator_command_exits_6_naming_the_file(tmp_path: Path, damage: str) -> None:
    db = _run_folder(tmp_path / "run")
    if damage == "empty":
        db.write_bytes(b"")
    else:
        data = bytearray(db.read_bytes())
        data[100:4096] = b"\xff" * (4096 - 100)  # the first page's b-tree header and cells
        db.write_bytes(bytes(data))
    before = db.read_bytes()
    cmd = [sys.executable, "-m", "coordinator.cli", "--broker", "127.0.0.1:9", "--federation", "f", "--run-id", "r1",
           "--run-dir", str(tmp_path / "run"), "--resume"]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 6, (r.returncode, r.stderr[-2000:])
    assert "state.sqlite is damaged" in r.stderr and "Traceback" not in r.stderr
    assert db.read_bytes() == before


def test_an_intact_run_folder_still_resumes(tmp_path: Path) -> None:
    _run_folder(tmp_path)
    st = RunState(tmp_path)
    found = st.load_latest_intact()
    assert found is not None and found[0] == 2
    assert torch.equal(found[2]["out.bias"], init_state(SPEC, 2)["out.bias"])
