"""The client table: each device's last status as read from ``{p}/client/<id>/status``, with presence.

One table serves every reader of client statuses (the grid, the status page's monitor, the device
commands), so one set of rules applies everywhere: an empty payload is a cleared status (the device
is forgotten); an invalid status or one naming another client raises MessageError and changes
nothing; presence expires by :class:`coordinator.presence.Presence`. The mapping holds the status the
coordinator acts on: an "offline" will keeps the previous status's fields with the state offline.
:meth:`ClientTable.seen` gives statuses exactly as received. The owner guards the table with its own lock.
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
    """One device's last status exactly as received (an offline will included), with its arrival (UNIX s)."""

    status: ClientStatus
    received_unix: float

    @property
    def last_seen_unix(self) -> float:
        """When the device last spoke: the time its status carries, else its arrival (an older client)."""
        return self.status.sent_unix or self.received_unix


class ClientTable(Mapping[str, ClientStatus]):
    """Client statuses by id, with presence and last-seen times (see the module docstring)."""

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
        """Take one message of ``cid``'s status topic; the status, or None when it was cleared (empty payload).

        ``retained`` statuses are aged from the time they carry; ``now``/``now_unix`` (monotonic, wall s)
        default to the clocks. Raises MessageError (table unchanged) for an invalid status or another client's.
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
        """Each known device's last status exactly as received (a read-only view)."""
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
