"""One plain paho-mqtt session against a test broker, with bounded waits: what the broker tests log in as.

The Mosquitto tests (``test_mosquitto_config.py``, ``test_broker_admin.py``) check what the
broker lets an account do: log in, subscribe, publish, receive, and what happens when the
account goes away. They need a session that is not the project's ``MqttLink`` (which retries
and hides refusals), so a refusal or a missing acknowledgement is seen at once and every wait
ends by itself after :data:`WAIT_S`.
"""

from __future__ import annotations

import queue
import ssl
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt

WAIT_S = 5.0
"""Longest wait for any acknowledgement or expected message (seconds)."""
QUIET_S = 0.5
"""How long :meth:`MqttPeer.settle` waits for stragglers (seconds)."""


class MqttPeer:
    """One paho-mqtt 2.x session (MQTT 3.1.1) on 127.0.0.1 with bounded waits on what the broker sends back.

    Parameters
    ----------
    port : int
        The broker's loopback port.
    user, password : str or None
        The login; ``None`` logs in anonymously.
    client_id : str, optional
        MQTT client id (default: a random ``test-xxxxxxxx``).
    tls : ssl.SSLContext, optional
        TLS for a secured listener.

    A dropped session stays dropped (reconnect delay 60-120 s) while a test looks at it;
    :attr:`dropped` is set and :attr:`dropped_at` holds the monotonic time of the drop.
    """

    def __init__(self, port: int, user: str | None, password: str | None, client_id: str = "", tls: ssl.SSLContext | None = None):
        self.messages: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.seen: list[tuple[str, bytes]] = []
        self.connack: queue.Queue[Any] = queue.Queue()
        self.subacks: dict[int, threading.Event] = {}
        self.dropped = threading.Event()
        self.dropped_at: float | None = None
        self.port = port
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"test-{uuid.uuid4().hex[:8]}",
                        protocol=mqtt.MQTTv311)  # fmt: skip
        if user is not None:
            c.username_pw_set(user, password)
        if tls is not None:
            c.tls_set_context(tls)
        c.reconnect_delay_set(60, 120)
        c.on_connect = lambda _c, _u, _f, rc, _p: self.connack.put(rc)
        c.on_message = lambda _c, _u, m: self.messages.put((m.topic, bytes(m.payload)))
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = lambda _c, _u, mid, _rc, _p: self.subacks.setdefault(mid, threading.Event()).set()
        self.client = c

    def _on_disconnect(self, *_: Any) -> None:
        self.dropped_at = time.monotonic()
        self.dropped.set()

    def connect(self, will: tuple[str, bytes] | None = None, background: bool = True) -> Any:
        """The CONNACK's reason code (paho ``ReasonCode``); a refused session is closed at once.

        ``will`` is (topic, payload), QoS 1, retained. An accepted session is served by paho's
        thread unless ``background`` is False (then nothing serves it: see :meth:`vanish`).

        Raises
        ------
        AssertionError
            No CONNACK within :data:`WAIT_S`.
        """
        if will is not None:
            self.client.will_set(will[0], will[1], qos=1, retain=True)
        self.client.connect("127.0.0.1", self.port, keepalive=30)
        end = time.monotonic() + WAIT_S
        while self.connack.empty():  # by hand until CONNACK: paho's thread would retry a refused login
            assert time.monotonic() < end, "no CONNACK"
            self.client.loop(0.05)
        rc = self.connack.get()
        if rc.is_failure:
            self.client.disconnect()
        elif background:
            self.client.loop_start()
        return rc

    def joins(self, will: tuple[str, bytes] | None = None, background: bool = True) -> bool:
        """True if the broker accepted the login (:meth:`connect`'s reason code is not a failure)."""
        return not self.connect(will, background).is_failure

    def vanish(self) -> None:
        """Drop the TCP connection without DISCONNECT, as a device that loses power: the broker sends the will."""
        sock = self.client.socket()
        assert sock is not None
        sock.close()

    def subscribe(self, *topics: str) -> None:
        """Subscribe at QoS 1 and wait for each SUBACK (AssertionError after :data:`WAIT_S`)."""
        for topic in topics:
            _, mid = self.client.subscribe(topic, qos=1)
            assert mid is not None, f"cannot subscribe to {topic}"
            assert self.subacks.setdefault(mid, threading.Event()).wait(WAIT_S), f"no SUBACK for {topic}"

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Publish at QoS 1 and wait for the PUBACK (AssertionError after :data:`WAIT_S`)."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(WAIT_S)
        assert info.is_published(), f"no PUBACK for {topic}"

    def expect(self, topic: str, payload: bytes) -> None:
        """Wait until (topic, payload) arrives; everything received meanwhile is kept in :attr:`seen`."""
        end = time.monotonic() + WAIT_S
        while (topic, payload) not in self.seen:
            try:
                self.seen.append(self.messages.get(timeout=max(0.0, end - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"{topic} {payload!r} never arrived; got {self.seen}") from None

    def settle(self) -> list[tuple[str, bytes]]:
        """Everything received, after :data:`QUIET_S` more seconds for stragglers."""
        time.sleep(QUIET_S)
        while not self.messages.empty():
            self.seen.append(self.messages.get())
        return self.seen

    def close(self) -> None:
        """Disconnect and stop paho's thread."""
        self.client.disconnect()
        self.client.loop_stop()
