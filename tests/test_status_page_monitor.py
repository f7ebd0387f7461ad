"""The monitor on the broker's read-only monitor account: it reads statuses, the round, the progress and the
receipts under the generated ACL, takes over nobody's session, counts malformed messages and keeps going."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from coordinator.server.monitor import Monitor, MonitorSnapshot
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus, CoordinatorStatus, Receipt, RoundAnnouncement, RoundProgress
from har_models.wire.topics import Topics

pytestmark = pytest.mark.mosquitto

T = Topics("home")
RECORD = {"round": 0, "selected": 2, "updates": 2, "rejected": 0, "missing": [], "arch_version": 0, "conv_filters": 8,
          "dense_units": 32, "bytes_up": 10, "bytes_down": 20, "received_union": None, "seconds": 0.5}  # fmt: skip


def _client(port: int, user: str, password: str, disconnected: list[str] | None = None) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=user, protocol=mqtt.MQTTv311)
    c.username_pw_set(user, password)
    if disconnected is not None:
        c.on_disconnect = lambda *a: disconnected.append(user)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def _until(monitor: Monitor, ok: Callable[[MonitorSnapshot], bool], timeout: float = 15.0) -> MonitorSnapshot:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        snap = monitor.snapshot()
        if ok(snap):
            return snap
        time.sleep(0.05)
    raise AssertionError(f"the monitor did not see it within {timeout} s: {monitor.snapshot()}")


@pytest.mark.slow
def test_the_monitor_account_reads_the_federation(tls_mosquitto: Callable[..., Any]) -> None:
    b = tls_mosquitto("home", ["phone-anna", "pi-ben"])
    dropped: list[str] = []
    coord = _client(b.port, "coordinator", b.password("coordinator"), dropped)
    anna = _client(b.port, "phone-anna", b.password("phone-anna"))
    monitor = Monitor(T, BrokerConfig(port=b.port, username="monitor", password=b.password("monitor")), client_name="monitor")
    try:
        now = time.time()
        coord.publish(T.coordinator_status, CoordinatorStatus("online", "run-1", "a", now, 30.0).to_bytes(), 1, True).wait_for_publish(5)
        coord.publish(T.progress, RoundProgress("run-1", 0, 10, RECORD).to_bytes(), 1, True).wait_for_publish(5)
        ann = RoundAnnouncement("run-1", 1, "training", {}, "hapt6", selected=("phone-anna", "pi-ben"), deadline_unix=now + 60)
        coord.publish(T.round, ann.to_bytes(), 1, True).wait_for_publish(5)
        anna.publish(T.client_status("phone-anna"), ClientStatus("phone-anna", "idle", sent_unix=now, refresh_s=30.0).to_bytes(), 1,
                     True).wait_for_publish(5)  # fmt: skip
        assert monitor.start(10.0), f"the monitor account could not log in: {monitor.link and monitor.link.connect_error}"
        # retained messages arrive on subscribing
        snap = _until(monitor, lambda s: s.progress is not None and s.announcement is not None and "phone-anna" in s.devices
                      and s.coordinator_online)  # fmt: skip
        assert snap.progress is not None and snap.progress.round == 0
        assert snap.devices["phone-anna"].online and snap.answered == frozenset()
        # a receipt (not retained) while the monitor listens: the round's answer is counted
        coord.publish(T.client_receipt("phone-anna"), Receipt("run-1", 1, 0, "b" * 64, "accepted").to_bytes(), 1).wait_for_publish(5)
        _until(monitor, lambda s: s.answered == {"phone-anna"})
        # malformed messages from a device are counted and ignored; the last good status stays
        anna.publish(T.client_status("phone-anna"), b"\x00garbage", 1, True).wait_for_publish(5)
        lost = b'{"protocol": 1, "client_id": "phone-anna", "state": "lost"}'
        anna.publish(T.client_status("phone-anna"), lost, 1, True).wait_for_publish(5)
        snap = _until(monitor, lambda s: s.malformed.get("status") == 2)
        assert snap.devices["phone-anna"].status.state == "idle"
        # still alive: the device goes offline
        anna.publish(T.client_status("phone-anna"), ClientStatus("phone-anna", "offline").to_bytes(), 1, True).wait_for_publish(5)
        _until(monitor, lambda s: not s.devices["phone-anna"].online and s.devices["phone-anna"].status.state == "offline")
        assert dropped == [], "logging in as the monitor disconnected the coordinator"
        assert monitor.snapshot().connected
    finally:
        monitor.stop()
        for c in (coord, anna):
            c.disconnect()
            c.loop_stop()
    assert not monitor.snapshot().connected
