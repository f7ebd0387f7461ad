"""The run's own storage: a lock held by another program is waited for and then named as such, a full disk is a full
disk, and neither is ever called damage (issue 37 item 6)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import torch

from coordinator import state as run_state
from coordinator.state import RunState, StateDamaged, StateLocked, StorageFull, save_state_file
from har_models.nn.model import ArchSpec, init_state


def test_a_lock_held_elsewhere_is_waited_for_and_named_never_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_state, "LOCK_WAIT_S", 0.2)
    st = RunState(tmp_path)
    other = sqlite3.connect(tmp_path / "state.sqlite", check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")  # a backup tool's read transaction, held
    with pytest.raises(StateLocked, match="locked by another program") as err:
        st.put("k", 1)
    assert not isinstance(err.value, StateDamaged)
    other.rollback()
    monkeypatch.setattr(run_state, "LOCK_WAIT_S", 30.0)
    again = RunState(tmp_path)
    other.execute("BEGIN EXCLUSIVE")
    released = threading.Timer(0.2, other.rollback)  # the other program lets go while the write waits
    released.start()
    again.put("k", 2)
    assert again.get("k") == 2
    released.join()


def test_a_full_disk_is_storage_full_for_the_database_and_for_model_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = RunState(tmp_path)
    pages = st._db.execute("PRAGMA page_count").fetchone()[0]
    st._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StorageFull, match="disk full: "):
        for i in range(10_000):
            st.event(i, "c", "rejected", "x" * 500)
    spec = ArchSpec(n_classes=6, conv_filters=2, dense_units=4)

    def no_space(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_state, "atomic_write", no_space)
    with pytest.raises(StorageFull) as err:
        save_state_file(tmp_path / "m.safetensors", spec, init_state(spec, 1))
    assert err.value.needed == sum(t.numel() * 4 for t in init_state(spec, 1).values() if isinstance(t, torch.Tensor))
    assert str(err.value).startswith(f"disk full: {tmp_path}, ")
