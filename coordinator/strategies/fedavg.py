"""FedAvg (McMahan et al., AISTATS 2017): the global model is the n_k-weighted mean of the clients' models."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.strategies.base import Aggregate, Federation, Strategy, fedavg_of
from coordinator.updates import ClientUpdate, Failure


class FedAvg(Strategy):
    """FedAvg: theta = sum_k n_k / n * theta_k, weighted by training windows n_k; no settings, no state."""

    name = "fedavg"
    feddist_paper = True

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """:func:`~coordinator.strategies.base.fedavg_of` of the results (failures carry no weight); ValueError if none trained."""
        return fedavg_of(results)
