"""The contract between FedALA (:mod:`edge_client.ala`) and a backend with its own kernel for learning W.

Zhang et al., AAAI 2023, Algorithm 1: a kernel's result (:class:`AlaLearned`), a backend's own
kernel (:class:`AlaKernel`) and the shared stop rule (:func:`stop_after_pass`); here so that a
backend implements it without importing ALA, which imports the backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from har_models.settings import AlaConfig

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class AlaLearned:
    """What a kernel that learns W returns (steps 3-5 of :func:`adaptive_local_aggregation`).

    ``state``: thetahat_i (the received model on a fallback); ``weights``: W after learning (the
    input W on a fallback or with eta = 0); ``losses``: last batch of each pass; ``n_sample``:
    windows in the s% sample; ``converged``: the start-phase stop test passed; ``fallback``:
    ``"empty sample"`` or ``"non-finite loss"``.
    """

    state: Arrays
    weights: Arrays
    losses: tuple[float, ...]
    n_sample: int
    converged: bool
    fallback: str | None = None


@runtime_checkable
class AlaKernel(Protocol):
    """A backend with its own way of learning W (the torch backend's autograd path)."""

    def learn_ala(self, *args: Any, **kwargs: Any) -> AlaLearned:
        """Steps 3-5 of ALA with the signature and contract of :func:`learn_ala_weights` (same draws), less ``backend``."""
        ...


def stop_after_pass(losses: Sequence[float], cfg: AlaConfig, start_phase: bool) -> tuple[bool, bool]:
    """After a pass: (stop, converged). One pass outside the start phase; in it, until std(last M) < tau or the cap
    (Algorithm 1 line 9's loop); shared so every kernel stops alike."""
    if not start_phase:
        return True, False
    if len(losses) > cfg.num_pre_loss and float(np.std(losses[-cfg.num_pre_loss :])) < cfg.threshold:
        return True, True
    return len(losses) >= cfg.max_passes, False
