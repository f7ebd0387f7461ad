"""FedALA's weight learning over any training backend, in numpy (no PyTorch).

Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023 (arXiv 2212.01197), Algorithm 1 lines 6-16; steps 3-5 of
:func:`edge_client.ala.adaptive_local_aggregation`, with the same deviations (uniform random
sample redrawn every round, reshuffled passes, pass cap) and the same random draws: the sample is
``randperm(N)[:n]`` and each pass ``sample[randperm(n)]`` from one generator seeded with ``seed``
(:class:`~edge_client.backends.base.TorchRandperm`), so with the ``"torch"`` backend this learns the
W of the PyTorch implementation. The caller does steps 1-2 (first participation, padding after a
growth, resetting a W of the wrong tensors) as :mod:`edge_client.ala` does.

For the top tensors h (W_h in [0, 1], same shapes):

    thetahat_h = theta_i,h + (theta_h - theta_i,h) ⊙ W_h                               (ALA blend)
    W_h <- clip(W_h - eta * grad_{thetahat_h} L ⊙ (theta_h - theta_i,h), 0, 1)      (paper eq. 6)

per batch of the s% sample, the gradient coming from the backend's
:meth:`~edge_client.backends.base.TrainingBackend.top_layer_grads`. The lower tensors hold theta.
The blend is computed as ``torch.lerp`` does (``a + w (b - a)`` for ``w < 0.5``, else
``b - (b - a)(1 - w)``), exact at both ends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .base import TorchRandperm, TrainingBackend

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class BackendAlaResult:
    """Outcome of :func:`learn_ala_weights`.

    Attributes
    ----------
    state : name -> float32 array
        thetahat_i: theta on the lower tensors, the blend on the higher ones (the received model on a fallback).
    weights : name -> float32 array
        W after learning (the input W on a fallback), for the higher tensors.
    losses : tuple of float
        Loss of the last batch of each pass.
    n_sample : int
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


def lerp(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a + w (b - a)`` as ``torch.lerp`` computes it in float32 (exact at w = 0 and w = 1)."""
    a, b, w = (np.asarray(v, np.float32) for v in (a, b, w))
    d = b - a
    return np.where(np.abs(w) < 0.5, a + w * d, b - d * (np.float32(1) - w)).astype(np.float32)


def blend(local: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> Arrays:
    """thetahat = theta_i + (theta - theta_i) ⊙ W on the tensors of ``weights``; theta elsewhere (new float32 arrays)."""
    return {n: lerp(local[n], t, weights[n]) if n in weights else np.array(t, np.float32) for n, t in received.items()}


def learn_ala_weights(
    backend: TrainingBackend,
    received: Mapping[str, np.ndarray],
    local: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    eta: float,
    rand_percent: float,
    batch_size: int,
    seed: int,
    start_phase: bool,
    threshold: float = 0.1,
    num_pre_loss: int = 10,
    max_passes: int = 20,
    class_weights: np.ndarray | None = None,
    dropout: bool = True,
) -> BackendAlaResult:
    """Learn FedALA's W on ``backend`` and return the blended starting model (steps 3-5 of FedALA's ALA).

    Parameters
    ----------
    backend : TrainingBackend of the received architecture (its weights are overwritten)
    received : name -> array, theta (all tensors)
    local : name -> array, theta_i with the received shapes (padded by the caller after a growth)
    weights : name -> array in [0, 1], W for the higher tensors (its keys define them)
    x : (N, 6, T) float32;  y : (N,) int64, the client's training windows
    eta, rand_percent, threshold, num_pre_loss, max_passes : as :class:`edge_client.ala.AlaConfig`
    batch_size : int, the local batch;  seed : int, this round's ALA seed
    start_phase : bool, learn until the loss settles (first ALA round) rather than one pass
    class_weights : (C,) float32, optional, the training loss's class weights
    dropout : bool, dropout active while learning (AlaConfig.mode == "train"); the backend's dropout
        stream is seeded with ``seed`` (with the torch backend: the global torch RNG, as FedALA's code)

    Returns
    -------
    BackendAlaResult

    Raises
    ------
    ValueError
        If names or shapes of ``received``, ``local`` and ``weights`` disagree, or ``batch_size`` < 1.
    """
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"learn_ala_weights: batch_size must be an integer >= 1, got {batch_size}")
    higher: Sequence[str] = tuple(weights)
    for n in received:
        if n not in local or np.shape(local[n]) != np.shape(received[n]):
            raise ValueError(f"learn_ala_weights: local {n!r} is missing or not of the received shape {np.shape(received[n])}; pad it")
    for h in higher:
        if h not in received or np.shape(weights[h]) != np.shape(received[h]):
            raise ValueError(f"learn_ala_weights: W[{h!r}] does not match a received tensor's shape")
    theta = {n: np.asarray(v, np.float32) for n, v in received.items()}
    theta_i = {n: np.asarray(v, np.float32) for n, v in local.items()}
    w = {h: np.array(weights[h], np.float32) for h in higher}
    w_stored = {h: v.copy() for h, v in w.items()}

    n_total = int(np.shape(x)[0])
    n_sample = int(n_total * rand_percent // 100)
    if n_sample == 0:
        return BackendAlaResult(blend(theta, theta, {}), w_stored, (), 0, False, "empty sample")
    if eta == 0:
        return BackendAlaResult(blend(theta_i, theta, w), w_stored, (), n_sample, False)

    diff = {h: theta[h] - theta_i[h] for h in higher}
    backend.set_weights(theta)
    backend.set_weights({h: lerp(theta_i[h], theta[h], w[h]) for h in higher}, partial=True)
    perm = TorchRandperm(int(seed))
    sample = perm(n_total)[:n_sample]
    losses: list[float] = []
    converged = False
    first = True
    eta32 = np.float32(eta)
    while True:
        order = sample[perm(n_sample)]
        loss = 0.0
        for lo in range(0, n_sample, batch_size):
            idx = order[lo : lo + batch_size]
            loss, grads = backend.top_layer_grads(
                x[idx], y[idx], higher, class_weights=class_weights, dropout=dropout, dropout_seed=int(seed) if first else None
            )
            first = False
            for h in higher:
                w[h] = np.clip(w[h] - eta32 * grads[h] * diff[h], 0.0, 1.0).astype(np.float32)
            backend.set_weights({h: lerp(theta_i[h], theta[h], w[h]) for h in higher}, partial=True)
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            return BackendAlaResult(blend(theta, theta, {}), w_stored, tuple(losses), n_sample, False, "non-finite loss")
        if not start_phase:
            break
        if len(losses) > num_pre_loss and float(np.std(losses[-num_pre_loss:])) < threshold:
            converged = True
            break
        if len(losses) >= max_passes:
            break
    return BackendAlaResult(blend(theta_i, theta, w), w, tuple(losses), n_sample, converged)
