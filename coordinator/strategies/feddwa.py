"""FedDWA (Liu et al., IJCAI 2023, arXiv 2305.06124): personalised mixes weighted by guidance distances.

The arithmetic (distances, top-K weights, the mixes) is in :mod:`coordinator.feddwa`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from coordinator import feddwa
from coordinator.aggregation import weighted_average
from coordinator.strategies.base import Aggregate, Federation, contributors
from coordinator.strategies.fedavg import FedAvg
from coordinator.updates import ClientUpdate, Failure
from har_models.settings import doc
from har_models.wire.messages import TrainingPlan


@dataclass(frozen=True)
class FedDWASettings:
    """FedDWA's settings.

    ``top_k`` is K, sources kept per client (5 in the paper's code); ``gram`` the distances' Gram
    arithmetic (:data:`coordinator.feddwa.DEFAULT_GRAM`). Raises ValueError if top_k < 1 or gram is unknown.
    """

    top_k: int = field(default=5, metadata=doc("FedDWA K: sources kept per client", flag="--top-k"))
    gram: str = field(
        default=feddwa.DEFAULT_GRAM,
        metadata=doc("FedDWA distances' Gram product: float32 (centred, summed in float64) or exact float64",
                     flag="--dwa-gram", choices=feddwa.GRAMS),
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"FedDWASettings.top_k must be >= 1, got {self.top_k}")
        if self.gram not in feddwa.GRAMS:
            raise ValueError(f"FedDWASettings.gram must be one of {feddwa.GRAMS}, got {self.gram!r}")


class FedDWA(FedAvg):
    """FedDWA: client i receives sum_j p_ij w_j, p_ij proportional to ||guidance_i - w_j||^-2 over the top-K.

    Clients that did not take part keep their P_i; G is the shadow FedAvg average (FedDist detection, the global measure).
    """

    name = "feddwa"
    settings_type = FedDWASettings
    settings_table = "feddwa"
    feddist_paper = False
    personalised = True
    settings: FedDWASettings

    @property
    def top_k(self) -> int:
        """K, sources kept per client."""
        return self.settings.top_k

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        """``base`` with ``guidance = True``: clients also train and upload a guidance model."""
        return replace(base, guidance=True)

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """P_i = sum_j p_ij w_j for every participant i (FedDWA eq. 7-9), with the shadow FedAvg G mixed in the same pass.

        Raises ValueError if no result carries training windows.
        """
        used = contributors(results)
        guid = [u.guidance if u.guidance is not None else u.state for u in used]
        res = feddwa.aggregate([u.state for u in used], guid, top_k=self.top_k, average_weights=[u.n_train for u in used],
                               gram=self.settings.gram)  # fmt: skip
        assert res.average is not None
        personal = {u.client_id: st for u, st in zip(used, res.states, strict=True)}
        return Aggregate(res.average, personal, res.weights, [u.client_id for u in used])

    def aggregate_intermediate(self, fed: Federation, first: Aggregate, results: Sequence[ClientUpdate]) -> Aggregate:
        """Mix intermediate-round models with this round's P; ValueError if no participant sent an intermediate update."""
        by_id = {u.client_id: u for u in results}
        keep = [i for i, cid in enumerate(first.participants) if cid in by_id and by_id[cid].n_train > 0]
        if not keep:
            raise ValueError("no participant of the round sent an intermediate update")
        ids = [first.participants[i] for i in keep]
        assert first.mixing is not None
        p = first.mixing[keep][:, keep]
        p = p / p.sum(dim=0, keepdim=True)
        states = [by_id[c].state for c in ids]
        personal = dict(zip(ids, feddwa.personalise(states, p), strict=True))
        g = weighted_average(states, [by_id[c].n_train for c in ids])
        return Aggregate(g, personal, p, ids)
