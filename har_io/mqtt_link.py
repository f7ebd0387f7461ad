"""Thin MQTT adapter shared by the coordinator and the edge client (paho-mqtt 2.x).

Rules it enforces (paho issues #527, #875, #354, #483; see docs/protocol.md):

* callbacks never block: they only put ``(topic, payload, retained)`` on :attr:`MqttLink.inbox`;
  all work happens in the program's own thread;
* subscriptions and the retained "online" status are renewed on every (re)connect;
  paho reconnects by itself with a bounded back-off;
* large payloads go out in chunks (:func:`har_models.chunking.split_payload`) at QoS 1,
  and the publisher waits for the acknowledgements, so memory stays bounded;
* MQTT 3.1.1 only, so the embedded broker and Mosquitto both work.
"""

from __future__ import annotations

import logging
import queue
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt

from har_models.chunking import DEFAULT_MAX_MESSAGE_BYTES, iter_chunks

log = logging.getLogger("fedhar.mqtt")


@dataclass(frozen=True)
class BrokerConfig:
    """Where and how to reach the broker.

    Parameters
    ----------
    host : str
    port : int
    username, password : str, optional
        Per-device credentials (the Mosquitto ACL lets a device write only under its id).
    tls_ca : str, optional
        CA certificate file; enables TLS.
    tls_cert, tls_key : str, optional
        Client certificate and key for mutual TLS.
    keepalive : int
        MQTT keep-alive, seconds.
    max_message_bytes : int
        Largest payload published; envelopes are chunked to fit (bytes).
    """

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    keepalive: int = 30
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    @classmethod
    def parse(cls, address: str, **kwargs: object) -> BrokerConfig:
        """From ``HOST:PORT`` (or ``HOST``, port 1883).

        Raises
        ------
        ValueError
            If the port is not an integer in 1..65535.
        """
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "1883")
        try:
            p = int(port)
        except ValueError:
            raise ValueError(f"broker address {address!r}: port {port!r} is not a number; use HOST:PORT") from None
        if not 0 < p < 65536 or not host:
            raise ValueError(f"broker address {address!r}: use HOST:PORT with a port in 1..65535")
        return cls(host=host, port=p, **kwargs)  # type: ignore[arg-type]


