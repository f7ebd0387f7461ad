"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023) under server momentum: the coordinator's default server step.

In round t, with Delta_i = x_t - x_i client i's update, p_i = n_i / n and Delta_t = sum_i p_i Delta_i:

    eta_t = min(eta_max(M), max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_t||^2 + eps))))   (FedExP, Algorithm 1)
    eta_max(M) = min(FEDEXP_ETA_MAX, max(1, M / FEDEXP_CLIENTS_PER_ETA))                    (this project)
    m_t = beta m_{t-1} + eta_t Delta_t,   x_{t+1} = x_t - m_t                                 (FedAvgM, Hsu et al. 2019)

with M the clients that contributed. FedExP's ratio is 1 / (1 + cos theta) for two equal-norm
updates at angle theta, so it never extrapolates two devices whose updates point the same half-space,
and it grows to about M / 2 when M updates are nearly orthogonal (many noisy clients). The cap
eta_max(M) bounds the step by the number of clients: 1 up to 15 clients, 2 from 30. Why these
numbers: ``docs/tuning/server-step.md``. ``--server-lr`` sets a fixed cap instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.server_opt import fedavgm_step, fedexp_eta, mean_sq_update_norm
from coordinator.strategies.base import contributors, log
from coordinator.strategies.fedopt import FedOpt, ServerOptSettings, State
from coordinator.updates import ClientUpdate

FEDEXP_ETA_MAX = 2.0
"""The largest cap of FedExP's eta_t (reached at 30 clients): with beta 0.5 an effective step of at most 4. On HAPT
validation windows (small CNN, one seed, docs/tuning/server-step.md) a cap of 3 with beta 0.5 fell 12.6 points of
global macro-F1 from its best round at 30 label-skewed clients and a cap of 2 at most 3.2; the old FedAvgM eta 3
(effective 6) collapsed 2-device federations to macro-F1 0.06."""

FEDEXP_CLIENTS_PER_ETA = 15.0
"""Clients per unit of cap: eta_max(M) = min(FEDEXP_ETA_MAX, max(1, M / 15)). At 10 clients every cap above 1 (1.5,
2, 3) fell 16-37 points from its best round on HAPT validation windows while eta 1 with beta 0.5 fell at most 5.8
(docs/tuning/server-step.md); at 30 clients a cap of 2 was stable."""

FEDEXP_BETA = 0.5
"""Server momentum under FedExP: without it (beta 0) FedExP's eta_t swung between 1.3 and 7 from round to round at 30
clients and the global macro-F1 with it (drops of 20-30 points); 0.5 is FedAvgM's tuned value (docs/results.md)."""


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
        """eta_t from the clients' updates (:func:`coordinator.server_opt.fedexp_eta`), capped by :meth:`eta_max`, then a
        momentum step on eta_t Delta_t."""
        used = contributors(results)
        msq = mean_sq_update_norm(x_t, (u.state for u in used), [u.n_train for u in used])
        cap = self.eta_max(len(used))
        eta_t = fedexp_eta(msq, delta, self.eps, cap) * self.step_scale
        log.info("round %d: %s server step %.3f (cap %.2g for %d clients, beta %.2g)", round_, self.name, eta_t, cap,
                 len(used), self.beta)  # fmt: skip
        x_new, m_new = fedavgm_step(x_t, {k: eta_t * d for k, d in delta.items()}, self.m, 1.0, self.beta)
        return eta_t, x_new, m_new, None
    def eta_max(self, n_clients: int) -> float:
        """min(FEDEXP_ETA_MAX, max(1, M / FEDEXP_CLIENTS_PER_ETA)), or the fixed cap ``--server-lr`` when it is set.

        Raises
        ------
        ValueError
            If ``n_clients`` < 1.
        """
        if n_clients < 1:
            raise ValueError(f"FedExP.eta_max: need at least one contributing client, got {n_clients}")
        if self.settings.lr is not None:
            return self.eta
        return min(FEDEXP_ETA_MAX, max(1.0, n_clients / FEDEXP_CLIENTS_PER_ETA))
