"""FedAdam (Reddi et al., ICLR 2021, Algorithm 2): Adam's moments on the pseudo-gradient, no bias correction."""

from __future__ import annotations

from coordinator.server_opt import BETA1
from coordinator.strategies.fedopt import FedOpt


class FedAdam(FedOpt):
    """FedAdam: ``v = beta2 v + (1 - beta2) Delta^2``; eta 0.01 and beta1 0.9 unless set."""

    name = "fedadam"
    default_lr = 0.01
    default_momentum = BETA1
    rule = "adam"
