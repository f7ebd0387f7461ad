"""FedAvgM (Hsu et al., arXiv 1909.06335): server momentum on the pseudo-gradient, m = beta m + Delta, x = x_t - eta m."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.server_opt import fedavgm_step
from coordinator.strategies.fedopt import FedOpt, State
from coordinator.updates import ClientUpdate

FEDAVGM_BETA = 0.5
"""FedAvgM's default momentum: the best of 0.5-0.9 on HAPT validation windows; at 0.9 a 30-client run diverged (docs/results.md)."""

FEDAVGM_ETA = 3.0
"""FedAvgM's default server lr: the best of 1-4 with beta 0.5 on HAPT validation windows (docs/results.md)."""


class FedAvgM(FedOpt):
    """FedAvgM: eta :data:`FEDAVGM_ETA` and beta :data:`FEDAVGM_BETA` unless set; with eta = 1 and beta = 0 it is FedAvg."""

    name = "fedavgm"
    default_lr = FEDAVGM_ETA
    default_momentum = FEDAVGM_BETA

    def step(self, round_: int, x_t: State, delta: State, results: Sequence[ClientUpdate]) -> tuple[float, State, State, State | None]:
        """m = beta m + Delta, x = x_t - eta m (Hsu et al. 2019, Algorithm 1)."""
        eta_t = self.eta * self.step_scale
        x_new, m_new = fedavgm_step(x_t, delta, self.m, eta_t, self.beta)
        return eta_t, x_new, m_new, None
