"""Thin MQTT adapter shared by the coordinator and the edge client (paho-mqtt 2.x).

Callbacks never block (they only fill :attr:`MqttLink.inbox`); the network runs in paho's own
thread (``loop_start``); paho reconnects with back-off after transient failures, while a refused
login or certificate stops the link (:attr:`MqttLink.fatal`); MQTT 5 is tried first, then 3.1.1;
large payloads go out as QoS 1 chunks within a window; a packet the broker refused is taken out of
paho's queue with the rest of its cut (:meth:`MqttLink._take_out` edits paho's private
``_out_messages``, paho 2.x has no public call) and the chunk size is halved. The rules and paho
issues behind them: docs/reliability.md. Login and TLS: :class:`har_io.broker_config.BrokerConfig`.
"""

from __future__ import annotations

import logging
import queue
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Any

import paho.mqtt.client as mqtt

from har_io.broker_config import MIN_CHUNK_BYTES, BrokerConfig
from har_io.link_status import (
    AUTH_REFUSALS,
    TRANSIENT_TLS_ERRORS,
    LinkStatus,
    describe_connect_failure,
    describe_early_close,
    describe_refusal,
)
from har_io.refusal_words import bundle_wrong_ca
from har_models.wire.chunking import CHUNK_HEADER_BYTES, iter_chunks

log = logging.getLogger("fedhar.mqtt")

PUBLISH_OVERHEAD_BYTES = 16
"""Bytes of a PUBLISH packet besides topic and payload, rounded up (header, length, topic length, id, properties)."""

PUBLISH_WINDOW = 16
"""Chunks :meth:`MqttLink.publish_chunks` leaves unacknowledged at a time: bounds a slow link's memory (paho #483)."""
PAHO_MAX_INFLIGHT = 32
"""QoS 1 messages paho sends before it waits for an acknowledgement."""

RECONNECT_MIN_S = 1
"""paho's first wait before connecting again after a failed attempt or a lost connection (s)."""
RECONNECT_MAX_S = 30
"""Longest wait between attempts (s); the wait doubles from :data:`RECONNECT_MIN_S` after each failure."""


class BrokerRefused(RuntimeError):
    """The broker refused us for a reason retrying cannot fix; ``kind`` is ``"auth"``, ``"tls"`` or ``"identity"``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class PacketRejected(RuntimeError):
    """The broker refused or dropped a packet because of its size; the link now cuts smaller chunks."""


class _Cut:
    """The chunk ids of one :meth:`MqttLink._publish_cut` call, and whether the cut was given up (a chunk refused).

    ``mids`` changes under the link's ``_state_lock``, ``given_up`` under its ``_ack``.
    """

    __slots__ = ("given_up", "mids")

    def __init__(self) -> None:
        self.mids: set[int] = set()
        self.given_up = False


MAX_LOOP_RESUMES = 5
"""Resumes of paho's loop within :data:`RESUME_WINDOW_S` after "OrderedDict mutated during iteration" before ``failed``."""
RESUME_WINDOW_S = 60.0


class PayloadTooLarge(ValueError):
    """A single (unchunked) message is larger than the broker accepts."""