class MqttLink:
    """One MQTT session with automatic reconnection and a message inbox.

    Parameters
    ----------
    cfg : BrokerConfig
    client_name : str
        MQTT client identifier (must be unique on the broker).
    subscriptions : sequence of (topic filter, qos)
        (Re)subscribed on every connect.
    will : (topic, payload), optional
        Last will, published retained at QoS 1 by the broker if this link dies.
    on_connect : callable, optional
        Called (in paho's thread, must not block) after each successful connect, e.g. to
        publish a retained "online" status.
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        client_name: str,
        subscriptions: Sequence[tuple[str, int]] = (),
        will: tuple[str, bytes] | None = None,
        on_connect: Callable[[MqttLink], None] | None = None,
    ):
        self.cfg = cfg
        self.client_name = client_name
        self.subscriptions = list(subscriptions)
        self.inbox: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.connected = threading.Event()
        self.bytes_sent = 0
        self.bytes_received = 0
        self.connects = 0
        self._on_connect_hook = on_connect
        self._publish_lock = threading.Lock()
        self._stopping = False
        c = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_name,
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        if cfg.username is not None:
            c.username_pw_set(cfg.username, cfg.password)
        if cfg.tls_ca:
            c.tls_set(ca_certs=cfg.tls_ca, certfile=cfg.tls_cert, keyfile=cfg.tls_key, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        if will is not None:
            c.will_set(will[0], will[1], qos=1, retain=True)
        c.reconnect_delay_set(min_delay=1, max_delay=30)
        c.max_inflight_messages_set(32)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        self._client = c

    # -- paho callbacks (network thread; never block) ---------------------------------------
    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason_code: object, properties: object) -> None:
        if getattr(reason_code, "is_failure", False):
            log.warning("%s: broker refused the connection: %s", self.client_name, reason_code)
            return
        self.connects += 1
        for topic, qos in self.subscriptions:
            client.subscribe(topic, qos)
        self.connected.set()
        log.info("%s: connected to %s:%d (connect #%d)", self.client_name, self.cfg.host, self.cfg.port, self.connects)
        if self._on_connect_hook is not None:
            self._on_connect_hook(self)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: object, flags: object, reason_code: object, properties: object
    ) -> None:
        self.connected.clear()
        if not self._stopping:
            log.warning("%s: disconnected (%s); reconnecting automatically", self.client_name, reason_code)

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        self.bytes_received += len(msg.payload)
        self.inbox.put((msg.topic, bytes(msg.payload), bool(msg.retain)))

    # -- control -------------------------------------------------------------------------------
    def start(self, wait_s: float | None = 30.0) -> bool:
        """Connect (in the background) and start the network loop.

        Parameters
        ----------
        wait_s : float, optional
            Seconds to wait for the first connection; None returns at once.

        Returns
        -------
        bool
            True if connected within ``wait_s`` (reconnection goes on regardless).
        """
        self._client.connect_async(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive)
        self._client.loop_start()
        return True if wait_s is None else self.connected.wait(wait_s)

    def stop(self, final: tuple[str, bytes] | None = None) -> None:
        """Publish ``final`` (topic, payload; retained, QoS 1) if given, then disconnect cleanly."""
        self._stopping = True
        if final is not None and self.connected.is_set():
            try:
                self.publish(final[0], final[1], retain=True, timeout=5.0)
            except (RuntimeError, TimeoutError, ValueError) as exc:
                log.warning("%s: could not publish final status: %s", self.client_name, exc)
        self._client.disconnect()
        self._client.loop_stop()

    def publish_nowait(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Queue a QoS 1 message without waiting (safe inside the ``on_connect`` hook)."""
        with self._publish_lock:
            self._client.publish(topic, payload, qos=1, retain=retain)
        self.bytes_sent += len(payload)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, timeout: float = 60.0) -> None:
        """Publish one message and (for QoS > 0) wait for the broker's acknowledgement.

        Waits for a connection first; paho re-sends unacknowledged QoS 1 messages after a
        reconnect.

        Raises
        ------
        TimeoutError
            If not connected or not acknowledged within ``timeout`` seconds.
        RuntimeError
            If paho rejected the message.
        """
        deadline = time.monotonic() + timeout
        info = self._send(topic, payload, qos, retain, deadline)
        if qos > 0:
            self._wait(info, deadline)

    def publish_chunks(self, topic_of: Callable[[int], str], payload: bytes, retain: bool = False, timeout: float = 300.0) -> int:
        """Publish ``payload`` as chunks on ``topic_of(i)`` at QoS 1; wait for all acknowledgements.

        At most 16 chunks are unacknowledged at a time, so a slow link cannot make the
        outgoing queue grow without bound (paho issue #483).

        Returns
        -------
        int
            Number of chunks.

        Raises
        ------
        TimeoutError
            If the chunks were not all acknowledged within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        pending: list[mqtt.MQTTMessageInfo] = []
        n = 0
        for i, chunk in enumerate(iter_chunks(payload, self.cfg.max_message_bytes)):
            pending.append(self._send(topic_of(i), chunk, 1, retain, deadline))
            n += 1
            if len(pending) >= 16:
                self._wait(pending.pop(0), deadline)
        for info in pending:
            self._wait(info, deadline)
        return n

    def _send(self, topic: str, payload: bytes, qos: int, retain: bool, deadline: float) -> mqtt.MQTTMessageInfo:
        while True:
            if not self.connected.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{self.client_name}: not connected to the broker; could not publish {topic}")
            with self._publish_lock:
                info = self._client.publish(topic, payload, qos=qos, retain=retain)
            if info.rc == mqtt.MQTT_ERR_NO_CONN:  # the link dropped just now: try again once reconnected
                time.sleep(0.1)
                continue
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise RuntimeError(f"{self.client_name}: publishing to {topic} failed: {mqtt.error_string(info.rc)}")
            self.bytes_sent += len(payload)
            return info

    def _wait(self, info: mqtt.MQTTMessageInfo, deadline: float) -> None:
        info.wait_for_publish(max(0.0, deadline - time.monotonic()))
        if not info.is_published():
            raise TimeoutError(f"{self.client_name}: message not acknowledged before the deadline")
