"""End-to-end delivery of updates: the coordinator's receipts and its requests for missing chunks.

A broker's PUBACK does not reach a subscriber that was away, so the coordinator answers every update
it counted with a Receipt on the client's receipt topic (the client re-sends until it has one), and a
transfer that stalls is answered with its missing chunk indices, so only those travel again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from har_io.mqtt_link import MqttLink
from har_models.wire.chunking import Reassembler, peek_transfer
from har_models.wire.messages import Receipt
from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.coordinator")

STREAM_PREFIX = "update/"
"""Reassembler stream of client ``cid``'s updates: ``update/{cid}``."""


class ReceiptDesk:
    """Receipts for one coordinator, one exchange open at a time.

    ``resend_after_s``: seconds without a chunk before a transfer's missing chunks are requested;
    ``reack_every_s``: least interval between two receipts for one client's repeated chunks.
    """

    def __init__(
        self,
        link: MqttLink,
        topics: Topics,
        run_id: str,
        reassembler: Reassembler,
        resend_after_s: float = 15.0,
        reack_every_s: float = 2.0,
    ):
        self.link, self.topics, self.run_id, self.reassembler = link, topics, run_id, reassembler
        self.resend_after_s, self.reack_every_s = resend_after_s, reack_every_s
        self.exchange: tuple[int, int] | None = None
        self.accepted_transfers: dict[str, str] = {}  # client id -> transfer counted in the open exchange
        self._last_sent: dict[str, float] = {}
        self.sent = 0

    def open(self, round_: int, stage: int) -> None:
        """An exchange opens: receipts from now on name ``(round_, stage)``."""
        self.exchange = (round_, stage)
        self.accepted_transfers.clear()
        self._last_sent.clear()

    def close(self) -> None:
        """The exchange closed: no more receipts or requests until the next one opens."""
        self.exchange = None

    def before_chunk(self, cid: str, message: bytes) -> None:
        """Look at a chunk before reassembly: re-acknowledge a counted transfer (rate-limited), or forget an uncounted completed one."""
        transfer = peek_transfer(message)
        if transfer is None:
            return
        stream = STREAM_PREFIX + cid
        if self.accepted_transfers.get(cid) == transfer:
            now = time.monotonic()
            if now - self._last_sent.get(cid, -1e9) >= self.reack_every_s:
                self._send(cid, transfer, "accepted")
            return
        if self.reassembler.completed(stream, transfer):
            self.reassembler.forget(stream, transfer)

    def accepted(self, cid: str, transfer: str) -> None:
        """The update ``transfer`` of ``cid`` is counted in the open exchange (or was already): say so."""
        self.accepted_transfers[cid] = transfer
        self._send(cid, transfer, "accepted")

    def request_missing(self, selected: Collection[str]) -> int:
        """Ask selected clients for the chunks of their stalled transfers; return how many requests went out."""
        if self.exchange is None:
            return 0
        n = 0
        for s in self.reassembler.stalled(self.resend_after_s):
            if not s.stream.startswith(STREAM_PREFIX):
                continue
            cid = s.stream[len(STREAM_PREFIX) :]
            if cid not in selected or self.accepted_transfers.get(cid) == s.transfer:
                continue
            self._send(cid, s.transfer, "missing", s.missing, s.count)
            self.reassembler.touch(s.stream, s.transfer)
            log.info("round %d: %s's update stalled with %d of %d chunks missing; asked for them", self.exchange[0], cid,
                     len(s.missing), s.count)  # fmt: skip
            n += 1
        return n

    def accepted_stale(self, cid: str, transfer: str, round_: int) -> None:
        """Buffered rounds: acknowledge ``cid``'s update for the earlier round ``round_`` (stage 0), whatever exchange is open."""
        if not self.link.connected.is_set():
            return
        self.link.publish_nowait(self.topics.client_receipt(cid), Receipt(self.run_id, round_, 0, transfer, "accepted").to_bytes())
        self.sent += 1

    def _send(self, cid: str, transfer: str, state: str, missing: tuple[int, ...] = (), count: int = 0) -> None:
        if self.exchange is None or not self.link.connected.is_set():
            return
        r = Receipt(self.run_id, self.exchange[0], self.exchange[1], transfer, state, missing, count)
        self.link.publish_nowait(self.topics.client_receipt(cid), r.to_bytes())
        self._last_sent[cid] = time.monotonic()
        self.sent += 1
