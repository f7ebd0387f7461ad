"""The Live screen's predictor: the device's current local model, behind one function.

:func:`load_predictor` gives ``predict(x) -> probabilities``: PyTorch eager where installed, else
the numpy reference (a phone); all agree to float32 rounding (``tests/test_backends.py``). The torch
predictor classifies on one intra-op thread (:mod:`edge_client.torch_threads`) without changing a
round's threads: at PyTorch's default count the pool's spinning was most of the cost.
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
    """The HAR CNN in PyTorch eager mode, for inference, from the stored ``arch_json`` and tensors.

    ``threads``: intra-op threads of a prediction (1), set for the call and restored, left alone
    while a round trains; None: PyTorch's count. Same probabilities either way; on a 2-core machine
    ``benchmarks/bench_device_cost.py --small`` measured 4.6-6.0 CPU s per hour of sensing on one
    thread against 8.9-35.9. Raises ValueError if the tensors do not match or ``threads`` < 1.
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
        """Probabilities (B, C) float32 for windows ``x`` (B, 6, T) float32; ValueError for another shape."""
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
    """A predictor for the store's current local model (backends of ``prefer`` in order, one without its runtime skipped),
    or None (no model, or an unusable one); ValueError if ``torch_threads`` < 1."""
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
