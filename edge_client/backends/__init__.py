"""Training backends: one interface (:class:`TrainingBackend`) over PyTorch, numpy and ExecuTorch."""

from edge_client.backends.base import (
    BACKEND_NAMES,
    ArchitectureMismatch,
    BackendOptions,
    EvalResult,
    TrainingBackend,
    TrainSummary,
    draw_dropout_masks,
    epoch_orders,
    train,
)
from edge_client.backends.factory import available_backends, choose_backend, make_backend

__all__ = [
    "BACKEND_NAMES",
    "ArchitectureMismatch",
    "BackendOptions",
    "EvalResult",
    "TrainSummary",
    "TrainingBackend",
    "available_backends",
    "choose_backend",
    "draw_dropout_masks",
    "epoch_orders",
    "make_backend",
    "train",
]
