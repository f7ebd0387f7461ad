"""Which devices harm the shared model: clipped updates, rejected messages and quarantine, per device; and the stored
objects devices found damaged.

Sources in the run folder: the events ``clipped_update`` (the quality guard scaled an update down),
``quarantined`` and ``released`` (detail: the reason), ``bad_object`` (a device refused a downloaded object whose bytes
did not match its SHA-256; detail: the hash, then what the coordinator did) and the round records' ``rejections``. A device
is quarantined while its newest of those two events is ``quarantined``. :func:`harm_by_device` folds
rows (pure); :func:`device_harm` reads a run's database, so the page and ``devices`` count the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CLIPPED = "clipped_update"
"""Event kind of an update the quality guard clipped."""

QUARANTINED = "quarantined"
RELEASED = "released"
"""Event kinds of a device left out of aggregation, and of its release (the detail says why)."""

BAD_OBJECT = "bad_object"
"""Event kind of a device's report of a damaged stored object (written by the grid)."""

EVENT_KINDS = (CLIPPED, QUARANTINED, RELEASED, BAD_OBJECT)


@dataclass(frozen=True)
class DeviceHarm:
    """What one device did to the shared model: clipped updates, rejections by reason, and its quarantine reason and round (or None);
    and ``bad_objects``, how many damaged stored objects it reported (the store's fault, not the device's)."""

    clipped: int = 0
    rejected: Mapping[str, int] = field(default_factory=dict)
    quarantine: str | None = None
    quarantine_round: int | None = None
    bad_objects: int = 0

    @property
    def rejected_total(self) -> int:
        """All its rejected messages."""
        return sum(self.rejected.values())

    def to_json(self) -> dict[str, Any]:
        """``{"clipped", "rejected", "rejected_by_reason", "quarantined", "quarantine_reason", "quarantine_round", "bad_objects"}``."""
        return {"clipped": self.clipped, "rejected": self.rejected_total, "rejected_by_reason": dict(sorted(self.rejected.items())),
                "quarantined": self.quarantine is not None, "quarantine_reason": self.quarantine,
                "quarantine_round": self.quarantine_round, "bad_objects": self.bad_objects}  # fmt: skip


NO_HARM = DeviceHarm()


def harm_by_device(events: Iterable[tuple[int | None, str | None, str, str]],
                   rejected: Mapping[str, Mapping[str, int]]) -> dict[str, DeviceHarm]:  # fmt: skip
    """Each device with something to report, from event rows (round, client, kind, detail; oldest first) and rejection counts."""
    clipped: dict[str, int] = {}
    bad: dict[str, int] = {}
    quarantine: dict[str, tuple[str, int | None] | None] = {}
    for round_, client, kind, detail in events:
        if client is None:
            continue
        if kind == CLIPPED:
            clipped[client] = clipped.get(client, 0) + 1
        elif kind == BAD_OBJECT:
            bad[client] = bad.get(client, 0) + 1
        elif kind == QUARANTINED:
            quarantine[client] = (detail or "no reason recorded", round_)
        elif kind == RELEASED:
            quarantine[client] = None
    out = {}
    for cid in sorted(set(clipped) | set(quarantine) | set(rejected) | set(bad)):
        q = quarantine.get(cid)
        out[cid] = DeviceHarm(clipped.get(cid, 0), dict(rejected.get(cid, {})), q[0] if q else None, q[1] if q else None,
                              bad.get(cid, 0))  # fmt: skip
    return out


def damaged_objects(events: Iterable[tuple[int | None, str | None, str, str]]) -> dict[str, int]:
    """Stored object (SHA-256 hex) -> how many device reports found its bytes damaged, from ``bad_object`` event rows."""
    out: dict[str, int] = {}
    for _, _, kind, detail in events:
        if kind == BAD_OBJECT and detail:
            sha = detail.split()[0]
            out[sha] = out.get(sha, 0) + 1
    return out


def harm_events(run_state: Any) -> list[tuple[int | None, str | None, str, str]]:
    """The event rows :func:`harm_by_device` reads, oldest first, from a RunState; StateDamaged if unreadable."""
    rows = list(run_state.events((CLIPPED, BAD_OBJECT)))
    if run_state.count_events(QUARANTINED) or run_state.count_events(RELEASED):
        # which of a device's quarantine events is the newest is their order in the table: read them in it
        rows += [r for r in run_state.events() if r[2] in (QUARANTINED, RELEASED)]
    return rows


def device_harm(run_state: Any) -> dict[str, DeviceHarm]:
    """Each device's :class:`DeviceHarm` in a run from its events and every record's rejections (O(rounds)); StateDamaged."""
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
