"""The edge client's MQTT agent: follows round announcements, trains, uploads.

paho's thread only queues messages; this agent's own thread reads and trains, so a long training
never stalls keep-alives, and it acts on the newest state (what queued up is read first). It is
assembled from parts, one job each: :mod:`.model_intake`, :mod:`.coordinator_watch`, :mod:`.rounds`,
:mod:`.answers`, :mod:`.delivery` (an update counts as delivered only on the coordinator's receipt,
docs/reliability.md) and :mod:`.identity`. Stopped in a round (SIGTERM), it sends its update and
awaits the receipt (``stop_flush_s``) before it says it is offline.

A served coordinator counts its starts in an epoch: a client seeing a higher epoch drops the older
one's round, sends an update still awaiting its receipt to the new one and republishes its status
at once (public report BR-46); an announcement of an older epoch is ignored (epoch 0, a
coordinator of ``run``, is always taken). Two processes with one client id both stop
(:data:`EXIT_DUPLICATE_ID`); another device or federation using the id is named in the log, the
status and :attr:`EdgeAgent.connection`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import random
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from edge_client.answers import Answers
from edge_client.backends.base import BackendOptions
from edge_client.bad_objects import BadObjects
from edge_client.blob_upload import TransportLink
from edge_client.client_config import BACKENDS, CheckIn, ClientConfig
from edge_client.coordinator_watch import CoordinatorWatch
from edge_client.cost import CostMeter
from edge_client.delivery import MAX_EARLIER, Delivery, PendingUpdate
from edge_client.identity import IdCollision, TwinWatch
from edge_client.model_intake import ModelIntake
from edge_client.pte_fetch import make_fetcher
from edge_client.rounds import RoundWorker, kept_round_costs
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer
from har_io.blob_http import BlobCache
from har_io.exit_codes import Exit
from har_io.link_status import LinkStatus
from har_io.mqtt_link import BrokerRefused, MqttLink
from har_models.wire.blob_messages import BLOB_NOTICE_INDEX, BlobGrant
from har_models.wire.chunking import SharedTransfers
from har_models.wire.messages import (
    MAX_FAULT_CHARS,
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    RoundAnnouncement,
    RoundOutlook,
    SensingHealth,
    offline_status,
)
from har_models.wire.topics import Topics

__all__ = ["BACKENDS", "EXIT_BROKER_REFUSED", "EXIT_DUPLICATE_ID", "CheckIn", "ClientConfig", "EdgeAgent"]

log = logging.getLogger("fedhar.client")

EXIT_BROKER_REFUSED = Exit.BROKER_REFUSED
"""Exit code: the broker refused the login, or TLS failed (a restart cannot help; :mod:`har_io.exit_codes`)."""
EXIT_DUPLICATE_ID = Exit.DUPLICATE_ID
"""Exit code: another process uses this client id (a restart cannot help; :mod:`har_io.exit_codes`)."""

Key = tuple[str, int, int]
T = TypeVar("T")


class EdgeAgent:
    """Runs one edge client against the broker until stopped (or its run finished).

    ``train_lock``, ``shared_transfers`` and ``blob_cache`` are shared by the clients hosted in one
    worker process (:mod:`simulation.worker`); ``blob_cache`` defaults to ``blob-cache/`` in the store's folder.
    ``cost``: where the rounds' CPU is measured; a holder that also measures sensing and the battery (the app) passes
    its own, so the status and its screen show one set of figures (default: a meter of the agent's own).
    """

    def __init__(self, cfg: ClientConfig, store: ClientStore, train_lock: threading.Lock | None = None,
                 shared_transfers: SharedTransfers | None = None, blob_cache: BlobCache | None = None,
                 cost: CostMeter | None = None):  # fmt: skip
        self.cfg = cfg
        self.store = store
        cid = cfg.client_id
        # Clients hosted together in one worker process train one at a time: memory stays that of
        # one training, and each training sees the same global RNG and thread settings as alone.
        self._train_lock = train_lock if train_lock is not None else contextlib.nullcontext()
        self.topics = Topics(cfg.federation)
        # Refused bytes (a model or programs that do not match their hash) go into the status at once.
        self.bad_objects = BadObjects(on_change=lambda: self._publish_status())
        # Programs delivered by the coordinator, for a client that cannot export them (edge_client/pte_fetch.py).
        self.programs = make_fetcher(cid, self.topics, cfg.backend, cfg.programs, cfg.program_cache, store.folder, cfg.max_model_bytes)
        if self.programs is not None:
            self.programs.bad = self.bad_objects
        program_cache = str(self.programs.folder) if self.programs is not None else cfg.program_cache
        self.trainer = ClientTrainer(store, cid, cfg.backend, BackendOptions(program_cache=program_cache))
        self.intake = ModelIntake(cid, self.topics, cfg.max_model_bytes, self.bad_objects, shared_transfers,
                                  blob_cache if blob_cache is not None else BlobCache(Path(store.folder) / "blob-cache"))  # fmt: skip
        self.announcement: RoundAnnouncement | None = None
        self.watch = CoordinatorWatch(cid)
        self.grant: BlobGrant | None = None  # the upload grant of the newest blob exchange
        self._earlier_grants: dict[Key, BlobGrant] = {}  # a few earlier ones: an update still owed a send uses its own
        self.outlook: RoundOutlook | None = None  # what the coordinator says it is doing about rounds (for people)
        self.exit_code = 0
        self.instance = uuid.uuid4().hex[:12]  # this process; see docs/reliability.md (identity)
        self.sensing: Callable[[], str] = lambda: ""  # "live"/"paused" from a live source's SensingFreshness; "" untracked
        self.charging: Callable[[], bool | None] = lambda: None  # on the charger (edge_client.power); None: not reported
        self.sensing_health: Callable[[], SensingHealth | None] = lambda: None  # a SensingHealthMeter's snapshot; None: no pipeline here
        self.fault: Callable[[], str] = lambda: ""  # the holder's device fault in words (a refused sensor); the store's is added
        # CPU of rounds (and, from a holder that senses, of sensing and the battery), in the status. Given at
        # construction: the round worker measures into this same meter.
        self.cost = cost if cost is not None else CostMeter(rounds=kept_round_costs(store))
        self.battery: Callable[[], float | None] = lambda: None  # battery level, %, sampled into ``cost`` at each status
        # A storage fault (or its end) is in the status at once: the coordinator stops selecting this device.
        # New windows too (a relabelled stretch, a recording stopped): a coordinator that selects by
        # windows sees them, and an update trained on them is not more than the status reported.
        self._republish: Callable[[object], None] = lambda _changed: self._publish_status()  # from the writer's thread
        self.epoch = 0  # the highest coordinator epoch seen (0: none, an unserved coordinator)
        self.check_in: CheckIn | None = None  # pace steering: when to come back (_note_pace); None: no pace announced
        self._pace_rng = random.Random()  # this device's own draws in the announced windows
        self.twins = TwinWatch(self.instance)
        self.collision = IdCollision(cid)
        self._stopped = threading.Event()
        self._state = "online"
        store.window_counts()  # read from the table here, as the agent starts; kept by the store from then on
        self.answers = Answers(store, cid)
        self._link = MqttLink(
            cfg.broker,
            f"fedhar-client-{cid}",
            subscriptions=[
                (self.topics.client_status(cid), 1),  # first: the retained one names our predecessor
                (self.topics.coordinator_status, 1),
                (self.topics.coordinator_outlook, 1),
                (self.topics.round, 1),
                (self.topics.global_model("+"), 1),
                (self.topics.client_model(cid, "+"), 1),
                (self.topics.client_receipt(cid), 1),
                (self.topics.client_grant(cid), 1),
            ]
            + (self.programs.subscriptions() if self.programs is not None else []),
            will=(self.topics.client_status(cid), offline_status(cid, self.instance)),
            on_connect=self._on_connect,
            intern=shared_transfers.message if shared_transfers is not None else None,
            on_disconnect=lambda _link, reason: self.collision.disconnected(reason),
        )
        uplink = TransportLink(self._link, lambda i: self.topics.client_update(cid, i), self.topics.client_update(cid, BLOB_NOTICE_INDEX),
                               self._grant_of)  # fmt: skip
        self.delivery = Delivery(uplink, self.answers.envelope, cid, receipt_wait_s=cfg.receipt_wait_s,
                                 max_message_bytes=cfg.broker.max_message_bytes)  # fmt: skip
        self.delivery.on_accepted = self._confirmed
        self.rounds = RoundWorker(cid, store, self.trainer, self.intake, self.answers, self.delivery, self._link, self.programs, self.cost,
                                  self._set_state, self._catch_up, self._acts_on, self._grant_of, self._train_lock,
                                  cfg.max_model_bytes)  # fmt: skip
        store.fault_listeners.append(self._republish)  # last: a listener may run at once, from another thread
        store.window_listeners.append(self._republish)

    @property
    def models(self) -> OrderedDict[str, bytes]:
        """Whole models received and not yet used: transfer id -> envelope (:attr:`ModelIntake.models`)."""
        return self.intake.models

    @property
    def coordinator(self) -> CoordinatorStatus | None:
        """The newest coordinator status this client took (None before one)."""
        return self.watch.status

    @property
    def coordinator_presence(self) -> str:
        """The coordinator as this client sees it now: "unknown", "offline", "gone" or "online" (:class:`CoordinatorWatch`)."""
        return self.watch.presence

    @property
    def phase(self) -> str:
        """What the agent does now (any thread): "online" (started), "training", "idle" (between rounds) or "offline" (stopped)."""
        return self._state

    @property
    def refusal(self) -> BrokerRefused | None:
        """Why the broker refused this client for good (credentials, certificates, identity), or None."""
        fatal = getattr(self._link, "fatal", None)
        return fatal if isinstance(fatal, BrokerRefused) else None

    @property
    def connection(self) -> LinkStatus:
        """The broker connection now (any thread): connected or not, and why the last attempt failed, in plain words.

        ``fatal``: a restart cannot help (the agent ends with :data:`EXIT_BROKER_REFUSED`).
        """
        status = self._link.status()
        words = self.collision.current()
        return dataclasses.replace(status, error=words) if words and not status.connected else status

    def _confirmed(self, pending: PendingUpdate) -> None:
        """The coordinator counted the update: its attempt is answered, and the status tells how long the upload took."""
        self.answers.confirmed(pending)
        self._publish_status()

    def _on_connect(self, link: MqttLink) -> None:
        self.collision.connected()
        link.publish_nowait(self.topics.client_status(self.cfg.client_id), self._status_bytes(), retain=True)

    def _status_bytes(self) -> bytes:
        self.cost.note_battery(self.battery(), self.charging())
        cost = self.cost.snapshot()
        try:
            last = self.store.get_meta("last_update") or {}
        except sqlite3.Error:  # a broken store: the status still goes out, saying so in its fault
            last = {}
        windows = self.store.window_counts()  # the store's now: windows added while running count at once
        faults = (self.store.fault, self.fault(), self.collision.current())
        return ClientStatus(
            client_id=self.cfg.client_id, state=self._state, label_set=self.store.labels.name, n_train=windows.n_train,
            n_test=windows.n_test, train_stats=windows.train_stats, class_counts=windows.class_counts,
            run_id=str(last.get("run_id", "")), last_round=int(last.get("round", -1)), instance=self.instance, sent_unix=time.time(),
            refresh_s=self.cfg.status_refresh_s, program_fault=self.trainer.program_fault, sensing=self.sensing(),
            charging=self.charging(), backend=self.trainer.backend_in_use, arch_version=self.trainer.arch_version,
            sensing_health=self.sensing_health(), fault="; ".join(f for f in faults if f)[:MAX_FAULT_CHARS],
            cost=cost if cost.to_json() else None,  # nothing measured yet: the message a client sent before it measured
            train_s=_seconds(self.rounds.train_s), download_s=_seconds(self.intake.download_s),
            upload_s=_seconds(self.delivery.upload_s), warming_up=self.rounds.warming_up, bad_objects=self.bad_objects.listed(),
        ).to_bytes()  # fmt: skip

    def _set_state(self, state: str) -> None:
        self._state = state
        self._publish_status()

    def _publish_status(self) -> None:
        """Publish the retained status as things are now (any thread; nothing while disconnected: the connect sends it)."""
        if self._link.connected.is_set():
            self._link.publish_nowait(self.topics.client_status(self.cfg.client_id), self._status_bytes(), retain=True)

    def run(self, stop: threading.Event | None = None, max_seconds: float | None = None) -> int:
        """Serve until ``stop`` is set, ``max_seconds`` pass, or the awaited run finishes.

        Returns 0, :data:`EXIT_BROKER_REFUSED` (login or TLS refused) or :data:`EXIT_DUPLICATE_ID`.
        """
        stop = stop or threading.Event()
        end = None if max_seconds is None else time.monotonic() + max_seconds
        counts = self.store.window_counts()
        log.info("[%s] starting: %d training / %d test windows; broker %s:%d", self.cfg.client_id, counts.n_train, counts.n_test,
                 self.cfg.broker.host, self.cfg.broker.port)  # fmt: skip
        self._link.start(wait_s=None)
        # Presence is refreshed from its own thread: a training round of several minutes blocks this one.
        threading.Thread(target=self._refresh_status, args=(stop,), name="status-refresh", daemon=True).start()
        try:
            while not stop.is_set() and (end is None or time.monotonic() < end) and not self.exit_code:
                if self._link.fatal is not None:
                    self.exit_code = EXIT_BROKER_REFUSED
                    break
                try:
                    topic, payload, retained = self._link.inbox.get(timeout=0.5)
                except queue.Empty:
                    self._maybe_work()  # re-sends an unconfirmed upload even when nothing arrives
                    continue
                self._handle(topic, payload, retained)
                if self.exit_code:
                    break
                if self._finished():
                    log.info("[%s] run %s finished after %d rounds here; exiting", self.cfg.client_id, self.cfg.exit_after_run,
                             self.rounds.rounds_done)  # fmt: skip
                    break
                if self._link.inbox.empty():  # act on the newest state: what queued up behind a training is read first
                    self._maybe_work()
            self._finish_round()
        except BrokerRefused:
            self.exit_code = EXIT_BROKER_REFUSED  # logged once by the link, with the cause and the fix
        finally:
            self._stopped.set()
            self._state = "offline"
            final = None
            if self.exit_code != EXIT_DUPLICATE_ID:  # the other process's status is not ours to overwrite
                final = (self.topics.client_status(self.cfg.client_id), offline_status(self.cfg.client_id, self.instance))
            self._link.stop(final=final)
            # The store outlives this agent (the app starts another after a failure or a change of settings).
            for listeners in (self.store.fault_listeners, self.store.window_listeners):
                with contextlib.suppress(ValueError):
                    listeners.remove(self._republish)
            log.info("[%s] stopped after %d round(s)", self.cfg.client_id, self.rounds.rounds_done)
        return self.exit_code

    def _finish_round(self) -> None:
        """Before the last word: the open round's update goes out and its receipt is awaited (at most ``stop_flush_s``)."""
        if self.exit_code or self.cfg.stop_flush_s <= 0 or not self._link.connected.is_set():
            return
        ann = self._catch_up()  # the newest state first (an announcement or a receipt may have queued)
        self.rounds.finish(ann if ann is not None and self._acts_on(ann) else None, self.cfg.stop_flush_s, self._step)

    def _step(self) -> bool:
        """Handle what arrives within 0.1 s; whether the open round is still one this client works on."""
        with contextlib.suppress(queue.Empty):
            self._handle(*self._link.inbox.get(timeout=0.1))
        ann = self.announcement
        return ann is not None and self._acts_on(ann)

    def _catch_up(self) -> RoundAnnouncement | None:
        """Handle every message waiting now; the announcement then open (None: none)."""
        with contextlib.suppress(queue.Empty):
            while not self.exit_code:
                self._handle(*self._link.inbox.get_nowait())
        return self.announcement

    def _acts_on(self, ann: RoundAnnouncement) -> bool:
        """Whether this client works on ``ann`` now: a training round that selects it, whose coordinator runs."""
        return ann.state == "training" and self._is_selected(ann) and self.watch.runs(ann, not self._link.inbox.empty())

    def _refresh_status(self, stop: threading.Event) -> None:
        """Republish the retained status every ``status_refresh_s`` seconds until the agent stops (own thread)."""
        while not stop.wait(self.cfg.status_refresh_s) and not self._stopped.is_set():
            self._publish_status()

    def _finished(self) -> bool:
        a = self.announcement
        return a is not None and a.state == "finished" and self.cfg.exit_after_run is not None and a.run_id == self.cfg.exit_after_run

    def _parse(self, parse: Callable[[bytes], T], payload: bytes, what: str) -> T | None:
        """``parse(payload)``, or None with a warning for a malformed message."""
        try:
            return parse(payload)
        except MessageError as exc:
            log.warning("[%s] ignoring malformed %s: %s", self.cfg.client_id, what, exc)
            return None

    def _handle(self, topic: str, payload: bytes, retained: bool = False) -> None:
        cid = self.cfg.client_id
        if topic == self.topics.round and not payload:
            self.announcement = None  # the run that owned it cleared it
            return
        if not payload:  # a cleared retained message
            return
        if topic == self.topics.round:
            ann = self._parse(RoundAnnouncement.from_bytes, payload, "round announcement")
            if ann is None:
                return
            self._note_epoch(ann.epoch)
            if 0 < ann.epoch < self.epoch:  # epoch 0: a coordinator that does not count epochs (run)
                log.info("[%s] ignoring round %d of coordinator epoch %d: epoch %d runs now", cid, ann.round, ann.epoch, self.epoch)
                return
            self.announcement = ann
            self._note_pace(ann)
        elif topic == self.topics.client_status(cid):
            other = self.twins.twin(payload, self._link.connects)
            if other is not None:
                log.error("[%s] another process is connected as client id %r (instance %s; this one is %s): the broker keeps "
                          "disconnecting one for the other. Two devices must not share an id: give each its own --client-id "
                          "(and its own credentials). Stopping (exit code %d)", cid, cid, other, self.instance,
                          EXIT_DUPLICATE_ID)  # fmt: skip
                self.exit_code = EXIT_DUPLICATE_ID
        elif topic == self.topics.coordinator_status:
            co = self._parse(CoordinatorStatus.from_bytes, payload, "coordinator status")
            if co is None:
                return
            self._note_epoch(co.epoch)
            if not 0 < co.epoch < self.epoch:  # else a status of a coordinator epoch that is gone (its will, delivered late)
                self.watch.take(co, retained)
        elif topic == self.topics.coordinator_outlook:
            with contextlib.suppress(MessageError):  # a malformed outlook costs the words on a screen, nothing more
                self.outlook = RoundOutlook.from_bytes(payload) if payload else None
        elif topic == self.topics.client_receipt(cid):
            self.rounds.on_receipt(payload)
        elif topic == self.topics.client_grant(cid):
            grant = self._parse(BlobGrant.from_bytes, payload, "upload grant")
            if grant is not None:
                if self.grant is not None and self.grant.key() != grant.key():
                    self._keep_grant(self.grant)
                self.grant = grant
        elif self.programs is not None and self.programs.owns(topic):
            self.programs.on_message(payload)
        else:
            self.intake.on_chunk(topic, payload)

    def _note_epoch(self, epoch: int) -> None:
        """React to a coordinator epoch seen in a status or an announcement (see the module docstring).

        A higher epoch means the served coordinator restarted: the older epoch's announcement is
        dropped, an upload awaiting its receipt goes to the new coordinator once
        (:meth:`Delivery.after_restart`), and the status is published now. The first epoch seen only sets it.
        """
        if epoch <= self.epoch:
            return
        old, self.epoch = self.epoch, epoch
        if old == 0:
            return
        ann = self.announcement
        if ann is not None and ann.epoch < epoch:
            self.announcement = None
        self.delivery.after_restart()
        log.info("[%s] the coordinator restarted (epoch %d -> %d): dropped epoch %d's round and announced myself again",
                 self.cfg.client_id, old, epoch, old)  # fmt: skip
        self._set_state(self._state)

    def _note_pace(self, ann: RoundAnnouncement) -> None:
        """Keep the check-in time of ``ann``'s pace in :attr:`check_in` (:meth:`CheckIn.of`: drawn once per announcement)."""
        if ann.pace is None:
            self.check_in = None
            return
        old, self.check_in = self.check_in, CheckIn.of(ann, self._is_selected(ann), self._pace_rng, self.check_in)
        if self.check_in is not None and self.check_in is not old:
            log.debug("[%s] round %d: check in again at %s", self.cfg.client_id, ann.round,
                      time.strftime("%H:%M:%S", time.localtime(self.check_in.at_unix)))  # fmt: skip

    def _maybe_work(self) -> None:
        """Re-send an unconfirmed upload when its wait is over; act on the open round if it selects this client and its coordinator runs."""
        self.delivery.poll(self._open_key())
        ann = self.announcement
        if ann is not None and self._acts_on(ann):
            self.rounds.work(ann)

    def _is_selected(self, ann: RoundAnnouncement) -> bool:
        """Whether ``ann`` selects this client: it names it, or (blob transport, whose announcement names nobody)
        this client holds its grant for that exchange and attempt."""
        if self.cfg.client_id in ann.selected:
            return True
        g = self._grant_of((ann.run_id, ann.round, ann.stage))
        return ann.transport == "blobs" and g is not None and g.attempt == ann.attempt

    def _keep_grant(self, grant: BlobGrant) -> None:
        """Keep an earlier exchange's grant while an update for it may still go: those of the updates delivery still
        owes a send, and at most MAX_EARLIER others (the newest)."""
        self._earlier_grants[grant.key()] = grant
        owed = {p.key for p in (self.delivery.pending, *self.delivery.earlier) if p is not None}
        spare = [k for k in self._earlier_grants if k not in owed]
        for key in spare[: max(0, len(spare) - MAX_EARLIER)]:
            del self._earlier_grants[key]

    def _grant_of(self, key: Key) -> BlobGrant | None:
        """This client's upload grant for exchange ``key``, if it arrived."""
        g = self.grant
        return g if g is not None and g.key() == key else self._earlier_grants.get(key)

    def _open_key(self) -> Key | None:
        """The exchange whose round is open for training now, or None."""
        a = self.announcement
        return (a.run_id, a.round, a.stage) if a is not None and a.state == "training" else None


def _seconds(value: float | None) -> float | None:
    """A measured duration for the status: rounded to milliseconds, None kept."""
    return None if value is None else round(max(0.0, value), 3)
