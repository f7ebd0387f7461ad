"""End-to-end delivery of a client's update: sent until the coordinator's receipt says it arrived.

A broker's acknowledgement is not enough (no subscriber, or a size limit dropping it silently;
docs/reliability.md). :class:`Delivery` follows one update for one :class:`Exchange`: sent whole;
a receipt ``accepted`` ends it; ``missing`` re-sends the chunks named, at their size (lost twice at
one size: the link cuts smaller and sends it whole again); no word back: sent whole again after
``receipt_wait_s``, doubling up to :data:`MAX_RECEIPT_WAIT_S`, while its round is open and before
its deadline (two unanswered whole sends at one size also cut smaller: Mosquitto's
``message_size_limit`` over MQTT 3.1.1 drops silently). The envelope is held in memory only while
first sent (until a send went out); later sends read it back from the store.

An update still owed a send when the next one starts (it never went out, or a send after a coordinator restart is
still due) is not replaced: it is kept beside it (:attr:`Delivery.earlier`, its bytes in memory, since the store now
holds the next update) and goes like after a restart, :data:`RESTART_TRIES` sends at most, so the coordinator counts
it or names it (a buffered round still waiting for that version, or a ``stale_round`` refusal).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from har_io.mqtt_link import PacketRejected
from har_models.wire.chunking import transfer_id
from har_models.wire.messages import Receipt, RoundAnnouncement

log = logging.getLogger("fedhar.client")

MAX_RECEIPT_WAIT_S = 60.0
"""Longest wait for a receipt before the update is sent whole again (s)."""

RESTART_TRIES = 5
"""Whole sends an update awaiting its receipt gets after the coordinator restarted, whatever round is open, until one
goes out (the restarted coordinator's blob store may not be up yet when its status arrives)."""

RESTART_RETRY_S = 1.0
"""First wait before such a send is tried again (s), doubled after each (1, 2, 4, 8 s): the store starts with serve."""

MAX_EARLIER = 2
"""Updates still owed a send kept beside the followed one (:attr:`Delivery.earlier`); a third drops the oldest, logged."""

Key = tuple[str, int, int]
"""An exchange: (run id, round, stage)."""

TRANSPORTS = ("mqtt", "blobs")
"""How an update travels: in chunks through the broker, or a PUT to the device's blob grant."""


@dataclass(frozen=True)
class Exchange:
    """The exchange an update answers, as the announcement acted on named it: ``attempt`` ("" when the coordinator
    names none) and ``transport`` (:data:`TRANSPORTS`)."""

    run_id: str
    round: int
    stage: int = 0
    attempt: str = ""
    transport: str = "mqtt"

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"Exchange: transport must be one of {TRANSPORTS}, got {self.transport!r}")

    @property
    def key(self) -> Key:
        """(run id, round, stage): what receipts and the store name."""
        return (self.run_id, self.round, self.stage)

    @classmethod
    def of(cls, ann: RoundAnnouncement) -> Exchange:
        """The exchange ``ann`` opens, in the transport it announces."""
        return cls(ann.run_id, ann.round, ann.stage, ann.attempt, ann.transport)


class UploadLink(Protocol):
    """What delivery needs of the network (:class:`edge_client.blob_upload.TransportLink` provides it)."""

    connected: threading.Event

    def chunk_size(self, exchange: Exchange) -> int:
        """Bytes per chunk message of ``exchange``'s transport under every limit known now."""
        ...

    def note_refused(self, refused_payload: int) -> None:
        """A message of ``refused_payload`` bytes was lost: cut later chunks smaller."""
        ...

    def send(self, exchange: Exchange, payload: bytes, chunk_bytes: int, only: Collection[int] | None = None) -> int:
        """Send ``payload`` in ``exchange``'s transport (only the chunks in ``only``); return the number of chunks it is cut into.

        Raises ``PacketRejected`` (the broker refused the size) or ``TimeoutError`` (not sent now; tried again later).
        """
        ...


