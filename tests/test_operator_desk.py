"""Operator commands do their live side through a running serve, over its socket, in its serving loop; without a
server they do it on the folders under the data folder's lock. The server runs here over in-memory devices (no broker); the broker folder
is a generated one that is never reloaded (``broker_reload = "none"``), so no command needs a broker, and a command that
logged in as the coordinator would fail at once (nothing listens on its port)."""

from __future__ import annotations

import json
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.inmemory_grid import InMemoryGrid, device_status
from support.serving import LoopGrid, until

import coordinator.broker as gen
from coordinator.server import devices_cli, operator_channel
from coordinator.server.audit import read_audit
from coordinator.server.data_lock import DataLock, FolderInUse
from coordinator.server.registry import Registry
from har_io.broker_config import BrokerConfig

BROKER = BrokerConfig.parse("127.0.0.1:9")
DEVICES = ("dev-a", "dev-b", "dev-c")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    broker = tmp_path / "broker"
    gen.generate(broker, {"federation": "home", "port": 19999}, list(DEVICES))
    d = tmp_path / "data"
    d.mkdir()
    (d / "server.toml").write_text(
        "conv_filters = 4\ndense_units = 8\nmin_clients = 2\n"
        f'[server]\nhttp_port = 0\nbroker_dir = "{broker}"\nbroker_reload = "none"\npublic_host = "127.0.0.1"\n'
        "[schedule]\nmin_clients = 4\nmin_round_interval_s = 3600\n"
    )
    reg = Registry(d)
    for name in DEVICES:
        reg.enrol(name, None)
    reg.close()
    return d


@pytest.fixture
def serving(data: Path) -> Iterator[tuple[Any, LoopGrid, str]]:
    from coordinator.server.serve import Server

    grid = LoopGrid({cid: device_status(cid, 30) for cid in DEVICES})
    server = Server(data, BROKER, "home", grid=lambda needs: grid, poll_s=0.02)
    stop = threading.Event()
    loop = threading.Thread(target=server.run, args=(stop,), name="serving-loop", daemon=True)
    loop.start()
    until(lambda: (data / operator_channel.SOCKET_NAME).exists(), 20, "the operator socket")
    try:
        yield server, grid, loop.name
    finally:
        stop.set()
        loop.join(20)
    assert not loop.is_alive() and not (data / operator_channel.SOCKET_NAME).exists()


def test_commands_go_through_the_running_server_and_are_done_in_its_loop(
    data: Path, serving: tuple[Any, LoopGrid, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, grid, loop = serving
    sock = data / operator_channel.SOCKET_NAME
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600 and stat.S_ISSOCK(sock.stat().st_mode)
    assert DataLock(data, "test").try_acquire() is False  # the server holds the folder
    monkeypatch.setenv("SUDO_USER", "anna")
    done_in: list[str] = []
    real_forget = grid.forget

    def forget(cid: str) -> None:  # where the server forgets the device: its loop's thread
        done_in.append(threading.current_thread().name)
        real_forget(cid)

    monkeypatch.setattr(grid, "forget", forget)
    t0 = time.monotonic()
    assert devices_cli.main("revoke", ["dev-c", "--data", str(data)]) == 0
    out, err = capsys.readouterr()
    assert time.monotonic() - t0 < 10  # no login to a broker that is not there
    assert err == ""  # no round open: nothing to wait for
    assert "dev-c recorded as revoked in " in out
    assert "dev-c's broker account and ACL removed; broker reloaded (none)" in out
    assert "the running server cleared dev-c's retained status and models (and refuses it from now on)" in out
    assert ("clear_device", "dev-c") in grid.log and "dev-c" not in grid.devices
    assert done_in and set(done_in) == {loop}  # in the serving loop, not in the channel's thread
    assert server.registry.is_revoked("dev-c")
    entry = read_audit(data)[-1]
    assert (entry.action, entry.device, entry.by) == ("revoke", "dev-c", "anna")  # the operator, not the server's account
    # release: the runner's own answer, the same exit status as without a server
    assert devices_cli.main("release", ["dev-a", "--data", str(data)]) == 0
    assert capsys.readouterr().out.strip() == "dev-a was not quarantined; nothing changed"
    # errors come back with their status: a name that is not enrolled (2), a version that is not kept (2)
    assert devices_cli.main("reissue", ["nobody", "--data", str(data)]) == 2
    assert "device 'nobody' is not enrolled" in capsys.readouterr().err
    assert devices_cli.main("pin", ["7", "--data", str(data)]) == 2
    assert "version 7 is not kept" in capsys.readouterr().err


def test_a_command_from_another_account_is_refused(data: Path, serving: tuple[Any, LoopGrid, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(operator_channel, "_peer_uid", lambda conn: 4242)
    out: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            out.append(text)

        def flush(self) -> None:
            pass

    got = operator_channel.ask(data, "release", {"name": "dev-a"}, Sink())  # type: ignore[arg-type]
    assert got.status == 2 and "uid 4242 may not give this server commands" in str(got.error)


def test_a_second_serve_is_refused_and_without_a_server_a_command_holds_the_lock(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.server.serve import Server

    first = Server(data, BROKER, "home", grid=lambda needs: InMemoryGrid({}))
    try:
        with pytest.raises(FolderInUse, match="in use by another fedhar-coordinator serve"):
            Server(data, BROKER, "home", grid=lambda needs: InMemoryGrid({}))
    finally:
        first.close()
    # No server: the command takes the lock, acts on the folders, and lets go.
    assert devices_cli.main("release", ["dev-a", "--data", str(data)]) == 0
    assert "no server runs: dev-a is released from quarantine when serve starts" in capsys.readouterr().out
    assert json.loads((data / "release_requests.json").read_text()) == ["dev-a"]
    assert (data / "serve.lock").read_text().startswith("fedhar-coordinator release pid ")
    # serve releases it at its next start, and the request is done
    server = Server(data, BROKER, "home", grid=lambda needs: LoopGrid({}), poll_s=0.02)
    stop = threading.Event()
    loop = threading.Thread(target=server.run, args=(stop,), daemon=True)
    loop.start()
    try:
        until(lambda: not (data / "release_requests.json").exists(), 20, "the release taken up")
    finally:
        stop.set()
        loop.join(20)
    assert DataLock(data, "test").try_acquire()  # the stopped server let go
