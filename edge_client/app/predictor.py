"""The Live screen's predictor: the device's current local model, behind one function.

:func:`load_predictor` returns an object with ``predict(x) -> probabilities``: PyTorch
eager where it is installed (desktop, a board), else the numpy reference implementation of
the same CNN (:mod:`edge_client.backends.numpy_ref`), which needs nothing but numpy (a
phone). ``prefer=("executorch", ...)`` asks for the ExecuTorch inference program first.
All three give the same probabilities to float32 rounding
(``tests/test_backends.py``).

The torch predictor classifies on one intra-op thread (:mod:`edge_client.torch_threads`), without
changing the threads a round trains with: at PyTorch's default count the intra-op pool's
spinning was most of what background classification cost.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

import numpy as np

from edge_client.store import ClientStore
from edge_client.torch_threads import INFERENCE_THREADS, inference_threads

log = logging.getLogger("fedhar.client.predictor")


class Predictor(Protocol):
    """What the app needs of a model."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities (B, C), rows summing to 1, for windows x (B, 6, T) float32."""
        ...


class TorchPredictor:
    """The HAR CNN in PyTorch eager mode, for inference.

    Parameters
    ----------
    arch_json : str
        :class:`~har_models.nn.model.ArchSpec` as JSON (as stored with the local model).
    state : dict name -> ndarray
        The model's tensors.
    threads : int or None
        PyTorch intra-op threads of a prediction (:data:`~edge_client.torch_threads.INFERENCE_THREADS`,
        1): the process's count is changed for the call and restored, and left alone while a
        round trains (:func:`~edge_client.torch_threads.inference_threads`). None: PyTorch's count
        as it is. The probabilities are the same either way (``tests/test_torch_threads.py``); the
        CPU is not: ``benchmarks/bench_device_cost.py --small`` measured 4.6-6.0 CPU s per hour of
        sensing on one thread, 8.9-35.9 at PyTorch's count on a 2-core machine.

    Raises
    ------
    ValueError
        If the tensors do not match the architecture, or ``threads`` < 1.
    """

    def __init__(self, arch_json: str, state: dict[str, np.ndarray], threads: int | None = INFERENCE_THREADS):
        import torch

        from har_models.nn.model import ArchSpec, build_model, check_state

        spec = ArchSpec.from_json(arch_json)
        check_state(spec, state)
        if threads is not None and threads < 1:
            raise ValueError(f"TorchPredictor: threads must be at least 1 (or None: PyTorch's own count), got {threads}")
        self.spec = spec
        self.threads = threads
        self._torch = torch
        self._model = build_model(spec, {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in state.items()}).eval()

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Probabilities (B, C) float32 for windows ``x`` (B, 6, T) float32, softmax of the logits.

        Raises
        ------
        ValueError
            If ``x`` is not (B, 6, T) with the model's T.
        """
        x = np.asarray(x, np.float32)
        if x.ndim != 3 or x.shape[1:] != (self.spec.n_channels, self.spec.window):
            raise ValueError(f"predict: windows must be (B, {self.spec.n_channels}, {self.spec.window}), got {x.shape}")
        with contextlib.ExitStack() as stack:
            if self.threads is not None:
                stack.enter_context(inference_threads(self.threads))
            with self._torch.no_grad():
                logits = self._model(self._torch.from_numpy(np.ascontiguousarray(x)))
                return self._torch.softmax(logits, dim=1).numpy().astype(np.float32)


def load_predictor(
    store: ClientStore, prefer: tuple[str, ...] = ("torch", "numpy"), torch_threads: int | None = INFERENCE_THREADS
) -> Predictor | None:
    """A predictor for the store's current local model, or None (no model yet, or an unusable one).

    Parameters
    ----------
    store : ClientStore
    prefer : tuple of backend names
        Tried in order; a backend whose runtime is not installed is skipped.
    torch_threads : int or None
        The torch predictor's intra-op threads (:class:`TorchPredictor`'s ``threads``; 1).

    Raises
    ------
    ValueError
        If ``torch_threads`` < 1.
    """
    if torch_threads is not None and torch_threads < 1:
        raise ValueError(f"load_predictor: torch_threads must be at least 1 (or None: PyTorch's own count), got {torch_threads}")
    loaded = store.load_local_model()
    if loaded is None:
        return None
    arch_json, state = loaded
    for name in prefer:
        try:
            if name == "torch":
                return TorchPredictor(arch_json, state, threads=torch_threads)
            from edge_client.backends.factory import make_backend
            from har_models.nn.arch import ArchSpec

            spec = ArchSpec.from_json(arch_json)
            return make_backend(name, spec, state)
        except ImportError:
            log.debug("no %s runtime on this device", name)
            continue
        except ValueError as exc:
            log.error("the stored local model cannot be used for predictions: %s", exc)
            return None
    return None