class _Client(mqtt.Client):
    """paho's client, telling the link about each connection attempt and any error that ends its loop (paho's thread)."""

    loop_timeout_s = 1.0
    """select() timeout of the network loop (paho's default; a test raises it to prove that
    a publish wakes the loop and does not wait for it)."""

    on_attempt: Callable[[], None] | None = None
    on_attempt_failed: Callable[[OSError], None] | None = None
    on_loop_error: Callable[[Exception], None] | None = None
    on_loop_resumed: Callable[[Exception], None] | None = None
    attempts = 0

    def reconnect(self) -> mqtt.MQTTErrorCode:
        self.attempts += 1
        if self.on_attempt is not None:
            self.on_attempt()
        try:
            return super().reconnect()
        except OSError as exc:  # socket, DNS and TLS errors; paho retries after them (the link may stop it)
            if self.on_attempt_failed is not None:
                self.on_attempt_failed(exc)
            raise

    def loop_forever(self, timeout: float | None = None, retry_first_connection: bool = False) -> mqtt.MQTTErrorCode:
        resumed: list[float] = []  # monotonic times the loop was resumed after a race in paho's queue
        while True:
            try:
                return super().loop_forever(self.loop_timeout_s if timeout is None else timeout, retry_first_connection)
            except RuntimeError as exc:
                # paho walks its queue of outgoing messages in this thread while a publish from another thread
                # (or a callback of this one) adds to it: "OrderedDict mutated during iteration". The queue itself
                # is whole, so the loop resumes; messages still in flight are sent again at the next connect.
                # A race happens once in a while; the same error again and again is a fault, reported below.
                now = time.monotonic()
                resumed = [t for t in resumed if now - t < RESUME_WINDOW_S] + [now]
                if "mutated during iteration" in str(exc) and len(resumed) <= MAX_LOOP_RESUMES:
                    if self.on_loop_resumed is not None:
                        self.on_loop_resumed(exc)
                    continue
                if self.on_loop_error is not None:
                    self.on_loop_error(exc)
                return mqtt.MQTTErrorCode.MQTT_ERR_UNKNOWN
            except Exception as exc:  # paho raises only on programming errors; never die silently
                if self.on_loop_error is not None:
                    self.on_loop_error(exc)
                return mqtt.MQTTErrorCode.MQTT_ERR_UNKNOWN


def login_refused(cfg: BrokerConfig, reason: str) -> str:
    """The words for a broker that refused ``cfg``'s login with ``reason`` (the CONNACK reason code's name).

    Credentials from an enrolment bundle were never typed by the reader: only the operator can issue new ones.
    """
    who = f"broker {cfg.host}:{cfg.port} refused the login of user {cfg.username!r}: {reason}."
    if cfg.enrolled:
        return (f"{who} The enrolment bundle's password is no longer accepted: the device was revoked or the bundle is out "
                f"of date. Ask the server's operator for a new bundle and enrol with it")  # fmt: skip
    return (f"{who} Check --username and --password-file (fedhar-coordinator broker writes "
            f"credentials/<user>.password; after it rotates or removes the user the old one no longer works)")  # fmt: skip


