"""What the status site keeps of the round records, folded one record at a time.

One :class:`RoundFold` is built over every record when the page starts, then takes each new record
(:meth:`RoundFold.add`, O(1) apart from per-device entries), so a request costs the same at round 10
as at 100,000. It keeps only what the site shows: the ``/metrics`` totals, each device's rounds and
newest figures, architecture change points, chart series, per-round model quality, rejections by
device and reason, and the quality guard's decisions.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.record import GuardNote, Metrics, RoundRecord
from coordinator.server.metrics import RoundTotals
from coordinator.server.web.series import RoundSeries


class Took:
    """A device's rounds in the round records: how many, and its newest ``(round, accuracy, macro-F1)``."""

    __slots__ = ("last", "rounds")

    def __init__(self) -> None:
        self.rounds = 0
        self.last: tuple[int, float | None, float | None] | None = None

    def add(self, round_: int, accuracy: float | None, macro_f1: float | None) -> None:
        self.rounds += 1
        self.last = (round_, accuracy, macro_f1)


@dataclass(frozen=True)
class Measured:
    """One measure of a round's record as the site shows it: accuracy and macro-F1 (None where not finite), devices, test windows."""

    accuracy: float | None
    macro_f1: float | None
    devices: int
    windows: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"accuracy", "macro_f1", "devices", "windows"}``."""
        return {"accuracy": self.accuracy, "macro_f1": self.macro_f1, "devices": self.devices, "windows": self.windows}


def measured(m: Metrics | None, per_device: Mapping[str, Metrics] | None = None) -> Measured | None:
    """``m`` (and the per-device figures it is the mean of) as :class:`Measured`; None without ``m``."""
    if m is None:
        return None
    per = per_device or {}
    ns = [d.n for d in per.values() if d.n is not None]
    windows = sum(ns) if ns else m.n
    devices = len(per) if per else (m.clients if m.clients is not None else 1)
    return Measured(_finite(m.accuracy), _finite(m.macro_f1), devices, windows)


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


@dataclass(frozen=True)
class RoundQuality:
    """What one round's record says about models: the devices' start measure (the previous round's shared
    model), the global model on a union test set (None in a deployment), and the personalisation mean.
    """

    start: Measured | None
    global_: Measured | None
    personalisation: Measured | None


@dataclass(frozen=True)
class GuardDecision:
    """The quality guard's decision in one round and its evidence: devices and test windows of the start
    measures compared (from the guard's note, or the round's start measure in older records).
    """

    round: int
    note: GuardNote
    devices: int | None
    windows: int | None


@dataclass
class RoundFold:
    """Everything the site keeps of the records (module docstring); :meth:`add` one record at a time, in round order."""

    totals: RoundTotals = field(default_factory=RoundTotals)
    took: dict[str, Took] = field(default_factory=dict)
    arch: list[tuple[int, int]] = field(default_factory=list)
    series: RoundSeries = field(default_factory=RoundSeries)
    quality: dict[int, RoundQuality] = field(default_factory=dict)
    rejected: dict[str, Counter[str]] = field(default_factory=dict)
    guard: GuardDecision | None = None
    rolled_back: set[int] = field(default_factory=set)
    last: int = -1
    last_updates: int = 0

    def add(self, rec: RoundRecord) -> None:
        """Fold the newest completed round ``rec``."""
        self.last, self.last_updates = rec.round, rec.participation.updates
        self.totals.add(rec)
        self.series.add(rec)
        ev = rec.evaluation
        for cid, m in ev.personalisation_clients.items():
            self.took.setdefault(cid, Took()).add(rec.round, m.accuracy, m.macro_f1)
        if not self.arch or self.arch[-1][1] != rec.arch.version:
            self.arch.append((rec.round, rec.arch.version))
        self.quality[rec.round] = RoundQuality(measured(ev.start, ev.start_clients), measured(ev.global_),
                                               measured(ev.personalisation, ev.personalisation_clients))  # fmt: skip
        for rej in rec.participation.rejections:
            self.rejected.setdefault(rej.client_id, Counter())[rej.reason] += rej.count
        if rec.guard is not None:
            start, note = self.quality[rec.round].start, rec.guard
            if note.devices or note.windows:  # the evidence the guard itself recorded
                self.guard = GuardDecision(rec.round, note, note.devices, note.windows)
            else:  # a record of an earlier release: the round's start measures
                self.guard = GuardDecision(rec.round, note, start.devices if start else None, start.windows if start else None)
            if rec.guard.action == "rollback":
                self.rolled_back.add(rec.guard.judged_round)

    def arch_at(self, round_: int) -> int | None:
        """The architecture version of completed round ``round_``'s model (None: not recorded)."""
        if round_ > self.last:
            return None
        i = bisect.bisect_right(self.arch, (round_, math.inf)) - 1
        return self.arch[i][1] if i >= 0 else None

    def best_round(self) -> int | None:
        """The guard's best version's round, as its newest decision names it (None: the guard never judged)."""
        return self.guard.note.to_round if self.guard is not None else None

    def version_quality(self, round_: int) -> dict[str, Measured | None]:
        """The quality of the version made in ``round_``: ``shared`` (the next round's start measure), ``global``, ``personalisation``."""
        q, after = self.quality.get(round_), self.quality.get(round_ + 1)
        return {"shared": after.start if after else None, "global": q.global_ if q else None,
                "personalisation": q.personalisation if q else None}  # fmt: skip


def version_rows(rows: Sequence[Mapping[str, Any]], fold: RoundFold, marks: Mapping[int, list[str]]) -> list[dict[str, Any]]:
    """The JSON of ``/api/versions``: each registry row with ``quality`` (:meth:`RoundFold.version_quality`) and ``marks``."""
    return [{**r, "quality": {k: m.to_json() if m is not None else None for k, m in fold.version_quality(int(r["round"])).items()},
             "marks": marks.get(int(r["version"]), [])} for r in rows]  # fmt: skip
