"""The FedDist evaluation protocol (Ek et al., PerCom 2021, evaluation section; DESIGN.md section 6).

* **global**: the global model (FedAvg / FedProx / FedDist server model; the shadow
  average under FedDWA and FedPer) on the union of all clients' test sets;
* **personalisation**: each client's model after this round's local training on its own
  test set (the client evaluates it and reports the confusion matrix), mean over clients;
* **generalisation**: each client's trained model on the union test set, mean over clients.

The union test set is a research harness: in a simulation the coordinator rebuilds it
from the same dataset files and split as the clients. A deployment has none, and then
reports personalisation (client side) and the received-model metrics summed over the
clients' confusion matrices, which equal the received model's metrics on the union of
their test sets.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """The ``[evaluation]`` settings table.

    Parameters
    ----------
    split_seed : int
        Seed of every client's 80/20 train/test split; the union test set uses the same one.
    generalisation_every : int
        Evaluate every client's model on the union test set every this many rounds (and in the last
        round); it costs one full evaluation per client. 0 = last round only.
    """

    split_seed: int = field(default=DEFAULT_SPLIT_SEED, metadata=doc("seed of every client's 80/20 train/test split"))
    generalisation_every: int = field(
        default=5, metadata=doc("rounds between generalisation evaluations (0 = last only)", "rounds")
    )


class Evaluator:
    """Evaluates models on a held-out union test set.

    Parameters
    ----------
    union_test : WindowSet
        Concatenated test windows of all clients, x of shape (N, 6, T).
    """

    def __init__(self, union_test: WindowSet):
        if len(union_test) == 0:
            raise ValueError("Evaluator: the union test set is empty; check the dataset path and split")
        self.union_test = union_test

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
