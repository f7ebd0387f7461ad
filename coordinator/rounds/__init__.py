"""Round policies and the parts the runner composes: one module each, one place that puts them together.

============  =========================================================  ==============================
module        what it decides                                             settings table
============  =========================================================  ==============================
``base``      synchronous rounds (the default): select ``fraction``,     (top level: ``min_clients``,
              wait for every selected device, quorum ``min_clients``      ``fraction``)
``cohort``    a cohort for a goal count, close at the goal, pace          ``[cohort]``
``buffered``  FedBuff: close at K updates, fold updates of earlier        ``[buffer]``
              versions in with weight 1/sqrt(1 + tau)
``guarded``   the quality guard, a strategy wrapper: clip outliers,       ``[guard]``
              roll back a version that fell below the best
============  =========================================================  ==============================

:func:`compose` is the one place that reads which of them a federation uses (as Home Assistant sets an
integration up in one place): the runner and the grid only call the parts it hands them. A new round
policy is one new module (a :class:`~coordinator.rounds.base.RoundPolicy` subclass with its settings
table) and its name in :data:`POLICIES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.rounds.base import NO_STEERING, Batch, Late, RoundPolicy, Steering, select_clients
from coordinator.rounds.buffered import BufferedRounds
from coordinator.rounds.cohort import CohortRounds
from coordinator.rounds.guarded import GuardedStrategy
from coordinator.strategies import Strategy, make_strategy

if TYPE_CHECKING:
    from coordinator.state import RunState

POLICIES: tuple[type[RoundPolicy], ...] = (BufferedRounds, CohortRounds)
"""The round policies other than synchronous rounds; at most one applies to a federation (the settings refuse two)."""


@dataclass(frozen=True)
class Parts:
    """What a federation's rounds are made of: the round policy and the (possibly wrapped) strategy."""

    policy: RoundPolicy
    strategy: Strategy


def policy_of(cfg: Any) -> RoundPolicy:
    """The round policy the federation settings ``cfg`` (a :class:`coordinator.config.CoordinatorConfig`) ask for:
    synchronous rounds unless a policy's settings turn it on."""
    for cls in POLICIES:
        if cls.applies(cfg):
            return cls(cfg)
    return RoundPolicy(cfg)


def compose(cfg: Any, state: RunState) -> Parts:
    """The parts of the federation ``cfg`` (a :class:`coordinator.config.CoordinatorConfig`) describes, whose run state is
    ``state``: its round policy, and its strategy, wrapped by the quality guard when ``[guard] enabled``."""
    policy = policy_of(cfg)
    strategy = make_strategy(cfg.aggregation, cfg.strategies)
    if cfg.guard.enabled:
        strategy = GuardedStrategy(strategy, cfg.guard, state, policy.quorum)
    return Parts(policy, strategy)


__all__ = ["NO_STEERING", "POLICIES", "Batch", "BufferedRounds", "CohortRounds", "GuardedStrategy", "Late", "Parts",
           "RoundPolicy", "Steering", "compose", "policy_of", "select_clients"]
