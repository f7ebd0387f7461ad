"""Which rounds this device has answered, with what update, and when it sends that update again.

A device trains a round once and keeps the update it made, with the model it started from
(:meth:`edge_client.store.ClientStore.save_last_update`). The rules (docs/reliability.md, "Answering
a round"):

* A round announced with the model the stored update was trained from is answered with that
  update, never trained again. A round the store holds no update for, or announced with another
  model (a coordinator restored from a backup or rolled back, another epoch that aggregated
  differently), is trained again: a device never stays silent on a round it has done before.
  An update stored by a release that did not record its model counts as made from the announced one.
* Each coordinator attempt is answered once, and only the newest one the device knows of: the
  agent reads what queued up behind a training before it sends, so attempts that came and went
  while it trained get nothing. While the update's receipt is missing in the attempt it was sent
  for, delivery (:mod:`edge_client.delivery`) sends it again with back-off; a receipt ends that.
* A new attempt is a new question: the coordinator runs a round again after it closed without
  quorum, or after it restarted, and forgets what the closed attempt counted, so the stored update
  goes once to each attempt whose receipt the device does not hold. A coordinator that keeps what
  it counted and re-opens the round under the same attempt gets nothing twice.
* An update made under another client id (a state folder kept across a rename) is never sent: the
  coordinator refuses it; the round is trained again.
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
    """The device's answers to rounds (see the module docstring).

    Parameters
    ----------
    store : ClientStore
    client_id : str

    Attributes
    ----------
    stored : StoredUpdate or None
        The update the store holds and this client id made; None if none.
    """

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
        """Store ``envelope``, the update of exchange ``key`` trained from the model ``trained_on`` (it answers from now on).

        Raises
        ------
        StateFolderUnusable
            From the store, when it cannot be written.
        """
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
        """Whether the stored update goes to ``exchange`` now (its holder checked :meth:`holds`).

        Not while it is on its way to this attempt (delivery re-sends it while its receipt is
        missing), not to an attempt whose receipt accepted it, not past the round's deadline.
        """
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
