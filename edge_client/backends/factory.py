"""Choose a training backend by name: the one place that knows the three implementations.

Kept apart from :mod:`edge_client.backends.base` (the interface and the helpers every
implementation uses), so the implementations depend on the interface and not the reverse.
Each implementation is imported only when asked for, so a device needs only its own
runtime (numpy; PyTorch; ExecuTorch).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edge_client.backends.base import BACKEND_NAMES, TrainingBackend
from har_models.nn.arch import ArchSpec

__all__ = ["BACKEND_NAMES", "make_backend"]


def make_backend(name: str, spec: ArchSpec, weights: Mapping[str, np.ndarray] | None = None, **options: object) -> TrainingBackend:
    """The backend called ``name`` for ``spec``, loaded with ``weights`` if given.

    Parameters
    ----------
    name : {"torch", "numpy", "executorch", "executorch-android"}
    spec : ArchSpec
    weights : name -> ndarray, optional (default: the backend's deterministic init, seed 0)
    **options
        Passed to the backend's constructor (e.g. ``cache_dir`` and ``train_batch`` for ``"executorch"``).

    Raises
    ------
    ValueError
        On an unknown name (listing the known ones).
    ImportError
        If the backend's runtime (torch, executorch) is not installed.
    """
    if name == "numpy":
        from edge_client.backends.numpy_ref import NumpyBackend

        return NumpyBackend(spec, weights, **options)  # type: ignore[arg-type]
    if name == "torch":
        from edge_client.backends.torch_eager import TorchBackend

        return TorchBackend(spec, weights, **options)  # type: ignore[arg-type]
    if name == "executorch":
        from edge_client.backends.executorch_rt import ExecuTorchBackend

        return ExecuTorchBackend(spec, weights, **options)  # type: ignore[arg-type]
    if name == "executorch-android":
        from edge_client.backends.android_executorch import AndroidExecuTorchBackend

        return AndroidExecuTorchBackend.from_cache(spec, weights, **options)  # type: ignore[arg-type]
    raise ValueError(f"make_backend: unknown backend {name!r}; choose one of {BACKEND_NAMES}")
