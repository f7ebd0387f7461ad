"""Another device or federation using this device's client id on the same broker is named in words (edge_client/identity.py).

The rule on a clock of the test's, then two agents with one client id in two federations on a real Mosquitto on
127.0.0.1, over MQTT 5 and MQTT 3.1.1: a broker that names the cause (MQTT 5's "Session taken over") is believed at
once; Mosquitto 2.0 closes the older session without a word in both versions, and the sessions it closes right after
opening them tell.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.identity import CLEAR_S, KNOCK_S, KNOCKS, TAKEN_OVER, IdCollision, collision_words
from edge_client.store import ClientStore
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_models.data.labels import HAPT_LABELS
from har_models.wire.messages import ClientStatus
from har_models.wire.topics import Topics

WORDS = "another device or federation uses the id hapt-01 on this broker"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_broker_naming_a_takeover_is_a_collision_at_once_and_a_long_session_clears_it() -> None:
    clock = Clock()
    c = IdCollision("hapt-01", clock)
    c.connected()
    clock.t += 600  # up for ten minutes: whatever closes it now is no knock-off...
    assert c.disconnected(TAKEN_OVER) == collision_words("hapt-01")  # ...but the broker said another client took the session
    assert c.current().startswith(WORDS)
    c.connected()
    clock.t += CLEAR_S - 1
    assert c.current().startswith(WORDS)
    clock.t += 1
    assert c.current() == ""  # up for CLEAR_S: the id is this device's alone again


def test_sessions_closed_right_after_they_opened_name_a_collision_and_a_dropped_network_does_not() -> None:
    clock = Clock()
    c = IdCollision("hapt-01", clock)
    for _ in range(KNOCKS - 1):
        c.connected()
        clock.t += KNOCK_S / 2
        assert c.disconnected("Unspecified error") is None
        clock.t += 1  # paho reconnects a second later
    c.connected()
    clock.t += KNOCK_S / 2
    assert c.disconnected("Unspecified error") == collision_words("hapt-01")
    other = IdCollision("hapt-02", clock)
    for _ in range(2 * KNOCKS):  # a network that drops the session after it ran a while, again and again
        other.connected()
        clock.t += 3 * KNOCK_S
        assert other.disconnected("Unspecified error") is None
    slow = IdCollision("hapt-03", clock)
    for _ in range(2 * KNOCKS):  # knock-offs too far apart to be one story
        slow.connected()
        clock.t += 1
        assert slow.disconnected("Unspecified error") is None
        clock.t += 100
    assert other.current() == slow.current() == ""


@pytest.mark.slow  # about 7 s each: three knock-offs a second apart (paho's reconnection delay), on this Mosquitto in both versions
@pytest.mark.parametrize("version", ["5", "3.1.1"])
def test_two_federations_using_one_client_id_on_one_broker_are_told_so_in_the_log_the_status_and_the_connection(
    mosquitto: int, tmp_path: Path, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker = BrokerConfig(port=mosquitto, mqtt_version=version)
    watcher = MqttLink(broker, "t-watcher", subscriptions=[(Topics("home").client_status("hapt-01"), 1)])
    agents, stops, threads, stores = [], [], [], []
    caplog.set_level(logging.INFO)
    try:
        assert watcher.start(10.0)
        for fed in ("home", "lab"):  # two federations, one broker, the same device name
            stores.append(ClientStore(tmp_path / fed, HAPT_LABELS))
            agents.append(EdgeAgent(ClientConfig("hapt-01", broker, federation=fed, backend="numpy"), stores[-1]))
            stops.append(threading.Event())
            threads.append(threading.Thread(target=agents[-1].run, args=(stops[-1],), daemon=True))
            threads[-1].start()
        end = time.monotonic() + 60
        while not all(a.collision.current() for a in agents):
            assert time.monotonic() < end, "the collision was not named within 60 s"
            time.sleep(0.05)
        home = agents[0]
        seen: list[ClientStatus] = []
        while not any(st.fault.startswith(WORDS) for st in seen):  # the coordinator of "home" reads it in the device's status
            assert time.monotonic() < end, f"no status with the collision in its fault: {[s.fault for s in seen]}"
            home._publish_status()
            try:
                seen.append(ClientStatus.from_bytes(watcher.inbox.get(timeout=0.5)[1]))
            except Exception:
                continue
        assert WORDS in caplog.text
        while home.connection.connected:  # between two knock-offs, the screen's words say why
            assert time.monotonic() < end
            time.sleep(0.01)
        status = home.connection
        assert status.connected or (status.error or "").startswith(WORDS)
    finally:
        for stop in stops:
            stop.set()
        for t in threads:
            t.join(30)
        for s in stores:
            s.close()
        watcher.stop()
