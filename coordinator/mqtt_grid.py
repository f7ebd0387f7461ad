"""The MQTT grid: the coordinator's side of the broker (the network implementation of :class:`coordinator.runner.Grid`).

:class:`MqttGrid` holds the broker session and everything that crosses it: the client table
(statuses and presence), update intake (reassembly, validation, spill, receipts, rejections),
model publishing and the retained state it restores after a reconnection, program delivery,
and the admission of devices (:mod:`coordinator.admission`). It decides nothing about rounds:
those are :class:`coordinator.runner.FederationRunner`'s. One thread does all the work; paho's
network thread only queues messages.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from tqdm import tqdm

from coordinator import fedbuff, spill
from coordinator.admission import OPEN, Admission, Eligibility, eligibility
from coordinator.blob_transport import URL_GRACE_S, NoticeRefused, make_grant, open_blob_store, publish_object, read_noticed
from coordinator.client_table import ClientTable
from coordinator.cohort import NO_STEERING, Steering
from coordinator.config import CoordinatorConfig
from coordinator.grid import CoordinatorError
from coordinator.presence import Presence
from coordinator.pte_desk import ProgramDesk
from coordinator.receipts import ReceiptDesk
from coordinator.record import RoundRecord
from coordinator.round import Exchange, published_models
from coordinator.state import RunState
from coordinator.strategies import Federation
from coordinator.updates import UpdateRejected, validate_update
from har_io.blobs import BlobError, BlobStore
from har_io.mqtt_link import MqttLink
from har_models.nn.model import ArchSpec
from har_models.wire import codec
from har_models.wire.blob_messages import BLOB_NOTICE_INDEX, BlobNotice, BlobRef
from har_models.wire.chunking import ChunkError, Reassembler, transfer_id
from har_models.wire.messages import (
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    RoundAnnouncement,
    RoundProgress,
    TrainingPlan,
)
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.coordinator")

COUNTED_PER_CLIENT = 4
"""Counted updates remembered per client to tell a re-sent copy (a duplicate) from a rejection: a
device re-sends only its last stored update, and FedDist's second stage makes two in a round."""


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
        Exited clients are not waited for; with none left the run stops at once.
    clients_restarted : callable, optional
        For the same launcher: client id -> when (s since the epoch) its process was last
        restarted after a crash, for clients not ended for good (:meth:`restarted`).
    admission : Admission
        Who may take part (:mod:`coordinator.admission`; default: everyone). A device it
        refuses (revoked or forgotten on the home server) has its status ignored and not
        counted as present, its updates rejected with reason ``revoked`` (also one already
        received in an open exchange), and is never selected; one not enrolled or off its
        charger when charging is required is left out of the selection. Asked at every
        message, so a revocation made by another process counts at once.
    epoch : int
        The served coordinator's epoch (one per start of ``fedhar-coordinator serve``), carried
        in every announcement and coordinator status; 0 (``run``) leaves it out of them.
    blob_store : BlobStore, optional
        With ``cfg.transport == "blobs"``: a store served by someone else (``serve`` serves its
        folder store beside the status page); else :meth:`connect` opens the one ``cfg`` names.
    """

    _steering: Steering = NO_STEERING  # the runner's steering of the exchanges (:meth:`steer`); frozen, so shared safely
    _not_needed: tuple[int, int, frozenset[str]] | None = None  # (round, stage, ids) the last exchange closed at its goal left out

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
    ):
        self.cfg = cfg
        self.admission = admission
        self.epoch = epoch
        self._refused_logged: set[str] = set()
        self._clients_gone = clients_gone
        self._clients_restarted = clients_restarted
        self.topics = Topics(cfg.federation)
        self.state = state  # events of exchanges and program requests go to the run's database
        self.clients = ClientTable()  # the last status of each device, with presence (coordinator/client_table.py)
        self._leaving: dict[str, ClientStatus] = {}  # devices whose newest status says they left from their app (ClientStatus.left)
        self.reassembler = Reassembler(max_payload_bytes=cfg.max_update_bytes)
        # A fresh id per coordinator process and per re-run of a round that closed without quorum:
        # a client that already answered the round re-sends its stored update for a new attempt.
        self.attempt = uuid.uuid4().hex[:12]
        self._collect: Exchange | None = None  # the exchange being collected
        self._published: Federation | None = None  # the federation whose models the open exchange published
        self.bar: tqdm | None = None  # a progress bar that shows the updates of the open exchange
        # Invalid messages and duplicates while no exchange is open: counted into the next one's record.
        self._rejected_outside: Counter[tuple[str, str]] = Counter()
        self._duplicates_outside: Counter[str] = Counter()
        # The sha256 (transfer id) of each client's last few counted updates: a restarted device
        # re-sends its stored update, and a copy of one already counted is a duplicate, not a rejection.
        self._counted: dict[str, deque[str]] = {}
        # What the open round counted so far: forgotten when the round closes without quorum, since
        # its next attempt must count the stored updates the devices send again (they are no copies).
        self._counted_this_round: list[tuple[str, str]] = []
        # The round whose last attempt closed without quorum, until its next attempt opens: an update for it
        # that arrives in between is the device answering too early (it re-sends it to the next attempt).
        self._failed_round: int | None = None
        self._spill_dir = cfg.run_dir / "spill"  # this round's updates (coordinator.spill); removed when it closes
        # Buffered rounds (cfg.buffer_size, coordinator/fedbuff.py): who still trains an earlier version, and the
        # updates of such devices that arrived while no exchange was open (the next exchange's buffer takes them).
        self.in_flight: fedbuff.InFlight | None = fedbuff.InFlight(cfg.max_staleness) if cfg.buffer_size else None
        self._stale: list[fedbuff.Stale] = []
        self._last_stale: list[fedbuff.Stale] = []  # the last closed exchange's: given back if its round failed
        self._link = MqttLink(
            cfg.broker,
            f"fedhar-coordinator-{cfg.federation}",
            subscriptions=[
                (self.topics.client_status("+"), 1),
                (self.topics.client_update("+", "+"), 1),
                (self.topics.client_program_request("+"), 1),  # coordinator/pte_desk.py
            ],
            will=(self.topics.coordinator_status, self._status_bytes("offline")),
            on_connect=lambda link: link.publish_nowait(
                self.topics.coordinator_status, self._status_bytes("online"), retain=True
            ),
        )
        # What this run keeps retained on the broker while it runs; a broker that crashes (no
        # autosave, or one older than the round) comes back without it, so it is published
        # again after every reconnection (_restore_retained, from the main thread).
        self._open: tuple[int, list[str], str, bytes] | None = None  # round, selected, global id, announcement
        self._progress_bytes: bytes | None = None  # the last progress message
        self._restored_connects = 0  # the link's connection count the retained state was last published for
        self._stop_refresh = threading.Event()
        self.receipts = ReceiptDesk(self._link, self.topics, cfg.run_id, self.reassembler)  # end-to-end delivery
        self._owned_chunks: dict[str, int] = {}  # retained chunk topic base -> chunks published (cleared at the end)
        # Blob transport (cfg.transport == "blobs", coordinator/blob_transport.py): the store, opened by connect().
        self.blobs: BlobStore | None = blob_store if cfg.transport == "blobs" else None
        self._close_blobs: Callable[[], None] = lambda: None
        self._global_blob: BlobRef | None = None  # the open exchange's global model in the store
        self._personal_blobs: dict[str, BlobRef] = {}  # ... and each selected client's own model (FedDWA, FedPer)
        self._objects: set[str] = set()  # objects this run wrote for the open (or last) exchange: older ones are dropped
        self._grants: dict[str, bytes] = {}  # client id -> its retained grant of the open exchange (published again on reconnect)
        self._granted: set[str] = set()  # clients with a retained grant on the broker (cleared at the end)
        self.programs = ProgramDesk(  # ExecuTorch programs for clients that ask (coordinator/pte_desk.py)
            self._link, self.topics, cfg.run_id, spec,
            on_reject=lambda cid, reason, detail: self.state.event(None, cid, "program_request_rejected", f"{reason}: {detail}"),
        )
        self.programs.blobs = self.blobs  # blob transport: programs through the same store

    # ------------------------------------------------------------------------------ helpers
    def _status_bytes(self, state: str) -> bytes:
        return CoordinatorStatus(
            state, self.cfg.run_id, self.attempt, sent_unix=time.time(), refresh_s=self.cfg.status_refresh_s, epoch=self.epoch
        ).to_bytes()

    def new_attempt(self, round_: int) -> None:
        """Start a new attempt (a round run again after it closed without quorum): a fresh attempt id, published at once.

        Every selected client answers an attempt: one that already trained on the same model
        re-sends its stored update, one whose model changed trains again. The coordinator
        status goes out before the announcement, since a client acts only on an announcement
        whose attempt its coordinator status names.
        """
        self.attempt = uuid.uuid4().hex[:12]
        log.info("round %d: attempt %s (the round is run again)", round_, self.attempt)
        if self._link.connected.is_set():
            try:
                self._link.publish(self.topics.coordinator_status, self._status_bytes("online"), retain=True)
            except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
                log.warning("round %d: the status naming the new attempt was not published (%s); the refresh sends it", round_, exc)

    def steer(self, steering: Steering) -> None:
        """Apply ``steering`` to the exchanges that follow (:mod:`coordinator.cohort`): the main exchange closes once
        ``steering.close_at`` updates arrived, and every announcement carries ``steering.pace``."""
        self._steering = steering

    def close_failed(self, round_: int) -> None:
        """Show round ``round_`` closed at once after it failed: clear its retained announcement.

        Clients then stop delivering for it and an observer (the status page) sees no open
        round, instead of "answered" counts of an attempt that is over; the next attempt
        announces the round again.
        """
        for cid, transfer in self._counted_this_round:  # nothing of the failed attempt was counted in a record
            with contextlib.suppress(KeyError, ValueError):
                self._counted[cid].remove(transfer)
        self._counted_this_round = []
        self._stale[:0] = self._last_stale  # the stale updates the failed attempt took count in the next one
        self._last_stale = []
        self._failed_round = round_
        try:
            self._link.publish(self.topics.round, b"", retain=True)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("round %d: the closed round's announcement was not cleared (%s)", round_, exc)

    def is_refused(self, cid: str) -> bool:
        """True if ``cid`` is refused (the ``refused`` predicate; always False without one)."""
        return self.admission.refused(cid)

    def _refresh_status(self) -> None:
        """Republish the retained "online" status every ``status_refresh_s`` seconds (own thread, until the run stops).

        A client treats a coordinator status older than three periods as a dead coordinator
        (its will may never have reached the broker); this thread keeps a live one fresh even
        while the main thread aggregates or evaluates for minutes.
        """
        while not self._stop_refresh.wait(self.cfg.status_refresh_s):
            if self._link.connected.is_set():
                self._link.publish_nowait(self.topics.coordinator_status, self._status_bytes("online"), retain=True)

    def _restore_retained(self) -> None:
        """After a reconnection, publish again what this run keeps retained: the open round's models and
        announcement, and the last progress message (the status goes from the link's on-connect hook).

        A broker that crashed and restarted empty (or from an autosave older than the round)
        has lost them, and a client that subscribes finds no round to work on: the round then
        waited for its deadline. Publishing again costs one more copy of the models for the
        clients subscribed; a client that already answered the round does not train again.
        Runs in the main thread (from :meth:`_pump`); a failure is logged and tried again after
        the next reconnection, never fatal.
        """
        connects = self._link.connects
        if connects <= self._restored_connects or not self._link.connected.is_set():
            return
        self._restored_connects = connects
        if connects <= 1:
            return
        try:
            if self._open is not None:
                round_, selected, global_id, ann = self._open
                assert self._published is not None
                if self.blobs is None:
                    new_global, personal, _ = self._publish_models(self._published, round_, selected)
                    expected = RoundAnnouncement.from_bytes(ann)
                    if new_global != global_id or personal != expected.personal_models:
                        log.error("round %d: the models published again differ from the announced ones; clients may wait", round_)
                for cid, grant in self._grants.items():  # blob transport: the models are in the store, the grants on the broker
                    self._link.publish(self.topics.client_grant(cid), grant, retain=True)
                self._link.publish(self.topics.round, ann, retain=True)
                log.info("round %d: reconnected (connection #%d); published the round's models and announcement again",
                         round_, connects)  # fmt: skip
            if self._progress_bytes is not None:
                self._link.publish(self.topics.progress, self._progress_bytes, retain=True)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("could not publish the retained round state again after reconnecting (%s); trying after the next", exc)

    def _pump(self, timeout: float) -> bool:
        """Handle at most one incoming message (waiting up to ``timeout`` seconds); False if none came.

        Whatever a message holds, its failure stays with it: it is logged (rate-limited),
        counted and dropped, and the coordinator goes on.
        """
        if self._link.fatal is not None:
            raise self._link.fatal
        if self._link.connects != self._restored_connects:
            self._restore_retained()
        try:
            topic, payload, retained = self._link.inbox.get(timeout=timeout)
        except queue.Empty:
            return False
        parsed = self.topics.parse_client_topic(topic)
        if parsed is None:
            return True
        cid, kind = parsed
        try:
            if kind == "status":
                self._on_status(cid, payload, retained)
            elif kind == "update" and topic.endswith("/" + BLOB_NOTICE_INDEX):
                self._on_blob_notice(cid, payload)
            elif kind == "update":
                self._on_update_chunk(cid, payload)
            elif kind == "program_request":
                self.programs.on_request(cid, payload)
        except Exception as exc:
            self._reject(cid, "internal_error", f"{type(exc).__name__}: {exc}")
        return True

    def _on_status(self, cid: str, payload: bytes, retained: bool = False) -> None:
        if self.is_refused(cid):
            # A revoked device's late or retained status must not make it present again.
            self.clients.forget(cid)
            if self._collect is not None and cid in self._collect.selected:
                self._collect.offline.add(cid)
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
        if self._collect is not None and cid in self._collect.selected:
            if st.state == "offline":
                self._collect.offline.add(cid)
            else:
                self._collect.offline.discard(cid)
        if prev is None or prev.state != st.state:
            log.debug("client %s is %s", cid, st.state)

    def _sender_refused(self, cid: str) -> bool:
        """True, with the message counted as rejected, if nothing ``cid`` sends may count (revoked, or its id in two processes)."""
        if self.is_refused(cid):
            self._reject(cid, "revoked", "the device was revoked; nothing it sends is counted")
            return True
        if cid in self.presence.conflicts:
            self._reject(cid, "duplicate_identity", "two processes use this client id")
            return True
        return False

    def _on_update_chunk(self, cid: str, payload: bytes) -> None:
        if self._sender_refused(cid):
            return
        self.receipts.before_chunk(cid, payload)
        try:
            done = self.reassembler.add(f"update/{cid}", payload)
        except ChunkError as exc:
            self._reject(cid, exc.reason, str(exc))
            return
        if done is None:
            return
        self._take_update(cid, done[0], done[1])

    def _on_blob_notice(self, cid: str, payload: bytes) -> None:
        """Blob transport: read the update a client's notice announces from its slot, check it, and take it."""
        if self._sender_refused(cid):
            return
        if self.blobs is None:
            self._reject(cid, "wrong_transport", "an upload notice arrived, but this coordinator does not use the blob transport")
            return
        try:
            notice = BlobNotice.from_bytes(payload)
        except MessageError as exc:
            self._reject(cid, "malformed", str(exc))
            return
        if notice.sha256 in self._counted.get(cid, ()):
            self._duplicate(cid, notice.sha256)
            return
        c = self._collect
        if self._stale_notice(cid, notice):
            return
        if notice.run_id != self.cfg.run_id or c is None or (notice.round, notice.stage) != (c.round, c.stage):
            nn = self._not_needed  # the cohort's close did not wait for this device: its late update is no fault
            late = nn is not None and cid in nn[2] and (notice.round, notice.stage) == nn[:2]
            if notice.run_id == self.cfg.run_id and (late or (c is None and notice.round == self._failed_round)):
                self._duplicate(cid, notice.sha256)
                return
            self._reject(cid, "stale_round", f"the notice is for run {notice.run_id[:40]} round {notice.round}.{notice.stage}, "
                                             f"the open exchange is {'none' if c is None else f'{c.round}.{c.stage}'}")  # fmt: skip
            return
        try:
            fetched = read_noticed(self.blobs, cid, notice, self.cfg.max_update_bytes)
        except NoticeRefused as exc:
            self._reject(cid, exc.reason, str(exc))
            return
        self._take_update(cid, fetched.transfer, fetched.data)

    def _stale_notice(self, cid: str, notice: BlobNotice) -> bool:
        """Buffered rounds over blobs: take the update a notice announces for a version ``cid`` is still training.

        Its slot (of that version's round) is read, checked and taken as a stale update
        (:meth:`_take_stale`). False if the notice is no such update.
        """
        assert self.blobs is not None
        if self._stale_version(cid, notice.run_id, notice.round, notice.stage) is None:
            return False
        try:
            fetched = read_noticed(self.blobs, cid, notice, self.cfg.max_update_bytes)
        except NoticeRefused as exc:
            self._reject(cid, exc.reason, str(exc))
            return True
        self._take_update(cid, fetched.transfer, fetched.data)  # its slot goes with its round's, max_staleness rounds on
        return True

    def _take_update(self, cid: str, transfer: str, data: bytes) -> None:
        """Count the whole update envelope ``data`` (SHA-256 ``transfer``) of ``cid``, whichever way it came, or reject it."""
        c = self._collect
        if transfer in self._counted.get(cid, ()) or self._from_not_needed(cid, data):
            self._duplicate(cid, transfer)
            return
        if self.in_flight is not None and self._take_stale(cid, transfer, data):
            return
        if c is None:
            if self._for_failed_round(data):
                self._duplicate(cid, transfer)
                return
            self._reject(cid, "no_open_round", "an update arrived while no round was open")
            return
        status = self.clients.get(cid)
        try:
            upd = validate_update(
                data,
                topic_client=cid,
                run_id=self.cfg.run_id,
                round_=c.round,
                stage=c.stage,
                spec=c.spec,
                selected=c.selected,
                want_guidance=c.guidance,
                max_bytes=self.cfg.max_update_bytes,
                reported_n_train=status.n_train if status is not None else None,
                reference=c.reference(cid) if c.reference is not None else None,
            )
        except UpdateRejected as exc:
            self._reject(cid, exc.reason, str(exc))
            return
        if cid in c.updates:
            self.receipts.accepted(cid, transfer)  # a re-sent update: acknowledge it again
            log.debug("round %d: duplicate update from %s ignored", c.round, cid)
            return
        try:
            upd = spill.spill_update(upd, self._spill_dir / f"r{c.round:04d}-s{c.stage}")
        except OSError as exc:  # a full disk: keep this update in memory rather than lose it
            log.warning("round %d: cannot spill the update of %s to disk (%s); keeping it in memory", c.round, cid, exc)
        c.add(upd)
        self._counted.setdefault(cid, deque(maxlen=COUNTED_PER_CLIENT)).append(transfer)
        self._counted_this_round.append((cid, transfer))
        self.receipts.accepted(cid, transfer)
        if self.bar is not None:
            self.bar.set_postfix_str(f"round {c.round}: {len(c.updates)}/{len(c.selected)} updates")

    def _take_stale(self, cid: str, transfer: str, data: bytes) -> bool:
        """Buffered rounds: take ``data`` if it is the update of a version ``cid`` is still training (FedBuff's stale update).

        Checked as its own round's update was (against that version's architecture and model),
        and kept in memory for the buffer of the exchange open now or, if none is, of the next one;
        False if it is no such update (it then goes the way of any other).
        """
        assert self.in_flight is not None
        try:
            header = codec.peek_header(data)
        except codec.EnvelopeError:
            return False
        meta = header.get("meta", {})
        r = header.get("round")
        if header.get("kind") != "update" or not isinstance(r, int):
            return False
        v = self._stale_version(cid, meta.get("run_id"), r, meta.get("stage", 0))
        if v is None:
            return False
        self.in_flight.arrived(cid, r)
        c = self._collect
        status = self.clients.get(cid)
        try:
            upd = validate_update(data, topic_client=cid, run_id=self.cfg.run_id, round_=r, stage=0, spec=v.spec,
                                  selected=(cid,), want_guidance=False, max_bytes=self.cfg.max_update_bytes,
                                  reported_n_train=status.n_train if status is not None else None, reference=v.state)  # fmt: skip
        except UpdateRejected as exc:
            self._reject(cid, exc.reason, str(exc))
            return True
        stale = fedbuff.Stale(upd, v)
        if c is not None:
            c.add_stale(stale)
        else:
            self._stale.append(stale)
        self._counted.setdefault(cid, deque(maxlen=COUNTED_PER_CLIENT)).append(transfer)
        self.receipts.accepted_stale(cid, transfer, r)
        log.debug("update of %s for version %d taken into the buffer", cid, r)
        return True

    def _stale_version(self, cid: str, run_id: object, round_: int, stage: object) -> fedbuff.Version | None:
        """Buffered rounds: the version an update of ``cid`` for (``run_id``, ``round_``, ``stage``) is a stale update of.

        None unless the run is this one, the stage 0, and ``cid`` still trains that version; and
        None for the open exchange's own update (a selected device's of its round).
        """
        c = self._collect
        if self.in_flight is None or run_id != self.cfg.run_id or stage != 0:
            return None
        if c is not None and c.round == round_ and cid in c.selected:
            return None
        return self.in_flight.version_of(cid, round_)

    def training(self) -> set[str]:
        """Buffered rounds: the devices still training an earlier version (not to be selected); empty otherwise."""
        return self.in_flight.training() if self.in_flight is not None else set()

    def _carry_outside(self, c: Exchange) -> None:
        """Count in exchange ``c`` what arrived while none was open, so every rejection reaches a round record."""
        c.rejected.update(self._rejected_outside)
        c.carried.update(self._rejected_outside)
        c.duplicates.update(self._duplicates_outside)
        self._rejected_outside.clear()
        self._duplicates_outside.clear()

    def _for_failed_round(self, data: bytes) -> bool:
        """Whether ``data`` is an update of this run for the round whose last attempt closed without quorum.

        Between two attempts of a round (e.g. devices delivering after a broker restart closed the
        attempt) such an update is no fault: the device sends its stored update again to the next
        attempt, which counts it. It is counted with the duplicates, apart from the rejections.
        """
        if self._failed_round is None:
            return False
        try:
            header = codec.peek_header(data)
        except codec.EnvelopeError:
            return False
        return bool(header["kind"] == "update" and header["round"] == self._failed_round
                    and header.get("meta", {}).get("run_id") == self.cfg.run_id)  # fmt: skip

    def _from_not_needed(self, cid: str, data: bytes) -> bool:
        """Whether ``data`` is the update of a device that the last exchange closed at its cohort goal did not wait for.

        Such a device was selected, trained and sends its update after the close (and again until the
        deadline, for want of a receipt): no fault, so it is counted with the duplicates, not as a
        rejection that would also stand as its reason for missing a later round.
        """
        nn = self._not_needed
        if nn is None or cid not in nn[2]:
            return False
        try:
            header = codec.peek_header(data)
        except codec.EnvelopeError:
            return False
        meta = header.get("meta", {})
        return bool(header["kind"] == "update" and (header["round"], meta.get("stage", 0)) == nn[:2]
                    and meta.get("run_id") == self.cfg.run_id)  # fmt: skip

    def _duplicate(self, cid: str, transfer: str) -> None:
        """Count a re-sent copy of an update already counted; re-acknowledge it if its exchange is the open one."""
        c = self._collect
        if c is not None and self.receipts.accepted_transfers.get(cid) == transfer:
            self.receipts.accepted(cid, transfer)  # it did not get its receipt: say so again
        if c is not None:
            c.duplicates[cid[:64]] += 1
        else:
            self._duplicates_outside[cid[:64]] += 1
        log.debug("round %s: a copy of an update of %s already counted; not a rejection", c.round if c else "-", cid)

    def _reject(self, cid: str, reason: str, detail: str) -> None:
        """Count an invalid message; log the first of each (client, reason) per exchange, and the total at its close."""
        c = self._collect
        key = (cid[:64], reason)
        counts = c.rejected if c is not None else self._rejected_outside
        counts[key] += 1
        if counts[key] == 1:
            rnd = c.round if c is not None else "-"
            log.warning("round %s: rejected update from %s: %s (%s); repeats are counted", rnd, key[0], reason, detail[:300])

    # ------------------------------------------------------------------------------ setup
    def _eligible(self) -> list[str]:
        return list(self.eligibility().eligible)

    def eligible(self) -> list[str]:
        """The clients a round started now could select (sorted ids)."""
        return self._eligible()

    def eligibility(self, label_set: str = "") -> Eligibility:
        """Who a round started now could select, and why each other known device could not (the one rule).

        ``label_set``: the federation's ("" before the federation exists: any).

        The messages already waiting are handled first: after minutes of aggregation and
        evaluation without reading the broker, the devices' latest statuses are in the inbox,
        and judging presence before reading them would find every device stale.
        """
        for _ in range(self._link.inbox.qsize()):
            if not self._pump(0.0):
                break
        return eligibility(self.clients, fresh=self.presence.fresh, admission=self.admission, label_set=label_set)

    def statuses(self) -> Mapping[str, ClientStatus]:
        """The last status of each present device, by id (a read-only view)."""
        return MappingProxyType(self.clients)

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a message from the devices, and handle it and those queued behind it then.

        A caller that looks at every device between waits (eligibility before round 0) then makes
        one pass per burst of statuses, not one per status. The queued messages are counted
        first, so a flood still returns.
        """
        if self._pump(seconds):
            for _ in range(self._link.inbox.qsize()):
                if not self._pump(0.0):
                    break

    def pump(self, timeout: float) -> bool:
        """Handle at most one incoming message, waiting up to ``timeout`` s; False if none came."""
        return self._pump(timeout)

    def forget(self, cid: str) -> None:
        """Forget device ``cid`` (revoked or forgotten): its status and presence; it is not present any more."""
        self.clients.forget(cid)

    @property
    def presence(self) -> Presence:
        """Freshness of the statuses and client ids used by two processes (the client table's)."""
        return self.clients.presence

    @property
    def link(self) -> MqttLink:
        """The coordinator's broker session (for a serving loop that clears a revoked device's retained topics)."""
        return self._link

    def gone(self) -> set[str]:
        """Ids of launcher-started clients that exited (``clients_gone``); raises CoordinatorError when none is left."""
        return self._check_clients_alive()

    def restarted(self) -> Mapping[str, float]:
        """Launcher-started clients whose process was restarted after a crash: id -> when (s since the epoch)."""
        return {} if self._clients_restarted is None else self._clients_restarted()

    def _check_clients_alive(self) -> set[str]:
        """Ids of launcher-started clients that exited; raises CoordinatorError when none is left."""
        if self._clients_gone is None:
            return set()
        gone, fatal = self._clients_gone()
        if fatal:
            raise CoordinatorError(fatal)
        return gone

    # ------------------------------------------------------------------------------ a round
    def _publish_models(self, fed: Federation, round_: int, selected: Sequence[str]) -> tuple[str, dict[str, str], int]:
        """Publish G (if anyone needs it) and the P_i of selected clients; return transfer ids and bytes delivered.

        Over MQTT as retained chunks (:meth:`_to_broker`); with the blob transport to the blob
        store instead (:meth:`_to_store`), whose objects of the last exchange are then dropped.
        """
        spec = fed.spec
        meta = {"arch": spec.to_dict()}
        send = self._to_store(round_) if self.blobs is not None else self._to_broker
        personal: dict[str, str] = {}
        down = 0
        need_global = [c for c in selected if c not in fed.personal]
        global_id = ""
        if need_global:
            env = codec.encode(fed.global_state, kind="model", round=round_, arch_version=spec.version, meta=meta)
            global_id = send(None, env)
            down += len(env) * len(need_global)
        for cid in selected:
            if cid in fed.personal:
                env = codec.encode(
                    fed.personal[cid], kind="model", round=round_, arch_version=spec.version, client_id=cid, meta=meta
                )
                personal[cid] = send(cid, env)
                down += len(env)
        if self.blobs is not None:
            self._drop_objects_but(round_, {global_id, *personal.values()} - {""})
        return global_id, personal, down

    def _to_broker(self, cid: str | None, env: bytes) -> str:
        """Publish model envelope ``env`` retained in chunks: G (``cid`` None) or ``cid``'s P_i; return its transfer id."""
        if cid is None:
            n = self._link.publish_chunks(self.topics.global_model, env, retain=True)
            self._own_chunks(self.topics.global_model(0), n)
        else:
            n = self._link.publish_chunks(functools.partial(self.topics.client_model, cid), env, retain=True)
            self._own_chunks(self.topics.client_model(cid, 0), n)
        return transfer_id(env)

    def _to_store(self, round_: int) -> Callable[[str | None, bytes], str]:
        """Blob transport: a sender that writes a model envelope to the store once, named by its SHA-256.

        It keeps G's reference for the announcement and each client's own model for its grant
        (:meth:`_grant_all`), and returns the object's SHA-256 (its transfer id).
        """
        assert self.blobs is not None
        store = self.blobs
        expires = time.time() + self.cfg.round_timeout_s + URL_GRACE_S
        self._global_blob = None
        self._personal_blobs = {}

        def send(cid: str | None, env: bytes) -> str:
            ref = publish_object(store, env, expires)
            if cid is None:
                self._global_blob = ref
            else:
                self._personal_blobs[cid] = ref
            return ref.sha256

        return send

    def _drop_objects_but(self, round_: int, now: set[str]) -> None:
        """Blob transport: drop the objects of the last exchange that exchange ``now`` does not use (no client needs them)."""
        assert self.blobs is not None
        for sha in sorted(self._objects - now):
            try:
                self.blobs.drop_object(sha)
            except BlobError as exc:
                log.warning("round %d: an earlier model %s was not removed from the blob store (%s)", round_, sha[:12], exc)
        self._objects = now

    def _grant_all(self, round_: int, stage: int, selected: Sequence[str]) -> None:
        """Blob transport: hand each selected client its grant (upload URL, own model) on its retained grant topic."""
        assert self.blobs is not None
        expires = time.time() + self.cfg.round_timeout_s + URL_GRACE_S
        personal = self._personal_blobs
        self._grants = {}
        for cid in selected:
            grant = make_grant(self.blobs, self.cfg.run_id, round_, stage, self.attempt, cid, expires, self.cfg.max_update_bytes,
                               personal.get(cid))  # fmt: skip
            self._grants[cid] = grant.to_bytes()
            # Queued, not one round trip each (10,000 grants): paho sends them in order, before the announcement.
            self._link.publish_nowait(self.topics.client_grant(cid), self._grants[cid], retain=True)
            self._granted.add(cid)

    def _own_chunks(self, first_topic: str, n: int) -> None:
        base = first_topic.rsplit("/", 1)[0]
        self._owned_chunks[base] = max(n, self._owned_chunks.get(base, 0))

    def exchange(self, fed: Federation, label_set: str, round_: int, stage: int, selected: Sequence[str],
                 plan: TrainingPlan) -> Exchange:  # fmt: skip
        """Publish models + announcement, collect updates until every selected client answered or went offline, or the deadline."""
        spec = fed.spec
        self._published = fed
        try:
            global_id, personal, down = self._publish_models(fed, round_, selected)
        except BlobError as exc:  # the blob store is down or refuses: this exchange gets no update, the run goes on
            return self._store_failed(fed, round_, stage, selected, plan, exc)
        deadline = time.time() + self.cfg.round_timeout_s
        ann = RoundAnnouncement(
            run_id=self.cfg.run_id,
            round=round_,
            state="training",
            arch=spec.to_dict(),
            label_set=label_set,
            # Blob transport: each selected device learns it from its own grant; the announcement every device
            # receives lists nobody, so a round's broker bytes do not grow as (selected) x (devices).
            selected=tuple(selected) if self.blobs is None else (),
            plan=plan,
            global_model=global_id,
            personal_models=personal,
            deadline_unix=deadline,
            stage=stage,
            attempt=self.attempt,
            epoch=self.epoch,
            transport="blobs" if self.blobs is not None else "mqtt",
            global_blob=self._global_blob.to_json() if self.blobs is not None and self._global_blob is not None else None,
            pace=self._steering.pace,
        )
        if stage == 0:
            self._counted_this_round = []
        c = self._collect = Exchange(
            round_, stage, spec, frozenset(selected), plan.guidance, bytes_down=down, reference=published_models(fed),
            enough=self._steering.close_at if stage == 0 else None,
        )
        self._failed_round = None
        if self._not_needed is not None and self._not_needed[:2] == (round_, stage):  # this exchange again: it counts them
            self._not_needed = None
        self._carry_outside(c)
        if self.in_flight is not None and stage == 0:
            c.buffered = True
            for s in self._stale:
                c.add_stale(s)
            self._stale = []
            c.awaiting = len(self.in_flight)
        c.offline.update(cid for cid in selected if cid in self.clients and self.clients[cid].state == "offline")
        self.receipts.open(round_, stage)
        ann_bytes = ann.to_bytes()
        self._open = (round_, list(selected), global_id, ann_bytes)
        if self.blobs is not None:
            self._grant_all(round_, stage, selected)  # before the announcement: a client that trains finds its grant there
        self._link.publish(self.topics.round, ann_bytes, retain=True)
        end = time.monotonic() + self.cfg.round_timeout_s
        next_check = 0.0
        while not c.complete() and time.monotonic() < end:
            self._pump(max(0.0, min(0.25, end - time.monotonic())))
            if time.monotonic() >= next_check:
                # Passes over every selected device, so at most twice a second, not after each message: per message
                # they made a round O(selected x messages), O(N^2) (docs/scale.md). A status saying offline and an
                # update from a refused device are handled as they arrive (_on_status, _on_update_chunk).
                self.receipts.request_missing(c.selected)
                c.offline.update(cid for cid in c.selected if not self.presence.fresh(cid))  # vanished without a will
                c.offline.update(cid for cid in c.selected if cid not in c.offline and self.is_refused(cid))
                c.offline.update(self._check_clients_alive() & c.selected)
                if self.in_flight is not None and c.buffered:
                    self._forget_vanished(self.in_flight)
                    c.awaiting = len(self.in_flight)
                next_check = time.monotonic() + 0.5
        # Handle what had already arrived at the close, but no more than that: under a flood of
        # messages the inbox never empties, and the round must still close at its deadline.
        for _ in range(self._link.inbox.qsize()):
            if not self._pump(0.0):
                break
        self._drop_refused(c)
        if c.buffered:  # FedBuff: who has not answered trains on; its update goes into a later version's buffer
            assert self.in_flight is not None
            self.in_flight.close(round_, spec, fed.global_state, sorted(c.selected - c.updates.keys() - c.offline))
            self._last_stale = list(c.stale)
        elif c.enough is not None and len(c.updates) >= c.enough:  # closed at its cohort goal: the others' updates may follow
            self._not_needed = (round_, stage, frozenset(c.selected - c.updates.keys()))
        self._collect = None
        self._open = None
        self._grants = {}
        self.receipts.close()
        if self.blobs is not None:
            try:
                # Buffered rounds: the devices still training this round upload to its slots later; the slots of the
                # round whose updates can no longer be taken go instead.
                gone = round_ - self.cfg.max_staleness if c.buffered else round_
                if gone >= 0:
                    self.blobs.drop_uploads(f"uploads/{self.cfg.run_id}/r{gone:04d}-s{stage}/")
            except BlobError as exc:
                log.warning("round %d: the exchange's upload slots were not removed from the blob store (%s)", round_, exc)
        for (cid, reason), n in sorted(c.rejected.items()):
            self.state.event(round_, cid, "rejected", f"{reason}: {n} message(s)")
            if n > 1:
                log.warning("round %d: %d messages from %s rejected (%s)", round_, n, cid, reason)
        for f in c.failures():
            kind = f.reason if f.reason in ("offline", "missed_deadline", "cohort_full", "still_training") else "no_valid_update"
            self.state.event(round_, f.client_id, kind, f"stage {stage}")
        return c

    def _store_failed(self, fed: Federation, round_: int, stage: int, selected: Sequence[str], plan: TrainingPlan,
                      exc: BlobError) -> Exchange:  # fmt: skip
        """An exchange that could not start because the blob store failed: closed at once, every selected client
        failed with reason ``blob_store_unavailable`` (the round then closes without quorum and is run again)."""
        log.error("round %d: the models could not be written to the blob store (%s); the exchange closes without updates "
                  "and the round is run again", round_, exc)  # fmt: skip
        self.state.event(round_, None, "blob_store_failed", str(exc)[:300])
        c = Exchange(round_, stage, fed.spec, frozenset(selected), plan.guidance)
        for cid in selected:
            c.rejected[(cid[:64], "blob_store_unavailable")] += 1
        return c

    def _forget_vanished(self, in_flight: fedbuff.InFlight) -> None:
        """Stop waiting for devices training an earlier version that went offline, stale or were refused."""
        waiting = in_flight.training()
        gone = {cid for cid in waiting if not self.presence.fresh(cid) or self.is_refused(cid)
                or (cid in self.clients and self.clients[cid].state == "offline")}  # fmt: skip
        for cid in in_flight.drop(gone):
            log.info("no longer waiting for %s's update of an earlier version: it went offline", cid)

    def _drop_refused(self, c: Exchange) -> None:
        """Take out of exchange ``c`` the updates of devices revoked while it was open (counted as rejected ``revoked``)."""
        for cid in sorted(c.updates):
            if self.is_refused(cid):
                upd = c.updates.pop(cid)
                c.bytes_up -= upd.size
                c.offline.add(cid)
                c.rejected[(cid[:64], "revoked")] += 1
                log.warning("round %d: the update of %s is not counted: the device was revoked during the round", c.round, cid)

    def publish_progress(self, record: RoundRecord) -> None:
        """Publish ``record`` as the federation's retained progress message (an observer's view of the run).

        A record too large for one message goes without its per-client parts; a broker that
        does not take it costs a warning, never the run.
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

    def clear_retained(self) -> None:
        """Forget an earlier run's retained round, progress and models on the broker (a run that starts afresh)."""
        self._link.publish(self.topics.round, b"", retain=True)
        self._link.publish(self.topics.progress, b"", retain=True)
        # ... and the models it left retained (it may have crashed before clearing them)
        self._link.sweep_retained([self.topics.global_model("+"), self.topics.client_model("+", "+"), self.topics.client_grant("+")])

    def finish(self, spec: ArchSpec, label_set: str) -> None:
        """Announce the run finished, and clear the model chunks it published: nobody may train on them once it ended."""
        fin = RoundAnnouncement(
            run_id=self.cfg.run_id,
            round=self.cfg.rounds - 1,
            state="finished",
            arch=spec.to_dict(),
            label_set=label_set,
            attempt=self.attempt,
            epoch=self.epoch,
        )
        self._link.publish(self.topics.round, fin.to_bytes(), retain=True)
        self._link.clear_retained([f"{base}/{i}" for base, n in sorted(self._owned_chunks.items()) for i in range(n)]
                                  + [self.topics.client_grant(cid) for cid in sorted(self._granted)])  # fmt: skip

    def open(self) -> None:
        """Connect to the broker (30 s at most) and start refreshing the coordinator status (:meth:`_connect`)."""
        self._connect()

    def leaving(self) -> Mapping[str, ClientStatus]:
        """Devices whose newest status says they left from their app (``ClientStatus.left``), by id (a read-only view)."""
        return MappingProxyType(self._leaving)

    def clear_device(self, cid: str) -> bool:
        """Delete what the broker retains of device ``cid`` (its status, personalised model chunks and grant) through
        this grid's own session; True when done, False (logged) when the broker did not take it.

        Raises
        ------
        ValueError
            For an invalid client id (a ``+`` or ``#`` would widen the sweep to other devices).
        """
        check_client_id(cid)
        try:
            self._link.clear_retained([self.topics.client_status(cid), self.topics.client_grant(cid)], timeout=10.0)
            models = self._link.sweep_retained([self.topics.client_model(cid, "+")], timeout=10.0)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("the retained topics of %s were not cleared (%s); they are ignored", cid, exc)
            return False
        log.info("cleared the retained status, grant and %d model chunk(s) of %s", len(models), cid)
        return True

    def _connect(self) -> None:
        """Connect to the broker (30 s at most) and start refreshing the coordinator status.

        Raises
        ------
        CoordinatorError
            If the broker cannot be reached within 30 s.
        har_io.mqtt_link.BrokerRefused
            If it refused the login or TLS failed.
        """
        if not self._link.start(wait_s=30.0):
            if self._link.fatal is not None:
                raise self._link.fatal
            raise CoordinatorError(f"cannot reach the broker at {self.cfg.broker.host}:{self.cfg.broker.port} within 30 s")
        self._restored_connects = self._link.connects  # nothing of this run is retained yet
        if self.cfg.transport == "blobs" and self.blobs is None:
            try:
                self.blobs, self._close_blobs = open_blob_store(self.cfg)
            except BlobError as exc:
                raise CoordinatorError(f"cannot open the blob store: {exc}") from None
            self.programs.blobs = self.blobs
        threading.Thread(target=self._refresh_status, name="coordinator-status-refresh", daemon=True).start()

    def close(self) -> None:
        """Stop refreshing, close the program desk, and leave the broker with the retained status "offline"."""
        self._stop_refresh.set()
        self.programs.close()
        moved = [int(getattr(self.blobs, k, -1)) for k in ("served", "served_bytes", "taken", "taken_bytes")]
        if min(moved) >= 0:  # the folder store counts what its HTTP side moved
            log.info("blob transport: %d model fetch(es) served (%.1f MB), %d upload(s) taken (%.1f MB)", moved[0],
                     moved[1] / 1e6, moved[2], moved[3] / 1e6)  # fmt: skip
        self._close_blobs()
        self._link.stop(final=(self.topics.coordinator_status, self._status_bytes("offline")))

