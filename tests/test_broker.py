"""The embedded broker forwards big payloads without turning them into text.

amqtt formats every forwarded message, payload included, into a debug log line even when
debug logging is off (an f-string argument is built before the level check). The broker
forwards :class:`coordinator.broker.Payload` objects instead, whose text form is one short line.
Here the broker runs in this process with its debug log captured: a 1 MiB payload crosses it
byte for byte, and no log line it writes is longer than a few hundred characters (without the
wrapping, the broadcast line alone is over 4 million characters).
"""

from __future__ import annotations

import asyncio
import logging
import threading

import paho.mqtt.client as mqtt
import pytest

from coordinator.broker import Payload, free_port, make_broker, wait_for_port

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


def test_payload_is_the_same_bytes_with_a_short_repr() -> None:
    data = bytes(range(256)) * 4096
    p = Payload(data)
    assert p == data and bytes(p) == data and len(p) == 1 << 20
    assert repr(p) == "<payload of 1048576 bytes>"
    assert b"\x00" + p[:3] == b"\x00\x00\x01\x02"  # behaves as bytes when packets are built


def test_a_big_payload_crosses_the_broker_without_being_formatted() -> None:
    port = free_port()
    stop: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    started = threading.Event()

    async def serve() -> None:
        nonlocal stop, loop
        loop, stop = asyncio.get_running_loop(), asyncio.Event()
        broker = make_broker("127.0.0.1", port)
        await broker.start()
        started.set()
        await stop.wait()
        await broker.shutdown()

    captured = _Lengths()
    amqtt_log = logging.getLogger("amqtt")
    old_level = amqtt_log.level
    amqtt_log.setLevel(logging.DEBUG)
    amqtt_log.addHandler(captured)
    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    got: list[bytes] = []
    arrived = threading.Event()
    clients = []
    try:
        assert started.wait(WAIT_S) and wait_for_port("127.0.0.1", port, WAIT_S)
        sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sub")
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pub")
        clients = [sub, pub]
        subscribed = threading.Event()
        sub.on_subscribe = lambda *a: subscribed.set()
        sub.on_message = lambda c, u, m: (got.append(m.payload), arrived.set())
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
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(WAIT_S)
        amqtt_log.removeHandler(captured)
        amqtt_log.setLevel(old_level)
    assert got == [payload]
    assert any("<payload of 1048576 bytes>" in m for m in captured.messages), "the broadcast was not logged at all"
    assert captured.longest < 2000, f"a broker log line of {captured.longest} characters"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
