"""Which clients are present, and whether one client id is used by two processes.

A retained "online" status outlives a revoked device (no will) or a lost will, so presence expires:
a status older than :data:`~har_models.wire.messages.PRESENCE_PERIODS` refresh periods counts as
offline (a live status aged from its arrival, a retained one from the time it carries). An instance
id that returns after another replaced it means two processes share the client id (an endless
session takeover): the id is quarantined and the conflict logged once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from har_models.wire.messages import PRESENCE_PERIODS, ClientStatus, fresh_until

log = logging.getLogger("fedhar.coordinator")


@dataclass
class _Seen:
    fresh_until: float | None  # monotonic time; None = no expiry (the client does not refresh)
    instances: list[str] = field(default_factory=list)  # in order of appearance


class Presence:
    """Freshness and identity of client statuses; a status older than ``periods * refresh_s`` counts as offline."""

    def __init__(self, periods: int = PRESENCE_PERIODS):
        self.periods = periods
        self._seen: dict[str, _Seen] = {}
        self.conflicts: dict[str, tuple[str, str]] = {}  # client id -> the two instances seen

    def note(self, st: ClientStatus, retained: bool, now: float | None = None, now_unix: float | None = None) -> None:
        """Record a status of ``st.client_id`` as it arrived (``retained``: delivered on subscribing)."""
        now = time.monotonic() if now is None else now
        now_unix = time.time() if now_unix is None else now_unix
        seen = self._seen.setdefault(st.client_id, _Seen(None))
        seen.fresh_until = fresh_until(st.sent_unix, st.refresh_s, retained, now, now_unix, self.periods)
        inst = st.instance
        if not inst:
            return
        if st.state == "offline" and inst in seen.instances:
            return  # the will of a replaced instance can arrive after its successor's status: harmless
        if seen.instances and inst != seen.instances[-1] and inst in seen.instances and st.client_id not in self.conflicts:
            # An instance that another replaced came back: two live processes share this id.
            self.conflicts[st.client_id] = (seen.instances[-1], inst)
            log.error(
                "another device or federation uses the id %s on this broker (two processes, instances %s and %s): the "
                "broker keeps disconnecting one for the other. The id takes no further part in this run; give each "
                "device its own client id (and its own credentials) and restart them",
                st.client_id,
                seen.instances[-1],
                inst,
            )
        if inst in seen.instances:
            seen.instances.remove(inst)
        seen.instances.append(inst)
        del seen.instances[:-8]

    def fresh(self, cid: str, now: float | None = None) -> bool:
        """True unless ``cid``'s last status has expired or its id is in conflict."""
        if cid in self.conflicts:
            return False
        seen = self._seen.get(cid)
        if seen is None or seen.fresh_until is None:
            return True
        return (time.monotonic() if now is None else now) < seen.fresh_until

    def forget(self, cid: str) -> None:
        """Drop what is known about ``cid`` (its retained status was cleared)."""
        self._seen.pop(cid, None)
