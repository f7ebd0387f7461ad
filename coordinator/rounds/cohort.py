"""Cohorts with a goal count, a minimum fraction and a deadline, and pace steering.

After Bonawitz et al., "Towards Federated Learning at Scale: System Design", MLSys 2019,
section 2: a round does not ask every present device, it selects a cohort sized for a goal count
of updates (over-selected, since some selected devices drop out), closes once the goal is reached
or at its deadline, counts only if at least a minimum fraction of the goal answered, and tells
the devices when to check in again (pace steering, section 2.3), so that the number of devices a
round deals with, and the bytes it moves, follow the goal and not the population.

In fedhar (settings table ``[cohort]``, :class:`CohortSettings`, and ``round_timeout_s``):

* the most devices a round selects is ``ceil(goal x (1 + overselect))``, drawn with the run's
  seeded generator as ``fraction``'s selection (:func:`coordinator.rounds.base.select_clients`);
* the quorum is ``max(min_clients, ceil(min_fraction x goal))`` updates;
* the main exchange closes once ``goal`` updates arrived; the devices it did not wait for fail
  with reason ``cohort_full``, and their updates that arrive later are no fault (counted with the
  duplicates, not as rejections that would stand as their reason for missing a later round);
* every announcement carries a :class:`~har_models.wire.pace.Pace` (:func:`pace_window`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.rounds.base import Late, RoundPolicy, Steering, select_clients
from har_models.settings import doc
from har_models.wire.pace import Pace

if TYPE_CHECKING:
    from coordinator.exchange import Exchange
    from coordinator.strategies import Federation

PACE_LEAD_S = 30.0
"""How long before a round opens (s, at most half a round's period) the check-in window starts: a device's
status must reach the coordinator, and be fresh, before the cohort is drawn. One client status refresh period."""


@dataclass(frozen=True)
class CohortSettings:
    """The ``[cohort]`` settings table (Bonawitz et al., MLSys 2019, section 2; see the module docstring).

    Parameters
    ----------
    goal : int
        Updates a round aims for (0 = off: ``fraction`` alone selects and exchanges wait for every selected
        device). Must be at least ``min_clients``.
    overselect : float
        Over-selection margin: select ``goal x (1 + overselect)`` devices (Bonawitz et al. select 130 %: 0.3).
    min_fraction : float
        Fraction of ``goal`` that must answer for a round to count; the quorum in force is
        ``max(min_clients, ceil(min_fraction x goal))``.
    """

    goal: int = field(
        default=0,
        metadata=doc("updates a round aims for: select at most goal x (1 + overselect) eligible devices, close the round "
                     "once goal updates arrived, and tell every device when to check in again (0 = off)", "updates",
                     flag="--cohort-goal"),
    )
    overselect: float = field(
        default=0.0,
        metadata=doc("over-selection margin with a cohort goal: select goal x (1 + margin) devices (0.3: 1.3 x the goal)",
                     flag="--cohort-overselect"),
    )
    min_fraction: float = field(
        default=0.0,
        metadata=doc("fraction of the cohort goal that must answer for a round to count; the quorum is "
                     "max(min_clients, ceil(fraction x goal))", flag="--cohort-min-fraction"),
    )

    def check(self, cfg: Any) -> None:
        """Refuse settings that cannot work together with ``cfg`` (ValueError naming the setting and the fix)."""
        if self.goal < 0 or 0 < self.goal < cfg.min_clients:
            raise ValueError(f"[cohort] goal (--cohort-goal) must be 0 (off) or at least min_clients ({cfg.min_clients}), "
                             f"got {self.goal}")  # fmt: skip
        if not 0 <= self.overselect <= 10 or not 0 <= self.min_fraction <= 1:
            raise ValueError(f"need 0 <= [cohort] overselect <= 10 and 0 <= [cohort] min_fraction <= 1; got {self.overselect}, "
                             f"{self.min_fraction}")  # fmt: skip


def pace_window(now_unix: float, period_s: float, present: int, cohort: int, lead_s: float = PACE_LEAD_S) -> Pace:
    """The check-in window announced with a round opened at ``now_unix`` (Bonawitz et al. 2019, section 2.3).

    The next round is expected to open one period later, ``T = now_unix + period_s``. Of the
    ``present`` eligible devices, a round needs about ``cohort``; so the devices are spread over
    ``k = max(1, ceil(present / cohort))`` rounds: the window runs from ``T - lead`` to
    ``T - lead + max(lead, (k - 1) x period_s)``, with ``lead = min(lead_s, period_s / 2)``. A
    small federation (``present <= cohort``) is told to come back together just before the next
    round opens; a large one spreads its check-ins, each device at its own uniformly drawn time,
    so about ``cohort`` devices arrive per round and none in a herd.

    Parameters
    ----------
    now_unix : float
        When the round opens (s since the epoch).
    period_s : float
        Expected time from one round's opening to the next (s, > 0).
    present : int
        Eligible devices now (>= 0).
    cohort : int
        Devices a round selects (>= 1).
    lead_s : float
        Upper bound on the lead (s, >= 0).

    Raises
    ------
    ValueError
        If ``period_s`` <= 0, ``cohort`` < 1, ``present`` < 0 or ``lead_s`` < 0.
    """
    if not period_s > 0 or cohort < 1 or present < 0 or lead_s < 0:
        raise ValueError(
            f"pace_window needs period_s > 0, cohort >= 1, present >= 0, lead_s >= 0; got {period_s}, {cohort}, {present}, {lead_s}"
        )
    k = max(1, math.ceil(present / cohort))
    lead = min(lead_s, period_s / 2)
    opens = now_unix + period_s
    after = opens - lead
    return Pace(next_round_unix=opens, check_in_after_unix=after, check_in_before_unix=after + max(lead, (k - 1) * period_s))


class CohortRounds(RoundPolicy):
    """Rounds that select a cohort for a goal count and close at it (see the module docstring)."""

    name = "cohort"

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return cfg.cohort.goal > 0

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.settings: CohortSettings = cfg.cohort
        # (round, stage, ids): the devices the last exchange closed at its goal did not wait for
        self._not_needed: tuple[int, int, frozenset[str]] | None = None

    @property
    def cap(self) -> int:
        """The most devices a round selects: ``ceil(goal x (1 + overselect))``."""
        s = self.settings
        return math.ceil(s.goal * (1 + s.overselect) - 1e-9)

    @property
    def quorum(self) -> int:
        """``max(min_clients, ceil(min_fraction x goal))``: the minimum fraction can only raise the floor."""
        s = self.settings
        return max(self.cfg.min_clients, math.ceil(s.min_fraction * s.goal - 1e-9))

    def select(self, eligible: Sequence[str], round_: int) -> list[str]:
        return select_clients(eligible, round_, self.quorum, self.cfg.fraction, self.cfg.seed, self.cap)

    def steering(self, now_unix: float, period_s: float, present: int, selected: int) -> Steering:
        pace = pace_window(now_unix, period_s, present, max(1, selected))
        return Steering(close_at=self.settings.goal, pace=pace, unanswered="cohort_full")

    def late(self, cid: str, round_: int, stage: int) -> Late | None:
        nn = self._not_needed
        if nn is not None and cid in nn[2] and (round_, stage) == nn[:2]:
            return Late(round_)  # trained for a round that closed at its goal without it: no fault, not needed
        return None

    @property
    def not_needed(self) -> tuple[int, int, frozenset[str]] | None:
        """(round, stage, devices) of the last exchange that closed at its goal without those devices; None: none."""
        return self._not_needed

    def closed(self, ex: Exchange, fed: Federation) -> None:
        if ex.full():
            self._not_needed = (ex.round, ex.stage, frozenset(ex.selected - ex.updates.keys()))
        elif self._not_needed is not None and self._not_needed[:2] == (ex.round, ex.stage):
            self._not_needed = None  # that exchange ran again and counted them: their updates are no copies any more
