"""FedPer (Arivazhagan et al., arXiv 1912.00818): shared base layers, personal layers kept on the clients."""

from __future__ import annotations

from dataclasses import replace

from coordinator.strategies.fedavg import FedAvg
from har_models.wire.messages import TrainingPlan

FEDPER_LOCAL = ("hidden.weight", "hidden.bias", "out.weight", "out.bias")
"""FedPer's personal layers for the HAR CNN: the dense layers, as in the FedDist authors' FedPer
(only the conv layer is shared; algorithms.md section 4.2)."""


class FedPer(FedAvg):
    """FedPer: the server averages every tensor (the shadow global model); clients keep :data:`FEDPER_LOCAL` of their own."""

    name = "fedper"
    feddist_paper = False
    personalised = True

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        """``base`` with ``keep_local`` = the dense layers."""
        return replace(base, keep_local=FEDPER_LOCAL)
