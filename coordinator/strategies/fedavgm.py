"""FedAvgM (Hsu et al., arXiv 1909.06335): server momentum on the pseudo-gradient, m = beta m + Delta, x = x_t - eta m."""

from __future__ import annotations

from coordinator.strategies.fedopt import FedOpt

FEDAVGM_BETA = 0.5
"""FedAvgM's default momentum: the best of 0.5 and 0.9 on HAPT validation windows (docs/results.md); at 0.9 the
global model of a 30-client run diverged in round 8."""


class FedAvgM(FedOpt):
    """FedAvgM: eta 1.0 and beta :data:`FEDAVGM_BETA` unless set; with eta = 1 and beta = 0 it is FedAvg."""

    name = "fedavgm"
    rule = "avgm"
    default_lr = 1.0
    default_momentum = FEDAVGM_BETA
