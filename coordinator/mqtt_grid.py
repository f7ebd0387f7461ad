"""The MQTT grid: the coordinator's side of the broker (the network implementation of :class:`coordinator.grid.Grid`).

:class:`MqttGrid` holds the broker session and what crosses it as control: the client table
(statuses and presence), the dispatch of incoming messages, the round announcement and the
retained state it restores after a reconnection, and program requests
(:mod:`coordinator.pte_desk`). Model bytes go through its one carrier
(:mod:`coordinator.transport`: retained chunks, or a blob store), and every update, whichever
carrier brought it, through its one update intake (:mod:`coordinator.transport.intake`). It
decides nothing about rounds: the runner (:class:`coordinator.runner.FederationRunner`) and its
round policy (:mod:`coordinator.rounds`) do. One thread does all the work; paho's network thread
only queues messages.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from tqdm import tqdm

from coordinator.admission import OPEN, Admission, Eligibility, eligibility
from coordinator.client_table import ClientTable
from coordinator.config import CoordinatorConfig
from coordinator.exchange import Exchange, published_models
from coordinator.grid import CoordinatorError, device_deadline
from coordinator.presence import Presence
from coordinator.pte_desk import ProgramDesk
from coordinator.receipts import ReceiptDesk
from coordinator.record import RoundRecord
from coordinator.rounds.base import Late, Steering
from coordinator.state import RunState
from coordinator.strategies import Federation
from coordinator.transport import Carrier, Opening, Refused, UpdateIntake, make_carrier, update_bound
from har_io.blobs import BlobError, BlobStore
from har_io.mqtt_link import MqttLink
from har_models.nn.model import ArchSpec
from har_models.wire.chunking import Reassembler
from har_models.wire.messages import (
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    RoundAnnouncement,
    RoundOutlook,
    RoundProgress,
    TrainingPlan,
)
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.coordinator")


def _no_late(cid: str, round_: int, stage: int) -> Late | None:
    return None


class MqttGrid:
    """The MQTT grid of a federation described by a :class:`CoordinatorConfig`.

    Parameters
    ----------
    cfg : CoordinatorConfig
    state : RunState
        The run's database: exchanges and program requests record their events there.
    spec : callable, optional
        ``spec()``: the architecture in force (None before the federation exists), for the
        programs a device asks for.
    clients_gone : callable, optional
        For a launcher that started the clients itself (``fedhar-simulate``): returns the ids
        of client processes that have exited and, if none is left, the error to stop with.
    clients_restarted : callable, optional
        For the same launcher: client id -> when (s since the epoch) its process was last
        restarted after a crash, for clients not ended for good (:meth:`restarted`).
    admission : Admission
        Who may take part (:mod:`coordinator.admission`; default: everyone). A device it refuses
        has its status ignored, its updates rejected with reason ``revoked`` (also one already
        received in an open exchange) and is never selected. Asked at every message, so a
        revocation made by another process counts at once.
    epoch : int
        The served coordinator's epoch, carried in every announcement and coordinator status; 0 leaves it out.
    blob_store : BlobStore, optional
        With the blob transport: a store served by someone else (``serve`` serves its folder store
        beside the status page); else the carrier opens the one ``cfg`` names.
    late : callable (cid, round, stage) -> Late or None
        The round policy's word on an update for another exchange than the open one
        (:meth:`coordinator.rounds.base.RoundPolicy.late`).
    """

    def __init__(
        self,
        cfg: CoordinatorConfig,
        state: RunState,
        spec: Callable[[], ArchSpec | None] = lambda: None,
        clients_gone: Callable[[], tuple[set[str], str | None]] | None = None,
        admission: Admission = OPEN,
        epoch: int = 0,
        clients_restarted: Callable[[], Mapping[str, float]] | None = None,
        blob_store: BlobStore | None = None,
        late: Callable[[str, int, int], Late | None] = _no_late,
    ):
        self.cfg = cfg
        self.admission = admission
        self.epoch = epoch
        self.state = state
        self._refused_logged: set[str] = set()
        self._clients_gone = clients_gone
        self._clients_restarted = clients_restarted
        self.topics = Topics(cfg.federation)
        self.clients = ClientTable()  # the last status of each device, with presence (coordinator/client_table.py)
        self._leaving: dict[str, ClientStatus] = {}  # devices whose newest status says they left from their app
        # A fresh id per coordinator process and per re-run of a round that closed without quorum:
        # a client that already answered the round re-sends its stored update for a new attempt.
        self.attempt = uuid.uuid4().hex[:12]
        self.bar: tqdm | None = None  # a progress bar that shows the updates of the open exchange
        self._link = MqttLink(
            cfg.broker,
            f"fedhar-coordinator-{cfg.federation}",
            subscriptions=[
                (self.topics.client_status("+"), 1),
                (self.topics.client_update("+", "+"), 1),
                (self.topics.client_program_request("+"), 1),  # coordinator/pte_desk.py
            ],
            will=(self.topics.coordinator_status, self._status_bytes("offline")),
            on_connect=lambda link: link.publish_nowait(self.topics.coordinator_status, self._status_bytes("online"), retain=True),
        )
        # What this run keeps retained on the broker while it runs; a broker that restarts empty has lost it, so it
        # is published again after every reconnection (_restore_retained, from the main thread).
        self._announcement: tuple[int, bytes] | None = None  # the open round and its announcement
        self._progress_bytes: bytes | None = None  # the last progress message
        self._outlook_bytes: bytes | None = None  # the last outlook
        self.model_version: Callable[[], int | None] = lambda: None  # the server's number of the version handed out
        self._between: Callable[[], None] = lambda: None  # what the serving loop does between an exchange's messages
        self._restored_connects = 0  # the link's connection count the retained state was last published for
        self._stop_refresh = threading.Event()
        reassembler = Reassembler(max_payload_bytes=cfg.transport.max_update_bytes)
        self.receipts = ReceiptDesk(self._link, self.topics, cfg.run_id, reassembler)  # end-to-end delivery
        self.carrier: Carrier = make_carrier(cfg.transport, cfg.run_id, cfg.run_dir, self._link, self.topics, self.receipts,
                                             reassembler, admission.refused, blob_store)  # fmt: skip
        self.intake = UpdateIntake(cfg.run_id, cfg.transport.max_update_bytes, state, self.receipts, self.clients,
                                   admission.refused, lambda: self.presence.conflicts, late, cfg.run_dir / "spill")  # fmt: skip
        self.intake.on_counted = self._show_progress
        self.programs = ProgramDesk(  # ExecuTorch programs for clients that ask (coordinator/pte_desk.py)
            self._link, self.topics, cfg.run_id, spec, send=self.carrier.send_program,
            on_reject=lambda cid, reason, detail: self.state.event(None, cid, "program_request_rejected", f"{reason}: {detail}"),
        )

    # ------------------------------------------------------------------------------ the session
    def open(self) -> None:
        """Connect to the broker (30 s at most), open the carrier, and start refreshing the coordinator status.

        Raises
        ------
        CoordinatorError
            If the broker cannot be reached within 30 s, or the carrier's store cannot be opened.
        har_io.mqtt_link.BrokerRefused
            If it refused the login or TLS failed.
        """
        if not self._link.start(wait_s=30.0):
            if self._link.fatal is not None:
                raise self._link.fatal
            raise CoordinatorError(f"cannot reach the broker at {self.cfg.broker.host}:{self.cfg.broker.port} within 30 s")
        self._restored_connects = self._link.connects  # nothing of this run is retained yet
        self.carrier.open()
        threading.Thread(target=self._refresh_status, name="coordinator-status-refresh", daemon=True).start()

    def close(self) -> None:
        """Stop refreshing, close the program desk and the carrier, and leave the broker with the retained status "offline"."""
        self._stop_refresh.set()
        self.programs.close()
        self.carrier.close()
        self._link.stop(final=(self.topics.coordinator_status, self._status_bytes("offline")))

    def clear_retained(self) -> None:
        """Forget an earlier run's retained round, progress and models on the broker (a run that starts afresh)."""
        for topic in (self.topics.round, self.topics.progress, self.topics.coordinator_outlook):
            self._link.publish(topic, b"", retain=True)
        # ... and the models it left retained (it may have crashed before clearing them)
        self._link.sweep_retained([self.topics.global_model("+"), self.topics.client_model("+", "+"), self.topics.client_grant("+")])

    def finish(self, spec: ArchSpec, label_set: str) -> None:
        """Announce the run finished, and take back the models it published: nobody may train on them once it ended."""
        fin = RoundAnnouncement(run_id=self.cfg.run_id, round=self.cfg.rounds - 1, state="finished", arch=spec.to_dict(),
                                label_set=label_set, attempt=self.attempt, epoch=self.epoch)  # fmt: skip
        self._link.publish(self.topics.round, fin.to_bytes(), retain=True)
        self.carrier.finish()

    def set_between(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` between the messages of an open exchange (about twice a second); its failure is logged, never raised."""
        self._between = hook

    def leaving(self) -> Mapping[str, ClientStatus]:
        """Devices whose newest status says they left from their app (``ClientStatus.left``), by id (a read-only view)."""
        return MappingProxyType(self._leaving)

    def clear_device(self, cid: str) -> bool:
        """Delete what the broker retains of device ``cid`` (its status, personalised model chunks and grant) and what
        the carrier handed it, through this grid's own session; True when done, False (logged) when the broker did not.

        Raises
        ------
        ValueError
            For an invalid client id (a ``+`` or ``#`` would widen the sweep to other devices).
        """
        check_client_id(cid)
        try:
            self.carrier.forget(cid)
        except BlobError as exc:
            log.warning("what the blob store holds of %s was not removed (%s)", cid, exc)
        try:
            self._link.clear_retained([self.topics.client_status(cid), self.topics.client_grant(cid)], timeout=10.0)
            models = self._link.sweep_retained([self.topics.client_model(cid, "+")], timeout=10.0)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("the retained topics of %s were not cleared (%s); they are ignored", cid, exc)
            return False
        log.info("cleared the retained status, grant and %d model chunk(s) of %s", len(models), cid)
        return True

    def status_bytes(self, state: str) -> bytes:
        """The coordinator status message this grid publishes in ``state`` ("online", "offline") now."""
        return self._status_bytes(state)

    def _status_bytes(self, state: str) -> bytes:
        return CoordinatorStatus(state, self.cfg.run_id, self.attempt, sent_unix=time.time(),
                                 refresh_s=self.cfg.timing.status_refresh_s, epoch=self.epoch).to_bytes()  # fmt: skip

    def _refresh_status(self) -> None:
        """Republish the retained "online" status every ``status_refresh_s`` seconds (own thread, until the run stops).

        A client treats a coordinator status older than three periods as a dead coordinator; this thread keeps a
        live one fresh even while the main thread aggregates or evaluates for minutes.
        """
        while not self._stop_refresh.wait(self.cfg.timing.status_refresh_s):
            if self._link.connected.is_set():
                self._link.publish_nowait(self.topics.coordinator_status, self._status_bytes("online"), retain=True)

    def _restore_retained(self) -> None:
        """After a reconnection, publish again what this run keeps retained: the open exchange's models (through the
        carrier) and announcement, and the last progress message (the status goes from the link's on-connect hook).

        A broker that restarted empty has lost them, and a client that subscribes finds no round to work on. Runs in
        the main thread; a failure is logged and tried again after the next reconnection, never fatal.
        """
        connects = self._link.connects
        if connects <= self._restored_connects or not self._link.connected.is_set():
            return
        self._restored_connects = connects
        if connects <= 1:
            return
        try:
            if self._announcement is not None:
                round_, ann = self._announcement
                self.carrier.restore()
                self._link.publish(self.topics.round, ann, retain=True)
                log.info("round %d: reconnected (connection #%d); published the round's models and announcement again",
                         round_, connects)  # fmt: skip
            for topic, kept in ((self.topics.progress, self._progress_bytes), (self.topics.coordinator_outlook, self._outlook_bytes)):
                if kept is not None:
                    self._link.publish(topic, kept, retain=True)
        except (OSError, RuntimeError, TimeoutError, ValueError, BlobError) as exc:
            log.warning("could not publish the retained round state again after reconnecting (%s); trying after the next", exc)

    # ------------------------------------------------------------------------------ messages
    def _pump(self, timeout: float) -> bool:
        """Handle at most one incoming message (waiting up to ``timeout`` seconds); False if none came.

        Whatever a message holds, its failure stays with it: it is logged (rate-limited), counted and dropped.
        """
        if self._link.fatal is not None:
            raise self._link.fatal
        if self._link.connects != self._restored_connects:
            self._restore_retained()
        try:
            topic, payload, retained = self._link.inbox.get(timeout=timeout)
        except queue.Empty:
            return False
        self.handle(topic, payload, retained)
        return True

    def handle(self, topic: str, payload: bytes, retained: bool = False) -> None:
        """Take in one message as the broker delivered it (a device's status, update or program request; anything else
        is ignored). Whatever it holds, its failure stays with it: counted as rejected (``internal_error``) and logged."""
        parsed = self.topics.parse_client_topic(topic)
        if parsed is None:
            return
        cid, kind = parsed
        try:
            if kind == "status":
                self._on_status(cid, payload, retained)
            elif kind == "update":
                self._on_update(cid, topic.rsplit("/", 1)[1], payload)
            elif kind == "program_request":
                self.programs.on_request(cid, payload)
        except Exception as exc:
            self.intake.reject(cid, "internal_error", f"{type(exc).__name__}: {exc}")

    def _on_update(self, cid: str, index: str, payload: bytes) -> None:
        if self.intake.refuses(cid):
            return
        try:
            arrival = self.carrier.arrived(cid, index, payload, self.intake)
        except Refused as exc:
            self.intake.reject(cid, exc.reason, str(exc))
            return
        if arrival is not None:
            self.intake.take(cid, arrival.transfer, arrival.data)

    def _on_status(self, cid: str, payload: bytes, retained: bool = False) -> None:
        c = self.intake.collecting
        if self.admission.refused(cid):
            # A revoked device's late or retained status must not make it present again.
            self.clients.forget(cid)
            if c is not None and cid in c.selected:
                c.offline.add(cid)
            if cid not in self._refused_logged:
                self._refused_logged.add(cid)
                log.warning("ignoring the status of revoked device %s (it is not counted as present)", cid[:64])
            if payload and self._link.connected.is_set():  # a late retained status: nobody else is to see it either
                self._link.publish_nowait(self.topics.client_status(cid), b"", retain=True)
            return
        prev = self.clients.get(cid)
        try:
            st = self.clients.note(cid, payload, retained)
        except MessageError as exc:
            log.warning("ignoring malformed status of client %r: %s", cid, exc)
            return
        if st is None:  # its retained status was cleared
            return
        if st.left:  # the device left from its app (its own account wrote this status): the server keeps its word
            if cid not in self._leaving:
                log.warning("device %s left the federation from its app%s", cid, " and asks to be forgotten" if st.left == "forget" else "")
            self._leaving[cid] = st
        else:
            self._leaving.pop(cid, None)  # back (enrolled again)
        if c is not None and cid in c.selected:
            if st.state == "offline":
                c.offline.add(cid)
            else:
                c.offline.discard(cid)
        if prev is None or prev.state != st.state:
            log.debug("client %s is %s", cid, st.state)
        if st.fault and (prev is None or prev.fault != st.fault):  # the device's own words (an id clash, a broken store)
            log.warning("device %s says: %s", cid, st.fault)
        for sha in sorted(set(st.bad_objects) - set(prev.bad_objects if prev is not None else ())):
            self._bad_object(cid, sha)

    def _bad_object(self, cid: str, sha: str) -> None:
        """Device ``cid`` refused object ``sha`` (its bytes did not match their SHA-256): record it (the page and /metrics
        count these per object) and have the carrier write the object again if the store still serves it."""
        rewritten = self.carrier.bad_object(sha)
        self.state.event(None, cid, "bad_object", f"{sha} {'written again' if rewritten else 'not held by this exchange'}")
        log.warning("device %s found object %s damaged%s", cid, sha[:12], "; it is written again" if rewritten else "")

    def _show_progress(self, c: Exchange) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"round {c.round}: {len(c.updates)}/{len(c.selected)} updates")

    # ------------------------------------------------------------------------------ the devices
    def eligibility(self, label_set: str = "") -> Eligibility:
        """Who a round started now could select, and why each other known device could not (the one rule).

        ``label_set``: the federation's ("" before the federation exists: any). The messages already waiting are
        handled first: after minutes of aggregation without reading the broker, the devices' latest statuses are in
        the inbox, and judging presence before reading them would find every device stale.
        """
        self._drain()
        return eligibility(self.clients, fresh=self.presence.fresh, admission=self.admission, label_set=label_set)

    def _drain(self) -> None:
        for _ in range(self._link.inbox.qsize()):  # counted first, so a flood still returns
            if not self._pump(0.0):
                break

    def statuses(self) -> Mapping[str, ClientStatus]:
        """The last status of each present device, by id (a read-only view)."""
        return MappingProxyType(self.clients)

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a message from the devices, and handle it and those queued behind it then."""
        if self._pump(seconds):
            self._drain()

    def forget(self, cid: str) -> None:
        """Forget device ``cid`` (revoked or forgotten): its status and presence; it is not present any more."""
        self.clients.forget(cid)

    @property
    def inbox(self) -> queue.Queue[tuple[str, bytes, bool]]:
        """The messages the broker delivered that are not handled yet: (topic, payload, retained), oldest first."""
        return self._link.inbox

    @property
    def presence(self) -> Presence:
        """Freshness of the statuses and client ids used by two processes (the client table's)."""
        return self.clients.presence

    def gone(self) -> set[str]:
        """Ids of launcher-started clients that exited (``clients_gone``); raises CoordinatorError when none is left."""
        if self._clients_gone is None:
            return set()
        gone, fatal = self._clients_gone()
        if fatal:
            raise CoordinatorError(fatal)
        return gone

    def restarted(self) -> Mapping[str, float]:
        """Launcher-started clients whose process was restarted after a crash: id -> when (s since the epoch)."""
        return {} if self._clients_restarted is None else self._clients_restarted()

    def _present(self, cid: str) -> bool:
        """Whether ``cid`` is still there: a fresh status that does not say offline, not refused."""
        return (self.presence.fresh(cid) and not self.admission.refused(cid)
                and not (cid in self.clients and self.clients[cid].state == "offline"))  # fmt: skip

    # ------------------------------------------------------------------------------ a round
    def new_attempt(self, round_: int, same_model: bool) -> None:
        """Run round ``round_`` again after it closed without quorum.

        With ``same_model`` the attempt keeps its id and the updates the failed attempt counted are counted in the
        next one (:meth:`coordinator.transport.intake.UpdateIntake.failed`): a device answers a round once, however
        many attempts it takes, and one that has its receipt sends nothing more. Otherwise (an operator's pin or
        rollback changed the model) a fresh attempt id goes out at once, before the announcement (a client acts only
        on an announcement whose attempt its coordinator status names): every selected client trains afresh.
        """
        if same_model:
            log.info("round %d: attempt %s again, the updates it counted kept", round_, self.attempt)
            return
        self.intake.forget_carried()
        self.attempt = uuid.uuid4().hex[:12]
        log.info("round %d: attempt %s (the round is run again)", round_, self.attempt)
        if self._link.connected.is_set():
            try:
                self._link.publish(self.topics.coordinator_status, self._status_bytes("online"), retain=True)
            except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
                log.warning("round %d: the status naming the new attempt was not published (%s); the refresh sends it", round_, exc)

    def close_failed(self, round_: int) -> None:
        """Show round ``round_`` closed at once after it failed: clear its retained announcement.

        Clients then stop delivering for it and an observer (the status page) sees no open round; the next
        attempt announces the round again.
        """
        self.intake.failed(round_)
        try:  # queued, in order before the next attempt's messages: a broker away now gets it when the link is back
            self._link.publish_nowait(self.topics.round, b"", retain=True)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("round %d: the closed round's announcement was not cleared (%s)", round_, exc)

    def exchange(self, fed: Federation, label_set: str, round_: int, stage: int, selected: Sequence[str],
                 plan: TrainingPlan, steering: Steering) -> Exchange:  # fmt: skip
        """Publish models + announcement, collect updates until the exchange is complete (``steering``), or the deadline."""
        spec = fed.spec
        wait_s = device_deadline(self.cfg.timing, self.clients, selected)
        deadline = time.time() + wait_s
        limit = min(self.cfg.transport.max_update_bytes, update_bound(spec, plan.guidance))
        opening = Opening(round_, stage, self.attempt, tuple(selected), deadline, steering.late_rounds, limit, steering.earlier())
        c = Exchange(round_, stage, spec, frozenset(selected), plan.guidance, steering, reference=published_models(fed))
        try:
            published = self.carrier.publish(fed, opening)
        except BlobError as exc:  # the blob store is down or refuses: this exchange gets no update, the run goes on
            log.error("round %d: the models could not be written to the blob store (%s); the exchange closes without "
                      "updates and the round is run again", round_, exc)  # fmt: skip
            self.state.event(round_, None, "blob_store_failed", str(exc)[:300])
            for cid in selected:
                c.rejected[(cid[:64], "blob_store_unavailable")] += 1
            return c
        c.bytes_down = published.bytes_down
        ann = RoundAnnouncement(
            run_id=self.cfg.run_id, round=round_, state="training", arch=spec.to_dict(), label_set=label_set, plan=plan,
            global_model=published.global_id, personal_models=published.personal, deadline_unix=deadline, stage=stage,
            attempt=self.attempt, epoch=self.epoch, pace=steering.pace, **published.announce,
        )  # fmt: skip
        self.intake.open(c, limit)
        if stage == 0:
            self.publish_outlook(RoundOutlook(self.cfg.run_id, time.time(), len(self.eligibility(label_set).eligible),
                                              open_round=round_, model_version=self.model_version()))  # fmt: skip
        c.offline.update(cid for cid in selected if cid in self.clients and self.clients[cid].state == "offline")
        self.receipts.open(round_, stage)
        ann_bytes = ann.to_bytes()
        self._announcement = (round_, ann_bytes)
        self._link.publish(self.topics.round, ann_bytes, retain=True)
        end = time.monotonic() + wait_s
        next_check = 0.0
        while not c.complete() and time.monotonic() < end:
            self._pump(max(0.0, min(0.25, end - time.monotonic())))
            if time.monotonic() >= next_check:
                # Passes over every selected device, so at most twice a second, not after each message: per message
                # they made a round O(selected x messages) (docs/scale.md).
                self.carrier.tick(c.selected)
                c.offline.update(cid for cid in c.selected if not self.presence.fresh(cid))  # vanished without a will
                c.offline.update(cid for cid in c.selected if cid not in c.offline and self.admission.refused(cid))
                c.offline.update(self.gone() & c.selected)
                c.awaited = steering.awaiting(self._present)
                try:
                    self._between()
                except Exception:  # an operator's request must not end the round
                    log.exception("round %d: what was done between the round's messages failed", round_)
                next_check = time.monotonic() + 0.5
        # Handle what had already arrived at the close, but no more than that: under a flood of
        # messages the inbox never empties, and the round must still close at its deadline.
        self._drain()
        c.warming.update(cid for cid in c.selected - c.updates.keys() if cid in self.clients and self.clients[cid].warming_up)
        self.intake.close()
        self._announcement = None
        self.receipts.close()
        self.carrier.closed(round_, stage, steering.late_rounds)
        return c

    def publish_outlook(self, outlook: RoundOutlook) -> None:
        """Publish ``outlook`` retained on the coordinator's outlook topic (what devices show their people); a broker that
        does not take it costs a warning, never the run."""
        self._outlook_bytes = outlook.to_bytes()
        try:
            self._link.publish_nowait(self.topics.coordinator_outlook, self._outlook_bytes, retain=True)
        except (OSError, RuntimeError, ValueError) as exc:
            log.warning("the outlook was not published (%s)", exc)

    def publish_progress(self, record: RoundRecord) -> None:
        """Publish ``record`` as the federation's retained progress message (an observer's view of the run).

        A record too large for one message goes without its per-client parts; a broker that does not take it costs a
        warning, never the run.
        """
        for rec in (record, record.without_details()):
            try:
                payload = RoundProgress(self.cfg.run_id, rec.round, self.cfg.rounds, rec.to_json()).to_bytes()
                self._progress_bytes = payload  # published again after a reconnection (_restore_retained)
                self._link.publish(self.topics.progress, payload, retain=True)
                return
            except ValueError as exc:  # too large for the message or the broker (PayloadTooLarge)
                log.warning("round %d: progress message: %s", record.round, exc)
            except (OSError, RuntimeError) as exc:
                log.warning("round %d: the progress message was not published (%s)", record.round, exc)
                return
