"""A served federation in this process, for tests that act on it as an operator and as its devices would.

``serve``'s :class:`coordinator.server.serve.Server` runs in a thread over a real Mosquitto, with its status page
on a free port. Device commands (``enrol``, ``revoke``, ``rename``...) run as the operator's command does, their
live side through the running server's socket (:class:`coordinator.server.operator_channel.RemoteSide`); they
administer a generated broker folder that is never reloaded (the test broker lets every login in, so what a
device may send is decided by the coordinator alone). Each device is an :class:`edge_client.agent.EdgeAgent`
(numpy backend) in a thread with a few synthetic windows in its own state folder; it can be frozen with an update made
(held where it would send it), stopped, and started again on the same folder, under another name.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import coordinator.broker as broker_files
from coordinator.server import device_commands
from coordinator.server.operator_channel import RemoteSide
from coordinator.server.operator_commands import perform
from coordinator.server.settings import read_serve_file
from coordinator.state import RunState
from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.store import ClientStore
from edge_client.timeline import STEP_NS
from har_io.broker_config import BrokerConfig
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from simulation.broker import free_port
from support.polling import poll

FED = "matrix"
WINDOWS = 24  # per device: 20 to train on (a step of a 2-filter CNN takes milliseconds), 4 to test


def until(cond: Callable[[], Any], what: str, timeout_s: float = 120.0) -> None:
    """Wait for ``cond()`` (asked every 0.2 s); AssertionError naming ``what`` after ``timeout_s``."""
    assert poll(cond, timeout_s, 0.2), f"{what}: not within {timeout_s:.0f} s"


class Device:
    """One device's state folder and, while it runs, its agent in a thread (see the module docstring).

    ``sent`` says which updates the device set out to deliver, under which name and when it first did:
    ``(name, run_id, round, stage) -> time.time()``.
    """

    def __init__(self, name: str, folder: Path, port: int, seed: int):
        self.name, self.folder, self.port, self.seed = name, folder, port, seed
        self.thaw, self.held = threading.Event(), threading.Event()
        self.thaw.set()
        self.sent: dict[tuple[str, str, int, int], float] = {}
        self.agent: EdgeAgent | None = None

    def start(self, password: str, name: str | None = None) -> None:
        """Run the agent as ``name`` (default: its name so far) with ``password``, on this device's folder."""
        self.name = name or self.name
        self.store = ClientStore(self.folder, HAPT_LABELS)
        if self.store.window_counts().n_train == 0:
            x = np.random.default_rng(self.seed).normal(size=(WINDOWS, 6, 128)).astype(np.float32)
            self.store.replace_windows("synthetic", WindowSet(x, np.arange(WINDOWS) % 6, HAPT_LABELS, np.arange(WINDOWS) * STEP_NS))
        login = BrokerConfig(port=self.port, username=self.name, password=password)
        cfg = ClientConfig(self.name, login, federation=FED, backend="numpy", status_refresh_s=2.0, receipt_wait_s=2.0, stop_flush_s=3.0)
        self.agent = agent = EdgeAgent(cfg, self.store)
        deliver = agent.delivery.start

        def held_then_sent(exchange: Any, envelope: bytes, deadline_unix: float) -> None:
            self.held.set()
            self.thaw.wait()  # frozen: the update is made, and waits with the device
            self.sent.setdefault((agent.cfg.client_id, *exchange.key), time.time())
            deliver(exchange, envelope, deadline_unix)

        agent.delivery.start = held_then_sent  # type: ignore[method-assign]
        self._halt = threading.Event()
        self._thread = threading.Thread(target=agent.run, args=(self._halt,), name=self.name, daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        """Hold the device when it next sends an update (``held`` says when it got there), until ``thaw`` is set."""
        self.held.clear()
        self.thaw.clear()

    def stop(self) -> None:
        """Thaw it, stop the agent (it sends the open round's update on its way out), close the store."""
        if self.agent is None:
            return
        self.thaw.set()
        self._halt.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), f"{self.name} did not stop"
        self.store.close()
        self.agent = None


