"""The *global* measure of the FedDist protocol (Ek et al., PerCom 2021, section V-A): the global model G_r of round r
on the union of the clients' test windows, taken from what the clients already measured wherever that is exact.

In round r + 1 every client first evaluates the model it received on its own test windows (the ``received``
confusion matrix, made before FedALA or training touch the model). When each of them received G_r itself, their
matrices summed are G_r's confusion matrix on the union of their test windows: window for window the
coordinator's own evaluation, so the figures are the same to the last digit and the coordinator need not evaluate
G_r at all. That holds when, in the completed round r + 1 (each condition is checked; otherwise G_r is evaluated
on the union test set as before, so a figure is never missing and never approximate):

1. the clients received G_r: the round right after r, the very version made by r (no operator rollback, no other
   version in between), and no personalised model sent (FedDWA, FedPer send each client its own);
2. every client of the union test set sent its matrix from that round (none stale, none quarantined), and the
   matrices count exactly the union's windows;
3. each client evaluated with the eager PyTorch backend (``torch``), the same arithmetic as the coordinator's
   evaluation; ExecuTorch or NumPy logits may differ in the last bits and flip a near tie.

The last round is evaluated at once (no later round measures it). A run stopped between rounds leaves the figure
of its last completed round to :meth:`GlobalMeasure.flush` (the end of a run) or, after ``--resume``, to the next
round. ``[evaluation] global_from = "central"`` evaluates every round at once, as earlier releases did.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.evaluation import Evaluator
from coordinator.record import Metrics
from coordinator.updates import ClientUpdate
from har_models.nn.metrics import pct, summarise
from har_models.nn.model import ArchSpec

log = logging.getLogger("fedhar.coordinator")

EXACT_BACKEND = "torch"
"""The client backend whose evaluation is the coordinator's own arithmetic."""


@dataclass(frozen=True)
class Pending:
    """G_r waiting for round r + 1's clients: the round, its architecture and state (the object the runner holds)."""

    round: int
    spec: ArchSpec
    state: Mapping[str, Any]


class GlobalMeasure:
    """When and from what G_r's figures (accuracy, macro-F1, weighted-F1, n) are taken.

    Parameters
    ----------
    evaluator : Evaluator or None
        The union test set (None: no global measure at all, as in a served federation).
    from_clients : bool
        ``[evaluation] global_from == "clients"``.
    last_round : int
        The run's last round (``rounds - 1``), always evaluated at once.
    """

    def __init__(self, evaluator: Evaluator | None, from_clients: bool, last_round: int):
        self.evaluator, self.from_clients, self.last_round = evaluator, from_clients, last_round
        self.pending: Pending | None = None
        self.from_clients_rounds = 0  # rounds whose figures came from the clients (this process)
        self.central_rounds = 0  # rounds evaluated on the union test set (this process)

    def of_round(self, round_: int, spec: ArchSpec, state: Mapping[str, Any], personalised: bool = False) -> dict[str, float] | None:
        """G_r's figures now, or None when round r + 1's clients are to give them (G_r is kept as :attr:`pending`).

        ``personalised``: the next round sends personalised models (FedDWA, FedPer), so its clients will not measure
        G_r: it is evaluated now.
        """
        if self.evaluator is None:
            return None
        self.pending = None
        if self.from_clients and round_ < self.last_round and not personalised:
            self.pending = Pending(round_, spec, state)
            return None
        self.central_rounds += 1
        return self.evaluator.global_metrics(spec, state)

    def settle(self, round_: int, received: Mapping[str, Any], personal_sent: Collection[str], trained: Sequence[ClientUpdate],
               left_out: Collection[str]) -> dict[int, dict[str, Any]]:  # fmt: skip
        """The pending round's figures once round ``round_`` completed, as ``{round: {"global": figures}}`` for its record
        (:meth:`coordinator.state.RunState.complete_round`'s ``amend``); empty when none waits.

        ``received`` is the global state the round sent, ``personal_sent`` the clients that got a personalised model
        instead, ``trained`` the round's updates with their matrices, ``left_out`` the quarantined clients. Where the
        figures came from is logged.
        """
        p, self.pending = self.pending, None
        if p is None or self.evaluator is None:
            return {}
        why = self._why_not(p, round_, received, personal_sent, trained, left_out)
        if why is None:
            mats = [np.asarray(u.confusion["received"]) for u in trained]
            self.from_clients_rounds += 1
            return _amend(p.round, summarise(sum(mats[1:], mats[0])), f"the clients' start measures of round {round_}")
        return self._central(p, why)

    def flush(self) -> dict[int, dict[str, Any]]:
        """The pending round evaluated on the union test set (the run ends with it), as :meth:`settle` gives it."""
        p, self.pending = self.pending, None
        if p is None or self.evaluator is None:
            return {}
        return self._central(p, "the run ends")

    def _central(self, p: Pending, why: str) -> dict[int, dict[str, Any]]:
        """``p`` evaluated on the union test set, as :meth:`settle` gives it; ``why`` in the log."""
        assert self.evaluator is not None
        self.central_rounds += 1
        return _amend(p.round, self.evaluator.global_metrics(p.spec, p.state), f"the union test set: {why}")

    def resume(self, last: int, spec: ArchSpec, state: Mapping[str, Any], measured: bool) -> None:
        """After ``--resume``: the last completed round's G, pending unless its record already has the figures."""
        self.pending = None if measured or self.evaluator is None else Pending(last, spec, state)

    def _why_not(self, p: Pending, round_: int, received: Mapping[str, Any], personal_sent: Collection[str],
                 trained: Sequence[ClientUpdate], left_out: Collection[str]) -> str | None:  # fmt: skip
        """None when the clients' matrices are exactly G's measure, else the reason in words."""
        assert self.evaluator is not None
        if round_ != p.round + 1 or received is not p.state:
            return "the clients received another version"
        ids = {u.client_id for u in trained}
        if ids & set(personal_sent):
            return "personalised models were sent"
        if self.evaluator.clients is None or ids != set(self.evaluator.clients) or ids & set(left_out):
            return "not every client of the union test set measured it"
        if any(u.round != round_ or "received" not in u.confusion for u in trained):
            return "an update came from an earlier round or without its measure"
        if any(u.meta.get("backend", EXACT_BACKEND) != EXACT_BACKEND for u in trained):  # the wire leaves out "torch"
            return "a client evaluated with another backend"
        if sum(int(np.asarray(u.confusion["received"]).sum()) for u in trained) != len(self.evaluator.union_test):
            return "the clients' test windows are not the union test set"
        return None


def _amend(round_: int, figures: Mapping[str, Any], source: str) -> dict[int, dict[str, Any]]:
    """``figures`` as the ``global`` entry of round ``round_``'s record (the form :class:`coordinator.record.Metrics` writes)."""
    log.info("round %d: global acc %s F1 %s (from %s)", round_, pct(figures["accuracy"]), pct(figures["macro_f1"]), source)
    return {round_: {"global": Metrics.from_json(figures).to_json()}}
