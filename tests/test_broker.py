"""The embedded broker: big payloads are not turned into text, retained messages go only where subscribed.

amqtt formats every forwarded message, payload included, into a debug log line even when
debug logging is off (an f-string argument is built before the level check). The broker
forwards :class:`simulation.broker.Payload` objects instead, whose text form is one short line.
Here the broker runs in this process with its debug log captured: a 1 MiB payload crosses it
byte for byte, and no log line it writes is longer than a few hundred characters (without the
wrapping, the broadcast line alone is over 4 million characters).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from simulation.broker import Payload, free_port, make_broker, wait_for_port

WAIT_S = 20.0


class _Lengths(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.longest = 0
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.longest = max(self.longest, len(text))
        self.messages.append(text[:200])


@pytest.fixture
def broker_port() -> Iterator[int]:
    """The embedded broker (:func:`simulation.broker.make_broker`) in a thread of this process; its port."""
    port = free_port()
    holder: dict[str, Any] = {}
    started = threading.Event()

    async def serve() -> None:
        holder["loop"], holder["stop"] = asyncio.get_running_loop(), asyncio.Event()
        broker = make_broker("127.0.0.1", port)
        await broker.start()
        started.set()
        await holder["stop"].wait()
        await broker.shutdown()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert started.wait(WAIT_S) and wait_for_port("127.0.0.1", port, WAIT_S)
        yield port
    finally:
        if "loop" in holder:
            holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(WAIT_S)


def test_payload_is_the_same_bytes_with_a_short_repr() -> None:
    data = bytes(range(256)) * 4096
    p = Payload(data)
    assert p == data and bytes(p) == data and len(p) == 1 << 20
    assert repr(p) == "<payload of 1048576 bytes>"
    assert b"\x00" + p[:3] == b"\x00\x00\x01\x02"  # behaves as bytes when packets are built


def test_a_big_payload_crosses_the_broker_without_being_formatted(broker_port: int) -> None:
    port = broker_port
    captured = _Lengths()
    amqtt_log = logging.getLogger("amqtt")
    old_level = amqtt_log.level
    amqtt_log.setLevel(logging.DEBUG)
    amqtt_log.addHandler(captured)
    got: list[bytes | bytearray] = []
    arrived = threading.Event()
    clients = []
    try:
        sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sub")
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pub")
        clients = [sub, pub]
        subscribed = threading.Event()
        sub.on_subscribe = lambda *a: subscribed.set()

        def on_message(_client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
            got.append(message.payload)
            arrived.set()

        sub.on_message = on_message
        sub.connect("127.0.0.1", port)
        sub.loop_start()
        sub.subscribe("t/big", qos=1)
        assert subscribed.wait(WAIT_S)
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        payload = bytes(range(256)) * 4096
        pub.publish("t/big", payload, qos=1).wait_for_publish(WAIT_S)
        assert arrived.wait(WAIT_S)
    finally:
        for c in clients:
            c.loop_stop()
            c.disconnect()
        amqtt_log.removeHandler(captured)
        amqtt_log.setLevel(old_level)
    assert got == [payload]
    assert any("<payload of 1048576 bytes>" in m for m in captured.messages), "the broadcast was not logged at all"
    assert captured.longest < 2000, f"a broker log line of {captured.longest} characters"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])


def test_a_connecting_client_gets_retained_messages_of_its_own_subscriptions_only(broker_port: int) -> None:
    port = broker_port
    clients: list[mqtt.Client] = []

    def connect(cid: str, topics: list[str], sink: list[str]) -> mqtt.Client:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid)
        clients.append(c)
        subscribed = threading.Event()
        c.on_subscribe = lambda *a: subscribed.set()
        c.on_message = lambda cl, u, m: sink.append(m.topic)
        c.connect("127.0.0.1", port)
        c.loop_start()
        if topics:
            c.subscribe([(t, 1) for t in topics])
            assert subscribed.wait(WAIT_S)
        return c

    try:
        seen_a: list[str] = []
        connect("a", ["fed/status/a"], seen_a)  # a filter the broker now knows
        pub = connect("pub", [], [])
        pub.publish("fed/status/a", b"a is online", qos=1, retain=True).wait_for_publish(WAIT_S)
        pub.publish("fed/status/b", b"b is online", qos=1, retain=True).wait_for_publish(WAIT_S)
        seen_b: list[str] = []
        connect("b", ["fed/status/b"], seen_b)
        end = time.monotonic() + 3.0  # bounded: what arrives in 3 s after the subscription
        while time.monotonic() < end and "fed/status/b" not in seen_b:
            time.sleep(0.05)
        time.sleep(0.5)  # anything else would have come with it
    finally:
        for c in clients:
            c.loop_stop()
            c.disconnect()
    assert seen_b == ["fed/status/b"]  # its own retained status, not client a's