@dataclass
class PendingUpdate:
    """An update sent and not yet acknowledged by the coordinator's receipt.

    ``envelope``: its bytes while first sent, then None (read back from the store); ``transfer``: the
    id receipts name; ``deadline_unix``: no send after it; ``chunk_bytes``, ``count``: of the last
    whole send; ``unanswered``: whole sends with neither receipt nor request; ``next_try``: monotonic
    time of the next whole send; ``resent``: chunk index -> re-sends since the last whole send;
    ``restarted``: the coordinator restarted since the last send, so the next one goes whatever round is open
    (``restart_sends``: whole sends before the restart); ``went_out``: a whole send reached the broker or the store.
    """

    exchange: Exchange
    envelope: bytes | None
    transfer: str
    deadline_unix: float
    chunk_bytes: int = 0
    count: int = 0
    sends: int = 0
    unanswered: int = 0
    next_try: float = 0.0
    resent: Counter[int] = field(default_factory=Counter)
    restarted: bool = False
    restart_sends: int = 0
    went_out: bool = False

    @property
    def key(self) -> Key:
        """(run id, round, stage) of its exchange."""
        return self.exchange.key

    def owed(self) -> bool:
        """Whether a send is still owed: none went out yet, or one after a coordinator restart is due."""
        return not self.went_out or self.restarted

    def owe_restart_send(self, now: float) -> None:
        """A send is owed whatever round is open, from ``now`` (monotonic s), :data:`RESTART_TRIES` at most."""
        self.restarted, self.next_try, self.unanswered, self.restart_sends = True, now, 0, self.sends

    def retry_restart_send(self, now: float) -> bool:
        """After a restart send that did not go out: schedule the next (1, 2, 4, 8 s on); False once the tries are spent."""
        if self.sends >= self.restart_sends + RESTART_TRIES:
            return False
        self.next_try = now + RESTART_RETRY_S * 2 ** (self.sends - self.restart_sends - 1)
        return True


