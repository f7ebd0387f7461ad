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
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec
from har_models.wire.pace import Pace

if TYPE_CHECKING:
    from coordinator.config import CoordinatorConfig
    from coordinator.exchange import Exchange
    from coordinator.strategies import Federation


def _nobody() -> Set[str]:
    return frozenset()


def _none_awaited(present: Callable[[str], bool]) -> int:
    return 0


@dataclass(frozen=True)
class Steering:
    """What the grid applies to a round's main exchange beyond the plan (from :meth:`RoundPolicy.steering`).

    Attributes
    ----------
    close_at : int, optional
        The exchange is complete once this many devices contributed (a valid update of this exchange,
        or one the policy holds, ``held``); None: only when every selected device answered or went offline.
    pace : Pace, optional
        Carried by the round's announcements (pace steering; None: left out).
    unanswered : str
        The failure reason of a selected device that had not answered when the exchange closed at ``close_at``.
    held : callable () -> set of str
        Devices whose update the policy holds for this round from elsewhere (FedBuff's updates of earlier
        versions): they count towards ``close_at``.
    awaiting : callable (present) -> int
        Devices the policy still waits for beyond the selected ones (FedBuff's devices training an earlier
        version), given ``present(cid)``, the grid's word on whether a device is still there; while any is
        awaited, an exchange whose selected devices all answered stays open (for ``close_at`` or the deadline).
    late_rounds : int
        For how many rounds after the exchange closes its devices may still deliver (FedBuff's staleness
        bound): their upload slots stay open that long.
    """

    close_at: int | None = None
    pace: Pace | None = None
    unanswered: str = "missed_deadline"
    held: Callable[[], Set[str]] = _nobody
    awaiting: Callable[[Callable[[str], bool]], int] = _none_awaited
    late_rounds: int = 0


NO_STEERING = Steering()
"""An exchange that waits for every selected device (or its deadline), with no pace in its announcements."""


@dataclass(frozen=True)
class Late:
    """What an update for an exchange other than the open one is to the round policy (:meth:`RoundPolicy.late`).

    Attributes
    ----------
    round : int
        The round (model version) the update was made for.
    spec : ArchSpec, optional
        The architecture it must have; None for an update that is no fault but not needed (it is counted
        with the duplicates, unread).
    reference : mapping, optional
        The model it was made from (int8_delta updates are deltas against it).
    take : callable, optional
        Hands the validated update to the policy.
    """

    round: int
    spec: ArchSpec | None = None
    reference: Any = None
    take: Callable[[ClientUpdate], None] | None = None

    @property
    def harmless(self) -> bool:
        """True for an update the policy does not want, but that is no fault of its device."""
        return self.take is None


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
    cfg : CoordinatorConfig
        ``min_clients``, ``fraction`` and ``seed`` are read here.
    """

    name: ClassVar[str] = "synchronous"

    def __init__(self, cfg: CoordinatorConfig):
        self.cfg = cfg

    @classmethod
    def applies(cls, cfg: CoordinatorConfig) -> bool:
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
