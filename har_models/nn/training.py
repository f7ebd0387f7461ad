"""Local training and evaluation of the HAR CNN (PyTorch backend).

Shared by the edge client (local epochs, guidance model), the coordinator's evaluation
of models on a held-out set, and the centralised and local-only baselines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from har_models.data.labels import balanced_class_weights
from har_models.data.windowing import WindowSet
from har_models.nn.metrics import confusion_matrix
from har_models.nn.model import ArchSpec, build_model, get_state
from har_models.settings import LocalTraining

__all__ = ["TrainConfig", "TrainResult", "balanced_class_weights", "evaluate", "make_loss", "predict", "train_local"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_loss(class_weights: np.ndarray | None) -> LossFn:
    """Cross-entropy averaged over the batch with per-sample class weights.

    ``mean_b(w_{y_b} * CE_b)``: the Keras reduction the FedDist code used (divides by the
    batch size, not by the sum of weights as ``CrossEntropyLoss(weight=...)`` would).
    ``class_weights=None`` is plain mean cross-entropy.
    """
    if class_weights is None:
        return lambda logits, y: F.cross_entropy(logits, y)
    w = torch.as_tensor(class_weights, dtype=torch.float32)
    return lambda logits, y: (F.cross_entropy(logits, y, reduction="none") * w[y]).mean()


@dataclass(frozen=True)
class TrainConfig:
    """Local optimisation settings.

    Parameters
    ----------
    epochs : int
        E, passes over the training windows.
    lr : float
        SGD learning rate (no momentum, as in the FedDist and FedDWA code).
    batch_size : int
        Windows per step; the last partial batch is kept.
    prox_mu : float
        FedProx weight mu: adds (mu / 2) ||w - w_ref||^2 (Li et al., MLSys 2020, eq. 2).
    frozen : tuple of str
        Parameter names that are not updated.
    seed : int
        Seeds the shuffling and dropout.
    """

    epochs: int = LocalTraining.local_epochs
    lr: float = LocalTraining.lr
    batch_size: int = LocalTraining.batch_size
    prox_mu: float = 0.0
    frozen: tuple[str, ...] = field(default=())
    seed: int = 0


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train_local`: new parameters, mean loss per epoch, steps, seconds."""

    state: dict[str, torch.Tensor]
    epoch_losses: tuple[float, ...]
    steps: int
    seconds: float


def train_local(
    spec: ArchSpec,
    state: Mapping[str, torch.Tensor],
    data: WindowSet,
    cfg: TrainConfig,
    loss_fn: LossFn,
    prox_ref: Mapping[str, torch.Tensor] | None = None,
) -> TrainResult:
    """Train the CNN from ``state`` for ``cfg.epochs`` epochs of SGD on ``data``.

    Parameters
    ----------
    spec : ArchSpec
    state : mapping name -> tensor, the starting parameters theta
    data : WindowSet with x of shape (N, 6, T)
    cfg : TrainConfig
    loss_fn : callable (logits (B, C), y (B,)) -> scalar
    prox_ref : mapping name -> tensor, optional
        w^t for the FedProx term; required when ``cfg.prox_mu > 0``.

    Returns
    -------
    TrainResult
        With 0 windows or 0 epochs, the state is returned unchanged.

    Raises
    ------
    ValueError
        If ``prox_mu > 0`` without ``prox_ref``, or a frozen name is unknown.
    """
    if cfg.prox_mu > 0 and prox_ref is None:
        raise ValueError("train_local: prox_mu > 0 needs prox_ref (the model received this round)")
    unknown = set(cfg.frozen) - set(spec.shapes())
    if unknown:
        raise ValueError(f"train_local: frozen names {sorted(unknown)} are not parameters of the model")
    t0 = time.perf_counter()
    model = build_model(spec, state)
    model.train()
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(name not in cfg.frozen)
        if name not in cfg.frozen:
            params.append((name, p))
    ref = {n: torch.as_tensor(prox_ref[n]).detach() for n, _ in params} if cfg.prox_mu > 0 and prox_ref else {}
    opt = torch.optim.SGD([p for _, p in params], lr=cfg.lr, momentum=0.0)
    x = torch.from_numpy(data.x)
    y = torch.from_numpy(data.y)
    n = len(data)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    torch.manual_seed(int(cfg.seed))  # dropout masks
    losses, steps = [], 0
    if n > 0 and params:
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=gen)
            total, seen = 0.0, 0
            for s in range(0, n, cfg.batch_size):
                idx = order[s : s + cfg.batch_size]
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x[idx]), y[idx])
                if ref:
                    loss = loss + 0.5 * cfg.prox_mu * sum(((p - ref[name]) ** 2).sum() for name, p in params)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
                steps += 1
            losses.append(total / max(seen, 1))
    return TrainResult(get_state(model), tuple(losses), steps, time.perf_counter() - t0)


@torch.no_grad()
def predict(spec: ArchSpec, state: Mapping[str, torch.Tensor], x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Predicted class of each window.

    Parameters
    ----------
    x : ndarray of shape (N, 6, T), float32 (acc m/s^2, gyro rad/s)

    Returns
    -------
    ndarray of shape (N,), int64
    """
    model = build_model(spec, state).eval()
    out = [model(torch.from_numpy(np.ascontiguousarray(x[s : s + batch_size]))).argmax(1) for s in range(0, len(x), batch_size)]
    return torch.cat(out).numpy().astype(np.int64) if out else np.empty(0, np.int64)


def evaluate(spec: ArchSpec, state: Mapping[str, torch.Tensor], data: WindowSet, batch_size: int = 512) -> np.ndarray:
    """Confusion matrix (C, C) of the model on ``data`` (rows: truth, columns: prediction)."""
    return confusion_matrix(data.y, predict(spec, state, data.x, batch_size), spec.n_classes)