class Delivery:
    """Sends one client's updates and follows each until the coordinator's receipt (see the module).

    ``load_stored`` gives the update the store holds as ((run id, round, stage), envelope);
    ``receipt_wait_s`` is the first wait for a receipt; ``max_message_bytes`` is named when no
    receipt ever came; ``clock`` and ``wall`` are monotonic and Unix time (s).
    """

    def __init__(
        self,
        link: UploadLink,
        load_stored: Callable[[], tuple[Key, bytes] | None],
        client_id: str,
        receipt_wait_s: float,
        max_message_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self._link = link
        self._load_stored = load_stored
        self._cid = client_id
        self.receipt_wait_s = receipt_wait_s
        self._max_message_bytes = max_message_bytes
        self._clock = clock
        self._wall = wall
        self.pending: PendingUpdate | None = None
        """The update being followed, or None (delivered, given up, or none sent)."""
        self.earlier: list[PendingUpdate] = []
        """Updates of earlier exchanges still owed a send when the followed one started, oldest first (see the module)."""
        self.upload_s: float | None = None
        """Seconds the last whole send that finished took (monotonic clock); None before one did."""
        self.on_accepted: Callable[[PendingUpdate], None] = lambda _p: None
        """Called (in the caller's thread) when the coordinator's receipt accepts the followed update."""

    def start(self, exchange: Exchange, envelope: bytes, deadline_unix: float) -> None:
        """Send ``envelope`` (already in the store) for ``exchange`` and follow it, replacing any update followed.

        Never raises for the network: a send that does not finish is tried again by :meth:`poll`.
        """
        old = self.pending
        if old is not None and old.key != exchange.key and old.owed() and old.envelope is not None:
            self._keep_earlier(old)
        self.pending = p = PendingUpdate(exchange, envelope, transfer_id(envelope), deadline_unix)
        self._send_full()
        if p.went_out:
            p.envelope = None  # sent; a re-send reads it back from the store (until then it stays in memory)

    def _keep_earlier(self, p: PendingUpdate) -> None:
        """Keep ``p`` (its bytes in memory) to be sent like after a restart beside the next update."""
        if not p.restarted:
            p.owe_restart_send(self._clock())
        self.earlier.append(p)
        while len(self.earlier) > MAX_EARLIER:
            gone = self.earlier.pop(0)
            log.warning("[%s] round %d: the update still owed a send is given up for a newer one (%d kept at most)", self._cid,
                        gone.key[1], MAX_EARLIER)  # fmt: skip

    def after_restart(self) -> None:
        """The coordinator restarted: send the followed update once more, at the next :meth:`poll`, whatever round is
        open and past its deadline (tried again if it could not go out, :data:`RESTART_TRIES` sends at most). It may
        have gone to the broker while no coordinator listened; the new one counts it (a buffered round still waiting
        for that version, a round opened again) or refuses it with a reason in its records (``stale_round``): never
        lost unnamed (the life-cycle matrix, tests/test_lifecycle_matrix.py)."""
        p = self.pending
        if p is not None:
            p.owe_restart_send(self._clock())
            if p.envelope is None:  # into memory now: the next round's update may take its place in the store
                p.envelope = self._envelope(p)

    def poll(self, open_key: Key | None) -> None:
        """Send the followed update whole again if its wait is over; drop it if ``open_key`` (the exchange open for
        training now) is another, or its deadline passed (unless the coordinator restarted since: :meth:`after_restart`)."""
        self._send_earlier()
        p = self.pending
        if p is None or self._clock() < p.next_try:
            return
        if p.restarted:
            if self._link.connected.is_set():
                log.info("[%s] round %d: sending the update whatever round is open (the coordinator restarted before its "
                         "receipt, or the update never went out)", self._cid, p.key[1])  # fmt: skip
                sent = self._send_full()
                # not sent (its blob store not up yet): again soon, RESTART_TRIES sends at most
                p.restarted = not sent and p.retry_restart_send(self._clock())
            return
        if open_key != p.key:
            if not p.went_out and p.restart_sends == 0:  # never reached the broker or the store: it goes as after a
                # restart, RESTART_TRIES sends at most, so the coordinator counts it or names it
                self.after_restart()
                self.poll(open_key)
                return
            log.warning("[%s] round %d closed before the coordinator's receipt for this update arrived", self._cid, p.key[1])
            self.pending = None
            return
        if self._wall() > p.deadline_unix:
            log.error(
                "[%s] round %d: the coordinator never confirmed this update (%d full send(s), last in chunks of %d bytes). "
                "If no update of this client arrives at all, check the broker's size limit (Mosquitto: "
                "message_size_limit / max_packet_size) against --max-message-bytes %d, and that the coordinator runs",
                self._cid,
                p.key[1],
                p.sends,
                p.chunk_bytes,
                self._max_message_bytes,
            )
            self.pending = None
            return
        if not self._link.connected.is_set():
            return
        log.info("[%s] round %d: no receipt from the coordinator yet; sending the update again", self._cid, p.key[1])
        self._send_full()

    def _send_earlier(self) -> None:
        """Send each kept earlier update whose wait is over; one that went out, or had its RESTART_TRIES, is done."""
        for p in list(self.earlier):
            if self._clock() < p.next_try or not self._link.connected.is_set():
                continue
            log.info("[%s] round %d: sending the earlier update still owed a send", self._cid, p.key[1])
            sent = self._send_full(p)
            if sent or not p.retry_restart_send(self._clock()):
                self.earlier.remove(p)  # out: the coordinator counts it or names it (no receipt is waited for)
                if not sent:
                    log.warning("[%s] round %d: the earlier update could not go out in %d tries; given up", self._cid,
                                p.key[1], RESTART_TRIES)  # fmt: skip

    def on_receipt(self, r: Receipt) -> None:
        """Act on the coordinator's receipt: done if accepted, the named chunks again if missing; a receipt about another
        update or an earlier cut of this one is ignored."""
        p = self.pending
        if p is None or r.transfer != p.transfer or (r.run_id, r.round, r.stage) != p.key:
            return
        if r.state == "accepted":
            log.info("[%s] round %d: the coordinator confirmed the update", self._cid, r.round)
            self.pending = None
            self.on_accepted(p)
            return
        # "missing": send exactly those chunks again, at the size they were cut to.
        p.unanswered = 0
        if r.count != p.count or not p.chunk_bytes:
            return  # a request about an earlier cut of this transfer; the current one is on its way
        again = [i for i in r.missing if i < p.count]
        if any(p.resent[i] >= 1 for i in again):
            # Lost twice at this size: the broker drops messages this large. Cut smaller, send all.
            log.warning("[%s] round %d: chunks of %d bytes were lost twice; sending the update in smaller chunks",
                        self._cid, r.round, p.chunk_bytes)  # fmt: skip
            self._link.note_refused(p.chunk_bytes)
            self._send_full()
            return
        envelope = self._envelope(p)
        if envelope is None:
            return
        for i in again:
            p.resent[i] += 1
        try:
            self._link.send(p.exchange, envelope, p.chunk_bytes, only=set(again))
        except PacketRejected:
            self._send_full()
        except TimeoutError as exc:
            log.warning("[%s] round %d: could not send the missing chunks (%s)", self._cid, r.round, exc)
        log.info("[%s] round %d: sent %d missing chunk(s) again", self._cid, r.round, len(again))

    def _envelope(self, p: PendingUpdate) -> bytes | None:
        """The bytes of ``p``: in memory while first sent, else the stored update (checked against its transfer
        id); None, with ``p`` dropped, if the store no longer has it."""
        if p.envelope is not None:
            return p.envelope
        stored = self._load_stored()
        if stored is not None and stored[0] == p.key and transfer_id(stored[1]) == p.transfer:
            return stored[1]
        log.error("[%s] round %d: the stored update to send again is gone or changed; not sending it", self._cid, p.key[1])
        if p is self.pending:
            self.pending = None
        elif p in self.earlier:
            self.earlier.remove(p)
        return None

    def _send_full(self, p: PendingUpdate | None = None) -> bool:
        """Send ``p`` (default: the followed update) whole; whether it went out (False: not now, tried again later, or
        dropped)."""
        p = p if p is not None else self.pending
        assert p is not None
        envelope = self._envelope(p)
        if envelope is None:
            return False
        size = self._link.chunk_size(p.exchange)
        if p.unanswered >= 2 and p.chunk_bytes and size >= p.chunk_bytes:
            # Twice sent whole without a word back: the broker may drop messages of this size
            # silently (Mosquitto's message_size_limit over MQTT 3.1.1); never send it unchanged again.
            self._link.note_refused(p.chunk_bytes)
            size = self._link.chunk_size(p.exchange)
        p.sends += 1
        p.unanswered += 1
        p.resent.clear()
        p.next_try = self._clock() + min(MAX_RECEIPT_WAIT_S, self.receipt_wait_s * 2 ** (p.sends - 1))
        began = self._clock()
        try:
            p.count = self._link.send(p.exchange, envelope, size)
            p.chunk_bytes = size
            self.upload_s = self._clock() - began
        except PacketRejected as exc:
            log.warning("[%s] round %d: %s; sending again in smaller chunks", self._cid, p.key[1], exc)
            p.unanswered -= 1
            p.next_try = self._clock()
            return False
        except TimeoutError as exc:
            log.warning("[%s] round %d: upload not finished (%s); trying again while the round is open", self._cid, p.key[1], exc)
            return False
        log.debug("[%s] round %d: update sent (attempt %d), %d bytes in %d chunks", self._cid, p.key[1], p.sends, len(envelope), p.count)
        p.went_out = True
        return True
