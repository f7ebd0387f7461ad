"""Training backends: one interface (:class:`TrainingBackend`) over PyTorch, numpy and ExecuTorch."""

from edge_client.backends.base import (
    BACKEND_NAMES,
    ArchitectureMismatch,
    EvalResult,
    TrainingBackend,
    TrainSummary,
    draw_dropout_masks,
    epoch_orders,
    train,
)
from edge_client.backends.factory import make_backend

__all__ = [
    "BACKEND_NAMES",
    "ArchitectureMismatch",
    "EvalResult",
    "TrainSummary",
    "TrainingBackend",
    "draw_dropout_masks",
    "epoch_orders",
    "make_backend",
    "train",
]
