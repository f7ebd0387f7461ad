"""FedYogi (Reddi et al., ICLR 2021, Algorithm 2): Yogi's sign-controlled second moment on the pseudo-gradient."""

from __future__ import annotations

from coordinator.server_opt import BETA1
from coordinator.strategies.fedopt import FedOpt


class FedYogi(FedOpt):
    """FedYogi: ``v = v - (1 - beta2) Delta^2 sign(v - Delta^2)``; eta 0.01 and beta1 0.9 unless set."""

    name = "fedyogi"
    default_lr = 0.01
    default_momentum = BETA1
    rule = "yogi"
