"""Choose a strategy by its ``--aggregation`` name: the one place that knows every strategy.

Kept apart from :mod:`coordinator.strategy` (FedAvg, FedProx, FedPer, FedDWA) and
:mod:`coordinator.server_opt` (FedAvgM, FedAdam, FedYogi, which build on it), so neither
module needs the other's names.
"""

from __future__ import annotations

from coordinator.server_opt import make_server_opt
from coordinator.strategy import FedDWA, FedPer, FedProx, Strategy


def make_strategy(
    name: str, prox_mu: float = 0.01, top_k: int = 5, server_lr: float | None = None, server_momentum: float | None = None
) -> Strategy:
    """The strategy called ``name`` (fedavg | fedprox | fedper | feddwa | fedavgm | fedadam | fedyogi).

    ``server_lr`` and ``server_momentum`` set the server optimisers' eta and beta (None:
    their defaults, :func:`coordinator.server_opt.make_server_opt`).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones).
    """
    if name == "fedavg":
        return Strategy()
    if name == "fedprox":
        return FedProx(prox_mu)
    if name == "fedper":
        return FedPer()
    if name == "feddwa":
        return FedDWA(top_k)
    if name in ("fedavgm", "fedadam", "fedyogi"):  # server optimisers (Reddi et al. 2021), coordinator/server_opt.py
        return make_server_opt(name, server_lr, server_momentum)
    raise ValueError(f"unknown aggregation {name!r}; choose fedavg, fedprox, fedper, feddwa, fedavgm, fedadam or fedyogi")
