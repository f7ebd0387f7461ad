"""Which rounds this device has answered, with what update, and when it sends that update again.

A device trains a round once and keeps the update with the model it started from; the rules
(docs/reliability.md, "Answering a round"): a round announced with that model is answered with
the stored update, never trained again (another model, or no stored update: trained again; an
update of a release that did not record its model counts as made from the announced one); each
coordinator attempt is answered once, only the newest one known, and delivery re-sends while its
receipt is missing; a new attempt gets the stored update once more; an update made under another
client id is never sent (the round is trained again).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from edge_client.delivery import Exchange, Key, PendingUpdate
from edge_client.store import ClientStore
from har_models.wire import codec

log = logging.getLogger("fedhar.client")

CONFIRMED_KEPT = 64
"""Exchanges whose confirming attempt is remembered (the newest)."""


@dataclass(frozen=True)
class StoredUpdate:
    """The update the store holds: its exchange and the transfer id of the model it was trained from ("" unknown)."""

    key: Key
    trained_on: str


class Answers:
    """The device's answers to rounds (see the module docstring); :attr:`stored`: the update the store holds and this
    client id made, or None."""

    def __init__(self, store: ClientStore, client_id: str):
        self._store = store
        self._cid = client_id
        self.stored: StoredUpdate | None = None
        self._confirmed: OrderedDict[Key, str] = OrderedDict()  # exchange -> the attempt whose receipt accepted its update
        last = self._own()
        if last is not None:
            info = last[0]
            self.stored = StoredUpdate((info["run_id"], info["round"], info["stage"]), str(info.get("trained_on", "")))

    def holds(self, key: Key, transfer: str) -> bool:
        """Whether the stored update answers exchange ``key`` announced with the model ``transfer``."""
        s = self.stored
        return s is not None and s.key == key and (not s.trained_on or not transfer or s.trained_on == transfer)

    def keep(self, key: Key, trained_on: str, envelope: bytes) -> None:
        """Store ``envelope``, the update of exchange ``key`` trained from the model ``trained_on`` (StateFolderUnusable
        from the store); it answers from now on."""
        self._store.save_last_update(key[0], key[1], key[2], envelope, trained_on=trained_on)
        self.stored = StoredUpdate(key, trained_on)

    def envelope(self) -> tuple[Key, bytes] | None:
        """The stored update as ``(key, bytes)`` for sending; None (and forgotten) if it is gone or another client id made it."""
        last = self._own()
        if last is None:
            self.stored = None
            return None
        return (last[0]["run_id"], last[0]["round"], last[0]["stage"]), last[1]

    def due(self, exchange: Exchange, pending: PendingUpdate | None, now_unix: float, deadline_unix: float) -> bool:
        """Whether the stored update goes to ``exchange`` now (its holder checked :meth:`holds`): not while on its way to
        this attempt, not to an attempt whose receipt accepted it, not past the round's deadline."""
        if pending is not None and pending.exchange.key == exchange.key and pending.exchange.attempt == exchange.attempt:
            return False
        if self._confirmed.get(exchange.key) == exchange.attempt:
            return False
        return not (deadline_unix and now_unix > deadline_unix)

    def confirmed(self, pending: PendingUpdate) -> None:
        """The coordinator's receipt accepted ``pending``: its attempt is answered."""
        self._confirmed[pending.exchange.key] = pending.exchange.attempt
        self._confirmed.move_to_end(pending.exchange.key)
        while len(self._confirmed) > CONFIRMED_KEPT:
            self._confirmed.popitem(last=False)

    def _own(self) -> tuple[dict[str, Any], bytes] | None:
        """The store's last update, if this client id made it; None if there is none or another id made it."""
        last = self._store.load_last_update()
        if last is None:
            return None
        try:
            made_by = codec.peek_header(last[1]).get("client_id")
        except codec.EnvelopeError:
            made_by = None
        if made_by != self._cid:
            log.warning("[%s] the stored update of round %s was made by %r, not this client id: not sent again; "
                        "the round is trained again", self._cid, last[0].get("round"), made_by)  # fmt: skip
            return None
        return last
