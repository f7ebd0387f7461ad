"""The one update intake: every update passes it, whichever carrier brought it.

In the order a message meets them: a refused sender (revoked, or its id used by two processes),
a copy of an update already counted (a duplicate, never a rejection), an update for another
exchange than the open one (asked of the round policy, :meth:`coordinator.rounds.base.RoundPolicy.late`:
FedBuff's update of an earlier version is taken into its buffer, a cohort's late answer is harmless,
an answer to a failed attempt waits for the next), validation (:func:`coordinator.updates.validate_update`),
spilling to disk, the receipt, and the counts every rejection and duplicate reaches a round record
through (those that arrive between exchanges are carried into the next one).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator import spill
from coordinator.receipts import ReceiptDesk
from coordinator.rounds.base import Late
from coordinator.updates import ClientUpdate, UpdateRejected, validate_update
from har_models.nn.model import ArchSpec
from har_models.wire import codec

if TYPE_CHECKING:
    from coordinator.client_table import ClientTable
    from coordinator.exchange import Exchange
    from coordinator.state import RunState

log = logging.getLogger("fedhar.coordinator")

COUNTED_PER_CLIENT = 4
"""Counted updates remembered per client to tell a re-sent copy (a duplicate) from a rejection: a
device re-sends only its last stored update, and FedDist's second stage makes two in a round."""


