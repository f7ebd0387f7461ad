"""Cohorts with a goal count, a minimum fraction and a deadline, and pace steering.

After Bonawitz et al., "Towards Federated Learning at Scale: System Design", MLSys 2019,
section 2: a round does not ask every present device, it selects a cohort sized for a goal count
of updates (over-selected, since some selected devices drop out), closes once the goal is reached
or at its deadline, counts only if at least a minimum fraction of the goal answered, and tells
the devices when to check in again (pace steering, section 2.3), so that the number of devices a
round deals with, and the bytes it moves, follow the goal and not the population.

In fedhar (``CoordinatorConfig.cohort_goal``, ``cohort_overselect``, ``cohort_min_fraction``,
``round_timeout_s``):

* :func:`cohort_cap`: the most devices a round selects, ``ceil(goal x (1 + margin))``; the
  selection itself is :func:`coordinator.round.select_clients`, the same seeded draw as
  ``fraction``'s;
* :func:`quorum`: the updates a round needs to change the model,
  ``max(min_clients, ceil(min_fraction x goal))``;
* :class:`Steering`: what the grid applies to a round's exchanges: close the main exchange
  once ``goal`` updates arrived, and the :class:`~har_models.wire.pace.Pace` its announcements
  carry (:func:`pace_window`).

Without a goal (the default) none of this acts: the quorum is ``min_clients``, the selection is
``fraction``'s, exchanges close when every selected device answered, and announcements carry no pace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.config import CoordinatorConfig
from har_models.wire.pace import Pace

PACE_LEAD_S = 30.0
"""How long before a round opens (s, at most half a round's period) the check-in window starts: a device's
status must reach the coordinator, and be fresh, before the cohort is drawn. One client status refresh period."""


def quorum(cfg: CoordinatorConfig) -> int:
    """The updates with training windows a round needs to change the model.

    ``min_clients`` without a cohort goal; with one, ``max(min_clients, ceil(cohort_min_fraction x cohort_goal))``
    (the minimum fraction can only raise the floor ``min_clients``).
    """
    if not cfg.cohort_goal:
        return cfg.min_clients
    return max(cfg.min_clients, math.ceil(cfg.cohort_min_fraction * cfg.cohort_goal - 1e-9))


def cohort_cap(cfg: CoordinatorConfig) -> int:
    """The most devices a round selects: ``ceil(cohort_goal x (1 + cohort_overselect))``; 0 without a goal (no cap)."""
    if not cfg.cohort_goal:
        return 0
    return math.ceil(cfg.cohort_goal * (1 + cfg.cohort_overselect) - 1e-9)


@dataclass(frozen=True)
class Steering:
    """What the grid applies to the exchanges of a round beyond the plan (set by :meth:`Grid.steer`).

    Attributes
    ----------
    close_at : int, optional
        The main exchange (stage 0) closes once this many valid updates arrived, before its
        deadline; the selected devices that had not answered then are failures with reason
        ``cohort_full``. None: it waits for every selected device (or the deadline).
    pace : Pace, optional
        Carried by the round's announcements (None: left out, the message of a coordinator without cohorts).
    """

    close_at: int | None = None
    pace: Pace | None = None


NO_STEERING = Steering()
"""No cohort goal: exchanges and announcements as without cohorts."""


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


def steering(cfg: CoordinatorConfig, now_unix: float, period_s: float, present: int, selected: int) -> Steering:
    """The steering of a round that opens at ``now_unix`` with ``present`` eligible devices and ``selected`` selected.

    :data:`NO_STEERING` without a cohort goal; else close at ``cohort_goal`` updates and the
    :func:`pace_window` for a cohort of ``selected`` devices (at least 1) and a period of ``period_s``.
    """
    if cfg.buffer_size:  # FedBuff: close at K updates, fresh or stale (coordinator/fedbuff.py); no pace
        return Steering(close_at=cfg.buffer_size)
    if not cfg.cohort_goal:
        return NO_STEERING
    return Steering(close_at=cfg.cohort_goal, pace=pace_window(now_unix, period_s, present, max(1, selected)))