class MqttLink:
    """One MQTT session with automatic reconnection and a message inbox.

    Parameters
    ----------
    client_name : str
        MQTT client identifier (unique on the broker).
    subscriptions : sequence of (topic filter, qos)
        (Re)subscribed on every connect.
    will : (topic, payload), optional
        Last will, retained at QoS 1.
    on_connect, on_disconnect : callable, optional
        Called in paho's thread (must not block) after each connect, and when a session that was
        up closed (with paho's reason name, unless an oversized packet was in flight); words
        ``on_disconnect`` returns replace the reason in the log line.
    intern : callable (payload bytes) -> bytes, optional
        Applied to each received payload in paho's thread, e.g. to share one model chunk between
        the inboxes of many clients (:meth:`har_models.wire.chunking.SharedTransfers.message`).

    Attributes
    ----------
    fatal : BrokerRefused or None
        Set when the broker refused us for good; the link will not retry.
    broker_max_packet : int or None
        Maximum packet size stated in the MQTT 5 CONNACK (bytes).
    protocol : str
        "5" or "3.1.1".
    connect_error : str or None
        Why the last attempt failed, in plain words; None after a connection. :meth:`status` gives it all.
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        client_name: str,
        subscriptions: Sequence[tuple[str, int]] = (),
        will: tuple[str, bytes] | None = None,
        on_connect: Callable[[MqttLink], None] | None = None,
        intern: Callable[[bytes], bytes] | None = None,
        on_disconnect: Callable[[MqttLink, str], str | None] | None = None,
    ):
        self.cfg = cfg
        self._on_disconnect_hook = on_disconnect
        self._intern = intern
        self.client_name = client_name
        self.subscriptions = list(subscriptions)
        self.inbox: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.connected = threading.Event()
        self.failed = threading.Event()
        self.fatal: BrokerRefused | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.connects = 0
        self.broker_max_packet: int | None = None
        self.size_cap: int | None = None  # learned after a broker refused a size (bytes of payload)
        self.protocol = "3.1.1" if cfg.mqtt_version == "3.1.1" else "5"
        self._will = will
        self._on_connect_hook = on_connect
        self._publish_lock = threading.Lock()
        self._stopping = False
        self._downgrade = False
        self._inflight: dict[int, int] = {}  # mid -> payload bytes, until acknowledged
        self._refused: dict[int, str] = {}  # mid -> why the broker refused it
        self._acked: OrderedDict[int, None] = OrderedDict()  # mids the broker acknowledged (the newest 4096)
        self._cuts: set[_Cut] = set()  # the chunk cuts being published now
        self._ack = threading.Condition()
        self._state_lock = threading.Lock()
        self._life_lock = threading.Lock()  # start, stop and the MQTT 3.1.1 rebuild of the client
        self._downgrade_now = threading.Event()
        self.connect_error: str | None = None
        self.connect_failures = 0
        self.retry_in_s: float | None = None
        self._waits = 0  # paho's back-off waits since the last successful connection, the next one included
        self._attempt_open = False  # an attempt started and neither failed nor succeeded yet
        self._sweep: tuple[list[str], set[str]] | None = None  # filters being swept, retained topics found
        self._client = self._make_client()

    # -- construction ----------------------------------------------------------------------------
    def _make_client(self) -> _Client:
        cfg = self.cfg
        v5 = self.protocol == "5"
        c = _Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_name,
            clean_session=None if v5 else True,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        )
        c.on_attempt = self._on_attempt
        c.on_attempt_failed = self._on_attempt_failed
        c.on_loop_error = self._on_loop_error
        c.on_loop_resumed = self._on_loop_resumed
        login = cfg.credentials()
        if login is not None:
            c.username_pw_set(*login)
        tls = cfg.tls_context()
        if tls is not None:
            c.tls_set_context(tls)
        if self._will is not None:
            c.will_set(self._will[0], self._will[1], qos=1, retain=True)
        c.reconnect_delay_set(min_delay=RECONNECT_MIN_S, max_delay=RECONNECT_MAX_S)
        c.max_inflight_messages_set(PAHO_MAX_INFLIGHT)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_publish = self._on_publish
        return c

    # -- paho callbacks (network thread; never block) ---------------------------------------
    def _fail(self, exc: BrokerRefused, words: str) -> None:
        if self.fatal is None:
            self._record_failure(words, fatal=True)
            self.fatal = exc
            log.error("%s: %s", self.client_name, exc)
        self.failed.set()
        self._client.disconnect()  # ends paho's loop: no silent retries

    def _record_failure(self, words: str, fatal: bool = False, waits: int = 1) -> None:
        """Note a failed connection attempt and log it once.

        ``waits``: paho's back-off waits before the next attempt (2 after a client object's first
        attempt failed in the socket: paho 2.2 waits in both its connection loops), else 1.
        """
        self._attempt_open = False
        self.connect_error = words
        self.connect_failures += 1
        if fatal:
            self.retry_in_s = None
            return
        wait = 0
        for _ in range(waits):
            wait += min(RECONNECT_MIN_S * 2**self._waits, RECONNECT_MAX_S)
            self._waits += 1
        self.retry_in_s = float(wait)
        log.warning(
            "%s: connection attempt %d to %s failed: %s; trying again in %.0f s",
            self.client_name,
            self.connect_failures,
            self.cfg.address,
            words,
            self.retry_in_s,
        )

    def status(self) -> LinkStatus:
        """The connection's state now (any thread): connected, the last failure's words, failures, back-off."""
        up = self.connected.is_set()
        return LinkStatus(
            connected=up,
            error=self.connect_error,
            failures=self.connect_failures,
            fatal=self.fatal is not None,
            retry_in_s=None if up or self.fatal is not None else self.retry_in_s,
        )

    def _on_attempt(self) -> None:
        self._attempt_open = True

    def _on_loop_resumed(self, exc: Exception) -> None:
        log.warning("%s: network loop resumed after a race in paho's outgoing queue (%s)", self.client_name, exc)

    def _on_loop_error(self, exc: Exception) -> None:
        log.error("%s: network loop stopped: %s: %s", self.client_name, type(exc).__name__, exc)
        self.connect_error = f"network loop stopped: {type(exc).__name__}: {exc}"
        self.failed.set()

    def _on_attempt_failed(self, exc: OSError) -> None:
        words = describe_connect_failure(exc, self.cfg.host, self.cfg.port, self._client.connect_timeout, tls=bool(self.cfg.tls_ca))
        if not isinstance(exc, ssl.SSLError) or isinstance(exc, TRANSIENT_TLS_ERRORS):
            self._record_failure(words, waits=2 if self._client.attempts == 1 else 1)
            return
        where = self.cfg.address
        text = str(getattr(exc, "verify_message", "") or exc)
        if "hostname" in text.lower() or "ip address mismatch" in text.lower():
            fix = (
                f"the broker's certificate is not valid for {self.cfg.host!r}: connect with the name the certificate "
                f"was issued for (see its subjectAltName), or issue a certificate that names {self.cfg.host!r}"
            )
        elif self.cfg.enrolled and ("issuer" in text.lower() or "self-signed" in text.lower() or "verify failed" in text.lower()):
            fix = bundle_wrong_ca(self.cfg.username or "", self.cfg.tls_ca)  # its CA came with its bundle, not from --tls-ca
        elif "issuer" in text.lower() or "self-signed" in text.lower() or "verify failed" in text.lower():
            fix = f"the broker's certificate was not signed by --tls-ca {self.cfg.tls_ca}: give the CA that signed it"
        else:
            fix = "check --tls-ca/--tls-cert/--tls-key against the broker's TLS listener"
        self._fail(BrokerRefused("tls", f"TLS with {where} failed: {text}; {fix}"), words)

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason_code: Any, properties: Any) -> None:
        if getattr(reason_code, "is_failure", False):
            name = str(reason_code)
            if self.protocol == "5" and self.cfg.mqtt_version == "auto" and name == "Unsupported protocol version":
                log.info("%s: broker speaks MQTT 3.1.1 only; using it (limit: --max-message-bytes)", self.client_name)
                self._attempt_open = False
                self._downgrade = True
                self._downgrade_now.set()
                client.disconnect()
                return
            if name in AUTH_REFUSALS:
                self._fail(BrokerRefused("auth", login_refused(self.cfg, name)), describe_refusal(name))
                return
            self._record_failure(describe_refusal(name))
            return
        self._attempt_open = False
        self.connect_error = None
        self.connect_failures = 0
        self.retry_in_s = None
        self._waits = 0
        self.broker_max_packet = getattr(properties, "MaximumPacketSize", None) if self.protocol == "5" else None
        self.connects += 1
        # paho sends its queue again right after this callback returns: a refused cut's chunks must be out of it.
        self._give_up_refused_cuts()
        for topic, qos in self.subscriptions:
            client.subscribe(topic, qos)
        self.connected.set()
        log.info(
            "%s: connected to %s:%d over MQTT %s (connect #%d%s)",
            self.client_name,
            self.cfg.host,
            self.cfg.port,
            self.protocol,
            self.connects,
            f", broker's maximum packet {self.broker_max_packet} bytes" if self.broker_max_packet else "",
        )
        if self._on_connect_hook is not None:
            self._on_connect_hook(self)

    def _on_disconnect(self, client: mqtt.Client, userdata: object, flags: object, reason_code: Any, properties: Any) -> None:
        was_up = self.connected.is_set()
        self.connected.clear()
        if self._stopping or self._downgrade or self.fatal is not None:
            return
        if not was_up:
            if self._attempt_open:  # closed between TCP connect and CONNACK: no other word came
                self._record_failure(describe_early_close(self.cfg.host, self.cfg.port, str(reason_code), bool(self.cfg.tls_ca)))
            return
        self._waits = 1  # paho waits RECONNECT_MIN_S before its first attempt after a lost connection
        # paho's own queue is the authority on what is unacknowledged: a packet may be on the wire
        # before publish() returned its id to us.
        c = self._client
        with c._out_message_mutex:
            big = {mid: len(m.payload) for mid, m in c._out_messages.items() if m.qos > 0 and len(m.payload) >= 2 * MIN_CHUNK_BYTES}
        if big:
            # The broker closes the connection on a packet over its max_packet_size (MQTT 3.1.1),
            # and paho drops it on a refusal code it cannot parse (MQTT 5 + message_size_limit):
            # either way paho would send the same packet again after reconnecting, forever.
            self._forget(big, f"the connection dropped ({reason_code}) while it was in flight")
        words = self._on_disconnect_hook(self, str(reason_code)) if self._on_disconnect_hook is not None and not big else None
        log.warning("%s: disconnected (%s); reconnecting automatically", self.client_name, words or reason_code)

    def _on_publish(self, client: mqtt.Client, userdata: object, mid: int, reason_code: Any, properties: Any) -> None:
        with self._state_lock:
            n = self._inflight.pop(mid, 0)
        if getattr(reason_code, "is_failure", False):
            self._refused[mid] = f"the broker answered {reason_code}"
            self.note_refused(n)
        with self._ack:
            self._acked[mid] = None
            while len(self._acked) > 4096:
                self._acked.popitem(last=False)
            self._ack.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        self.bytes_received += len(msg.payload)
        sweep = self._sweep
        if sweep is not None and any(mqtt.topic_matches_sub(f, msg.topic) for f in sweep[0]):
            if msg.retain and msg.payload:
                sweep[1].add(msg.topic)
            return
        payload = bytes(msg.payload)
        self.inbox.put((msg.topic, self._intern(payload) if self._intern is not None else payload, bool(msg.retain)))

    def _forget(self, mids: dict[int, int], why: str) -> None:
        """Take refused packets (mid -> payload bytes) out of paho's resend queue and record the refusal."""
        self._take_out(mids)
        with self._ack:
            for mid in mids:
                self._refused[mid] = why
            self._ack.notify_all()
        with self._state_lock:
            for mid in mids:
                self._inflight.pop(mid, None)
        self.note_refused(max(mids.values()))

    def _take_out(self, mids: Collection[int]) -> list[int]:
        """Take messages out of paho's queue (no public call for it) so they are never sent again; return the ids found."""
        c = self._client
        gone = []
        with c._out_message_mutex:
            for mid in mids:
                msg = c._out_messages.pop(mid, None)
                if msg is None:
                    continue
                gone.append(mid)
                if msg.state in (mqtt.mqtt_ms_wait_for_puback, mqtt.mqtt_ms_wait_for_pubrec):  # what paho counts in flight
                    c._inflight_messages = max(0, c._inflight_messages - 1)
        return gone

    def _give_up(self, cut: _Cut) -> None:
        """Send no more of ``cut`` and take its unacknowledged messages out of paho's queue (any thread)."""
        with self._ack:
            cut.given_up = True
        with self._state_lock:
            mids = list(cut.mids)
        gone = self._take_out(mids)
        with self._state_lock:
            for mid in gone:
                self._inflight.pop(mid, None)
        if gone:
            log.info("%s: %d queued chunk(s) of a refused cut withdrawn; it goes again in smaller chunks", self.client_name, len(gone))
        with self._ack:
            self._ack.notify_all()

    def _give_up_refused_cuts(self) -> None:
        """Give up every cut of which the broker refused a message (paho's thread, on connect, before paho resends)."""
        with self._publish_lock:  # no chunk is between paho's publish() and its cut's record
            with self._state_lock:
                cuts = [(cut, list(cut.mids)) for cut in self._cuts]
            with self._ack:
                refused = [cut for cut, mids in cuts if cut.given_up or any(mid in self._refused for mid in mids)]
            for cut in refused:
                self._give_up(cut)

    def note_refused(self, refused_payload: int) -> None:
        """Cut later chunks to half of ``refused_payload`` bytes (floor :data:`MIN_CHUNK_BYTES`): a message that size was lost."""
        if refused_payload <= 0:
            return
        new = max(MIN_CHUNK_BYTES, refused_payload // 2)
        if self.size_cap is None or new < self.size_cap:
            self.size_cap = new
            log.warning(
                "%s: the broker refused or dropped a %d-byte message; cutting chunks to %d bytes from now on. "
                "Set --max-message-bytes below the broker's limit (Mosquitto: max_packet_size / message_size_limit) "
                "to avoid the failed attempt",
                self.client_name,
                refused_payload,
                new,
            )

    # -- control -------------------------------------------------------------------------------
    def _watch_connack(self, wait_s: float = 3.0) -> None:
        """Until the first connection: fall back to MQTT 3.1.1 when the broker does not speak MQTT 5.

        Either the broker refuses the version, or it never answers (amqtt 0.12 with a last will).
        """
        since: float | None = None
        while self.connects == 0 and not self._stopping and not self.failed.is_set():
            if self._downgrade_now.wait(0.1):
                break
            if self._client.socket() is None:
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= wait_s and self.connects == 0:
                log.info("%s: no answer to an MQTT 5 CONNECT within %.0f s; using MQTT 3.1.1", self.client_name, wait_s)
                self._attempt_open = False
                self._downgrade = True
                break
        if not self._downgrade:
            return
        with self._life_lock:
            if self._stopping:
                return
            old = self._client
            old.disconnect()
            _stop_loop(old)  # joins paho's thread of the MQTT 5 client (this is not that thread)
            self.protocol = "3.1.1"
            with self._publish_lock:
                self._client = self._make_client()
            self._downgrade = False
            self._waits = 0  # a new paho client starts its back-off afresh
            self._connect_and_loop()

    def _connect_and_loop(self) -> None:
        c = self._client
        c.connect_async(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive, clean_start=True)
        c.loop_start()

    def start(self, wait_s: float | None = 30.0) -> bool:
        """Connect in the background and start paho's network thread.

        Returns True if connected within ``wait_s`` seconds (None: return at once); reconnection goes on regardless.
        """
        with self._life_lock:
            self._connect_and_loop()
        if self.protocol == "5" and self.cfg.mqtt_version == "auto":
            threading.Thread(target=self._watch_connack, name=f"mqtt-{self.client_name}-v5", daemon=True).start()
        if wait_s is None:
            return True
        end = time.monotonic() + wait_s
        while time.monotonic() < end and not self.connected.is_set() and not self.failed.is_set():
            self.connected.wait(0.05)
        return self.connected.is_set()

    def stop(self, final: tuple[str, bytes] | None = None) -> None:
        """Publish ``final`` (topic, payload; retained, QoS 1) if given, then disconnect cleanly and stop paho's thread."""
        if final is not None and self.connected.is_set():
            try:
                self.publish(final[0], final[1], retain=True, timeout=5.0)
            except (RuntimeError, TimeoutError, ValueError) as exc:
                log.warning("%s: could not publish final status: %s", self.client_name, exc)
        self._stopping = True
        with self._life_lock:
            self._client.disconnect()
            _stop_loop(self._client)  # returns at once when called from paho's own thread

    def clear_retained(self, topics: Sequence[str], timeout: float = 60.0) -> None:
        """Delete the retained messages of ``topics``; raises as :meth:`publish`."""
        deadline = time.monotonic() + timeout
        infos = [self._send(t, b"", 1, True, deadline) for t in topics]
        for info in infos:
            self._wait(info, deadline)

    def sweep_retained(self, filters: Sequence[str], quiet_s: float = 1.0, timeout: float = 60.0) -> list[str]:
        """Delete every retained message under ``filters``; return the topics cleared, sorted.

        Subscribes until ``quiet_s`` pass without a retained message; payloads never reach :attr:`inbox`.
        """
        found: set[str] = set()
        self._sweep = (list(filters), found)
        try:
            with self._publish_lock:
                for f in filters:
                    self._client.subscribe(f, 1)
            last, seen = time.monotonic(), 0
            end = last + timeout
            while time.monotonic() < end and time.monotonic() - last < quiet_s:
                time.sleep(0.05)
                if len(found) != seen:
                    last, seen = time.monotonic(), len(found)
            with self._publish_lock:
                for f in filters:
                    self._client.unsubscribe(f)
        finally:
            self._sweep = None
        topics = sorted(found)
        if topics:
            self.clear_retained(topics, timeout=timeout)
            log.info("%s: cleared %d retained message(s) under %s", self.client_name, len(topics), ", ".join(filters))
        return topics

    @property
    def attempts(self) -> int:
        """Connection attempts of the current session object (each TCP connect and CONNECT)."""
        return self._client.attempts

    def payload_limit(self, topic: str) -> int:
        """Largest payload on ``topic`` (bytes) under the configured, the broker's and any learned limit."""
        limit = self.cfg.max_message_bytes
        if self.broker_max_packet:
            limit = min(limit, self.broker_max_packet - PUBLISH_OVERHEAD_BYTES - len(topic.encode()))
        if self.size_cap is not None:
            limit = min(limit, self.size_cap)
        return limit

    def publish_nowait(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Queue a QoS 1 message without waiting (safe inside the ``on_connect`` hook)."""
        with self._publish_lock:
            self._client.publish(topic, payload, qos=1, retain=retain)
        self.bytes_sent += len(payload)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, timeout: float = 60.0) -> None:
        """Publish one message and (QoS > 0) wait for its acknowledgement, first waiting for a connection.

        Raises
        ------
        PayloadTooLarge
            Larger than the broker accepts.
        BrokerRefused
            The link stopped for good.
        TimeoutError
            Not connected or not acknowledged within ``timeout`` s.
        RuntimeError
            paho rejected it, or the broker refused it (:class:`PacketRejected`).
        """
        limit = self.payload_limit(topic)
        if len(payload) > limit:
            raise PayloadTooLarge(self._too_large(topic, len(payload), limit))
        deadline = time.monotonic() + timeout
        info = self._send(topic, payload, qos, retain, deadline)
        if qos > 0:
            self._wait(info, deadline)

    def _too_large(self, topic: str, size: int, limit: int) -> str:
        src = (
            f"the broker's maximum packet size of {self.broker_max_packet} bytes"
            if self.broker_max_packet and limit < self.cfg.max_message_bytes
            else f"--max-message-bytes {self.cfg.max_message_bytes}"
        )
        return (
            f"{self.client_name}: a {size}-byte message on {topic} exceeds {src} (payload room {limit} bytes); "
            f"raise max_packet_size in mosquitto.conf and --max-message-bytes, or send less"
        )

    def publish_chunks(
        self,
        topic_of: Callable[[int], str],
        payload: bytes,
        retain: bool = False,
        timeout: float = 300.0,
        chunk_bytes: int | None = None,
        only: Collection[int] | None = None,
    ) -> int:
        """Publish ``payload`` as QoS 1 chunks on ``topic_of(i)``, at most :data:`PUBLISH_WINDOW` unacknowledged; return the count.

        ``chunk_bytes`` re-sends chunks ``only`` of an earlier send of that size (a refusal then
        raises); by default :meth:`chunk_size`, cutting smaller after each refusal.

        Raises
        ------
        TimeoutError
            Not all acknowledged within ``timeout`` s.
        PacketRejected
            The broker refused a chunk of the given (or the smallest) size.
        BrokerRefused
            The link stopped for good.
        """
        deadline = time.monotonic() + timeout
        if chunk_bytes is not None:
            return self._publish_cut(topic_of, payload, retain, deadline, chunk_bytes, only)
        while True:  # cut again, smaller, each time the broker refuses a size (a refused size is never re-sent)
            size = self.chunk_size(topic_of)
            try:
                return self._publish_cut(topic_of, payload, retain, deadline, size, only)
            except PacketRejected:
                if self.chunk_size(topic_of) >= size:
                    raise
                log.info("%s: sending %s again in chunks of %d bytes", self.client_name, topic_of(0), self.chunk_size(topic_of))

    def _publish_cut(
        self,
        topic_of: Callable[[int], str],
        payload: bytes,
        retain: bool,
        deadline: float,
        size: int,
        only: Collection[int] | None,
    ) -> int:
        cut = _Cut()
        with self._state_lock:
            self._cuts.add(cut)
        pending: list[mqtt.MQTTMessageInfo] = []
        n = 0
        try:
            for i, chunk in enumerate(iter_chunks(payload, size)):
                n += 1
                if only is not None and i not in only:
                    continue
                pending.append(self._send(topic_of(i), chunk, 1, retain, deadline, cut))
                if len(pending) >= PUBLISH_WINDOW:
                    self._wait(pending.pop(0), deadline, cut)
            for info in pending:
                self._wait(info, deadline, cut)
        except PacketRejected:
            # The payload goes again in smaller chunks: none of this cut may follow them onto the wire.
            self._give_up(cut)
            raise
        finally:
            with self._state_lock:
                self._cuts.discard(cut)
                mids = list(cut.mids)
            with self._ack:
                for mid in mids:  # refusals of chunks nobody waited for
                    self._refused.pop(mid, None)
        return n

    def chunk_size(self, topic_of: Callable[[int], str]) -> int:
        """Chunk message size for topics ``topic_of(i)`` under every known limit (bytes)."""
        return max(CHUNK_HEADER_BYTES + 1, self.payload_limit(topic_of(10**9)))

    def _send(self, topic: str, payload: bytes, qos: int, retain: bool, deadline: float, cut: _Cut | None = None) -> mqtt.MQTTMessageInfo:
        while True:
            while not self.connected.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
                if self.fatal is not None:
                    raise self.fatal
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{self.client_name}: not connected to the broker; could not publish {topic}")
            if self.size_cap is not None and len(payload) > self.size_cap:
                # Cut before the broker refused this size (the refusal may have arrived while
                # the rest was being queued): never hand paho a packet of a refused size.
                raise PacketRejected(f"{self.client_name}: a {len(payload)}-byte message is over the {self.size_cap} bytes "
                                     f"left after the broker refused a larger one")  # fmt: skip
            with self._publish_lock:
                if cut is not None and cut.given_up:
                    raise PacketRejected(f"{self.client_name}: the broker refused a chunk cut like this one; "
                                         f"the rest of the cut is not sent")  # fmt: skip
                info = self._client.publish(topic, payload, qos=qos, retain=retain)
                # At QoS 1 paho keeps the message and sends it (again) after a reconnect when the
                # link just dropped (NO_CONN, CONN_LOST): track it like a sent one, never publish a copy.
                queued = qos > 0 and info.rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN, mqtt.MQTT_ERR_CONN_LOST)
                if queued:
                    with self._state_lock:
                        self._inflight[info.mid] = len(payload)
                        if cut is not None:
                            cut.mids.add(info.mid)
            if not queued and info.rc in (mqtt.MQTT_ERR_NO_CONN, mqtt.MQTT_ERR_CONN_LOST):  # QoS 0: try again once reconnected
                time.sleep(0.1)
                continue
            if not queued and info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise RuntimeError(f"{self.client_name}: publishing to {topic} failed: {mqtt.error_string(info.rc)}")
            self.bytes_sent += len(payload)
            return info

    def _wait(self, info: mqtt.MQTTMessageInfo, deadline: float, cut: _Cut | None = None) -> None:
        mid = info.mid
        with self._ack:
            while True:
                # paho reports a refusal (on_publish) before the acknowledgement counts, and a packet
                # taken out of its queue is never acknowledged: check the refusal first.
                why = self._refused.pop(mid, None)
                if why is not None:
                    if cut is not None:
                        cut.given_up = True  # before the refusal leaves _refused, where paho's thread looks for it
                    self._acked.pop(mid, None)
                    with self._state_lock:
                        self._inflight.pop(mid, None)
                    raise PacketRejected(
                        f"{self.client_name}: the broker refused a message ({why}); chunks are now cut to "
                        f"{self.size_cap} bytes. Its limit is below --max-message-bytes {self.cfg.max_message_bytes}: "
                        f"lower that option, or raise max_packet_size / message_size_limit in mosquitto.conf"
                    )
                if mid in self._acked:
                    del self._acked[mid]
                    with self._state_lock:
                        self._inflight.pop(mid, None)
                        if cut is not None:
                            cut.mids.discard(mid)
                    return
                if cut is not None and cut.given_up:  # paho's thread took this chunk out with the rest of its cut
                    raise PacketRejected(f"{self.client_name}: the broker refused a chunk of this cut; chunks are now cut to "
                                         f"{self.size_cap} bytes")  # fmt: skip
                if self.fatal is not None:
                    raise self.fatal
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.client_name}: message not acknowledged before the deadline")
                self._ack.wait(min(0.2, left))


def _stop_loop(client: Any) -> None:
    """paho's ``loop_stop``: it sets its network thread's terminate flag, then joins the thread.

    A SIGINT inside ``loop_start`` (KeyboardInterrupt in ``Thread.start()``) leaves paho a thread that
    ``join`` refuses with RuntimeError; the flag is set by then, so the thread ends as it comes up, and
    the stop goes on instead of hiding the interrupt behind an error of its own.
    """
    try:
        client.loop_stop()
    except RuntimeError as exc:
        if "before it is started" not in str(exc):
            raise