class UpdateIntake:
    """Takes in the updates of one federation (see the module docstring).

    Parameters
    ----------
    run_id : str
    max_update_bytes : int
        Largest update envelope accepted (bytes).
    state : RunState
        Where rejections and failures are recorded as events.
    receipts : ReceiptDesk
    clients : ClientTable
        The devices' last statuses (their reported training windows are checked against their updates').
    refused : callable cid -> bool
        Devices whose messages are refused (revoked or forgotten).
    conflicts : callable () -> collection of str
        Client ids two processes use at once (nothing they send counts).
    late : callable (cid, round, stage) -> Late or None
        The round policy's word on an update for another exchange than the open one.
    spill_dir : Path
        Where counted updates wait for aggregation (:mod:`coordinator.spill`).
    """

    def __init__(self, run_id: str, max_update_bytes: int, state: RunState, receipts: ReceiptDesk, clients: ClientTable,
                 refused: Callable[[str], bool], conflicts: Callable[[], Collection[str]],
                 late: Callable[[str, int, int], Late | None], spill_dir: Path):  # fmt: skip
        self.run_id = run_id
        self.max_update_bytes = max_update_bytes
        self.state = state
        self.receipts = receipts
        self.clients = clients
        self.refused = refused
        self.conflicts = conflicts
        self.late = late
        self.spill_dir = spill_dir
        self.collecting: Exchange | None = None
        self.limit = max_update_bytes  # the open exchange's update bound (bytes)
        self.on_counted: Callable[[Exchange], None] = lambda ex: None  # a progress bar's hook
        # Invalid messages and duplicates while no exchange is open: counted into the next one's record.
        self._rejected_outside: Counter[tuple[str, str]] = Counter()
        self._duplicates_outside: Counter[str] = Counter()
        # The sha256 (transfer id) of each client's last few counted updates: a restarted device re-sends its
        # stored update, and a copy of one already counted is a duplicate, not a rejection.
        self._counted: dict[str, deque[str]] = {}
        # What the open round counted so far: forgotten when the round closes without quorum, since its next
        # attempt must count the stored updates the devices send again (they are no copies).
        self._counted_this_round: list[tuple[str, str]] = []
        # The round whose last attempt closed without quorum, until its next attempt opens: an update for it that
        # arrives in between is no fault; it is kept and counted in the next attempt (its device may have stopped since,
        # sending its update on its way out, and will not send it again).
        self._failed_round: int | None = None
        self._between: dict[str, tuple[str, bytes]] = {}  # client id -> (transfer, envelope) of such an update
        self._carried: tuple[int, int, list[tuple[str, ClientUpdate]]] | None = None  # a failed attempt's counted updates
        self._closed: Exchange | None = None  # the exchange closed last

    # ------------------------------------------------------------------ exchanges
    def open(self, ex: Exchange, limit: int) -> None:
        """Collect into ``ex`` from now on, taking updates of at most ``limit`` bytes; what arrived while none was open
        is counted in it."""
        if ex.stage == 0:
            self._counted_this_round = []
        self.collecting = ex
        self.limit = min(limit, self.max_update_bytes)
        again = self._failed_round == ex.round
        self._failed_round = None
        ex.rejected.update(self._rejected_outside)
        ex.carried.update(self._rejected_outside)
        ex.duplicates.update(self._duplicates_outside)
        self._rejected_outside.clear()
        self._duplicates_outside.clear()
        carried, self._carried = self._carried, None
        if carried is not None and carried[:2] == (ex.round, ex.stage):
            for transfer, u in carried[2]:
                if u.client_id in ex.selected and not self.refused(u.client_id) and ex.add(u):
                    self._counted_this_round.append((u.client_id, transfer))
                    self.receipts.accepted_transfers[u.client_id] = transfer
        between, self._between = self._between, {}
        for cid, (transfer, data) in sorted(between.items()) if again else ():
            if cid in ex.selected and not self.refused(cid):
                ex.duplicates[cid[:64]] -= 1  # counted as a harmless repeat when it came; counted here instead
                if ex.duplicates[cid[:64]] <= 0:
                    del ex.duplicates[cid[:64]]
                self.take(cid, transfer, data)

    def close(self) -> None:
        """The open exchange closed: take out what its revoked devices sent, record its rejections and failures."""
        ex = self.collecting
        self.collecting = None
        if ex is None:
            return
        self._closed = ex
        for cid in sorted(ex.updates):
            if self.refused(cid):
                upd = ex.updates.pop(cid)
                ex.bytes_up -= upd.size
                ex.offline.add(cid)
                ex.rejected[(cid[:64], "revoked")] += 1
                log.warning("round %d: the update of %s is not counted: the device was revoked during the round", ex.round, cid)
        for (cid, reason), n in sorted(ex.rejected.items()):
            self.state.event(ex.round, cid, "rejected", f"{reason}: {n} message(s)")
            if n > 1:
                log.warning("round %d: %d messages from %s rejected (%s)", ex.round, n, cid, reason)
        for f in ex.failures():
            kind = f.reason if f.reason in ("offline", "missed_deadline", "cohort_full", "still_training", "warming_up") \
                else "no_valid_update"  # fmt: skip
            self.state.event(ex.round, f.client_id, kind, f"stage {ex.stage}")

    def failed(self, round_: int) -> None:
        """Round ``round_`` closed without quorum: its attempt's counted updates (those of its main exchange) are kept for
        the next attempt of the round, which counts them again unless :meth:`forget_carried` says the model changed."""
        ex = self._closed if self._closed is not None and (self._closed.round, self._closed.stage) == (round_, 0) else None
        counted = dict(self._counted_this_round)
        self._carried = (ex.round, ex.stage, [(counted[c], u) for c, u in sorted(ex.updates.items()) if c in counted]) \
            if ex is not None else None  # fmt: skip
        self._counted_this_round = []
        self._failed_round = round_

    def forget_carried(self) -> None:
        """The next attempt publishes another model: the failed attempt's updates no longer count (their devices train
        again, and their copies are no duplicates)."""
        if self._carried is not None:
            for transfer, u in self._carried[2]:
                with contextlib.suppress(KeyError, ValueError):
                    self._counted[u.client_id].remove(transfer)
        self._carried = None

    # ------------------------------------------------------------------ messages
    def refuses(self, cid: str) -> bool:
        """True, with the message counted as rejected, if nothing ``cid`` sends may count (revoked, or its id in two processes)."""
        if self.refused(cid):
            self.reject(cid, "revoked", "the device was revoked; nothing it sends is counted")
            return True
        if cid in self.conflicts():
            self.reject(cid, "duplicate_identity", "two processes use this client id")
            return True
        return False

    def screen(self, cid: str, run_id: str, round_: int, stage: int, transfer: str) -> bool:
        """Whether an update announced for (``run_id``, ``round_``, ``stage``) with SHA-256 ``transfer`` is worth reading
        (a blob notice, before its slot is read); False when it was counted as a duplicate or rejected here."""
        if transfer in self._counted.get(cid, ()):
            self.duplicate(cid, transfer)
            return False
        verdict = self._where(cid, run_id, round_, stage)
        if isinstance(verdict, str):
            if verdict == "duplicate":
                self.duplicate(cid, transfer)
            else:
                c = self.collecting
                self.reject(cid, "stale_round", f"the notice is for run {run_id[:40]} round {round_}.{stage}, "
                                                f"the open exchange is {'none' if c is None else f'{c.round}.{c.stage}'}")  # fmt: skip
            return False
        return True

    def _where(self, cid: str, run_id: Any, round_: Any, stage: Any) -> Late | str | None:
        """Where an update for (``run_id``, ``round_``, ``stage``) goes: None (the open exchange), a :class:`Late` the
        round policy takes, "duplicate" (harmless) or "elsewhere" (nowhere: the caller rejects it)."""
        c = self.collecting
        if c is not None and run_id == self.run_id and (round_, stage) == (c.round, c.stage):
            return None
        if run_id == self.run_id and isinstance(round_, int) and isinstance(stage, int):
            late = self.late(cid, round_, stage)
            if late is not None:
                return "duplicate" if late.harmless else late
            if c is None and round_ == self._failed_round:
                return "duplicate"
        return "elsewhere" if c is not None or run_id != self.run_id else "none_open"

    def take(self, cid: str, transfer: str, data: bytes) -> None:
        """Count the whole update envelope ``data`` (SHA-256 ``transfer``) of ``cid``, whichever way it came, or reject it."""
        if transfer in self._counted.get(cid, ()):
            self.duplicate(cid, transfer)
            return
        try:
            header = codec.peek_header(data)
            meta = header.get("meta", {})
            where = self._where(cid, meta.get("run_id"), header.get("round"), meta.get("stage", 0)) \
                if header.get("kind") == "update" else None  # fmt: skip
        except codec.EnvelopeError:
            where = None  # validation below names what is wrong with it
        if where == "duplicate":
            if self.collecting is None and self._failed_round is not None and header.get("round") == self._failed_round:
                self._between[cid] = (transfer, data)  # counted in the next attempt of its round
            self.duplicate(cid, transfer)
        elif isinstance(where, Late):
            self._take_late(cid, transfer, data, where)
        elif self.collecting is None:
            self.reject(cid, "no_open_round", "an update arrived while no round was open")
        else:
            self._take_fresh(cid, transfer, data, self.collecting)

    def _validate(self, cid: str, data: bytes, round_: int, stage: int, spec: ArchSpec, selected: Any, guidance: bool,
                  reference: Any) -> ClientUpdate | None:  # fmt: skip
        status = self.clients.get(cid)
        try:
            return validate_update(data, topic_client=cid, run_id=self.run_id, round_=round_, stage=stage, spec=spec,
                                   selected=selected, want_guidance=guidance, max_bytes=self.limit,
                                   reported_n_train=status.n_train if status is not None else None, reference=reference)  # fmt: skip
        except UpdateRejected as exc:
            self.reject(cid, exc.reason, str(exc))
            return None

    def _take_fresh(self, cid: str, transfer: str, data: bytes, c: Exchange) -> None:
        upd = self._validate(cid, data, c.round, c.stage, c.spec, c.selected, c.guidance,
                             c.reference(cid) if c.reference is not None else None)  # fmt: skip
        if upd is None:
            return
        if cid in c.updates:
            self.receipts.accepted(cid, transfer)  # a re-sent update: acknowledge it again
            log.debug("round %d: duplicate update from %s ignored", c.round, cid)
            return
        try:
            upd = spill.spill_update(upd, self.spill_dir / f"r{c.round:04d}-s{c.stage}")
        except OSError as exc:  # a full disk: keep this update in memory rather than lose it
            log.warning("round %d: cannot spill the update of %s to disk (%s); keeping it in memory", c.round, cid, exc)
        c.add(upd)
        self._count(cid, transfer)
        self._counted_this_round.append((cid, transfer))
        self.receipts.accepted(cid, transfer)
        self.on_counted(c)

    def _take_late(self, cid: str, transfer: str, data: bytes, late: Late) -> None:
        """An update the round policy takes from another exchange (FedBuff's of an earlier version), checked as its own
        round's update was, against that version's architecture and model; its receipt names its own round."""
        assert late.spec is not None and late.take is not None
        upd = self._validate(cid, data, late.round, 0, late.spec, (cid,), False, late.reference)
        if upd is None:
            return
        late.take(upd)  # its bytes count in the record of the round that aggregates it
        self._count(cid, transfer)
        self.receipts.accepted_stale(cid, transfer, late.round)

    def _count(self, cid: str, transfer: str) -> None:
        self._counted.setdefault(cid, deque(maxlen=COUNTED_PER_CLIENT)).append(transfer)

    def duplicate(self, cid: str, transfer: str) -> None:
        """Count a harmless repeat; re-acknowledge it if it is the update counted in the open exchange."""
        c = self.collecting
        if c is not None and self.receipts.accepted_transfers.get(cid) == transfer:
            self.receipts.accepted(cid, transfer)  # it did not get its receipt: say so again
        (c.duplicates if c is not None else self._duplicates_outside)[cid[:64]] += 1
        log.debug("round %s: a copy of an update of %s already counted; not a rejection", c.round if c else "-", cid)

    def reject(self, cid: str, reason: str, detail: str) -> None:
        """Count an invalid message; log the first of each (client, reason) per exchange, and the total at its close."""
        c = self.collecting
        key = (cid[:64], reason)
        counts = c.rejected if c is not None else self._rejected_outside
        counts[key] += 1
        if counts[key] == 1:
            log.warning("round %s: rejected update from %s: %s (%s); repeats are counted", c.round if c is not None else "-",
                        key[0], reason, detail[:300])  # fmt: skip
