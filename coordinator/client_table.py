"""The client table: each device's last status as read from ``{p}/client/<id>/status``, with presence.

One table serves every reader of client statuses: the coordinator's grid
(:class:`coordinator.mqtt_grid.MqttGrid`), the status page's read-only monitor
(:class:`coordinator.server.monitor.Monitor`) and the device commands' look at the broker
(``coordinator.server.devices_cli``). So a status is parsed, checked against its topic, aged and
told online or offline by one set of rules everywhere:

* an empty payload is a cleared retained status (a revoked or forgotten device): the device is
  forgotten;
* a payload that is not a valid :class:`~har_models.wire.messages.ClientStatus`, or one that
  names another client than its topic, raises :class:`~har_models.wire.messages.MessageError`
  and changes nothing;
* presence expires by :class:`coordinator.presence.Presence` (a status older than
  ``PRESENCE_PERIODS`` refresh periods counts as offline; an id used by two processes is never
  fresh);
* a device's last-seen time is the time its status carries, or its arrival when it carries none.

The table is a read-only mapping from client id to the status the coordinator acts on: the last
status received, except that an "offline" status (a last will, which says 0 windows) keeps the
fields of the status before it with the state set to offline, so what the device last reported
stays known. :meth:`ClientTable.latest` and :meth:`ClientTable.seen` give the status exactly as
received (with its arrival and last-seen time). The table holds no lock: each owner guards it as
it guards the rest of its state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from coordinator.presence import Presence
from har_models.wire.messages import ClientStatus, MessageError


@dataclass(frozen=True)
class Seen:
    """One device's last status exactly as received (an offline will included).

    Attributes
    ----------
    status : ClientStatus
    received_unix : float
        When it arrived (s since the epoch, the receiver's clock).
    """

    status: ClientStatus
    received_unix: float

    @property
    def last_seen_unix(self) -> float:
        """When the device last spoke (s since the epoch): the time its status carries, else its arrival (an older client)."""
        return self.status.sent_unix or self.received_unix


class ClientTable(Mapping[str, ClientStatus]):
    """Client statuses by id, with presence and last-seen times (see the module docstring).

    Parameters
    ----------
    presence : Presence, optional
        Freshness and identity of the statuses (default: a new :class:`Presence` with the
        protocol's ``PRESENCE_PERIODS``).
    """

    def __init__(self, presence: Presence | None = None):
        self.presence = Presence() if presence is None else presence
        self._known: dict[str, ClientStatus] = {}  # what the coordinator acts on (an offline will keeps the last fields)
        self._seen: dict[str, Seen] = {}  # as received, with its arrival

    # ------------------------------------------------------------------ Mapping
    def __getitem__(self, cid: str) -> ClientStatus:
        return self._known[cid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)

    # ------------------------------------------------------------------ writing
    def note(
        self, cid: str, payload: bytes, retained: bool = False, now: float | None = None, now_unix: float | None = None
    ) -> ClientStatus | None:
        """Take one message of ``cid``'s status topic as it arrived; returns the status, or None when it was cleared.

        Parameters
        ----------
        cid : str
            The client id of the topic the message came on.
        payload : bytes
            The message; empty for a cleared retained status (``cid`` is then forgotten).
        retained : bool
            Delivered on subscribing (aged from the time the status carries, not from now).
        now, now_unix : float, optional
            Monotonic and wall-clock time of arrival (s); default: the clocks now.

        Raises
        ------
        MessageError
            If the payload is not a valid client status, or names another client than ``cid``;
            the table is unchanged then.
        """
        if not payload:
            self.forget(cid)
            return None
        st = ClientStatus.from_bytes(bytes(payload))
        if st.client_id != cid:
            raise MessageError(f"a client status on the topic of {cid!r:.70} claims to be {st.client_id!r:.70}")
        now = time.monotonic() if now is None else now
        now_unix = time.time() if now_unix is None else now_unix
        self.presence.note(st, retained, now, now_unix)
        prev = self._known.get(cid)
        self._known[cid] = st if st.state != "offline" or prev is None else replace(prev, state="offline")
        self._seen[cid] = Seen(st, now_unix)
        return st

    def forget(self, cid: str) -> None:
        """Drop everything known of ``cid`` (its status was cleared, or it was revoked or forgotten)."""
        self._known.pop(cid, None)
        self._seen.pop(cid, None)
        self.presence.forget(cid)

    # ------------------------------------------------------------------ reading
    def seen(self) -> Mapping[str, Seen]:
        """Each known device's last status exactly as received, with its arrival and last-seen time (a read-only view)."""
        return MappingProxyType(self._seen)

    def latest(self, cid: str) -> ClientStatus | None:
        """``cid``'s last status exactly as received (an offline will included); None if unknown."""
        seen = self._seen.get(cid)
        return None if seen is None else seen.status

    def fresh(self, cid: str, now: float | None = None) -> bool:
        """True unless ``cid``'s last status expired or its id is used by two processes (``now``: monotonic s)."""
        return self.presence.fresh(cid, now)

    def online(self, cid: str, now: float | None = None) -> bool:
        """True if ``cid`` is known, its last status is not "offline" and it is fresh (``now``: monotonic s)."""
        st = self._known.get(cid)
        return st is not None and st.state != "offline" and self.presence.fresh(cid, now)
