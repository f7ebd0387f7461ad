"""FedProx (Li et al., MLSys 2020): FedAvg on the server, a proximal term in the clients' objective."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from coordinator.strategies.fedavg import FedAvg
from har_models.settings import doc
from har_models.wire.messages import TrainingPlan


@dataclass(frozen=True)
class FedProxSettings:
    """FedProx's settings.

    ``mu`` is the proximal weight of (mu/2)||w - w^t||^2 (Li et al. 2020, eq. 2; algorithms.md 4.3
    proposes 0.01, the paper tunes 0.001..1). Raises ValueError if mu is negative.
    """

    mu: float = field(default=0.01, metadata=doc("FedProx mu: proximal weight of (mu/2)||w - w^t||^2", flag="--prox-mu"))

    def __post_init__(self) -> None:
        if not self.mu >= 0:
            raise ValueError(f"FedProxSettings.mu must be >= 0, got {self.mu}")


class FedProx(FedAvg):
    """FedProx: the FedAvg server; clients add (mu/2)||w - w^t||^2 to their loss (Li et al., MLSys 2020)."""

    name = "fedprox"
    settings_type = FedProxSettings
    settings_table = "fedprox"
    settings: FedProxSettings

    @property
    def mu(self) -> float:
        """The proximal weight mu."""
        return self.settings.mu

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        """``base`` with ``prox_mu = mu``."""
        return replace(base, prox_mu=self.settings.mu)
