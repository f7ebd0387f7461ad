"""The FedDist evaluation protocol (Ek et al., PerCom 2021, evaluation section; DESIGN.md section 6).

**global**: the global model (the shadow average under FedDWA and FedPer) on the union of the
clients' test sets; **personalisation**: each client's trained model on its own test set (reported
as a confusion matrix), mean over clients; **generalisation**: each trained model on the union test
set, mean over clients. The union test set exists only in research runs (rebuilt from the clients'
files and split); a deployment reports personalisation and the received model's figures from the
summed confusion matrices, which equal those on the union of the test sets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from har_models.data.splits import DEFAULT_SPLIT_SEED
from har_models.data.windowing import WindowSet
from har_models.nn.metrics import mean_over_clients, summarise
from har_models.nn.model import ArchSpec
from har_models.nn.training import evaluate
from har_models.settings import doc


@dataclass(frozen=True)
class EvaluationSettings:
    """The ``[evaluation]`` settings table."""

    split_seed: int = field(default=DEFAULT_SPLIT_SEED, metadata=doc("seed of every client's 80/20 train/test split"))
    generalisation_every: int = field(
        default=5, metadata=doc("rounds between generalisation evaluations (0 = last only)", "rounds")
    )
    global_from: str = field(
        default="clients",
        metadata=doc("the global model's figures: from the next round's client start measures where they are exact "
                     "(else the union test set), or always 'central'", choices=("clients", "central")),
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.global_from not in ("clients", "central"):
            raise ValueError(f"[evaluation] global_from = {self.global_from!r}: must be 'clients' or 'central'")


class Evaluator:
    """Evaluates models on a held-out union test set (windows ``(N, 6, T)``); ValueError if it is empty.

    ``clients``: the client ids whose test splits make up the union (None: not known), which lets
    :mod:`coordinator.global_measure` take G's figures from those clients' own measures.
    """

    def __init__(self, union_test: WindowSet, clients: Collection[str] | None = None):
        if len(union_test) == 0:
            raise ValueError("Evaluator: the union test set is empty; check the dataset path and split")
        self.union_test = union_test
        self.clients = frozenset(clients) if clients is not None else None

    def global_metrics(self, spec: ArchSpec, state: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Accuracy, macro-F1, weighted-F1 of one model on the union test set."""
        return summarise(evaluate(spec, state, self.union_test))

    def generalisation(
        self, spec: ArchSpec, states: Mapping[str, Mapping[str, torch.Tensor]]
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Each client's model on the union test set: ``(mean over clients, per client)``."""
        cms = {cid: evaluate(spec, st, self.union_test) for cid, st in states.items()}
        return mean_over_clients(list(cms.values())), {cid: summarise(cm) for cid, cm in cms.items()}


def personalisation(confusions: Mapping[str, np.ndarray]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean over clients of their own-test-set metrics: ``(mean, per client)``."""
    return mean_over_clients(list(confusions.values())), {cid: summarise(cm) for cid, cm in confusions.items()}


def union_of_clients(confusions: Mapping[str, np.ndarray]) -> dict[str, float] | None:
    """Metrics of the summed confusion matrices: exact metrics on the union of the clients' test sets."""
    mats = [np.asarray(m) for m in confusions.values()]
    return summarise(sum(mats[1:], mats[0])) if mats else None
