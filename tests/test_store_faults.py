"""A state folder that cannot be written: exit 6 at start; while running, a fault on screen and in the status, never selected.

The folder is made read-only for real: by its modes, or as root by a read-only file system
mounted over it (see :class:`Folder`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from coordinator.server.schedule import eligible_devices
from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.app.controller import AppConfig, DeviceController
from edge_client.cli import main
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore, StateFolderUnusable
from har_io.broker_config import BrokerConfig
from har_models.data.hapt import read_hapt_recordings
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from har_models.wire.messages import ClientStatus

ROOT = Path(__file__).resolve().parents[1]


class Folder:
    """A state folder that can be turned read-only and back.

    By its modes (0555 folder, 0444 files); as root, whom modes do not stop, by mounting a
    read-only tmpfs over it: every path under it then fails with EROFS, as on a file system
    the kernel remounted read-only, while the files the store holds open stay as they were.
    """

    def __init__(self, path: Path):
        self.path = path
        self.root = os.geteuid() == 0
        self.covered = False

    def read_only(self) -> None:
        if self.root:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(self.path)], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"running as root and cannot mount a read-only tmpfs over the folder: {r.stderr.strip()}")
            self.covered = True
        else:
            for p in [*self.path.rglob("*"), self.path]:
                p.chmod(0o555 if p.is_dir() else 0o444)

    def writable(self) -> None:
        if self.root:
            if self.covered:
                subprocess.run(["umount", str(self.path)], check=True)
                self.covered = False
        else:
            for p in [self.path, *self.path.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.fixture
def folder(tmp_path) -> Iterator[Folder]:
    f = Folder(tmp_path / "state")
    f.path.mkdir()
    try:
        yield f
    finally:
        f.writable()


def _windows(n: int = 40) -> WindowSet:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 6, 128)).astype(np.float32)
    return WindowSet(x, np.arange(n) % 6, HAPT_LABELS, np.arange(n, dtype=np.int64) * 1_280_000_000)


def _filled(path: Path) -> None:
    store = ClientStore(path, HAPT_LABELS, owner="pi-1")
    store.replace_windows("recorded", _windows())
    store.close()


def test_a_read_only_state_folder_at_start_is_exit_6_with_the_folder_and_the_fix(folder, capsys):
    _filled(folder.path)
    folder.read_only()
    with pytest.raises(StateFolderUnusable) as exc:
        ClientStore(folder.path, HAPT_LABELS, owner="pi-1")
    assert f"state folder {folder.path} cannot be written (opening the store:" in str(exc.value)
    code = main(["--client-id", "pi-1", "--broker", "127.0.0.1:1", "--source", "recorded:hapt6", "--state-dir", str(folder.path)])
    err = capsys.readouterr().err
    assert code == 6, err
    assert err.startswith(f"fedhar-client: state folder {folder.path} cannot be written") and "Make the folder writable" in err
    assert "Traceback" not in err and "OperationalError" not in err


def test_a_folder_turning_read_only_while_running_is_a_fault_in_the_status_and_the_device_is_not_selected(folder):
    _filled(folder.path)
    store = ClientStore(folder.path, HAPT_LABELS, owner="pi-1")
    try:
        agent = EdgeAgent(ClientConfig(client_id="pi-1", broker=BrokerConfig(port=1), federation="home", backend="numpy"), store)
        heard: list[str] = []
        store.fault_listeners.append(heard.append)
        before = ClientStatus.from_bytes(agent._status_bytes())
        assert before.fault == "" and before.selectable and before.n_train > 0
        folder.read_only()
        # every kind of write the client makes while it runs
        writes = [
            lambda: store.save_local_model("{}", {"w": np.ones(3, np.float32)}),
            lambda: store.save_tensors("encoding_residual", {"w": np.ones(3, np.float32)}, {"round": 1}),
            lambda: store.save_last_update("run-1", 1, 0, b"update"),
            lambda: store.set_meta("run_id", "run-1"),
            lambda: store.replace_windows("recorded", _windows(12)),
        ]
        for write in writes:
            with pytest.raises(StateFolderUnusable) as exc:
                write()
            assert f"state folder {folder.path} cannot be written (" in str(exc.value)
        assert len(heard) == 1 and "(the local model: " in heard[0]  # told once, when it began
        assert "(the recorded windows: " in store.fault  # the newest write's words
        status = ClientStatus.from_bytes(agent._status_bytes())
        assert status.fault == store.fault and "cannot be written" in status.fault and "this device takes part in no round" in status.fault
        assert status.state != "offline" and status.n_train > 0 and not status.selectable
        assert eligible_devices({"pi-1": status}, fresh=lambda c: True, enrolled=lambda c: True, revoked=lambda c: False).left_out == {
            "pi-1": "device_fault"
        }
        # writable again: the next write succeeds, the fault clears, and the device is selectable again
        folder.writable()
        store.set_meta("run_id", "run-1")
        assert store.fault == "" and heard[-1] == ""
        assert ClientStatus.from_bytes(agent._status_bytes()).selectable
    finally:
        folder.writable()
        store.close()


def test_the_coordinator_leaves_out_a_device_whose_status_has_a_fault():
    ok = ClientStatus("pi-1", "idle", "hapt6", n_train=30, n_test=8)
    bad = ClientStatus("pi-2", "idle", "hapt6", n_train=30, n_test=8, fault="state folder /x cannot be written")
    assert ClientStatus.from_bytes(bad.to_bytes()) == bad and b'"fault"' not in ok.to_bytes()  # optional on the wire
    assert ok.selectable and not bad.selectable


def test_the_app_shows_a_storage_fault_on_the_federation_screen(folder):
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    cfg = AppConfig(state_dir=folder.path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    views: list = []
    ctl = DeviceController(cfg, ReplaySensor(rec, speed=None, loop=False), on_federation=views.append, charging=lambda: True,
                           supervise_s=5.0)  # fmt: skip
    try:
        folder.read_only()
        with pytest.raises(StateFolderUnusable):
            ctl.store.set_meta("run_id", "run-1")
        end = time.monotonic() + 10
        while time.monotonic() < end and not (views and views[-1].state.startswith("cannot take part")):
            time.sleep(0.05)
        assert views[-1].state == "cannot take part: storage failed"
        assert views[-1].error.startswith(f"state folder {folder.path} cannot be written (the setting run_id:")
    finally:
        folder.writable()
        ctl.close()
