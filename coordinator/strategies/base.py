"""The strategy interface: Flower's hooks, the model state they act on, and the persistence contract.

Flower's hooks (Beutel et al., arXiv 2007.14390): :meth:`Strategy.configure_fit` says what the
selected clients do, :meth:`Strategy.aggregate_fit` combines their results and sees the failures,
:meth:`Strategy.aggregate_intermediate` combines a FedDist intermediate exchange. Like a
``torch.optim`` optimiser, :meth:`Strategy.state_dict` / :meth:`Strategy.load_state_dict` carry
state between rounds, so the run folder persists any strategy the same way. Settings are a frozen
dataclass (:attr:`Strategy.settings_type`) under :attr:`Strategy.settings_table` of the configuration.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from coordinator.aggregation import State, weighted_average
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.model import ArchSpec
from har_models.wire.messages import TrainingPlan

if TYPE_CHECKING:
    from coordinator.record import GuardNote, RoundRecord

log = logging.getLogger("fedhar.coordinator.strategy")


@dataclass
class Federation:
    """The coordinator's model state between rounds.

    ``initial_spec`` is round 0's architecture (FedDist's caps are relative to it); ``global_state`` is G
    (or the shadow average under FedDWA, FedPer); ``personal`` holds P_i (clients without one receive G).
    """

    spec: ArchSpec
    initial_spec: ArchSpec
    global_state: State
    personal: dict[str, State] = field(default_factory=dict)


@dataclass(frozen=True)
class Aggregate:
    """Result of one aggregation: new G, the participants' new personalised models, FedDWA's P[j, i] ``(n, n)`` or None."""

    global_state: State
    personal: dict[str, State]
    mixing: torch.Tensor | None
    participants: list[str]


def contributors(updates: Sequence[ClientUpdate]) -> list[ClientUpdate]:
    """Updates with at least one training window (the others trained nothing); ValueError if none has one."""
    used = [u for u in updates if u.n_train > 0]
    if not used:
        raise ValueError("no update carries training windows (all n_train = 0); nothing to aggregate")
    return used


def fedavg_of(results: Sequence[ClientUpdate]) -> Aggregate:
    """theta = sum_k n_k / n * theta_k over the results with n_k > 0 (McMahan et al., AISTATS 2017, Algorithm 1).

    Raises ValueError if no result carries training windows.
    """
    used = contributors(results)
    g = weighted_average([u.state for u in used], [u.n_train for u in used])
    return Aggregate(g, {}, None, [u.client_id for u in used])


class Strategy:
    """Base of every strategy: Flower's hooks and the persistence contract; not registered itself.

    A subclass that sets :attr:`name` (its ``--aggregation`` name) is registered when its module is
    imported, so a new strategy is one new file implementing :meth:`aggregate_fit`. ``feddist_paper``:
    FedDist's paper mode applies unchanged (one global model every client takes whole; else
    ``feddist_mode = "auto"`` picks function-preserving). ``personalised``: a model per client, so no
    buffered rounds.
    """

    name: ClassVar[str] = ""
    settings_type: ClassVar[type | None] = None
    settings_table: ClassVar[str] = ""
    feddist_paper: ClassVar[bool] = False
    personalised: ClassVar[bool] = False
    registry: ClassVar[dict[str, type[Strategy]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name", "")
        if not name:
            return
        if (cls.settings_type is None) != (not cls.settings_table):
            raise TypeError(f"strategy {name!r}: settings_type and settings_table go together")
        known = Strategy.registry.get(name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"strategy name {name!r} is taken by {known.__module__}.{known.__qualname__}")
        Strategy.registry[name] = cls

    def __init__(self, settings: Any = None):
        """Build the strategy from its settings (None: the defaults); TypeError for settings of another type or none expected."""
        if self.settings_type is None:
            if settings is not None:
                raise TypeError(f"{self.name or type(self).__name__} has no settings, got {type(settings).__name__}")
        elif settings is None:
            settings = self.settings_type()
        elif not isinstance(settings, self.settings_type):
            raise TypeError(f"{self.name}: settings must be {self.settings_type.__name__}, got {type(settings).__name__}")
        self.settings = settings

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        """The training plan the selected clients follow in round ``round_`` under this strategy (``base`` here)."""
        return base

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """Combine the round's validated updates; ``failures`` are the selected clients that sent none.

        Raises ValueError if the results cannot be aggregated (the round closes with the model unchanged).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement aggregate_fit")

    def aggregate_intermediate(self, fed: Federation, first: Aggregate, results: Sequence[ClientUpdate]) -> Aggregate:
        """Aggregate the updates of a FedDist intermediate exchange (as :meth:`aggregate_fit` here)."""
        return self.aggregate_fit(-1, fed, results)

    def shrink_step(self, factor: float) -> bool:
        """Multiply the server step by ``factor`` in (0, 1] and forget the momentum (the guard's rollback); whether there was one.

        Raises ValueError if ``factor`` is not in (0, 1].
        """
        if not 0 < factor <= 1:
            raise ValueError(f"{self.name}: shrink_step factor must be in (0, 1], got {factor}")
        return False

    def grow_step(self, factor: float) -> bool:
        """Multiply the server step by ``factor`` >= 1, never above the setting (the guard's recovery); whether it changed.

        Raises ValueError if ``factor`` is below 1 or not finite.
        """
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"{self.name}: grow_step factor must be a finite number >= 1, got {factor}")
        return False

    @property
    def persisted_name(self) -> str:
        """The name the strategy's state is kept under in the run folder (a wrapper's: its inner strategy's)."""
        return self.name

    def judge(self, round_: int, fed: Federation, spec0: ArchSpec, received: State,
              results: Sequence[ClientUpdate]) -> GuardNote | None:  # fmt: skip
        """Judge the version received in round ``round_`` by the clients' start measures (a guard may restore ``fed``); None here."""
        return None

    def restore(self, records: Sequence[RoundRecord]) -> None:
        """Take up, after a restart, what the strategy decided in the completed rounds (their ``records``); nothing here."""

    def best_version(self) -> tuple[int, ArchSpec, Mapping[str, Any]] | None:
        """The version a quality guard holds as the best (round, architecture, global model); None here."""
        return None

    def forget_best(self) -> None:
        """An operator chose another version: a quality guard judges afresh from it; nothing here."""

    def release(self, cid: str) -> bool:
        """Release device ``cid`` from a quality guard's quarantine; False here (no quarantine)."""
        return False

    def left_out(self) -> frozenset[str]:
        """Devices whose updates and measures are not trusted now (a quality guard's quarantine); none here."""
        return frozenset()

    @property
    def keeps_state(self) -> bool:
        """True when the strategy carries state between rounds (its class overrides :meth:`state_dict`)."""
        return type(self).state_dict is not Strategy.state_dict

    def state_dict(self) -> State:
        """What the strategy carries from round to round, as named tensors to persist (empty: stateless)."""
        return {}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], spec: ArchSpec | None = None) -> None:
        """Take back what :meth:`state_dict` gave; ValueError if ``state`` is not this strategy's or does not fit ``spec``."""
        if state:
            raise ValueError(f"{self.name}: keeps no state between rounds, got {sorted(state)[:3]}")
