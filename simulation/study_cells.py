"""The study's cells and what every cell shares: the types the grid (:mod:`simulation.study`)
runs and the report (:mod:`simulation.study_report`) reads, so neither imports the other's
internals."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.record import MEASURES

__all__ = ["BASELINES", "MEASURES", "Cell", "StudySettings", "finished"]  # MEASURES: coordinator.record's, re-exported

BASELINES = ("centralised", "local-only")
"""Cells that are baselines (``fedhar-baseline MODE``), not federations."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a split, a strategy (or a baseline) and a seed."""

    split: str
    strategy: str
    seed: int

    def folder(self, out: Path) -> Path:
        """``OUT/<split>/<strategy>/seed<k>``."""
        return out / self.split / self.strategy / f"seed{self.seed}"


def finished(folder: Path) -> dict[str, Any] | None:
    """The report of a finished cell, else None.

    Finished means: ``report.json`` has its final figures and wall time, and a federated
    run has every round its configuration asked for. A simulation stopped by a signal also
    writes its report with a wall time, after fewer rounds; that cell is not finished.
    """
    path = folder / "report.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not doc.get("final") or doc.get("wall_seconds") is None:
        return None
    planned = (doc.get("config") or {}).get("rounds")
    if isinstance(planned, int) and len(doc.get("rounds") or []) < planned:
        return None
    return doc


_FED = CoordinatorConfig(run_dir=Path("."))
"""The federation's defaults, which a study's cells share unless told otherwise."""


@dataclass(frozen=True)
class StudySettings:
    """What every cell shares.

    Parameters
    ----------
    rounds, local_epochs : int
        Federated rounds and local epochs (baselines train ``rounds * local_epochs`` epochs).
    lr : float
        Client (and baseline) SGD learning rate.
    conv_filters, dense_units : int
        CNN widths.
    clients : int
        First N subjects (0 = all).
    dataset : {"hapt", "realworld"}
    data : Path or None
        Dataset location (default: the committed HAPT).
    split_seed : int
        Seed of every split.
    extra : tuple of str
        Further ``fedhar-simulate`` options, given to every federated cell.
    """

    rounds: int = _FED.rounds
    local_epochs: int = _FED.training.local_epochs
    lr: float = _FED.training.lr
    conv_filters: int = _FED.model.conv_filters
    dense_units: int = _FED.model.dense_units
    clients: int = 0
    dataset: str = "hapt"
    data: Path | None = None
    split_seed: int = _FED.evaluation.split_seed
    extra: tuple[str, ...] = ()

    def common(self) -> list[str]:
        """Options both ``fedhar-simulate`` and ``fedhar-baseline`` take."""
        out = ["--dataset", self.dataset, "--lr", str(self.lr), "--conv-filters", str(self.conv_filters),
               "--dense-units", str(self.dense_units), "--split-seed", str(self.split_seed)]
        if self.clients:
            out += ["--clients", str(self.clients)]
        if self.data is not None:
            out += ["--data", str(self.data)]
        return out
