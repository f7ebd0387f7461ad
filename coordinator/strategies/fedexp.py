"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023): a server step eta_t taken each round from the clients' updates.

eta_t = min(eta_max, max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_t||^2 + eps)))), m = beta m + eta_t Delta_t,
x = x_t - m (:func:`coordinator.server_opt.fedexp_eta`).
"""

from __future__ import annotations

from coordinator.strategies.fedopt import FedOpt

FEDEXP_ETA_MAX = float("inf")
"""FedExP's cap eta_max on its adaptive step (placeholder until measured)."""

FEDEXP_BETA = 0.0
"""FedExP's server momentum (placeholder until measured)."""


class FedExP(FedOpt):
    """FedExP: eta_t from the updates' agreement, capped at :data:`FEDEXP_ETA_MAX`, momentum :data:`FEDEXP_BETA`."""

    name = "fedexp"
    rule = "exp"
    default_lr = FEDEXP_ETA_MAX
    default_momentum = FEDEXP_BETA
