"""Which devices harm the shared model: clipped updates, rejected messages and quarantine, per device.

Three sources, all in the run folder:

* the run's events (:meth:`coordinator.state.RunState.events`): a ``clipped_update`` event for each
  update the quality guard scaled down (:func:`coordinator.guard.oversized_updates`), and
  ``quarantined`` / ``released`` events, each naming the device and, in its detail, the reason;
* the round records' ``rejections`` (client id, reason, count): messages the coordinator refused.

A device is quarantined while its newest ``quarantined``/``released`` event is ``quarantined``.
:func:`harm_by_device` folds given rows (pure); :func:`device_harm` reads a run folder's database,
for the status page and for ``fedhar-coordinator devices`` alike, so both count the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CLIPPED = "clipped_update"
"""Event kind of an update the quality guard clipped (coordinator/runner.py writes it)."""

QUARANTINED = "quarantined"
RELEASED = "released"
"""Event kinds of a device left out of aggregation, and of its release (the detail says why)."""

EVENT_KINDS = (CLIPPED, QUARANTINED, RELEASED)


@dataclass(frozen=True)
class DeviceHarm:
    """What one device did to the shared model, as the run recorded it.

    Attributes
    ----------
    clipped : int
        Its updates the quality guard clipped (``clipped_update`` events).
    rejected : dict reason -> int
        Its messages the coordinator rejected, by reason code (the records' ``rejections``).
    quarantine : str or None
        While it is quarantined (its newest quarantine event is ``quarantined``): that event's
        reason; None when it is not.
    quarantine_round : int or None
        The round of that event.
    """

    clipped: int = 0
    rejected: Mapping[str, int] = field(default_factory=dict)
    quarantine: str | None = None
    quarantine_round: int | None = None

    @property
    def rejected_total(self) -> int:
        """All its rejected messages."""
        return sum(self.rejected.values())

    def to_json(self) -> dict[str, Any]:
        """``{"clipped", "rejected", "rejected_by_reason", "quarantined", "quarantine_reason", "quarantine_round"}``."""
        return {"clipped": self.clipped, "rejected": self.rejected_total, "rejected_by_reason": dict(sorted(self.rejected.items())),
                "quarantined": self.quarantine is not None, "quarantine_reason": self.quarantine,
                "quarantine_round": self.quarantine_round}  # fmt: skip


NO_HARM = DeviceHarm()


def harm_by_device(events: Iterable[tuple[int | None, str | None, str, str]],
                   rejected: Mapping[str, Mapping[str, int]]) -> dict[str, DeviceHarm]:  # fmt: skip
    """Each device's :class:`DeviceHarm` from event rows and rejection counts.

    Parameters
    ----------
    events : iterable of (round, client, kind, detail)
        The run's event rows, oldest first (``RunState.events`` order); kinds other than
        :data:`EVENT_KINDS` and rows without a client are ignored.
    rejected : mapping client id -> (reason -> count)
        The records' rejections summed per device.

    Returns
    -------
    dict client id -> DeviceHarm
        Only devices with something to report.
    """
    clipped: dict[str, int] = {}
    quarantine: dict[str, tuple[str, int | None] | None] = {}
    for round_, client, kind, detail in events:
        if client is None:
            continue
        if kind == CLIPPED:
            clipped[client] = clipped.get(client, 0) + 1
        elif kind == QUARANTINED:
            quarantine[client] = (detail or "no reason recorded", round_)
        elif kind == RELEASED:
            quarantine[client] = None
    out = {}
    for cid in sorted(set(clipped) | set(quarantine) | set(rejected)):
        q = quarantine.get(cid)
        out[cid] = DeviceHarm(clipped.get(cid, 0), dict(rejected.get(cid, {})), q[0] if q else None, q[1] if q else None)
    return out


def harm_events(run_state: Any) -> list[tuple[int | None, str | None, str, str]]:
    """The event rows :func:`harm_by_device` reads, oldest first, from a :class:`coordinator.state.RunState`.

    Raises
    ------
    coordinator.state.StateDamaged
        If the run's database cannot be read.
    """
    rows = list(run_state.events(CLIPPED))
    if run_state.count_events(QUARANTINED) or run_state.count_events(RELEASED):
        # which of a device's quarantine events is the newest is their order in the table: read them in it
        rows += [r for r in run_state.events() if r[2] in (QUARANTINED, RELEASED)]
    return rows


def device_harm(run_state: Any) -> dict[str, DeviceHarm]:
    """Each device's :class:`DeviceHarm` in a run: its events and every round record's rejections.

    What ``fedhar-coordinator devices`` shows beside the status page, from the same sources:
    ``device_harm(RunState(data / "run"))``. Reads every record (O(rounds)); the page keeps the
    rejections folded instead (:class:`coordinator.server.web.fold.RoundFold`).

    Raises
    ------
    coordinator.state.StateDamaged
        If the run's database cannot be read.
    """
    from coordinator.record import RecordError, RoundRecord

    rejected: dict[str, dict[str, int]] = {}
    for row in run_state.rounds():
        try:
            rec = RoundRecord.from_json(row)
        except RecordError:
            continue
        for rej in rec.participation.rejections:
            per = rejected.setdefault(rej.client_id, {})
            per[rej.reason] = per.get(rej.reason, 0) + rej.count
    return harm_by_device(harm_events(run_state), rejected)
