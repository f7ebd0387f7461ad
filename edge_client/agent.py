"""The edge client's MQTT agent: follows round announcements, trains, uploads.

Threads: paho's network thread only queues messages (:class:`~har_io.mqtt_link.MqttLink`);
this agent's own thread parses them, reassembles models and runs training, so a long
training never stalls keep-alives or acknowledgements.

Delivery is end to end (docs/reliability.md): an update counts as delivered only when the
coordinator's receipt for it arrives; until then it is sent again with back-off, while its
round is open, and chunks the coordinator reports missing are sent again on their own.
A round is acted on only while the coordinator that announced it is online for that run.
Two processes with one client id are detected through the instance id in the client's own
retained status, and both stop (exit code :data:`EXIT_DUPLICATE_ID`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from edge_client.backends.base import BACKEND_NAMES, BackendOptions
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer, RoundOutcome
from har_io.memory import release_free_memory
from har_io.mqtt_link import BrokerConfig, BrokerRefused, MqttLink, PacketRejected
from har_models.data.windowing import ChannelStats
from har_models.wire import codec
from har_models.wire.chunking import ChunkError, Reassembler, SharedTransfers, peek_transfer, transfer_id
from har_models.wire.messages import ClientStatus, CoordinatorStatus, MessageError, Receipt, RoundAnnouncement, offline_status
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.client")

BACKENDS = BACKEND_NAMES

EXIT_BROKER_REFUSED = 4
"""Exit code: the broker refused the login, or TLS failed (a restart cannot help)."""
EXIT_DUPLICATE_ID = 5
"""Exit code: another process uses this client id (a restart cannot help)."""


@dataclass
class _Pending:
    """An update sent and not yet acknowledged by the coordinator's receipt.

    The envelope is in memory only while it is first sent; later sends read it back from
    the store (``last_update.bin``, written before the first send), so a worker whose
    clients wait for receipts does not hold one update per client.
    """

    key: tuple[str, int, int]  # run, round, stage
    envelope: bytes | None
    transfer: str
    deadline_unix: float
    chunk_bytes: int = 0  # size of the last full send (bytes per chunk message)
    count: int = 0  # chunks of the last full send
    sends: int = 0  # full sends so far
    unanswered: int = 0  # full sends that got neither receipt nor request
    next_try: float = 0.0  # monotonic time of the next full send
    resent: Counter[int] = field(default_factory=Counter)  # chunk index -> times re-sent on request


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
    backend : {"torch", "executorch", "numpy"}
        The training backend of :class:`~edge_client.trainer.ClientTrainer`: PyTorch eager (boards,
        desktop, the simulation), ExecuTorch programs (as on a phone), or the numpy reference (no
        PyTorch); :func:`edge_client.backends.factory.choose_backend` picks the best installed.
    program_cache : str, optional
        Folder of the exported ExecuTorch programs (``executorch`` backend).
    exit_after_run : str, optional
        Exit once the coordinator announces that this run id finished (used by simulations);
        otherwise run until stopped.
    status_refresh_s : float
        Republish the retained status this often (s), so the coordinator can tell a present
        device from one that vanished without a last will (e.g. revoked).
    receipt_wait_s : float
        Seconds to wait for the coordinator's receipt before sending an update again; doubles
        after each unanswered send, up to 60 s, and never beyond the round's deadline.
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

    def __post_init__(self) -> None:
        check_client_id(self.client_id)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")


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
    """

    def __init__(
        self,
        cfg: ClientConfig,
        store: ClientStore,
        train_lock: threading.Lock | None = None,
        shared_transfers: SharedTransfers | None = None,
    ):
        self.cfg = cfg
        self.store = store
        # Clients hosted together in one worker process train one at a time: memory stays that of
        # one training, and each training sees the same global RNG and thread settings as alone.
        self._train_lock = train_lock if train_lock is not None else contextlib.nullcontext()
        self.trainer = ClientTrainer(store, cfg.client_id, cfg.backend, BackendOptions(program_cache=cfg.program_cache))
        self.topics = Topics(cfg.federation)
        self.reassembler = Reassembler(max_payload_bytes=cfg.max_model_bytes, shared=shared_transfers)
        self.announcement: RoundAnnouncement | None = None
        self.coordinator: CoordinatorStatus | None = None
        self.models: OrderedDict[str, bytes] = OrderedDict()  # transfer id -> envelope (newest last)
        # (run, round, stage, transfer) that failed validation: keyed by the exchange, since a
        # later run may send byte-identical models.
        self.rejected: set[tuple[str, int, int, str]] = set()
        self.rounds_done = 0
        self.exit_code = 0
        self.instance = uuid.uuid4().hex[:12]  # this process; see docs/reliability.md (identity)
        self._predecessor: str | None = None  # the instance whose status was retained when we first connected
        self._own_status_seen = False
        self._pending: _Pending | None = None
        self._stopped = threading.Event()
        self._state = "online"
        train = store.windows("train")
        self._n_train, self._n_test = len(train), len(store.windows("test"))
        self._train_stats = ChannelStats.of(train.x).to_json() if len(train) else {}
        self._class_counts = tuple(int(c) for c in train.class_counts())
        # Exchanges (run, round, stage) answered already, and the coordinator attempt each answer
        # reached: a new attempt (coordinator restarted) gets the stored update again, not a retraining.
        self._done: set[tuple[str, int, int]] = set()
        self._sent_attempt: dict[tuple[str, int, int], str] = {}
        last = store.load_last_update()
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
            ],
            will=(self.topics.client_status(cfg.client_id), offline_status(cfg.client_id, self.instance)),
            on_connect=lambda link: link.publish_nowait(
                self.topics.client_status(cfg.client_id), self._status_bytes(), retain=True
            ),
            intern=shared_transfers.message if shared_transfers is not None else None,
        )

    def _status_bytes(self) -> bytes:
        last = self.store.get_meta("last_update") or {}
        return ClientStatus(
            client_id=self.cfg.client_id,
            state=self._state,
            label_set=self.store.labels.name,
            n_train=self._n_train,
            n_test=self._n_test,
            train_stats=self._train_stats,
            class_counts=self._class_counts,
            run_id=str(last.get("run_id", "")),
            last_round=int(last.get("round", -1)),
            instance=self.instance,
            sent_unix=time.time(),
            refresh_s=self.cfg.status_refresh_s,
        ).to_bytes()

    def _set_state(self, state: str) -> None:
        self._state = state
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
            self._n_train,
            self._n_test,
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
                    self._maybe_work()  # retries a pending upload even when nothing arrives
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
                self.announcement = RoundAnnouncement.from_bytes(payload)
            except MessageError as exc:
                log.warning("[%s] ignoring malformed round announcement: %s", cid, exc)
            return
        if topic == self.topics.client_status(cid):
            self._on_own_status(payload)
            return
        if topic == self.topics.coordinator_status:
            try:
                self.coordinator = CoordinatorStatus.from_bytes(payload)
            except MessageError as exc:
                log.warning("[%s] ignoring malformed coordinator status: %s", cid, exc)
            return
        if topic == self.topics.client_receipt(cid):
            self._on_receipt(payload)
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

    def _coordinator_runs(self, ann: RoundAnnouncement) -> bool:
        """True if the coordinator that announced ``ann`` is online for its run (not a dead run's leftovers)."""
        co = self.coordinator
        return co is not None and co.state == "online" and co.run_id == ann.run_id and (not co.attempt or co.attempt == ann.attempt)

    def _maybe_work(self) -> None:
        self._retry_pending()
        ann = self.announcement
        cid = self.cfg.client_id
        if ann is None or ann.state != "training" or cid not in ann.selected or not self._coordinator_runs(ann):
            return
        key = (ann.run_id, ann.round, ann.stage)
        if key in self._done:
            if self._sent_attempt.get(key) != ann.attempt and self._link.connected.is_set():
                last = self.store.load_last_update()
                if last is not None and (last[0]["run_id"], last[0]["round"], last[0]["stage"]) == key:
                    log.info("[%s] round %d: sending the stored update for coordinator attempt %s", cid, ann.round, ann.attempt)
                    self._start_upload(key, last[1], ann.deadline_unix)
                self._sent_attempt[key] = ann.attempt
            return
        _, transfer = ann.model_for(cid)
        if not transfer or (*key, transfer) in self.rejected or transfer not in self.models:
            return
        # Decoding and training hold the worker's training lock: clients hosted together then hold
        # one decoded model at a time, not one each while they wait.
        with self._train_lock:
            outcome = self._decode_and_train(ann, transfer, key)
        if outcome is None:
            return
        self.store.save_last_update(ann.run_id, ann.round, ann.stage, outcome.envelope)
        self._done.add(key)
        self._start_upload(key, outcome.envelope, ann.deadline_unix)
        self._sent_attempt[key] = ann.attempt
        self.rounds_done += 1
        log.info("[%s] round %d%s: %s", cid, ann.round, f".{ann.stage}" if ann.stage else "", outcome.summary)
        del outcome
        release_free_memory()
        self._set_state("idle")

    def _decode_and_train(self, ann: RoundAnnouncement, transfer: str, key: tuple[str, int, int]) -> RoundOutcome | None:
        """Check the received model against the announcement and run the round; None if the client cannot."""
        cid = self.cfg.client_id
        try:
            env = codec.decode(self.models[transfer], max_bytes=self.cfg.max_model_bytes)
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
            return self.trainer.run_round(ann, env.tensors)
        except Exception as exc:
            # Whatever a plan or model from the network contains, the client survives: it says
            # why it cannot follow this one and waits for the next round.
            log.error("[%s] round %d: cannot follow this round's plan: %s: %s", cid, ann.round, type(exc).__name__, exc)
            self.rejected.add((*key, transfer))
            self._done.add(key)
            self._set_state("idle")
            return None

    # -- end-to-end delivery -------------------------------------------------------------------------
    def _start_upload(self, key: tuple[str, int, int], envelope: bytes, deadline_unix: float) -> None:
        """Send an update (stored first: :meth:`ClientStore.save_last_update`) and follow it until the coordinator's receipt arrives."""
        self._pending = p = _Pending(key, envelope, transfer_id(envelope), deadline_unix)
        self._send_full()
        p.envelope = None  # sent; a re-send reads it back from the store

    def _envelope(self, p: _Pending) -> bytes | None:
        """The bytes of pending update ``p``: in memory while first sent, else the stored last update (checked against
        its transfer id); None, with the pending update dropped, if the store no longer has it."""
        if p.envelope is not None:
            return p.envelope
        stored = self.store.load_last_update()
        same = stored is not None and (stored[0]["run_id"], stored[0]["round"], stored[0]["stage"]) == p.key
        if stored is not None and same and transfer_id(stored[1]) == p.transfer:
            return stored[1]
        log.error("[%s] round %d: the stored update to send again is gone or changed; not sending it", self.cfg.client_id, p.key[1])
        self._pending = None
        return None

    def _topic_of(self, i: int) -> str:
        return self.topics.client_update(self.cfg.client_id, i)

    def _send_full(self) -> None:
        p = self._pending
        assert p is not None
        cid = self.cfg.client_id
        envelope = self._envelope(p)
        if envelope is None:
            return
        size = self._link.chunk_size(self._topic_of)
        if p.unanswered >= 2 and p.chunk_bytes and size >= p.chunk_bytes:
            # Twice sent whole without a word back: the broker may drop messages of this size
            # silently (Mosquitto's message_size_limit over MQTT 3.1.1); never send it unchanged again.
            self._link.note_refused(p.chunk_bytes)
            size = self._link.chunk_size(self._topic_of)
        p.sends += 1
        p.unanswered += 1
        p.resent.clear()
        wait = min(60.0, self.cfg.receipt_wait_s * 2 ** (p.sends - 1))
        p.next_try = time.monotonic() + wait
        try:
            p.count = self._link.publish_chunks(self._topic_of, envelope, chunk_bytes=size)
            p.chunk_bytes = size
        except PacketRejected as exc:
            log.warning("[%s] round %d: %s; sending again in smaller chunks", cid, p.key[1], exc)
            p.unanswered -= 1
            p.next_try = time.monotonic()
            return
        except TimeoutError as exc:
            log.warning("[%s] round %d: upload not finished (%s); trying again while the round is open", cid, p.key[1], exc)
            return
        log.debug("[%s] round %d: update sent (attempt %d), %d bytes in %d chunks", cid, p.key[1], p.sends, len(envelope), p.count)

    def _retry_pending(self) -> None:
        p = self._pending
        if p is None or time.monotonic() < p.next_try:
            return
        if not self._still_open(p.key):
            log.warning("[%s] round %d closed before the coordinator's receipt for this update arrived", self.cfg.client_id, p.key[1])
            self._pending = None
            return
        if time.time() > p.deadline_unix:
            log.error(
                "[%s] round %d: the coordinator never confirmed this update (%d full send(s), last in chunks of %d bytes). "
                "If no update of this client arrives at all, check the broker's size limit (Mosquitto: "
                "message_size_limit / max_packet_size) against --max-message-bytes %d, and that the coordinator runs",
                self.cfg.client_id,
                p.key[1],
                p.sends,
                p.chunk_bytes,
                self.cfg.broker.max_message_bytes,
            )
            self._pending = None
            return
        if not self._link.connected.is_set():
            return
        log.info("[%s] round %d: no receipt from the coordinator yet; sending the update again", self.cfg.client_id, p.key[1])
        self._send_full()

    def _still_open(self, key: tuple[str, int, int]) -> bool:
        a = self.announcement
        return a is not None and a.state == "training" and (a.run_id, a.round, a.stage) == key

    def _on_receipt(self, payload: bytes) -> None:
        cid = self.cfg.client_id
        try:
            r = Receipt.from_bytes(payload)
        except MessageError as exc:
            log.warning("[%s] ignoring malformed receipt: %s", cid, exc)
            return
        p = self._pending
        if p is None or r.transfer != p.transfer or (r.run_id, r.round, r.stage) != p.key:
            return
        if r.state == "accepted":
            log.info("[%s] round %d: the coordinator confirmed the update", cid, r.round)
            self._pending = None
            return
        # "missing": send exactly those chunks again, at the size they were cut to.
        p.unanswered = 0
        if r.count != p.count or not p.chunk_bytes:
            return  # a request about an earlier cut of this transfer; the current one is on its way
        again = [i for i in r.missing if i < p.count]
        if any(p.resent[i] >= 1 for i in again):
            # Lost twice at this size: the broker drops messages this large. Cut smaller, send all.
            log.warning("[%s] round %d: chunks of %d bytes were lost twice; sending the update in smaller chunks",
                        cid, r.round, p.chunk_bytes)  # fmt: skip
            self._link.note_refused(p.chunk_bytes)
            self._send_full()
            return
        envelope = self._envelope(p)
        if envelope is None:
            return
        for i in again:
            p.resent[i] += 1
        try:
            self._link.publish_chunks(self._topic_of, envelope, chunk_bytes=p.chunk_bytes, only=set(again))
        except PacketRejected:
            self._send_full()
        except TimeoutError as exc:
            log.warning("[%s] round %d: could not send the missing chunks (%s)", cid, r.round, exc)
        log.info("[%s] round %d: sent %d missing chunk(s) again", cid, r.round, len(again))
