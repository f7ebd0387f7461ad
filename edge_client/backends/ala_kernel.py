"""The contract between FedALA (:mod:`edge_client.ala`) and a backend with its own kernel for learning W.

Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023,
algorithm 1: what a kernel returns (:class:`AlaLearned`), what a backend with its own kernel offers
(:class:`AlaKernel`, the torch backend's autograd path), and the stop rule every kernel shares
(:func:`stop_after_pass`). It sits with the backends so that a backend implements it without
importing ALA, which imports the backends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from har_models.settings import AlaConfig

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class AlaLearned:
    """What a kernel that learns W returns (steps 3-5 of :func:`adaptive_local_aggregation`).

    Attributes
    ----------
    state : name -> float32 array
        thetahat_i: theta on the lower tensors, the blend on the higher ones (the received model on a fallback).
    weights : name -> float32 array
        W after learning (the input W on a fallback or with eta = 0), for the higher tensors.
    losses : tuple of float
        Loss of the last batch of each pass.
    n_sample : int
        Windows in the s% sample.
    converged : bool
        Whether the start-phase stop test passed.
    fallback : str or None
        ``"empty sample"`` or ``"non-finite loss"`` when the received model is returned.
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

    def learn_ala(
        self,
        received: Mapping[str, np.ndarray],
        local: Mapping[str, np.ndarray],
        weights: Mapping[str, np.ndarray],
        x: np.ndarray,
        y: np.ndarray,
        *,
        config: AlaConfig,
        batch_size: int,
        seed: int,
        start_phase: bool,
        class_weights: np.ndarray | None = None,
    ) -> AlaLearned:
        """Steps 3-5 of ALA with the contract of :func:`learn_ala_weights` (same inputs, same random draws)."""
        ...


def stop_after_pass(losses: Sequence[float], cfg: AlaConfig, start_phase: bool) -> tuple[bool, bool]:
    """After a pass: (stop, converged). One pass outside the start phase; in it, until std(last M) < tau or the cap.

    Shared by every kernel so they stop alike (Zhang et al., AAAI 2023, algorithm 1 line 9's loop).
    """
    if not start_phase:
        return True, False
    if len(losses) > cfg.num_pre_loss and float(np.std(losses[-cfg.num_pre_loss :])) < cfg.threshold:
        return True, True
    return len(losses) >= cfg.max_passes, False
