"""What the federation looks like from the broker: a read-only observer on the monitor account.

The status page never logs in as ``coordinator`` (that would take over its session); it reads through
the broker's read-only ``monitor`` account. A :class:`Monitor` subscribes to the small retained and
control topics only (coordinator status, round, progress, each client's status, receipt and grant),
never to model or update chunks, and keeps the latest of each. Device statuses go into a
:class:`coordinator.client_table.ClientTable` (the coordinator's own presence rules). A malformed
message is counted by kind (:attr:`Monitor.malformed`) and ignored. One lock guards everything:
paho's thread feeds the inbox, the monitor's thread parses, web threads read :meth:`Monitor.snapshot`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.client_table import ClientTable
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_io.threads import join_started
from har_models.wire.blob_messages import BlobGrant
from har_models.wire.messages import (
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    Receipt,
    RoundAnnouncement,
    RoundProgress,
    fresh_until,
)
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.server.monitor")


@dataclass(frozen=True)
class DeviceSeen:
    """The latest status of one device as the monitor received it (times in s since the epoch, this machine's clock).

    ``last_seen_unix`` is the time the status carries (its arrival for older clients); ``windows`` and
    ``backend`` are the last that carried any, with when (what an offline device last had);
    ``window_age_since_unix`` is when the current ``sensing_health.window_age_s`` was first reported
    (a stopped stream repeats it, so the age now is that value plus the time since).
    """

    status: ClientStatus
    received_unix: float
    online: bool
    last_seen_unix: float
    windows: tuple[int, int, float] | None = None
    backend: tuple[str, float] | None = None
    window_age_since_unix: float | None = None


@dataclass(frozen=True)
class MonitorSnapshot:
    """A consistent copy of everything the monitor knows, taken under its lock.

    ``selected`` are the clients the open round's announcement names (with the blob transport, those
    holding a grant for its attempt); ``answered`` those with an accepted receipt while this attempt was
    open (an earlier attempt's receipt does not count); ``malformed`` counts ignored messages by kind;
    ``announced_unix`` is when this monitor first received the open attempt (no later than it opened).
    """

    devices: dict[str, DeviceSeen] = field(default_factory=dict)
    coordinator: CoordinatorStatus | None = None
    coordinator_online: bool = False
    progress: RoundProgress | None = None
    announcement: RoundAnnouncement | None = None
    selected: frozenset[str] = frozenset()
    answered: frozenset[str] = frozenset()
    malformed: dict[str, int] = field(default_factory=dict)
    connected: bool = False
    announced_unix: float | None = None


class Monitor:
    """A read-only MQTT observer of one federation (see the module docstring).

    Without ``cfg`` it has no session and is fed through :meth:`handle` alone; ``clock`` and ``wall``
    (monotonic and wall-clock s) are injected by tests that age statuses.
    """

    def __init__(
        self,
        topics: Topics,
        cfg: BrokerConfig | None = None,
        client_name: str = "fedhar-monitor",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.topics = topics
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._clients = ClientTable()  # each device's last status and presence, by the coordinator's rules
        self._windows: dict[str, tuple[int, int, float]] = {}  # the last status that carried windows
        self._backends: dict[str, tuple[str, float]] = {}  # the last status that named a backend
        self._age_since: dict[str, tuple[float, float]] = {}  # reported window age -> arrival of its first report
        self._coordinator: CoordinatorStatus | None = None
        self._coordinator_fresh_until: float | None = None
        self._progress: RoundProgress | None = None
        self._announcement: RoundAnnouncement | None = None
        self._announced: tuple[tuple[str, int, int, str, int], float] | None = None  # the attempt's key, its first arrival
        # client -> the open announcement's identity (_attempt_key) when its last accepted receipt for that exchange arrived
        self._receipts: dict[str, tuple[str, int, int, str, int]] = {}
        self._grants: dict[str, tuple[str, int, int, str]] = {}  # blob transport: client -> (run, round, stage, attempt) of its grant
        self.malformed: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.link: MqttLink | None = None
        if cfg is not None:
            self.link = MqttLink(cfg, client_name, subscriptions=[(t, 1) for t in self.subscriptions()])

    def subscriptions(self) -> list[str]:
        """The topic filters the monitor reads (no model or update chunks)."""
        p = self.topics.prefix
        return [self.topics.coordinator_status, self.topics.round, self.topics.progress, f"{p}/client/+/status",
                f"{p}/client/+/receipt", f"{p}/client/+/grant"]  # fmt: skip

    # ------------------------------------------------------------------ session
    def start(self, wait_s: float | None = 10.0) -> bool:
        """Connect and start the parsing thread; True once connected within ``wait_s``. RuntimeError without a BrokerConfig."""
        if self.link is None:
            raise RuntimeError("Monitor.start: this monitor has no broker settings; pass cfg=BrokerConfig(...) to read a broker")
        self._stop.clear()
        self._thread = threading.Thread(target=self._drain, name="fedhar-monitor", daemon=True)
        self._thread.start()
        return self.link.start(wait_s)

    def stop(self) -> None:
        """Disconnect and stop the parsing thread (within about a second)."""
        self._stop.set()
        if self.link is not None:
            self.link.stop()
        join_started(self._thread, 5.0)

    def _drain(self) -> None:
        assert self.link is not None
        inbox = self.link.inbox
        while not self._stop.is_set():
            try:
                topic, payload, retained = inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            self.handle(topic, payload, retained)

    # ------------------------------------------------------------------ messages
    def handle(self, topic: str, payload: bytes, retained: bool = False) -> None:
        """Take one message as it arrived (``retained``: delivered on subscribing); never raises for its content."""
        try:
            self._handle(topic, bytes(payload), retained)
        except MessageError as exc:
            kind = self._kind(topic)
            with self._lock:
                self.malformed[kind] += 1
            log.debug("ignored a malformed %s message on %s: %s", kind, topic, exc)
        except Exception:  # a bug must not stop the monitor's thread; counted and logged once per message
            with self._lock:
                self.malformed["error"] += 1
            log.exception("monitor: a message on %s could not be handled", topic)

    def _kind(self, topic: str) -> str:
        t = self.topics
        if topic == t.coordinator_status:
            return "coordinator"
        if topic == t.round:
            return "round"
        if topic == t.progress:
            return "progress"
        parsed = t.parse_client_topic(topic)
        return parsed[1] if parsed else "other"

    def _handle(self, topic: str, payload: bytes, retained: bool) -> None:
        t = self.topics
        now, now_unix = self._clock(), self._wall()
        if topic == t.coordinator_status:
            if not payload:
                with self._lock:
                    self._coordinator, self._coordinator_fresh_until = None, None
                return
            cs = CoordinatorStatus.from_bytes(payload)
            with self._lock:
                self._coordinator = cs
                self._coordinator_fresh_until = fresh_until(cs.sent_unix, cs.refresh_s, retained, now, now_unix)
            return
        if topic == t.round:
            ann = RoundAnnouncement.from_bytes(payload) if payload else None
            with self._lock:
                self._announcement = ann
                if ann is None:
                    self._announced = None
                elif self._announced is None or self._announced[0] != _attempt_key(ann):
                    self._announced = (_attempt_key(ann), now_unix)
            return
        if topic == t.progress:
            prog = RoundProgress.from_bytes(payload) if payload else None
            with self._lock:
                self._progress = prog
            return
        parsed = t.parse_client_topic(topic)
        if parsed is None:
            raise MessageError(f"topic {topic!r:.80} is not one the monitor reads")
        cid, kind = parsed
        try:
            check_client_id(cid)
        except ValueError as exc:
            raise MessageError(str(exc)) from None
        if kind == "status":
            with self._lock:
                st = self._clients.note(cid, payload, retained, now, now_unix)  # MessageError: counted by handle()
                if st is None:  # the retained status was cleared (a revoked or forgotten device)
                    self._windows.pop(cid, None)
                    self._backends.pop(cid, None)
                    self._age_since.pop(cid, None)
                    self._receipts.pop(cid, None)
                    return
                if st.n_train > 0 or st.n_test > 0:
                    self._windows[cid] = (st.n_train, st.n_test, now_unix)
                if st.backend:
                    self._backends[cid] = (st.backend, now_unix)
                age = st.sensing_health.window_age_s if st.sensing_health is not None else None
                if age is None:
                    self._age_since.pop(cid, None)
                elif cid not in self._age_since or self._age_since[cid][0] != age:
                    # a retained status may be old: its age counts from when it was sent, when it says
                    self._age_since[cid] = (age, st.sent_unix if retained and st.sent_unix else now_unix)
        elif kind == "receipt":
            r = Receipt.from_bytes(payload)
            if r.state == "accepted":
                with self._lock:
                    ann = self._announcement
                    if ann is not None and ann.state == "training" and (r.run_id, r.round, r.stage) == (ann.run_id, ann.round, ann.stage):
                        self._receipts[cid] = _attempt_key(ann)
        elif kind == "grant":
            with self._lock:
                if not payload:
                    self._grants.pop(cid, None)
                    return
                g = BlobGrant.from_bytes(payload)
                self._grants[cid] = (g.run_id, g.round, g.stage, g.attempt)
        else:
            raise MessageError(f"topic {topic!r:.80} is not one the monitor reads")

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> MonitorSnapshot:
        """A consistent copy of the monitor's view now."""
        now = self._clock()
        with self._lock:
            devices = {}
            for cid, seen in self._clients.seen().items():
                since = self._age_since.get(cid)
                devices[cid] = DeviceSeen(seen.status, seen.received_unix, self._clients.online(cid, now), seen.last_seen_unix,
                                          self._windows.get(cid), self._backends.get(cid),
                                          since[1] if since is not None else None)  # fmt: skip
            cs = self._coordinator
            c_online = cs is not None and cs.state == "online" and (
                self._coordinator_fresh_until is None or now < self._coordinator_fresh_until)  # fmt: skip
            ann = self._announcement
            answered: set[str] = set()
            selected: frozenset[str] = frozenset()
            if ann is not None and ann.state == "training":
                key = _attempt_key(ann)
                selected = frozenset(ann.selected)
                if ann.transport == "blobs" and not selected:  # the announcement names nobody: the grants say who
                    selected = frozenset(c for c, g in self._grants.items() if g == (ann.run_id, ann.round, ann.stage, ann.attempt))
                answered = {cid for cid in selected if self._receipts.get(cid) == key}
            return MonitorSnapshot(
                devices=devices,
                coordinator=cs,
                coordinator_online=c_online,
                progress=self._progress,
                announcement=ann,
                selected=selected,
                answered=frozenset(answered),
                malformed=dict(self.malformed),
                connected=self.link is not None and self.link.connected.is_set(),
                announced_unix=self._announced[1] if self._announced is not None and ann is not None else None,
            )


def _attempt_key(ann: RoundAnnouncement) -> tuple[str, int, int, str, int]:
    """What tells one attempt of an exchange from another: run, round, stage, attempt id and epoch."""
    return (ann.run_id, ann.round, ann.stage, ann.attempt, ann.epoch)
