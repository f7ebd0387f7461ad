"""The quality guard as a part of the round: a strategy wrapper that clips outliers and rolls back collapses.

The rules are :mod:`coordinator.guard`'s (pure functions over the clients' start measures and the
updates' norms); this module applies them around any strategy, as Flower's clipping wrappers do
(``DifferentialPrivacyServerSideFixedClipping(strategy)``): :class:`GuardedStrategy` clips an update
that changes the model far more than the round's others before the wrapped strategy aggregates,
and judges the version the clients received by their start measures after the round
(:meth:`GuardedStrategy.judge`): a version that fell more than ``margin`` points below the best is
discarded, the federation continues from the best version with a halved server step, which doubles
back after :data:`coordinator.guard.RECOVER_AFTER` versions kept in a row. Its settings are the
``[guard]`` table (:class:`GuardSettings`); :func:`coordinator.rounds.compose` wraps the strategy
when it is enabled.

It acts only on enough evidence: a comparison of two versions needs ``min_devices`` devices and
``min_windows`` test windows that measured both, else the guard abstains (and says so); a device's
update is clipped against its own recent accepted updates as well as the round's others, and one
without such a history (just joined, or back from a freeze) gets room to start far away
(:data:`coordinator.guard.NEWCOMER_SLACK`). A device clipped or rejected in ``quarantine_after``
rounds in a row is quarantined: still served a model, but left out of aggregation until an operator
releases it (``fedhar-coordinator release NAME``); both are events of the run (``quarantined``,
``released``), so the page, ``/metrics`` and ``devices`` show them, and a restart keeps them.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from coordinator import guard
from coordinator.record import GuardNote, RoundRecord
from coordinator.strategies.base import Aggregate, Federation, Strategy
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.model import ArchSpec
from har_models.settings import doc
from har_models.wire.messages import TrainingPlan

if TYPE_CHECKING:
    from coordinator.state import RunState

log = logging.getLogger("fedhar.coordinator")


@dataclass(frozen=True)
class GuardSettings:
    """The ``[guard]`` settings table (see :mod:`coordinator.guard`)."""

    enabled: bool = field(
        default=False,
        metadata=doc("quality guard: a version whose clients' start macro-F1 falls more than the margin below the best "
                     "version's (or is not finite) is rolled back to the best with a halved server step, and an update "
                     "more than 10 x the round's others is clipped (coordinator/guard.py); off in run and simulate so "
                     "research figures stay raw, on in serve", flag="--guard"),
    )
    margin: float = field(
        default=guard.DEFAULT_MARGIN,
        metadata=doc("how far below the best version's start macro-F1 a version may fall before the guard rolls back",
                     "points", flag="--guard-margin"),
    )
    min_devices: int = field(
        default=2,
        metadata=doc("fewest devices that measured both versions for the guard to judge (else it abstains)", "devices",
                     flag="--guard-min-devices"),
    )
    min_windows: int = field(
        default=30,
        metadata=doc("fewest test windows behind a comparison for the guard to judge (else it abstains)", "windows",
                     flag="--guard-min-windows"),
    )
    quarantine_after: int = field(
        default=3,
        metadata=doc("rounds in a row a device's update is clipped or rejected before it is quarantined: left out of "
                     "aggregation until released (0 = never)", "rounds", flag="--quarantine-after"),
    )

    def check(self, cfg: Any) -> None:
        """Refuse a margin outside [0, 100] points or negative minimums (ValueError naming the setting)."""
        if not 0 <= self.margin <= 100:
            raise ValueError(f"[guard] margin (--guard-margin) must be in [0, 100] points of macro-F1, got {self.margin}")
        if self.min_devices < 1 or self.min_windows < 0 or self.quarantine_after < 0:
            raise ValueError(f"need [guard] min_devices >= 1, min_windows >= 0 and quarantine_after >= 0; got {self.min_devices}, "
                             f"{self.min_windows}, {self.quarantine_after}")  # fmt: skip


HISTORY_ROUNDS = 10
"""Accepted update norms kept per device for its own history (the clipping rule's); one older than this many rounds
no longer makes a device "known"."""

NOT_HARM = frozenset({"offline", "missed_deadline", "cohort_full", "still_training", "cannot_train", "blob_store_unavailable",
                      "duplicate_identity", "revoked", "warming_up"})  # fmt: skip
"""Failure reasons that are no strike against a device (absence, the store's fault, an identity clash, revocation)."""


class GuardedStrategy(Strategy):
    """``inner`` with the quality guard around it (see the module docstring).

    Parameters
    ----------
    inner : Strategy
        The strategy that aggregates.
    settings : GuardSettings
    state : RunState
        The run's database (clipped updates and rollbacks are recorded as events) and folder (the best version).
    """

    def __init__(self, inner: Strategy, settings: GuardSettings, state: RunState, quorum: int = 1):
        super().__init__()
        self.inner = inner
        self.settings = settings
        self.state = state
        self.quorum = quorum  # updates a round needs: one quarantine must not leave a round below it
        self.best: guard.Best | None = None  # the best version so far
        self._kept = 0  # versions kept since the server step last changed
        self._norms: dict[str, deque[tuple[int, float]]] = {}  # device -> (round, norm) of its recent accepted updates
        self._strikes: dict[str, int] = {}  # device -> rounds in a row it was clipped or rejected
        self.quarantined: dict[str, str] = self._read_quarantine()  # device -> why

    # ------------------------------------------------------------------ the wrapped strategy
    @property
    def persisted_name(self) -> str:
        return self.inner.persisted_name

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        return self.inner.configure_fit(round_, base)

    def aggregate_fit(self, round_: int, fed: Federation, results: Sequence[ClientUpdate],
                      failures: Sequence[Failure] = ()) -> Aggregate:  # fmt: skip
        """The inner strategy's aggregate of ``results`` without the quarantined devices' updates, each oversized update
        clipped to the others' median norm first; strikes counted and quarantines made for the next rounds.

        Raises
        ------
        ValueError
            If leaving out quarantined devices leaves fewer contributing updates than the quorum.
        """
        kept = [u for u in results if u.client_id not in self.quarantined]
        if len([u for u in kept if u.n_train > 0]) < self.quorum:
            raise ValueError(f"{len(results) - len(kept)} of the round's updates come from quarantined devices "
                             f"({', '.join(sorted(self.quarantined))}): too few left for the quorum of {self.quorum}")  # fmt: skip
        clipped = self._clip(round_, kept, fed.global_state)
        self._strike(round_, results, clipped, failures)
        return self.inner.aggregate_fit(round_, fed, [u for _, u in clipped], failures)

    def aggregate_intermediate(self, fed: Federation, first: Aggregate, results: Sequence[ClientUpdate]) -> Aggregate:
        return self.inner.aggregate_intermediate(fed, first, results)

    def shrink_step(self, factor: float) -> bool:
        return self.inner.shrink_step(factor)

    def grow_step(self, factor: float) -> bool:
        return self.inner.grow_step(factor)

    @property
    def keeps_state(self) -> bool:
        return self.inner.keeps_state

    def state_dict(self) -> Any:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, torch.Tensor], spec: ArchSpec | None = None) -> None:
        self.inner.load_state_dict(state, spec)

    # ------------------------------------------------------------------ the guard
    def _history(self, round_: int) -> dict[str, float]:
        """Each device's median norm of its accepted updates of the last :data:`HISTORY_ROUNDS` rounds."""
        return {cid: statistics.median(n for _, n in seen) for cid, seen in self._norms.items()
                if seen and seen[-1][0] >= round_ - HISTORY_ROUNDS}  # fmt: skip

    def _clip(self, round_: int, results: list[ClientUpdate], received: Mapping[str, Any]) -> list[tuple[bool, ClientUpdate]]:
        """``results`` as (clipped?, update), each oversized update (:func:`coordinator.guard.oversized_updates`, against the
        others' median and the device's own history) clipped to the others' median norm, logged and stored as a
        ``clipped_update`` event; one whose change is not finite is left out. The accepted ones' norms join the history."""
        oversized = guard.oversized_updates(results, received, history=self._history(round_))
        norms = guard.update_norms([u for u in results if u.client_id not in oversized], received)
        for cid, norm in norms.items():
            self._norms.setdefault(cid, deque(maxlen=HISTORY_ROUNDS)).append((round_, norm))
        out = []
        for u in results:
            if u.client_id not in oversized:
                out.append((False, u))
                continue
            median, text = oversized[u.client_id]
            try:
                out.append((True, guard.clipped(u, received, median)))
            except ValueError as exc:
                log.warning("round %d: the update of %s is left out: %s", round_, u.client_id, exc)
                continue
            log.warning("round %d: the update of %s is clipped to the others' median norm: %s", round_, u.client_id, text)
            self.state.event(round_, u.client_id, "clipped_update", text)
        return out

    def _strike(self, round_: int, results: Sequence[ClientUpdate], clipped: Sequence[tuple[bool, ClientUpdate]],
                failures: Sequence[Failure]) -> None:  # fmt: skip
        """Count a strike for each device clipped or rejected this round (a clean update clears its count); quarantine a
        device at ``quarantine_after`` strikes in a row."""
        struck = {u.client_id for was, u in clipped if was} | {f.client_id for f in failures if f.reason not in NOT_HARM}
        struck |= {u.client_id for u in results} - {u.client_id for _, u in clipped}  # left out: not finite
        for cid in {u.client_id for _, u in clipped} - struck:
            self._strikes.pop(cid, None)
        k = self.settings.quarantine_after
        for cid in sorted(struck - self.quarantined.keys()):
            self._strikes[cid] = self._strikes.get(cid, 0) + 1
            if k and self._strikes[cid] >= k:
                why = f"clipped or rejected in {self._strikes[cid]} rounds in a row"
                self.quarantined[cid] = why
                log.warning("round %d: device %s is quarantined (%s): its updates are left out until an operator releases it "
                            "(fedhar-coordinator release %s)", round_, cid, why, cid)  # fmt: skip
                self.state.event(round_, cid, "quarantined", why)

    def _read_quarantine(self) -> dict[str, str]:
        """The devices quarantined by this run's events and not released since (a restart keeps them)."""
        out: dict[str, str] = {}
        for _, cid, kind, detail in self.state.events(("quarantined", "released")):
            if cid is not None and kind == "quarantined":
                out[cid] = detail
            elif cid is not None and kind == "released":
                out.pop(cid, None)
        return out

    def left_out(self) -> frozenset[str]:
        """The quarantined devices: left out of aggregation, of the guard's judgement and of the shared model's start measure."""
        return frozenset(self.quarantined)

    def release(self, cid: str) -> bool:
        """Release device ``cid`` from quarantine (its strikes forgotten); True if it was quarantined."""
        if self.quarantined.pop(cid, None) is None:
            return False
        self._strikes.pop(cid, None)
        self.state.event(None, cid, "released", "released by the operator")
        log.info("device %s released from quarantine: its updates count again", cid)
        return True

    def judge(self, round_: int, fed: Federation, spec0: ArchSpec, received: Mapping[str, Any],
              results: Sequence[ClientUpdate]) -> GuardNote | None:  # fmt: skip
        """Judge the version the clients received in round ``round_`` (made by round ``round_ - 1``) by their start measures.

        A kept version that scores at least the best becomes the best (saved to the run folder). A rollback
        discards this round's aggregate: ``fed``'s global model and architecture become the best's, the server
        step shrinks (x :data:`coordinator.guard.STEP_FACTOR`, momentum reset) and the event is logged;
        personalised models are kept. None when no client sent a start measure (nothing to judge).
        """
        figures = guard.client_figures([u for u in results if u.client_id not in self.quarantined])  # no say for a suspect
        if not figures:
            return None
        s = self.settings
        note = guard.judge(round_ - 1, figures, self.best, s.margin, guard.finite_model(fed.global_state), s.min_devices,
                           s.min_windows)  # fmt: skip
        if note.action == "rollback" and self.best is not None:
            best = self.best
            fed.spec = best.spec
            fed.global_state = {k: v.clone() for k, v in best.global_state.items()}
            shrunk = self.inner.shrink_step(1.0)  # tells whether there is a step; _step_after halves it
            self._step_after(round_, "rollback")
            log.warning("round %d: quality guard rolled back to the version of round %d (%s); %s", round_, best.round,
                        note.reason, "server step halved, momentum reset" if shrunk else f"{self.persisted_name} has no "
                        "server step to shrink")  # fmt: skip
            self.state.event(round_, None, "rollback", f"to round {best.round}: {note.reason}")
        elif note.to_round == round_ - 1:
            self.best = guard.Best(round_ - 1, figures, spec0, received)
            guard.save_best(self.state.folder, self.best)
        if note.action == "keep":
            self._step_after(round_, "keep")
        return note

    def _step_after(self, round_: int, action: str, quiet: bool = False) -> None:
        """The server step after the guard's decision ``action`` in round ``round_``: halved at a rollback; doubled back
        (at most to its setting) after :data:`coordinator.guard.RECOVER_AFTER` versions kept in a row."""
        if action == "rollback":
            self.inner.shrink_step(guard.STEP_FACTOR)
            self._kept = 0
            return
        self._kept += 1
        if self._kept >= guard.RECOVER_AFTER and self.inner.grow_step(1 / guard.STEP_FACTOR):
            self._kept = 0
            if not quiet:
                log.info("round %d: %d versions kept in a row; server step doubled back", round_, guard.RECOVER_AFTER)

    def restore(self, records: Sequence[RoundRecord]) -> None:
        """Take back the best version from the run folder, and the server step as the guard's decisions left it
        (halvings and recoveries replayed in order). An unreadable best version is logged and judging starts afresh."""
        try:
            self.best = guard.load_best(self.state.folder)
        except ValueError as exc:
            log.error("%s", exc)
        self._kept = 0
        shrinks = 0
        for rec in records:
            if rec.guard is not None:
                shrinks += rec.guard.action == "rollback"
                self._step_after(rec.round, rec.guard.action, quiet=True)
        if shrinks:
            log.info("quality guard: %d rollback(s) so far; %d version(s) kept since the step last changed", shrinks, self._kept)

    def forget_best(self) -> None:
        """An operator chose another version: judge afresh from it (the best version is forgotten, its file deleted)."""
        self.best = None
        (self.state.folder / guard.BEST_FILE).unlink(missing_ok=True)

    def best_version(self) -> tuple[int, ArchSpec, Mapping[str, Any]] | None:
        return (self.best.round, self.best.spec, self.best.global_state) if self.best is not None else None

