"""What the federation looks like from the broker: a read-only observer on the monitor account.

The status page must not log in as ``coordinator`` (that would take over the running
coordinator's session), so it reads the federation through the broker's read-only ``monitor``
account (``fedhar-coordinator broker`` gives it ``topic read fedhar/v1/<fed>/#``).
A :class:`Monitor` subscribes to the small retained and control topics only, never to model or
update chunks::

    {p}/coordinator/status     the coordinator's presence (CoordinatorStatus)
    {p}/round                  the open round's announcement (RoundAnnouncement)
    {p}/progress               the record of the last completed round (RoundProgress)
    {p}/client/+/status        each device's presence (ClientStatus)
    {p}/client/+/receipt       the coordinator's receipts: who has answered the open round

and keeps the latest of each. Device statuses go into the coordinator's own client table
(:class:`coordinator.client_table.ClientTable`: the same parsing, topic check, presence and
last-seen rules as the running coordinator's; a status older than ``PRESENCE_PERIODS`` refresh
periods counts as offline). Messages are parsed with the wire module's checks; a malformed
one is counted by kind (:attr:`Monitor.malformed`) and ignored. Everything is behind one lock:
paho's thread feeds the inbox, the monitor's own thread parses, and the web threads read
:meth:`Monitor.snapshot`.
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
    """The latest status of one device as the monitor received it.

    Attributes
    ----------
    status : ClientStatus
    received_unix : float
        When it arrived (s since the epoch, this machine's clock).
    online : bool
        Its state is not "offline" and it is fresh (:meth:`coordinator.client_table.ClientTable.online`).
    last_seen_unix : float
        When the device last spoke: the time its status carries, or its arrival when it
        carries none (an older client).
    windows : tuple (n_train, n_test, unix) or None
        The windows of the last status that carried any (n_train or n_test > 0) and when it was
        received: what an offline device last had (its will says 0/0).
    backend : tuple (backend, unix) or None
        The backend of the last status that named one, and when it was received.
    window_age_since_unix : float or None
        Arrival of the first status that reported the current ``sensing_health.window_age_s``:
        a stream that stopped (a replay that ended) repeats the same age, so the age now is that
        value plus the time since (None: no age reported).
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

    Attributes
    ----------
    devices : dict client id -> DeviceSeen
    coordinator : CoordinatorStatus or None
    coordinator_online : bool
        Its state is "online" and the status is fresh.
    progress : RoundProgress or None
        The retained record of the last completed round.
    announcement : RoundAnnouncement or None
        The open round (or the "finished" announcement).
    selected : frozenset of str
        The clients the open round selected: those its announcement names or, with the blob
        transport (whose announcement names nobody), those holding a grant for its exchange and attempt.
    answered : frozenset of str
        Selected clients of the open round whose update the coordinator counted in this
        attempt: an accepted receipt for the round's exchange (run, round, stage) that arrived
        while this announcement (its ``attempt`` and ``epoch``) was open. A receipt of an earlier
        attempt of the same round (one that closed without quorum), or a device's status saying it
        sent an update, is not an answer: the re-run counts only what it received itself.
    malformed : dict kind -> int
        Messages ignored because they did not parse, by kind ("status", "coordinator", "round",
        "progress", "receipt").
    connected : bool
        Whether the monitor's own MQTT session is up.
    announced_unix : float or None
        When this monitor first received the open announcement's attempt (s since the epoch, this
        machine's clock): no later than it opened, so a round's time open counts from here at most
        (a retained announcement received on connecting counts from then). None without one.
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

    Parameters
    ----------
    topics : Topics
        The federation's topic names.
    cfg : BrokerConfig, optional
        The broker and the monitor account's credentials; without it the monitor has no MQTT
        session and is fed through :meth:`handle` alone (tests, or a caller with its own link).
    client_name : str
        MQTT client id of the session (unique on the broker).
    clock, wall : callables returning float
        Monotonic and wall-clock time (s); injected by tests that age statuses.

    Notes
    -----
    :meth:`handle` is the one entrance of messages; it never raises for a message's content.
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
        """Connect (paho's thread) and start the thread that parses the inbox; True once connected within ``wait_s``.

        Raises
        ------
        RuntimeError
            If the monitor was built without a BrokerConfig.
        """
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
        if self._thread is not None:
            self._thread.join(5.0)

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
        """A consistent copy of the monitor's view now (see :class:`MonitorSnapshot`)."""
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
    """What tells one attempt of an exchange from another: run, round, stage, the coordinator's attempt id and epoch."""
    return (ann.run_id, ann.round, ann.stage, ann.attempt, ann.epoch)
