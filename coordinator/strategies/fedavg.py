"""FedAvg (McMahan et al., AISTATS 2017): the global model is the n_k-weighted mean of the clients' models."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.strategies.base import Aggregate, Federation, Strategy, fedavg_of
from coordinator.updates import ClientUpdate, Failure


class FedAvg(Strategy):
    """FedAvg: theta = sum_k n_k / n * theta_k, weighted by training windows n_k; clients train plainly.

    No settings, no state between rounds.
    """

    name = "fedavg"
    feddist_paper = True

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """theta = sum_k n_k / n * theta_k over the results with n_k > 0 (McMahan et al., AISTATS 2017, Algorithm 1).

        Failures carry no weight.

        Raises
        ------
        ValueError
            If no result carries training windows.
        """
        return fedavg_of(results)
