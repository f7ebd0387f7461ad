"""`fedhar-coordinator devices` and `revoke` ask a running server's status page, not the broker.

The server's monitor session holds the broker's monitor account, and a generated broker allows
one session per user name: a second login with it (what the commands did) knocked the status
page's session off the broker. With the page answering, no broker is needed at all.
"""

from __future__ import annotations

import time
from pathlib import Path

from coordinator.server.broker_view import from_status_page, retained_states
from coordinator.server.device_tables import device_table
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.settings import settings_of
from coordinator.server.web import ServerView, start_status_page
from har_models.wire.messages import ClientStatus, CoordinatorStatus
from har_models.wire.topics import Topics

T = Topics("home")


def test_the_commands_read_presence_from_the_running_page(tmp_path: Path) -> None:
    data = tmp_path / "data"
    reg = Registry(data)
    for name in ("phone-anna", "pi-kitchen", "tab-old"):
        reg.enrol(name, None)
    now = time.time()
    mon = Monitor(T)
    mon.handle(T.coordinator_status, CoordinatorStatus("online", "run-1", "a1", now, 30.0).to_bytes(), True)
    mon.handle(T.client_status("phone-anna"), ClientStatus("phone-anna", "idle", sent_unix=now, refresh_s=30.0).to_bytes(), False)
    mon.handle(T.client_status("pi-kitchen"), ClientStatus("pi-kitchen", "offline").to_bytes(), True)
    page = start_status_page(ServerView(name="home", registry=reg, monitor=mon), "127.0.0.1", 0, token="s3cret-0123456789abcdef")
    try:
        # broker_dir names no broker: an answer can only have come from the page.
        toml = {"server": {"http_port": page.port, "token": "s3cret-0123456789abcdef", "broker_dir": str(tmp_path / "no-broker")}}
        file = settings_of(toml)
        assert from_status_page(file) == ({"phone-anna": "idle", "pi-kitchen": "offline", "tab-old": "offline"}, True)
        assert retained_states(file) == from_status_page(file)
        rows = {r["name"]: r["online"] for r in device_table(data, retained_states(file)[0])}  # type: ignore[index]
        assert rows == {"phone-anna": "yes", "pi-kitchen": "no", "tab-old": "no"}
        # A wrong token is no answer (the broker path is tried next, and it has no broker folder here).
        assert from_status_page(settings_of({"server": {**toml["server"], "token": "wrong"}})) is None
    finally:
        page.stop()
        reg.close()
    assert from_status_page(file, timeout_s=1.0) is None  # no page running
    assert from_status_page(settings_of({"server": {"http_port": 0}})) is None
