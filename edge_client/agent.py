"""The edge client's MQTT agent: follows round announcements, trains, uploads.

Threads: paho's network thread only queues messages (:class:`~har_io.mqtt_link.MqttLink`);
this agent's own thread parses them, reassembles models and runs training, so a long
training never stalls keep-alives or acknowledgements.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from edge_client.store import ClientStore
from edge_client.trainer_common import RoundOutcome, Trainer
from har_io.memory import release_free_memory
from har_io.mqtt_link import BrokerConfig, MqttLink
from har_models import codec
from har_models.chunking import ChunkError, Reassembler
from har_models.messages import ClientStatus, MessageError, RoundAnnouncement, offline_status
from har_models.topics import Topics, check_client_id
from har_models.windowing import ChannelStats

log = logging.getLogger("fedhar.client")

BACKENDS = ("torch", "numpy", "executorch")


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
    backend : {"torch", "numpy", "executorch"}
        How the client trains: PyTorch eager (:class:`~edge_client.trainer.LocalTrainer`, boards,
        desktop, the simulation), or through a training backend without PyTorch
        (:class:`~edge_client.backend_trainer.BackendTrainer`: the numpy reference, or ExecuTorch
        programs as on a phone).
    program_cache : str, optional
        Folder of the exported ExecuTorch programs (``executorch`` backend).
    exit_after_run : str, optional
        Exit once the coordinator announces that this run id finished (used by simulations);
        otherwise run until stopped.
    """

    client_id: str
    broker: BrokerConfig
    federation: str = "default"
    max_model_bytes: int = 512 * 1024 * 1024
    exit_after_run: str | None = None
    backend: str = "torch"
    program_cache: str | None = None

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
        Shared by clients hosted in one worker process (:mod:`edge_client.worker`).
    """

    def __init__(self, cfg: ClientConfig, store: ClientStore, train_lock: threading.Lock | None = None):
        self.cfg = cfg
        self.store = store
        # Clients hosted together in one worker process train one at a time: memory stays that of
        # one training, and each training sees the same global RNG and thread settings as alone.
        self._train_lock = train_lock if train_lock is not None else contextlib.nullcontext()
        self.trainer: Trainer
        if cfg.backend == "torch":
            from edge_client.trainer import LocalTrainer  # the only path that imports PyTorch

            self.trainer = LocalTrainer(store, cfg.client_id)
        else:
            from edge_client.backend_trainer import BackendTrainer

            opts = {"cache_dir": cfg.program_cache} if cfg.backend == "executorch" and cfg.program_cache else {}
            self.trainer = BackendTrainer(store, cfg.client_id, cfg.backend, **opts)
        self.topics = Topics(cfg.federation)
        self.reassembler = Reassembler(max_payload_bytes=cfg.max_model_bytes)
        self.announcement: RoundAnnouncement | None = None
        self.models: OrderedDict[str, bytes] = OrderedDict()  # transfer id -> envelope (newest last)
        self.rejected: set[str] = set()  # transfers that failed validation
        self.rounds_done = 0
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
                (self.topics.round, 1),
                (self.topics.global_model("+"), 1),
                (self.topics.client_model(cfg.client_id, "+"), 1),
            ],
            will=(self.topics.client_status(cfg.client_id), offline_status(cfg.client_id)),
            on_connect=lambda link: link.publish_nowait(
                self.topics.client_status(cfg.client_id), self._status_bytes(), retain=True
            ),
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
            0 on a normal end.
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
        try:
            while not stop.is_set() and (end is None or time.monotonic() < end):
                try:
                    topic, payload, _ = self._link.inbox.get(timeout=0.5)
                except queue.Empty:
                    self._maybe_work()  # retries a pending upload even when nothing arrives
                    continue
                self._handle(topic, payload)
                if self._finished():
                    log.info(
                        "[%s] run %s finished after %d rounds here; exiting",
                        self.cfg.client_id,
                        self.cfg.exit_after_run,
                        self.rounds_done,
                    )
                    break
                self._maybe_work()
        finally:
            self._state = "offline"
            self._link.stop(final=(self.topics.client_status(self.cfg.client_id), offline_status(self.cfg.client_id)))
            log.info("[%s] stopped after %d round(s)", self.cfg.client_id, self.rounds_done)
        return 0

    def _finished(self) -> bool:
        a = self.announcement
        return (
            a is not None
            and a.state == "finished"
            and self.cfg.exit_after_run is not None
            and a.run_id == self.cfg.exit_after_run
        )

    def _handle(self, topic: str, payload: bytes) -> None:
        if not payload:  # a cleared retained message
            return
        if topic == self.topics.round:
            try:
                self.announcement = RoundAnnouncement.from_bytes(payload)
            except MessageError as exc:
                log.warning("[%s] ignoring malformed round announcement: %s", self.cfg.client_id, exc)
            return
        stream = "global" if topic.startswith(self.topics.global_model("")) else "personal"
        try:
            done = self.reassembler.add(stream, payload)
        except ChunkError as exc:
            log.warning("[%s] dropped a %s model chunk (%s): %s", self.cfg.client_id, stream, exc.reason, exc)
            return
        if done is not None:
            transfer, envelope = done
            self.models[transfer] = envelope
            while len(self.models) > 2:
                self.models.popitem(last=False)

    def _maybe_work(self) -> None:
        ann = self.announcement
        cid = self.cfg.client_id
        if ann is None or ann.state != "training" or cid not in ann.selected:
            return
        key = (ann.run_id, ann.round, ann.stage)
        if key in self._done:
            if self._sent_attempt.get(key) != ann.attempt and self._link.connected.is_set():
                last = self.store.load_last_update()
                if last is not None and (last[0]["run_id"], last[0]["round"], last[0]["stage"]) == key:
                    log.info("[%s] round %d: sending the stored update for coordinator attempt %s", cid, ann.round, ann.attempt)
                    if self._upload(key, last[1]):
                        self._sent_attempt[key] = ann.attempt
                else:
                    self._sent_attempt[key] = ann.attempt
            return
        _, transfer = ann.model_for(cid)
        if not transfer or transfer in self.rejected or transfer not in self.models:
            return
        # Decoding and training hold the worker's training lock: clients hosted together then hold
        # one decoded model at a time, not one each while they wait.
        with self._train_lock:
            outcome = self._decode_and_train(ann, transfer, key)
        if outcome is None:
            return
        self.store.save_last_update(ann.run_id, ann.round, ann.stage, outcome.envelope)
        self._done.add(key)
        if self._upload(key, outcome.envelope):
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
            self.rejected.add(transfer)
            return None
        self.models.pop(transfer, None)  # decoded: the 26 MB of envelope bytes are not needed any more
        self._set_state("training")
        try:
            return self.trainer.run_round(ann, env.tensors)
        except Exception as exc:
            # Whatever a plan or model from the network contains, the client survives: it says
            # why it cannot follow this one and waits for the next round.
            log.error("[%s] round %d: cannot follow this round's plan: %s: %s", cid, ann.round, type(exc).__name__, exc)
            self.rejected.add(transfer)
            self._done.add(key)
            self._set_state("idle")
            return None

    def _upload(self, key: tuple[str, int, int], envelope: bytes) -> bool:
        """Send an update; False if it failed (it is tried again while its round is open)."""
        cid = self.cfg.client_id
        try:
            n = self._link.publish_chunks(lambda i: self.topics.client_update(cid, i), envelope)
        except (TimeoutError, RuntimeError) as exc:
            log.error("[%s] round %d: upload failed (%s); will retry while the round is open", cid, key[1], exc)
            return False
        log.debug("[%s] round %d: update sent, %d bytes in %d chunks", cid, key[1], len(envelope), n)
        return True
