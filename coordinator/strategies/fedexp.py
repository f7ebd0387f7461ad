"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023) under server momentum: the coordinator's default server step.

In round t, with Delta_i = x_t - x_i client i's update, p_i = n_i / n and Delta_t = sum_i p_i Delta_i:

    eta_t = min(eta_max(M), max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_t||^2 + eps))))   (FedExP, Algorithm 1)
    eta_max(M) = min(FEDEXP_ETA_MAX, max(1, M / FEDEXP_CLIENTS_PER_ETA))                    (this project)
    m_t = beta m_{t-1} + eta_t Delta_t,   x_{t+1} = x_t - m_t                                 (FedAvgM, Hsu et al. 2019)

with M the contributing clients. The ratio is 1 / (1 + cos theta) for two equal-norm updates, so two
devices agreeing are never extrapolated; it grows to about M / 2 for nearly orthogonal updates. The
cap is 1 up to 15 clients, 2 from 30 (docs/tuning/server-step.md); ``--server-lr`` fixes it instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.server_opt import fedavgm_step, fedexp_eta, mean_sq_update_norm
from coordinator.strategies.base import contributors, log
from coordinator.strategies.fedopt import FedOpt, ServerOptSettings, State
from coordinator.updates import ClientUpdate

FEDEXP_ETA_MAX = 2.0
"""The largest cap of eta_t (reached at 30 clients): a cap of 2 fell at most 3.2 points from its best round
at 30 label-skewed clients, 3 fell 12.6 (docs/tuning/server-step.md)."""

FEDEXP_CLIENTS_PER_ETA = 15.0
"""Clients per unit of cap: at 10 clients every cap above 1 fell 16-37 points, eta 1 at most 5.8 (docs/tuning/server-step.md)."""

FEDEXP_BETA = 0.5
"""Server momentum under FedExP: without it eta_t swung between 1.3 and 7 at 30 clients (docs/results.md)."""


class FedExP(FedOpt):
    """FedExP's eta_t, capped by :meth:`eta_max`, under momentum :data:`FEDEXP_BETA` (module docstring)."""

    name = "fedexp"
    default_lr = FEDEXP_ETA_MAX
    default_momentum = FEDEXP_BETA
    sized_cap = True

    def __init__(self, settings: ServerOptSettings | None = None):
        super().__init__(settings)
        if not self.eta >= 1:
            raise ValueError(f"{type(self).__name__}: FedExP's cap eta_max (--server-lr) must be >= 1, got {self.eta}")

    def step(self, round_: int, x_t: State, delta: State, results: Sequence[ClientUpdate]) -> tuple[float, State, State, State | None]:
        """eta_t from the clients' updates (:func:`coordinator.server_opt.fedexp_eta`), capped, then a momentum step on eta_t Delta_t."""
        used = contributors(results)
        msq = mean_sq_update_norm(x_t, (u.state for u in used), [u.n_train for u in used])
        cap = self.eta_max(len(used))
        eta_t = fedexp_eta(msq, delta, self.eps, cap) * self.step_scale
        log.info("round %d: %s server step %.3f (cap %.2g for %d clients, beta %.2g)", round_, self.name, eta_t, cap,
                 len(used), self.beta)  # fmt: skip
        x_new, m_new = fedavgm_step(x_t, {k: eta_t * d for k, d in delta.items()}, self.m, 1.0, self.beta)
        return eta_t, x_new, m_new, None

    def eta_max(self, n_clients: int) -> float:
        """min(FEDEXP_ETA_MAX, max(1, M / FEDEXP_CLIENTS_PER_ETA)), or the fixed ``--server-lr``; ValueError if ``n_clients`` < 1."""
        if n_clients < 1:
            raise ValueError(f"FedExP.eta_max: need at least one contributing client, got {n_clients}")
        if self.settings.lr is not None:
            return self.eta
        return min(FEDEXP_ETA_MAX, max(1.0, n_clients / FEDEXP_CLIENTS_PER_ETA))
