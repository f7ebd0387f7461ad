"""The round policy interface and synchronous rounds, the default policy.

A round policy decides what the runner (:class:`coordinator.runner.FederationRunner`) leaves open:
who a round selects, the quorum it needs, when its main exchange may close before every selected
device answered (:class:`Steering`, which the grid applies), what an update for another exchange
than the open one is worth (:meth:`RoundPolicy.late`, which the update intake asks), and which
updates the strategy aggregates when the round closes (:meth:`RoundPolicy.batch`). Each policy owns
its state and its settings table; :func:`coordinator.rounds.compose` picks one from the settings.

:class:`RoundPolicy` itself is synchronous rounds (McMahan et al., AISTATS 2017, Algorithm 1):
``max(min_clients, ceil(fraction x eligible))`` devices drawn with the run's seeded generator
(:func:`select_clients`), an exchange that waits for every selected device or its deadline, the
quorum ``min_clients``, and no use for an update of an exchange that already closed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from coordinator.exchange import NO_STEERING, Exchange, Late, Steering
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec

if TYPE_CHECKING:
    from coordinator.strategies import Federation

__all__ = ["NO_STEERING", "Batch", "FederationSettings", "Late", "RoundPolicy", "Steering", "select_clients"]


class FederationSettings(Protocol):
    """What a round policy reads of the federation's settings (a :class:`coordinator.config.CoordinatorConfig`)."""

    @property
    def min_clients(self) -> int: ...

    @property
    def fraction(self) -> float: ...

    @property
    def seed(self) -> int: ...


@dataclass(frozen=True)
class Batch:
    """The updates a closed round aggregates (:meth:`RoundPolicy.batch`).

    Attributes
    ----------
    results : list of ClientUpdate
        What the strategy aggregates, ordered by client id.
    trained : list of ClientUpdate
        The models as the clients sent them (the round's evaluation), ordered by client id.
    stale : dict client id -> int
        Updates of earlier versions among ``results``, with how many versions behind they were.
    extra : list of ClientUpdate
        Updates in ``results`` that did not come through the round's exchange (their bytes count in its traffic).
    """

    results: list[ClientUpdate]
    trained: list[ClientUpdate]
    stale: dict[str, int] = field(default_factory=dict)
    extra: list[ClientUpdate] = field(default_factory=list)


def select_clients(eligible: Sequence[str], round_: int, min_clients: int, fraction: float, seed: int,
                   cap: int = 0) -> list[str]:  # fmt: skip
    """The clients selected for round ``round_``, sorted.

    All eligible clients when ``fraction`` covers them (FedDist: C = 1); otherwise
    max(min_clients, ceil(fraction * n)) drawn without replacement by a generator seeded
    with (seed, round), so a resumed run selects the same clients. ``cap`` > 0 (a cohort
    goal) bounds that count from above, never below ``min_clients``: the same seeded draw,
    of fewer. Empty below ``min_clients`` (the quorum).
    """
    eligible = sorted(eligible)
    if len(eligible) < min_clients:
        return []
    k = max(min_clients, math.ceil(fraction * len(eligible)))
    if cap > 0:
        k = max(min_clients, min(k, cap))
    if k >= len(eligible):
        return eligible
    rng = np.random.default_rng([seed, round_])
    return sorted(rng.choice(eligible, size=k, replace=False).tolist())


class RoundPolicy:
    """Synchronous rounds (see the module docstring); the base every round policy refines.

    Parameters
    ----------
    cfg : FederationSettings
        ``min_clients``, ``fraction`` and ``seed`` are read here.
    """

    name: ClassVar[str] = "synchronous"

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        """Whether ``cfg``'s settings turn this policy on (synchronous rounds: the fallback, never asked)."""
        return False

    @property
    def quorum(self) -> int:
        """Updates with training windows a round needs to change the model."""
        return self.cfg.min_clients

    def select(self, eligible: Sequence[str], round_: int) -> list[str]:
        """The devices round ``round_`` hands the model to (sorted); empty when too few are eligible."""
        return select_clients(eligible, round_, self.quorum, self.cfg.fraction, self.cfg.seed)

    @property
    def versions_needed(self) -> int:
        """How many versions before the newest the policy may need after a restart (the run folder keeps them)."""
        return 0

    def busy(self) -> bool:
        """True while devices the policy waits for may still make a round worth opening with nobody selected."""
        return False

    def steering(self, now_unix: float, period_s: float, present: int, selected: int) -> Steering:
        """The steering of a round opening at ``now_unix`` (period ``period_s`` since the last opening) with
        ``present`` eligible and ``selected`` selected devices."""
        return NO_STEERING

    def late(self, cid: str, round_: int, stage: int) -> Late | None:
        """What an update of this run from ``cid`` for exchange (``round_``, ``stage``), not the open one, is worth.

        None: nothing (the intake rejects it as ``stale_round``).
        """
        return None

    def closed(self, ex: Exchange, fed: Federation) -> None:
        """The main exchange ``ex`` of a round closed (before aggregation; also when the round then fails)."""

    def batch(self, ex: Exchange, round_: int, spec: ArchSpec, received: Any) -> Batch:
        """The updates round ``round_`` aggregates: here the exchange's valid updates.

        ``spec`` and ``received`` are the architecture and global model the round handed out.
        """
        results = ex.results()
        return Batch(results, results)

    def completed(self) -> None:
        """The round aggregated its :meth:`batch` (a round that failed keeps what it held for the next attempt)."""

    def record(self) -> dict[str, Any]:
        """What the policy keeps across a restart (JSON; :meth:`restore` takes it back)."""
        return {}

    def restore(self, saved: dict[str, Any], models: Callable[[int], tuple[ArchSpec, Any] | None]) -> None:
        """Take back :meth:`record`'s output after a restart; ``models(round)`` gives a kept version's model."""
