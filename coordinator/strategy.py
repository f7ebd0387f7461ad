"""Aggregation strategies: small classes over the pure functions of the papers.

A strategy has Flower's hooks (Beutel et al., arXiv 2007.14390, ``flwr.server.strategy``):
:meth:`Strategy.configure_fit` says what the selected clients do in a round,
:meth:`Strategy.aggregate_fit` combines their results and sees the failures (clients
that missed the deadline, went offline or were rejected), and
:meth:`Strategy.aggregate_intermediate` combines the updates of a FedDist intermediate
exchange. Client selection and the round's bookkeeping are in :mod:`coordinator.round`;
growth (FedDist) and client initialisation (FedALA) are orthogonal switches, so every
combination runs.

=========  ==============================================================  =================
name       what the coordinator does                                        client extras
=========  ==============================================================  =================
fedavg     theta = sum_k n_k/n theta_k (McMahan et al. 2017)               --
fedprox    as fedavg                                                       (mu/2)||w - w^t||^2 (Li et al. 2020)
fedper     as fedavg; only the conv layer is used by clients               keep hidden+out local (Arivazhagan et al. 2019)
feddwa     client i gets sum_j p_ij w_j, p from guidance distances         train + upload guidance (Liu et al. 2023)
=========  ==============================================================  =================
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from coordinator import feddwa
from coordinator.aggregation import State, weighted_average
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.model import ArchSpec
from har_models.wire.messages import TrainingPlan

log = logging.getLogger("fedhar.coordinator.strategy")

FEDPER_LOCAL = ("hidden.weight", "hidden.bias", "out.weight", "out.bias")
"""FedPer's personal layers for the HAR CNN: the dense layers, as in the FedDist authors' FedPer
(only the conv layer is shared; algorithms.md section 4.2)."""


@dataclass
class Federation:
    """The coordinator's model state between rounds.

    Attributes
    ----------
    spec : ArchSpec
        Current architecture (version v).
    initial_spec : ArchSpec
        Architecture of round 0 (FedDist width caps are relative to it).
    global_state : State
        The global model G (FedAvg/FedProx/FedDist) or the shadow average (FedDWA, FedPer).
    personal : dict client id -> State
        Personalised models P_i (FedDWA); clients without one receive G.
    """

    spec: ArchSpec
    initial_spec: ArchSpec
    global_state: State
    personal: dict[str, State] = field(default_factory=dict)


@dataclass(frozen=True)
class Aggregate:
    """Result of one aggregation.

    Attributes
    ----------
    global_state : State
        New G.
    personal : dict client id -> State
        New personalised models of this round's participants (empty unless personalised).
    mixing : Tensor of shape (n, n), optional
        FedDWA's P[j, i] over ``participants`` (kept to re-mix after intermediate rounds).
    participants : list of str
        Client ids that contributed, in the order of ``mixing``.
    """

    global_state: State
    personal: dict[str, State]
    mixing: torch.Tensor | None
    participants: list[str]


def _contributors(updates: Sequence[ClientUpdate]) -> list[ClientUpdate]:
    """Updates with at least one training window; the others trained nothing and are left out."""
    used = [u for u in updates if u.n_train > 0]
    if not used:
        raise ValueError("no update carries training windows (all n_train = 0); nothing to aggregate")
    return used


class Strategy:
    """FedAvg (McMahan et al., AISTATS 2017): weighted by training windows n_k.

    Subclasses change :meth:`plan` (what clients do) and/or :meth:`aggregate`.
    """

    name = "fedavg"

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        """The training plan the selected clients follow in round ``round_`` under this strategy."""
        return base

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """Combine the round's validated updates; ``failures`` are the selected clients that sent none.

        theta = sum_k n_k / n * theta_k over the results with n_k > 0 (McMahan et al.,
        AISTATS 2017, algorithm 1). Failures carry no weight.

        Raises
        ------
        ValueError
            If no result carries training windows.
        """
        used = _contributors(results)
        g = weighted_average([u.state for u in used], [u.n_train for u in used])
        return Aggregate(g, {}, None, [u.client_id for u in used])

    def aggregate_intermediate(self, fed: Federation, first: Aggregate, results: Sequence[ClientUpdate]) -> Aggregate:
        """Aggregate the updates of a FedDist intermediate exchange (as :meth:`aggregate_fit` here)."""
        return self.aggregate_fit(-1, fed, results)


class FedProx(Strategy):
    """FedProx (Li et al., MLSys 2020): FedAvg server, proximal local objective.

    Parameters
    ----------
    mu : float
        Proximal weight (algorithms.md 4.3 proposes 0.01; the paper tunes 0.001..1).
    """

    name = "fedprox"

    def __init__(self, mu: float = 0.01):
        if not mu >= 0:
            raise ValueError(f"FedProx: mu must be >= 0, got {mu}")
        self.mu = float(mu)

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        return replace(base, prox_mu=self.mu)


class FedPer(Strategy):
    """FedPer (Arivazhagan et al., arXiv 1912.00818): shared base layers, local personal layers.

    The server still averages every tensor (its average is reported as the shadow global
    model), but clients replace only the base (conv) layer and keep :data:`FEDPER_LOCAL`.
    """

    name = "fedper"

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        return replace(base, keep_local=FEDPER_LOCAL)


class FedDWA(Strategy):
    """FedDWA (Liu et al., IJCAI 2023, arXiv 2305.06124): personalised mixes by guidance distance.

    Each participant uploads w_i and its guidance model; client i then receives
    sum_j p_ij w_j with p_ij proportional to ||guidance_i - w_j||^-2 over the top-K (see
    :mod:`coordinator.feddwa`). Clients that did not take part keep their P_i. G is the
    shadow FedAvg average (for FedDist detection and the global measure).

    Parameters
    ----------
    top_k : int
        K, sources kept per client (5 in the paper's code).
    """

    name = "feddwa"

    def __init__(self, top_k: int = 5):
        if top_k < 1:
            raise ValueError(f"FedDWA: top_k must be >= 1, got {top_k}")
        self.top_k = int(top_k)

    def configure_fit(self, round_: int, base: TrainingPlan) -> TrainingPlan:
        return replace(base, guidance=True)

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """P_i = sum_j p_ij w_j for every participant i (FedDWA eq. 7-9); G is the shadow FedAvg.

        G is mixed in the same pass over the trained models as the P_i (one more column of
        FedAvg weights n_k / n), so it equals :func:`weighted_average` up to float64 rounding order.
        """
        used = _contributors(results)
        guid = [u.guidance if u.guidance is not None else u.state for u in used]
        res = feddwa.aggregate([u.state for u in used], guid, top_k=self.top_k, average_weights=[u.n_train for u in used])
        assert res.average is not None
        personal = {u.client_id: st for u, st in zip(used, res.states, strict=True)}
        return Aggregate(res.average, personal, res.weights, [u.client_id for u in used])

    def aggregate_intermediate(self, fed: Federation, first: Aggregate, results: Sequence[ClientUpdate]) -> Aggregate:
        """Mix intermediate-round models with this round's P (no new guidance models)."""
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
