"""The rows :class:`coordinator.server.registry.Registry` returns: devices, model versions, participation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DeviceState = Literal["enrolled", "revoked", "forgotten"]


@dataclass(frozen=True)
class DeviceRow:
    """One device of the registry.

    ``enrolled_unix``, ``revoked_unix``, ``forgotten_unix`` are UNIX times in seconds (None when
    that has not happened); ``state`` is the latest of them; ``renamed_to`` is the name a renamed
    device carries now (its old name is revoked).
    """

    name: str
    owner: str | None
    enrolled_unix: float
    revoked_unix: float | None
    forgotten_unix: float | None
    state: DeviceState
    renamed_to: str | None = None


@dataclass(frozen=True)
class VersionRow:
    """One kept model version: ``version`` (1, 2, ...), the round (0-based) whose global model it is,
    when it was written (UNIX s), the architecture version, the file, and the round's figures
    (e.g. ``{"personalisation_accuracy": 0.71, ...}``; releases before wrote ``personalization_*``:
    read them through :func:`coordinator.server.figures.read_figures`)."""

    version: int
    round: int
    created_unix: float
    arch_version: int
    path: Path
    figures: dict[str, Any]


@dataclass(frozen=True)
class ParticipationRow:
    """Device ``name`` contributed to round ``round`` (0-based) at ``t`` (UNIX s) with these local figures (0..1 or None)."""

    name: str
    round: int
    t: float
    accuracy: float | None
    macro_f1: float | None


@dataclass(frozen=True)
class ParticipationSummary:
    """A device's participation in short: ``rounds`` contributed to, its newest contribution's time
    ``last_t`` (UNIX s) and its newest row ``last``."""

    rounds: int
    last_t: float
    last: ParticipationRow
