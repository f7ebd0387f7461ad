"""The edge client's MQTT agent: follows round announcements, trains, uploads.

Threads: paho's network thread only queues messages (:class:`~har_io.mqtt_link.MqttLink`);
this agent's own thread parses them, reassembles models and runs training, so a long
training never stalls keep-alives or acknowledgements.

Delivery is end to end (docs/reliability.md, :mod:`edge_client.delivery`): an update counts as
delivered only when the coordinator's receipt for it arrives; until then it is sent again with
back-off, while its round is open, and chunks the coordinator reports missing are sent again on
their own.
A round is acted on only while the coordinator that announced it is online for that run, and
its status is fresh: a coordinator that refreshes its retained status (``refresh_s``) and has not
done so for :data:`~har_models.wire.messages.PRESENCE_PERIODS` periods is gone (it crashed and
its will never reached the broker); the agent logs that once and shows it in
:attr:`EdgeAgent.coordinator_presence`.
A served coordinator (``fedhar-coordinator serve``) counts its starts in an epoch, carried in its
status and every announcement: a client that sees a higher epoch drops the work of the older one
(its announcement and an upload still waiting for a receipt) and publishes its status at once, so
the restarted coordinator counts it present without waiting for the refresh (public report BR-46);
an announcement of an older epoch is not acted on (epoch 0, a coordinator of ``run`` that does
not count epochs, is always taken).
Two processes with one client id are detected through the instance id in the client's own
retained status, and both stop (exit code :data:`EXIT_DUPLICATE_ID`).

The connection's state, with the cause of the last failed attempt in plain words, is
:attr:`EdgeAgent.connection` (a :class:`~har_io.link_status.LinkStatus`), for a screen to show.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_client.backends.base import BACKEND_NAMES, BackendOptions
from edge_client.blob_upload import TransportLink
from edge_client.cost import ROUND_COST_KEY, CostMeter
from edge_client.delivery import Delivery
from edge_client.pte_fetch import PROGRAM_MODES, make_fetcher
from edge_client.sent_log import SENT_KEY, note_receipt, note_sent
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer, RoundOutcome
from har_io.blob_http import BlobCache, fetch_model
from har_io.blobs import BlobError
from har_io.broker_config import BrokerConfig
from har_io.exit_codes import Exit
from har_io.link_status import LinkStatus
from har_io.memory import release_free_memory
from har_io.mqtt_link import BrokerRefused, MqttLink
from har_models.wire import codec
from har_models.wire.blob_messages import BLOB_NOTICE_INDEX, BlobGrant, BlobRef
from har_models.wire.chunking import ChunkError, Reassembler, SharedTransfers, peek_transfer
from har_models.wire.messages import (
    MAX_FAULT_CHARS,
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    Receipt,
    RoundAnnouncement,
    SensingHealth,
    fresh_until,
    offline_status,
)
from har_models.wire.pace import Pace
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.client")

BACKENDS = BACKEND_NAMES

EXIT_BROKER_REFUSED = Exit.BROKER_REFUSED
"""Exit code: the broker refused the login, or TLS failed (a restart cannot help; :mod:`har_io.exit_codes`)."""
EXIT_DUPLICATE_ID = Exit.DUPLICATE_ID
"""Exit code: another process uses this client id (a restart cannot help; :mod:`har_io.exit_codes`)."""


@dataclass(frozen=True)
class ClientConfig:
    """Settings of one edge client.

    Parameters
    ----------
    client_id : str
        Stable device id (letters, digits, ``_ . -``); also its MQTT user name in deployments.
    broker : BrokerConfig
    federation : str
        Federation name (topic prefix ``fedhar/v1/{federation}``).
    max_model_bytes : int
        Largest model envelope accepted (bytes).
    backend : {"torch", "executorch", "executorch-android", "numpy"}
        The training backend of :class:`~edge_client.trainer.ClientTrainer`: PyTorch eager (boards,
        desktop, the simulation), ExecuTorch programs (the Python runtime, or the Java training
        module on a phone), or the numpy reference (no PyTorch);
        :func:`edge_client.backends.factory.choose_backend` picks the best installed.
    program_cache : str, optional
        Folder of the exported ExecuTorch programs (``executorch`` backends).
    programs : {"auto", "export", "fetch"}
        Whether an ``executorch`` client exports its programs or asks the coordinator for them
        (:func:`edge_client.pte_fetch.needs_delivery`; ``executorch-android`` always asks).
    exit_after_run : str, optional
        Exit once the coordinator announces that this run id finished (used by simulations);
        otherwise run until stopped.
    status_refresh_s : float
        Republish the retained status this often (s), so the coordinator can tell a present
        device from one that vanished without a last will (e.g. revoked).
    receipt_wait_s : float
        Seconds to wait for the coordinator's receipt before sending an update again; doubles
        after each further send, up to 60 s, and never beyond the round's deadline
        (:class:`edge_client.delivery.Delivery`).
    """

    client_id: str
    broker: BrokerConfig
    federation: str = "default"
    max_model_bytes: int = 512 * 1024 * 1024
    exit_after_run: str | None = None
    backend: str = "torch"
    program_cache: str | None = None
    status_refresh_s: float = 30.0
    receipt_wait_s: float = 30.0
    programs: str = "auto"

    def __post_init__(self) -> None:
        check_client_id(self.client_id)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.programs not in PROGRAM_MODES:
            raise ValueError(f"programs must be one of {PROGRAM_MODES}, got {self.programs!r}")


@dataclass(frozen=True)
class CheckIn:
    """When this device should check in again, from the pace of a round announcement (:mod:`har_models.wire.pace`).

    Attributes
    ----------
    run_id : str
    round, stage : int
        The announcement the pace came with.
    selected : bool
        Whether this device was selected in that round: if so, the time applies once its update is delivered.
    pace : Pace
        The window the coordinator gave every device.
    at_unix : float
        This device's own time in that window (s since the epoch), drawn once per announcement: the jitter that
        spreads a population's check-ins.
    """

    run_id: str
    round: int
    stage: int
    selected: bool
    pace: Pace
    at_unix: float


class EdgeAgent:
    """Runs one edge client against the broker until stopped (or its run finished).

    Parameters
    ----------
    cfg : ClientConfig
    store : ClientStore
        Holds the windows (already ingested), the local model and bookkeeping.
    train_lock : threading.Lock, optional
        Shared by clients hosted in one worker process (:mod:`simulation.worker`).
    shared_transfers : SharedTransfers, optional
        Shared by clients hosted in one worker process: the model they all receive is held once.
    blob_cache : BlobCache, optional
        Where models fetched from a blob store are kept by hash (blob transport); shared by the
        clients of one worker process. Default: ``blob-cache/`` in the store's folder.
    """

    def __init__(
        self,
        cfg: ClientConfig,
        store: ClientStore,
        train_lock: threading.Lock | None = None,
        shared_transfers: SharedTransfers | None = None,
        blob_cache: BlobCache | None = None,
    ):
        self.cfg = cfg
        self.store = store
        # Clients hosted together in one worker process train one at a time: memory stays that of
        # one training, and each training sees the same global RNG and thread settings as alone.
        self._train_lock = train_lock if train_lock is not None else contextlib.nullcontext()
        # Programs delivered by the coordinator, for a client that cannot export them (edge_client/pte_fetch.py).
        self.programs = make_fetcher(cfg.client_id, Topics(cfg.federation), cfg.backend, cfg.programs, cfg.program_cache, store.folder,
                                     cfg.max_model_bytes)  # fmt: skip
        program_cache = str(self.programs.folder) if self.programs is not None else cfg.program_cache
        self.trainer = ClientTrainer(store, cfg.client_id, cfg.backend, BackendOptions(program_cache=program_cache))
        self.topics = Topics(cfg.federation)
        self.reassembler = Reassembler(max_payload_bytes=cfg.max_model_bytes, shared=shared_transfers)
        self.announcement: RoundAnnouncement | None = None
        self.coordinator: CoordinatorStatus | None = None
        self._coordinator_until: float | None = None  # monotonic time its status goes stale; None = never
        self._coordinator_gone_logged = False
        self.models: OrderedDict[str, bytes] = OrderedDict()  # transfer id -> envelope (newest last)
        # Blob transport (docs/scale.md): models fetched by hash, the grant of the open exchange.
        self.blob_cache = blob_cache if blob_cache is not None else BlobCache(Path(store.folder) / "blob-cache")
        self.grant: BlobGrant | None = None
        self._fetch_retry_at = 0.0  # monotonic time a failed model fetch may be tried again
        # (run, round, stage, transfer) that failed validation: keyed by the exchange, since a
        # later run may send byte-identical models.
        self.rejected: set[tuple[str, int, int, str]] = set()
        self.rounds_done = 0
        self.exit_code = 0
        self.instance = uuid.uuid4().hex[:12]  # this process; see docs/reliability.md (identity)
        self.sensing: Callable[[], str] = lambda: ""  # "live"/"paused" from a live source's SensingFreshness; "" untracked
        self.charging: Callable[[], bool | None] = lambda: None  # on the charger (edge_client.power); None: not reported
        self.sensing_health: Callable[[], SensingHealth | None] = lambda: None  # a SensingHealthMeter's snapshot; None: no pipeline here
        self.fault: Callable[[], str] = lambda: ""  # the holder's device fault in words (a refused sensor); the store's is added
        # CPU of rounds (and, from a holder that senses, of sensing and the battery), in the status; the app shares its own.
        self.cost = CostMeter(rounds=_kept_round_costs(store))
        self.battery: Callable[[], float | None] = lambda: None  # battery level, %, sampled into ``cost`` at each status
        # A storage fault (or its end) is in the status at once: the coordinator stops selecting this device.
        # New windows too (a relabelled stretch, a recording stopped): a coordinator that selects by
        # windows sees them, and an update trained on them is not more than the status reported.
        self._republish: Callable[[object], None] = lambda _changed: self._publish_status()  # from the writer's thread
        self.epoch = 0  # the highest coordinator epoch seen (0: none, an unserved coordinator)
        self.check_in: CheckIn | None = None  # pace steering: when to come back (_note_pace); None: no pace announced
        self._pace_rng = random.Random()  # this device's own draws in the announced windows
        self._predecessor: str | None = None  # the instance whose status was retained when we first connected
        self._own_status_seen = False
        self._stopped = threading.Event()
        self._state = "online"
        store.window_counts()  # read from the table here, as the agent starts; kept by the store from then on
        # Exchanges (run, round, stage) answered already, and the coordinator attempt each answer
        # reached: a new attempt (the coordinator restarted, or ran the round again after it closed
        # without quorum) gets the stored update again, not a retraining, unless the model announced
        # for this client changed since it trained (_trained_on: the transfer it trained on).
        self._done: set[tuple[str, int, int]] = set()
        self._sent_attempt: dict[tuple[str, int, int], str] = {}
        self._trained_on: dict[tuple[str, int, int], str] = {}
        last = self._own_last_update()
        if last is not None:
            self._done.add((last[0]["run_id"], last[0]["round"], last[0]["stage"]))
        self._link = MqttLink(
            cfg.broker,
            f"fedhar-client-{cfg.client_id}",
            subscriptions=[
                (self.topics.client_status(cfg.client_id), 1),  # first: the retained one names our predecessor
                (self.topics.coordinator_status, 1),
                (self.topics.round, 1),
                (self.topics.global_model("+"), 1),
                (self.topics.client_model(cfg.client_id, "+"), 1),
                (self.topics.client_receipt(cfg.client_id), 1),
                (self.topics.client_grant(cfg.client_id), 1),
            ]
            + (self.programs.subscriptions() if self.programs is not None else []),
            will=(self.topics.client_status(cfg.client_id), offline_status(cfg.client_id, self.instance)),
            on_connect=lambda link: link.publish_nowait(
                self.topics.client_status(cfg.client_id), self._status_bytes(), retain=True
            ),
            intern=shared_transfers.message if shared_transfers is not None else None,
        )
        self.delivery = Delivery(
            TransportLink(self._link, self.topics.client_update(cfg.client_id, BLOB_NOTICE_INDEX), self._transport_of, self._grant_of),
            lambda i: self.topics.client_update(cfg.client_id, i),
            self._stored_update,
            cfg.client_id,
            receipt_wait_s=cfg.receipt_wait_s,
            max_message_bytes=cfg.broker.max_message_bytes,
        )
        store.fault_listeners.append(self._republish)  # last: a listener may run at once, from another thread
        store.window_listeners.append(self._republish)

    @property
    def refusal(self) -> BrokerRefused | None:
        """Why the broker refused this client for good (credentials, certificates, identity), or None."""
        fatal = getattr(self._link, "fatal", None)
        return fatal if isinstance(fatal, BrokerRefused) else None

    @property
    def connection(self) -> LinkStatus:
        """The broker connection now (any thread): connected or not, and why the last attempt failed.

        ``connection.error`` holds the cause in plain words ("login refused: bad user name or
        password", "TLS: certificate verify failed (wrong CA?)", "broker unreachable: connection
        refused at HOST:PORT", "DNS: unknown host 'HOST'", ...), None once connected;
        ``connection.fatal`` is True when a restart cannot help (the agent then ends with
        :data:`EXIT_BROKER_REFUSED`); ``connection.retry_in_s`` is the wait before the next attempt.
        """
        return self._link.status()

    def _status_bytes(self) -> bytes:
        self.cost.note_battery(self.battery(), self.charging())
        cost = self.cost.snapshot()
        try:
            last = self.store.get_meta("last_update") or {}
        except sqlite3.Error:  # a broken store: the status still goes out, saying so in its fault
            last = {}
        windows = self.store.window_counts()  # the store's now: windows added while running count at once
        return ClientStatus(
            client_id=self.cfg.client_id,
            state=self._state,
            label_set=self.store.labels.name,
            n_train=windows.n_train,
            n_test=windows.n_test,
            train_stats=windows.train_stats,
            class_counts=windows.class_counts,
            run_id=str(last.get("run_id", "")),
            last_round=int(last.get("round", -1)),
            instance=self.instance,
            sent_unix=time.time(),
            refresh_s=self.cfg.status_refresh_s,
            program_fault=self.trainer.program_fault,
            sensing=self.sensing(),
            charging=self.charging(),
            backend=self.trainer.backend_in_use,
            arch_version=self.trainer.arch_version,
            sensing_health=self.sensing_health(),
            fault="; ".join(f for f in (self.store.fault, self.fault()) if f)[:MAX_FAULT_CHARS],
            cost=cost if cost.to_json() else None,  # nothing measured yet: the message a client sent before it measured
        ).to_bytes()

    def _set_state(self, state: str) -> None:
        self._state = state
        self._publish_status()

    def _publish_status(self) -> None:
        """Publish the retained status as things are now (any thread; nothing while disconnected: the connect sends it)."""
        if self._link.connected.is_set():
            self._link.publish_nowait(self.topics.client_status(self.cfg.client_id), self._status_bytes(), retain=True)

    def run(self, stop: threading.Event | None = None, max_seconds: float | None = None) -> int:
        """Serve until ``stop`` is set, ``max_seconds`` pass, or the awaited run finishes.

        Returns
        -------
        int
            0 on a normal end; :data:`EXIT_BROKER_REFUSED` if the broker refused the login or
            TLS failed; :data:`EXIT_DUPLICATE_ID` if another process uses this client id.
        """
        stop = stop or threading.Event()
        end = None if max_seconds is None else time.monotonic() + max_seconds
        log.info(
            "[%s] starting: %d training / %d test windows; broker %s:%d",
            self.cfg.client_id,
            self.store.window_counts().n_train,
            self.store.window_counts().n_test,
            self.cfg.broker.host,
            self.cfg.broker.port,
        )
        self._link.start(wait_s=None)
        # Presence is refreshed from its own thread: a training round of several minutes blocks this one.
        refresher = threading.Thread(target=self._refresh_status, args=(stop,), name="status-refresh", daemon=True)
        refresher.start()
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
                    log.info(
                        "[%s] run %s finished after %d rounds here; exiting",
                        self.cfg.client_id,
                        self.cfg.exit_after_run,
                        self.rounds_done,
                    )
                    break
                self._maybe_work()
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
            log.info("[%s] stopped after %d round(s)", self.cfg.client_id, self.rounds_done)
        return self.exit_code

    def _refresh_status(self, stop: threading.Event) -> None:
        """Republish the retained status every ``status_refresh_s`` seconds until the agent stops (own thread)."""
        while not stop.wait(self.cfg.status_refresh_s) and not self._stopped.is_set():
            if self._link.connected.is_set():
                self._link.publish_nowait(self.topics.client_status(self.cfg.client_id), self._status_bytes(), retain=True)

    def _on_own_status(self, payload: bytes) -> None:
        """Watch our own retained status: another instance's there means a second process uses our id."""
        try:
            st = ClientStatus.from_bytes(payload)
        except MessageError:
            return
        if st.instance == self.instance:
            self._own_status_seen = True
            return
        if not self._own_status_seen and self._link.connects <= 1 and self._predecessor is None:
            self._predecessor = st.instance  # left by the process before us (it may still send its will)
            return
        if not st.instance or (st.instance == self._predecessor and (st.state == "offline" or not self._own_status_seen)):
            return  # the process before us (its status, or its will arriving late); a dead one never comes back online
        if st.state == "offline" and self._link.connects <= 1:
            return  # a will we never saw the owner of, from before our first connection settled
        log.error(
            "[%s] another process is connected as client id %r (instance %s; this one is %s): the broker keeps "
            "disconnecting one for the other. Two devices must not share an id: give each its own --client-id "
            "(and its own credentials). Stopping (exit code %d)",
            self.cfg.client_id,
            self.cfg.client_id,
            st.instance,
            self.instance,
            EXIT_DUPLICATE_ID,
        )
        self.exit_code = EXIT_DUPLICATE_ID

    def _finished(self) -> bool:
        a = self.announcement
        return (
            a is not None
            and a.state == "finished"
            and self.cfg.exit_after_run is not None
            and a.run_id == self.cfg.exit_after_run
        )

    def _handle(self, topic: str, payload: bytes, retained: bool = False) -> None:
        cid = self.cfg.client_id
        if topic == self.topics.round and not payload:
            self.announcement = None  # the run that owned it cleared it
            return
        if not payload:  # a cleared retained message
            return
        if topic == self.topics.round:
            try:
                ann = RoundAnnouncement.from_bytes(payload)
            except MessageError as exc:
                log.warning("[%s] ignoring malformed round announcement: %s", cid, exc)
                return
            self._note_epoch(ann.epoch)
            if 0 < ann.epoch < self.epoch:  # epoch 0: a coordinator that does not count epochs (run)
                log.info("[%s] ignoring round %d of coordinator epoch %d: epoch %d runs now", cid, ann.round, ann.epoch, self.epoch)
                return
            self.announcement = ann
            self._note_pace(ann)
            return
        if topic == self.topics.client_status(cid):
            self._on_own_status(payload)
            return
        if topic == self.topics.coordinator_status:
            try:
                co = CoordinatorStatus.from_bytes(payload)
            except MessageError as exc:
                log.warning("[%s] ignoring malformed coordinator status: %s", cid, exc)
                return
            self._note_epoch(co.epoch)
            if 0 < co.epoch < self.epoch:
                return  # a status of a coordinator epoch that is gone (e.g. its will, delivered late)
            self.coordinator = co
            self._coordinator_until = fresh_until(co.sent_unix, co.refresh_s, retained, time.monotonic(), time.time())
            if self._coordinator_gone_logged and self._coordinator_fresh():
                log.info("[%s] the coordinator of run %s is online again", cid, co.run_id)
                self._coordinator_gone_logged = False
            return
        if topic == self.topics.client_receipt(cid):
            self._on_receipt(payload)
            return
        if topic == self.topics.client_grant(cid):
            try:
                self.grant = BlobGrant.from_bytes(payload)
            except MessageError as exc:
                log.warning("[%s] ignoring malformed upload grant: %s", cid, exc)
            return
        if self.programs is not None and self.programs.owns(topic):
            self.programs.on_message(payload)
            return
        stream = "global" if topic.startswith(self.topics.global_model("")) else "personal"
        t = peek_transfer(payload)
        if t is not None and t not in self.models and self.reassembler.completed(stream, t):
            # Received and used before: sent again, it is a new publication (a new run may send a
            # byte-identical model), so collect it again rather than ignore it.
            self.reassembler.forget(stream, t)
        try:
            done = self.reassembler.add(stream, payload)
        except ChunkError as exc:
            # A JSON message where a chunk belongs is another message type delivered on a model
            # topic (amqtt's retained delivery at subscribe time does this): not worth a warning.
            level = logging.DEBUG if payload[:1] == b"{" else logging.WARNING
            log.log(level, "[%s] dropped a %s model chunk (%s): %s", self.cfg.client_id, stream, exc.reason, exc)
            return
        if done is not None:
            transfer, envelope = done
            log.debug("[%s] %s model %s received whole (%d bytes)", self.cfg.client_id, stream, transfer[:12], len(envelope))
            self.models[transfer] = envelope
            while len(self.models) > 2:
                self.models.popitem(last=False)

    def _note_epoch(self, epoch: int) -> None:
        """React to a coordinator epoch seen in a status or an announcement (see the module docstring).

        A higher epoch than any seen before means the served coordinator restarted: the open
        announcement of the older epoch and an upload still waiting for its receipt are dropped
        (an update stored for the same run, round and stage is sent again when the new epoch
        announces that round, as after any coordinator restart), and the status is published
        now instead of at the next refresh. The first epoch seen only sets it.
        """
        if epoch <= self.epoch:
            return
        old, self.epoch = self.epoch, epoch
        if old == 0:
            return
        cid = self.cfg.client_id
        ann = self.announcement
        if ann is not None and ann.epoch < epoch:
            self.announcement = None
        if self.delivery.pending is not None:
            self.delivery.pending = None
        log.info("[%s] the coordinator restarted (epoch %d -> %d): dropped the work of epoch %d and announced myself again",
                 cid, old, epoch, old)  # fmt: skip
        self._set_state(self._state)

    def _note_pace(self, ann: RoundAnnouncement) -> None:
        """Keep the check-in time of ``ann``'s pace in :attr:`check_in` (drawn once per announcement; cleared without one).

        A phone would schedule its next wake-up at ``check_in.at_unix`` once it has nothing to do in
        the round (not selected, or its update delivered) and disconnect until then (Android's
        WorkManager; not part of this agent). This agent stays connected: it records the time, which
        its holder can show, and goes on following announcements.
        """
        if ann.pace is None:
            self.check_in = None
            return
        old = self.check_in
        if old is not None and (old.run_id, old.round, old.stage, old.pace) == (ann.run_id, ann.round, ann.stage, ann.pace):
            return  # the same announcement again (a reconnection): the same time
        selected = self._is_selected(ann)
        self.check_in = CheckIn(ann.run_id, ann.round, ann.stage, selected, ann.pace, ann.pace.draw(self._pace_rng))
        log.debug("[%s] round %d: %s; check in again at %s (window %.0f s, next round at %s)", self.cfg.client_id, ann.round,
                  "selected" if selected else "not selected", time.strftime("%H:%M:%S", time.localtime(self.check_in.at_unix)),
                  ann.pace.window_s, time.strftime("%H:%M:%S", time.localtime(ann.pace.next_round_unix)))  # fmt: skip

    def _coordinator_fresh(self) -> bool:
        """False once the coordinator's status is older than its promised refresh periods allow."""
        until = self._coordinator_until
        return until is None or time.monotonic() < until

    @property
    def coordinator_presence(self) -> str:
        """The coordinator as this client sees it now, for a log or a screen (any thread).

        ``"unknown"`` (no status yet), ``"offline"`` (its will or its last word), ``"gone"`` (it
        said online but stopped refreshing: more than three of its ``refresh_s`` periods without a
        status, so it crashed and its will was lost) or ``"online"``.
        """
        co = self.coordinator
        if co is None:
            return "unknown"
        if co.state != "online":
            return "offline"
        return "online" if self._coordinator_fresh() else "gone"

    def _coordinator_runs(self, ann: RoundAnnouncement) -> bool:
        """True if the coordinator that announced ``ann`` is online for its run (not a dead run's leftovers)."""
        co = self.coordinator
        if co is None or co.state != "online" or co.run_id != ann.run_id or (co.attempt and co.attempt != ann.attempt):
            return False
        if self._coordinator_fresh():
            return True
        if not self._link.inbox.empty():
            # A training step blocks this loop while the coordinator's refreshes queue up behind it:
            # judge its presence once the messages that arrived meanwhile are read, not before.
            return False
        if not self._coordinator_gone_logged:
            self._coordinator_gone_logged = True
            age = time.time() - co.sent_unix
            log.warning(
                "[%s] the coordinator of run %s is gone: its status is %.0f s old and it promised one every %.0f s "
                "(it stopped without its last will reaching the broker); not training on round %d until it is back",
                self.cfg.client_id, co.run_id, age, co.refresh_s, ann.round,
            )  # fmt: skip
        return False

    def _maybe_work(self) -> None:
        self.delivery.poll(self._open_key())
        ann = self.announcement
        cid = self.cfg.client_id
        if ann is None or ann.state != "training" or not self._is_selected(ann) or not self._coordinator_runs(ann):
            return
        key = (ann.run_id, ann.round, ann.stage)
        _, transfer = ann.model_for(cid)
        trained_on = self._trained_on.get(key)
        if key in self._done and trained_on is not None and transfer and transfer != trained_on:
            log.info("[%s] round %d: attempt %s announces another model than the one I trained on; training again",
                     cid, ann.round, ann.attempt)  # fmt: skip
            self._done.discard(key)
            del self._trained_on[key]
        if key in self._done:
            if self._sent_attempt.get(key) != ann.attempt and self._link.connected.is_set():
                last = self._own_last_update()
                if last is not None and (last[0]["run_id"], last[0]["round"], last[0]["stage"]) == key:
                    log.info("[%s] round %d: sending the stored update for coordinator attempt %s", cid, ann.round, ann.attempt)
                    self.delivery.start(key, last[1], ann.deadline_unix)
                self._sent_attempt[key] = ann.attempt
            return
        if transfer and ann.transport == "blobs" and transfer not in self.models and (*key, transfer) not in self.rejected:
            self._fetch_blob(ann, key, transfer)
        if not transfer or (*key, transfer) in self.rejected or transfer not in self.models:
            return
        if self.programs is not None and not self.programs.ready(ann, self._link.publish_nowait):
            return  # asked the coordinator for this architecture's programs; trains once they are stored
        # Decoding and training hold the worker's training lock: clients hosted together then hold
        # one decoded model at a time, not one each while they wait.
        with self._train_lock:
            outcome = self._decode_and_train(ann, transfer, key)
        if outcome is None:
            return
        self.store.save_last_update(ann.run_id, ann.round, ann.stage, outcome.envelope)
        self._note_sent(ann, len(outcome.envelope))
        self._done.add(key)
        self._trained_on[key] = transfer
        self.delivery.start(key, outcome.envelope, ann.deadline_unix)
        self._sent_attempt[key] = ann.attempt
        self.rounds_done += 1
        log.info("[%s] round %d%s: %s", cid, ann.round, f".{ann.stage}" if ann.stage else "", outcome.summary)
        del outcome
        release_free_memory()
        self._set_state("idle")

    def _fetch_blob(self, ann: RoundAnnouncement, key: tuple[str, int, int], transfer: str) -> None:
        """Fetch the model ``transfer`` of a blob-transport round into :attr:`models` (checked byte for byte).

        The global model's reference is in the announcement, a personalised one in this
        client's grant (which may not have arrived yet). A failed fetch is logged and tried
        again 5 s later while the round is open.
        """
        if time.monotonic() < self._fetch_retry_at:
            return
        cid = self.cfg.client_id
        ref: BlobRef | None = None
        try:
            if transfer == ann.global_model and ann.global_blob is not None:
                ref = BlobRef.from_json(ann.global_blob)
            elif self.grant is not None and self.grant.key() == key and self.grant.model is not None:
                ref = self.grant.model
        except ValueError as exc:  # the announcement was checked on arrival; kept for safety
            log.warning("[%s] round %d: bad model reference: %s", cid, ann.round, exc)
        if ref is None or ref.sha256 != transfer:
            return  # the grant naming this client's own model is still on its way
        try:
            envelope = fetch_model(ref, self.cfg.max_model_bytes, self.blob_cache)
        except BlobError as exc:
            log.warning("[%s] round %d: cannot fetch model %s: %s; trying again in 5 s", cid, ann.round, transfer[:12], exc)
            self._fetch_retry_at = time.monotonic() + 5.0
            return
        self.models[transfer] = envelope
        while len(self.models) > 2:
            self.models.popitem(last=False)

    def _is_selected(self, ann: RoundAnnouncement) -> bool:
        """Whether ``ann`` selects this client: it names it, or (blob transport, whose announcement names nobody)
        this client holds its grant for that exchange and attempt."""
        if self.cfg.client_id in ann.selected:
            return True
        g = self._grant_of((ann.run_id, ann.round, ann.stage))
        return ann.transport == "blobs" and g is not None and g.attempt == ann.attempt

    def _transport_of(self, key: tuple[str, int, int]) -> str:
        """How exchange ``key`` was announced ("blobs" or "mqtt").

        An exchange no longer announced (a buffered round closed while this client trained it) is
        "blobs" while this client holds its upload grant (only the blob transport grants), else "mqtt".
        """
        a = self.announcement
        if a is not None and (a.run_id, a.round, a.stage) == key:
            return a.transport
        return "blobs" if self._grant_of(key) is not None else "mqtt"

    def _grant_of(self, key: tuple[str, int, int]) -> BlobGrant | None:
        """This client's upload grant for exchange ``key``, if it arrived."""
        g = self.grant
        return g if g is not None and g.key() == key else None

    def _decode_and_train(self, ann: RoundAnnouncement, transfer: str, key: tuple[str, int, int]) -> RoundOutcome | None:
        """Check the received model against the announcement and run the round; None if the client cannot."""
        cid = self.cfg.client_id
        try:
            # The reassembler delivered these bytes only after checking them against ``transfer``.
            env = codec.decode(self.models[transfer], max_bytes=self.cfg.max_model_bytes, verified=transfer)
            if env.kind != "model" or env.round != ann.round or env.arch_version != ann.arch.get("version"):
                raise codec.BadHeader(
                    f"model is {env.kind} for round {env.round} v{env.arch_version}, "
                    f"announcement says round {ann.round} v{ann.arch.get('version')}"
                )
            if env.client_id not in ("", cid):
                raise codec.BadHeader(f"model is addressed to {env.client_id!r}")
        except codec.EnvelopeError as exc:
            log.error("[%s] round %d: rejected model %s (%s): %s", cid, ann.round, transfer[:12], exc.reason, exc)
            self.rejected.add((*key, transfer))
            return None
        self.models.pop(transfer, None)  # decoded: the 26 MB of envelope bytes are not needed any more
        self._set_state("training")
        try:
            with self.cost.round(ann.round, lambda: self.trainer.backend_in_use):
                outcome = self.trainer.run_round(ann, env.tensors)
            self._keep_round_costs()
            return outcome
        except Exception as exc:
            # Whatever a plan or model from the network contains, the client survives: it says
            # why it cannot follow this one and waits for the next round.
            log.error("[%s] round %d: cannot follow this round's plan: %s: %s", cid, ann.round, type(exc).__name__, exc)
            self.rejected.add((*key, transfer))
            self._done.add(key)
            self._set_state("idle")
            return None

    def _keep_round_costs(self) -> None:
        """Store the kept round costs (:data:`~edge_client.cost.ROUND_COST_KEY`), so the screen and a restart see them."""
        try:
            self.store.set_meta(ROUND_COST_KEY, self.cost.rounds_json())
        except (OSError, ValueError, sqlite3.Error) as exc:  # a full disk does not stop the round
            log.error("[%s] cannot keep the round's cost: %s", self.cfg.client_id, exc)

    # -- end-to-end delivery (edge_client.delivery) ---------------------------------------------------
    def _stored_update(self) -> tuple[tuple[str, int, int], bytes] | None:
        """The update in the store as (run id, round, stage) and its bytes, or None."""
        last = self._own_last_update()
        return None if last is None else ((last[0]["run_id"], last[0]["round"], last[0]["stage"]), last[1])

    def _own_last_update(self) -> tuple[dict[str, Any], bytes] | None:
        """The store's last update, if it was made by this client id; None if there is none or another id made it.

        A state folder kept across a change of client id (a device renamed or re-enrolled under a
        new name) holds an update whose envelope names the old id: the coordinator refuses it
        (``client_mismatch``), so sending it again to every new attempt would leave the round
        without this device. It is not sent; the device trains the round again.
        """
        last = self.store.load_last_update()
        if last is None:
            return None
        try:
            made_by = codec.peek_header(last[1]).get("client_id")
        except codec.EnvelopeError:
            made_by = None
        if made_by != self.cfg.client_id:
            log.warning("[%s] the stored update of round %s was made by %r, not this client id: not sent again; "
                        "the round is trained again", self.cfg.client_id, last[0].get("round"), made_by)  # fmt: skip
            return None
        return last

    def _open_key(self) -> tuple[str, int, int] | None:
        """The exchange whose round is open for training now, or None."""
        a = self.announcement
        return (a.run_id, a.round, a.stage) if a is not None and a.state == "training" else None

    def _note_sent(self, ann: RoundAnnouncement, n_bytes: int) -> None:
        """Add the update to the ledger of what left the device (:mod:`edge_client.sent_log`); a full disk does not stop the round."""
        try:
            ledger = note_sent(self.store.get_meta(SENT_KEY, []), ann.run_id, ann.round, ann.stage, n_bytes,
                               int(ann.arch.get("version", 0)), time.time())  # fmt: skip
            self.store.set_meta(SENT_KEY, ledger)
        except (OSError, ValueError) as exc:
            log.error("[%s] round %d: cannot note the update in the ledger: %s", self.cfg.client_id, ann.round, exc)

    def _on_receipt(self, payload: bytes) -> None:
        try:
            r = Receipt.from_bytes(payload)
        except MessageError as exc:
            log.warning("[%s] ignoring malformed receipt: %s", self.cfg.client_id, exc)
            return
        if r.state == "accepted":
            try:
                self.store.set_meta(SENT_KEY, note_receipt(self.store.get_meta(SENT_KEY, []), r.run_id, r.round, r.stage))
            except (OSError, ValueError) as exc:
                log.error("[%s] round %d: cannot note the receipt in the ledger: %s", self.cfg.client_id, r.round, exc)
        self.delivery.on_receipt(r)


def _kept_round_costs(store: ClientStore) -> list[dict[str, object]]:
    """The round costs kept in ``store`` (:data:`~edge_client.cost.ROUND_COST_KEY`); [] if none or unreadable."""
    try:
        kept = store.get_meta(ROUND_COST_KEY, [])
    except (sqlite3.Error, ValueError):
        return []
    return kept if isinstance(kept, list) else []
