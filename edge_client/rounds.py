"""One edge client's work in the rounds that select it: train a round, keep the update, answer the coordinator's attempt.

:class:`RoundWorker` acts on an open round the agent has checked: it answers with the stored update
where that answers the round (:mod:`edge_client.answers`), else decodes the received model, trains,
keeps the update with the model it started from and sends it (:mod:`edge_client.delivery`). It
measures what a coordinator sizes deadlines with (:attr:`RoundWorker.train_s`,
:attr:`RoundWorker.warming_up`); on stop it sends the open round's update and awaits its receipt.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from edge_client.answers import Answers
from edge_client.cost import ROUND_COST_KEY, CostMeter
from edge_client.delivery import Delivery, Exchange
from edge_client.model_intake import ModelIntake
from edge_client.pte_fetch import ProgramFetcher
from edge_client.sent_log import SENT_KEY, note_receipt, note_sent
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer, RoundOutcome
from har_io.memory import release_free_memory
from har_io.mqtt_link import MqttLink
from har_models.wire import codec
from har_models.wire.blob_messages import BlobGrant
from har_models.wire.messages import MessageError, Receipt, RoundAnnouncement

log = logging.getLogger("fedhar.client")

Key = tuple[str, int, int]


class RoundWorker:
    """Trains and answers the rounds one client is selected for (see the module docstring).

    ``programs``: the fetcher of a client that cannot export its programs; ``set_state`` publishes
    the client's state; ``catch_up`` reads every waiting message and returns the open announcement;
    ``acts_on`` says whether an announcement selects this client and its coordinator runs;
    ``grant_of`` gives the upload grant of an exchange; ``train_lock`` is held while decoding and
    training (one training at a time in a worker process).
    """

    def __init__(self, client_id: str, store: ClientStore, trainer: ClientTrainer, intake: ModelIntake, answers: Answers,
                 delivery: Delivery, link: MqttLink, programs: ProgramFetcher | None, cost: CostMeter,
                 set_state: Callable[[str], None], catch_up: Callable[[], RoundAnnouncement | None],
                 acts_on: Callable[[RoundAnnouncement], bool], grant_of: Callable[[Key], BlobGrant | None],
                 train_lock: AbstractContextManager[object] | threading.Lock, max_model_bytes: int):  # fmt: skip
        self.client_id, self.store, self.trainer, self.intake = client_id, store, trainer, intake
        self.answers, self.delivery, self.link, self.programs, self.cost = answers, delivery, link, programs, cost
        self._set_state, self._catch_up, self._acts_on = set_state, catch_up, acts_on
        self._grant_of, self._train_lock, self.max_model_bytes = grant_of, train_lock, max_model_bytes
        # (run, round, stage, transfer) that failed validation: keyed by the exchange, since a
        # later run may send byte-identical models.
        self.rejected: set[tuple[str, int, int, str]] = set()
        self.rounds_done = 0
        self.train_s: float | None = None  # seconds the last local training took (model received to update ready)
        self.warming_up = True  # until this process's first local training finished (the backend loaded)
        self._noted: tuple[Key, str] | None = None  # the exchange and attempt a retraining was last logged for

    def work(self, ann: RoundAnnouncement) -> None:
        """Act on the open round ``ann`` (selecting this client, its coordinator running): answer it, or train it first."""
        key = (ann.run_id, ann.round, ann.stage)
        _, transfer = ann.model_for(self.client_id)
        if (*key, transfer) in self.rejected:
            return
        if self.answers.holds(key, transfer):
            self.answer(ann)
            return
        stored = self.answers.stored
        if stored is not None and stored.key == key and self._noted != (key, ann.attempt):
            self._noted = (key, ann.attempt)
            log.info("[%s] round %d: attempt %s announces another model than the one I trained on; training again", self.client_id,
                     ann.round, ann.attempt)  # fmt: skip
        if transfer and ann.transport == "blobs" and transfer not in self.intake.models:
            self.intake.fetch(ann, transfer, self._grant_of(key))
        if not transfer or transfer not in self.intake.models:
            return
        if self.programs is not None and not self.programs.ready(ann, self.link.publish_nowait):
            return  # asked the coordinator for this architecture's programs; trains once they are stored
        # Decoding and training hold the worker's training lock: clients hosted together then hold
        # one decoded model at a time, not one each while they wait.
        with self._train_lock:
            outcome = self.decode_and_train(ann, transfer, key)
        if outcome is None:
            return
        self.answers.keep(key, transfer, outcome.envelope)
        self._note_sent(ann, len(outcome.envelope))
        self.rounds_done += 1
        log.info("[%s] round %d%s: %s", self.client_id, ann.round, f".{ann.stage}" if ann.stage else "", outcome.summary)
        del outcome
        release_free_memory()
        self._set_state("idle")
        # What queued up behind the training is read first: attempts that came and went meanwhile get nothing.
        newest = self._catch_up()
        if newest is not None and (newest.run_id, newest.round, newest.stage) == key:
            if self._acts_on(newest):
                self.answer(newest)  # the round's newest attempt
        elif newest is not None and newest.run_id == ann.run_id and self.link.connected.is_set():
            # The round moved on while this client trained (a buffered round took its quorum): the update goes once,
            # for the exchange it was trained for, which a buffered round takes as a stale update.
            kept = self.answers.envelope()
            if kept is not None and kept[0] == key:
                self.delivery.start(Exchange.of(ann), kept[1], ann.deadline_unix)

    def answer(self, ann: RoundAnnouncement) -> None:
        """Send the stored update to ``ann``'s attempt, in its transport, unless that attempt has it or it is on its way."""
        ex = Exchange.of(ann)
        if not self.link.connected.is_set() or not self.answers.due(ex, self.delivery.pending, time.time(), ann.deadline_unix):
            return
        stored = self.answers.envelope()
        if stored is None or stored[0] != ex.key:
            return  # gone from the store: the next pass trains the round again
        log.info("[%s] round %d: sending the stored update for coordinator attempt %s (%s)", self.client_id, ann.round,
                 ann.attempt or "-", ex.transport)  # fmt: skip
        self.delivery.start(ex, stored[1], ann.deadline_unix)

    def finish(self, ann: RoundAnnouncement | None, wait_s: float, step: Callable[[], bool]) -> None:
        """The client stops: answer the open round ``ann`` (None: none open here) and await the receipt up to ``wait_s``.

        ``step`` reads a moment's messages and says whether the round is still open for this client;
        the update stays stored either way, and goes again if the round is run again.
        """
        if ann is None:
            return
        key = (ann.run_id, ann.round, ann.stage)
        if self.answers.holds(key, ann.model_for(self.client_id)[1]):
            self.answer(ann)
        p = self.delivery.pending
        if p is None or p.key != key:
            return  # nothing on its way for the open round
        if not p.chunk_bytes:
            p.next_try = 0.0  # no whole send finished yet (a grant late, a broker slow): try again now, not after the wait
        log.info("[%s] stopping: waiting up to %.0f s for the coordinator's receipt of round %d's update", self.client_id, wait_s,
                 ann.round)  # fmt: skip
        end = time.monotonic() + wait_s
        while self.delivery.pending is not None and time.monotonic() < end and self.link.connected.is_set():
            self.delivery.poll(key)
            if not step():
                break
        if self.delivery.pending is not None:
            log.warning("[%s] stopping before the coordinator confirmed round %d's update; it stays stored and goes again if the "
                        "round is run again", self.client_id, ann.round)  # fmt: skip

    def decode_and_train(self, ann: RoundAnnouncement, transfer: str, key: Key) -> RoundOutcome | None:
        """Check the received model ``transfer`` against ``ann`` and run the round; None if the client cannot."""
        cid = self.client_id
        began = time.monotonic()
        try:
            # The intake delivered these bytes only after checking them against ``transfer``.
            env = codec.decode(self.intake.models[transfer], max_bytes=self.max_model_bytes, verified=transfer)
            if env.kind != "model" or env.round != ann.round or env.arch_version != ann.arch.get("version"):
                raise codec.BadHeader(f"model is {env.kind} for round {env.round} v{env.arch_version}, "
                                      f"announcement says round {ann.round} v{ann.arch.get('version')}")  # fmt: skip
            if env.client_id not in ("", cid):
                raise codec.BadHeader(f"model is addressed to {env.client_id!r}")
        except codec.EnvelopeError as exc:
            log.error("[%s] round %d: rejected model %s (%s): %s", cid, ann.round, transfer[:12], exc.reason, exc)
            self.rejected.add((*key, transfer))
            return None
        self.intake.models.pop(transfer, None)  # decoded: the 26 MB of envelope bytes are not needed any more
        self._set_state("training")
        try:
            with self.cost.round(ann.round, lambda: self.trainer.backend_in_use):
                outcome = self.trainer.run_round(ann, env.tensors)
            self.train_s = time.monotonic() - began
            self._keep_round_costs()
            return outcome
        except Exception as exc:
            # Whatever a plan or model from the network contains, the client survives: it says
            # why it cannot follow this one and waits for the next round.
            log.error("[%s] round %d: cannot follow this round's plan: %s: %s", cid, ann.round, type(exc).__name__, exc)
            self.rejected.add((*key, transfer))
            self._set_state("idle")
            return None
        finally:
            self.warming_up = False  # the first training of this process is over (the backend is loaded)

    def on_receipt(self, payload: bytes) -> None:
        """Take a receipt: note an accepted one in the ledger, and hand it to delivery."""
        try:
            r = Receipt.from_bytes(payload)
        except MessageError as exc:
            log.warning("[%s] ignoring malformed receipt: %s", self.client_id, exc)
            return
        if r.state == "accepted":
            try:
                self.store.set_meta(SENT_KEY, note_receipt(self.store.get_meta(SENT_KEY, []), r.run_id, r.round, r.stage))
            except (OSError, ValueError) as exc:
                log.error("[%s] round %d: cannot note the receipt in the ledger: %s", self.client_id, r.round, exc)
        self.delivery.on_receipt(r)

    def _keep_round_costs(self) -> None:
        """Store the kept round costs (:data:`~edge_client.cost.ROUND_COST_KEY`), so the screen and a restart see them."""
        try:
            self.store.set_meta(ROUND_COST_KEY, self.cost.rounds_json())
        except (OSError, ValueError, sqlite3.Error) as exc:  # a full disk does not stop the round
            log.error("[%s] cannot keep the round's cost: %s", self.client_id, exc)

    def _note_sent(self, ann: RoundAnnouncement, n_bytes: int) -> None:
        """Add the update to the ledger of what left the device (:mod:`edge_client.sent_log`); a full disk does not stop the round."""
        try:
            ledger = note_sent(self.store.get_meta(SENT_KEY, []), ann.run_id, ann.round, ann.stage, n_bytes,
                               int(ann.arch.get("version", 0)), time.time())  # fmt: skip
            self.store.set_meta(SENT_KEY, ledger)
        except (OSError, ValueError) as exc:
            log.error("[%s] round %d: cannot note the update in the ledger: %s", self.client_id, ann.round, exc)


def kept_round_costs(store: ClientStore) -> list[dict[str, object]]:
    """The round costs kept in ``store`` (:data:`~edge_client.cost.ROUND_COST_KEY`); [] if none or unreadable."""
    try:
        kept = store.get_meta(ROUND_COST_KEY, [])
    except (sqlite3.Error, ValueError):
        return []
    return kept if isinstance(kept, list) else []
