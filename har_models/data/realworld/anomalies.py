"""Irregularities of the raw REALWORLD data: the record kept of each, and the timestamp checks.

Every anomaly the loader meets is recorded once as an :class:`Anomaly` (kind, where, file,
what was done) and logged through the ``har_models.data.realworld`` logger: kinds that lose
data (:data:`WARNING_KINDS`) as warnings, the others as info.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("har_models.data.realworld")

WARNING_KINDS = frozenset(
    {
        "missing_archive",
        "missing_recording",
        "missing_sensor",
        "corrupt_archive",
        "corrupt_member",
        "bad_header",
        "bad_time_unit",
        "malformed_rows",
        "empty",
        "no_overlap",
        "ambiguous_csv",
    }
)
"""Anomaly kinds that lose data; they are logged as warnings, the others as info."""


@dataclass(frozen=True)
class Anomaly:
    """One irregularity of the raw data met during a load, and what the loader did about it.

    Parameters
    ----------
    kind : str
        Category, e.g. ``"multipart"`` or ``"malformed_rows"`` (package docstring lists all).
    where : str
        ``proband{k}/{activity}[/{position}][/part{i}]``: what the anomaly concerns.
    file : str
        File relative to the dataset root; ``!`` separates an archive from a member, e.g.
        ``proband4/data/acc_climbingup_csv.zip!acc_climbingup_2_csv.zip!acc_climbingup_2_chest.csv``.
    action : str
        What was found and what was done, one sentence.
    """

    kind: str
    where: str
    file: str
    action: str

    def __str__(self) -> str:
        return f"REALWORLD {self.kind} at {self.where} ({self.file}): {self.action}"


@dataclass
class Report:
    """Collects anomalies in the order met; logs each (kind, where, file) once."""

    anomalies: list[Anomaly] = field(default_factory=list)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)

    def add(self, kind: str, where: str, file: str, action: str) -> None:
        """Record (and log) an anomaly unless the same kind was already recorded for ``where`` and ``file``."""
        if (kind, where, file) in self._seen:
            return
        self._seen.add((kind, where, file))
        a = Anomaly(kind, where, file, action)
        self.anomalies.append(a)
        log.log(logging.WARNING if kind in WARNING_KINDS else logging.INFO, "%s", a)


def stamp_problems(t_ns: np.ndarray, reorder_ns: int, max_gap_ns: int) -> list[tuple[str, str]]:
    """Duplicated, out-of-order and gapped stamps of one stream, as the resampler will treat them.

    Mirrors the rules of :class:`~har_models.data.resample.Resampler` for a stream pushed in file
    order: a sample stamped ``reorder_ns`` or more behind the newest earlier one is late
    and dropped; of the rest, the first of equal stamps is kept; spacings over
    ``max_gap_ns`` are gaps. Not mirrored: the resampler takes 25 or more consecutive samples
    more than 1 s behind as a backward clock step (:mod:`har_models.data.clock`), which this
    report still counts as late.

    Parameters
    ----------
    t_ns : ndarray of shape (n,), int64
        Stamps in file order, ns.
    reorder_ns, max_gap_ns : int
        As in :class:`~har_models.data.realworld.RealWorldConfig`, ns.

    Returns
    -------
    list of (kind, action)
        ``duplicate_stamps``, ``out_of_order`` and ``gaps``, each only when present.
    """
    problems: list[tuple[str, str]] = []
    if t_ns.size < 2:
        return problems
    prev_max = np.maximum.accumulate(t_ns)[:-1]
    behind = np.r_[False, t_ns[1:] < prev_max]
    late = np.r_[False, t_ns[1:] + reorder_ns <= prev_max]
    kept = t_ns[~late]
    unique = np.unique(kept)
    n_dup = kept.size - unique.size
    n_behind, n_late = int(behind.sum()), int(late.sum())
    if n_dup:
        problems.append(("duplicate_stamps", f"{plural(n_dup, 'sample')} with a timestamp seen before; the first to arrive is kept"))
    if n_behind:
        problems.append(
            (
                "out_of_order",
                f"{plural(n_behind, 'sample')} stamped before an earlier row; {int((behind & ~late).sum())} re-sorted within the "
                f"{reorder_ns / 1e6:g} ms reorder horizon, {n_late} dropped as late",
            )
        )
    elif n_late:  # only equal stamps with reorder_ns == 0
        problems.append(("out_of_order", f"{plural(n_late, 'sample')} with the newest stamp again and no reorder horizon; dropped as late"))
    gaps = np.diff(unique)
    big = gaps[gaps > max_gap_ns]
    if big.size:
        problems.append(
            (
                "gaps",
                f"{plural(big.size, 'gap')} longer than {max_gap_ns / 1e6:g} ms (longest {big.max() / 1e9:.2f} s, "
                f"{big.sum() / 1e9:.1f} s in all); not interpolated, no window spans them",
            )
        )
    return problems


def plural(count: int, noun: str) -> str:
    """``"1 gap"``, ``"2 gaps"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