class Served:
    """A data folder with its ``server.toml`` (``settings`` added at the top level), and ``serve`` on it while started.

    ``page`` is the status page's base URL; ``passwords`` the devices' newest ones, by name.
    """

    def __init__(self, tmp: Path, port: int, settings: str):
        self.port, self.tmp = port, tmp
        self.broker_dir = tmp / "broker"
        broker_files.generate(self.broker_dir, {"federation": FED, "port": port}, [])
        self.data = tmp / "data"
        self.data.mkdir()
        http = free_port()
        (self.data / "server.toml").write_text(
            f"min_clients = 2\n{settings}\n[model]\nconv_filters = 2\ndense_units = 4\n[training]\nlocal_epochs = 1\n"
            "[timing]\nround_timeout_s = 60\nstatus_refresh_s = 2\ndeadline_slack_s = 1\n"
            f'[server]\nname = "home"\nhttp_port = {http}\nbroker_dir = "{self.broker_dir}"\nbroker_reload = "none"\n'
            'public_host = "127.0.0.1"\n[schedule]\nmin_clients = 2\nmin_round_interval_s = 0\n'
        )
        self.file = read_serve_file(self.data / "server.toml")
        self.page = f"http://127.0.0.1:{http}"
        self.passwords: dict[str, str] = {}  # by device name, from its newest bundle
        self.server: Any = None

    def start(self) -> None:
        """Start ``serve`` in a thread; return once its operator socket answers."""
        from coordinator.server.operator_channel import SOCKET_NAME
        from coordinator.server.serve import Server

        self.server = Server(self.data, BrokerConfig(port=self.port), FED, poll_s=0.05)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self.server.run, args=(self._halt,), name="serve", daemon=True)
        self._thread.start()
        until(lambda: (self.data / SOCKET_NAME).exists(), "serve's operator socket")

    def stop(self) -> None:
        """Stop ``serve`` (after the round it runs, if any) and wait for it to let go of the data folder; once is enough."""
        if self.server is None:
            return
        self.server = None
        self._halt.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "serve did not stop"

    def enrol(self, name: str) -> None:
        """Enrol ``name`` as ``fedhar-coordinator enrol`` does: an account in the broker folder, a registry row, a bundle."""
        device_commands.enrol(self.data, self.file, name, None)
        self._read_bundle(name)

    def command(self, cmd: str, **args: Any) -> list[str]:
        """A routed operator command (``revoke``, ``rename``...) against the running server; the lines it prints."""
        lines = perform(cmd, args, self.data, self.file, RemoteSide(self.data))
        for name in (args.get("name"), args.get("new")):
            if name is not None and (self.data / "enrolment" / f"{name}.json").exists():
                self._read_bundle(name)  # re-issued or renamed: a new password
        return lines

    def _read_bundle(self, name: str) -> None:
        """Keep the password of ``name``'s new bundle (serve deletes a bundle once its device took part with it)."""
        self.passwords[name] = str(json.loads((self.data / "enrolment" / f"{name}.json").read_text())["password"])

    def records(self) -> list[dict[str, Any]]:
        """The completed rounds' records, oldest first."""
        state = RunState(self.data / "run")
        try:
            return state.rounds()
        finally:
            state.close()

    def events(self) -> list[tuple[int | None, str | None, str, str]]:
        """The run's events: (round, client, kind, detail), oldest first."""
        state = RunState(self.data / "run")
        try:
            return state.events()
        finally:
            state.close()

    def last_round(self) -> int:
        """The newest completed round (-1 before one)."""
        recs = self.records()
        return recs[-1]["round"] if recs else -1

    def round_after(self, what: str, counts: Callable[[dict[str, Any]], bool] = lambda r: True, timeout_s: float = 120.0) -> None:
        """Wait for a round completed after now (numbered after the newest completed one) whose record ``counts``."""
        after = self.last_round()
        until(lambda: any(r["round"] > after and counts(r) for r in self.records()), what, timeout_s)
