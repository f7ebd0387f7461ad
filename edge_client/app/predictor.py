"""The Live screen's predictor: the device's current local model, behind one function.

:func:`load_predictor` returns an object with ``predict(x) -> probabilities``: PyTorch
eager where it is installed (desktop, a board), else the numpy reference implementation of
the same CNN (:mod:`edge_client.backends.numpy_ref`), which needs nothing but numpy (a
phone). ``prefer=("executorch", ...)`` asks for the ExecuTorch inference program first.
All three give the same probabilities to float32 rounding
(``tests/test_backends.py``).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from edge_client.store import ClientStore

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

    Raises
    ------
    ValueError
        If the tensors do not match the architecture.
    """

    def __init__(self, arch_json: str, state: dict[str, np.ndarray]):
        import torch

        from har_models.nn.model import ArchSpec, build_model, check_state

        spec = ArchSpec.from_json(arch_json)
        check_state(spec, state)
        self.spec = spec
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
        with self._torch.no_grad():
            logits = self._model(self._torch.from_numpy(np.ascontiguousarray(x)))
            return self._torch.softmax(logits, dim=1).numpy().astype(np.float32)


def load_predictor(store: ClientStore, prefer: tuple[str, ...] = ("torch", "numpy")) -> Predictor | None:
    """A predictor for the store's current local model, or None (no model yet, or an unusable one).

    Parameters
    ----------
    store : ClientStore
    prefer : tuple of backend names
        Tried in order; a backend whose runtime is not installed is skipped.
    """
    loaded = store.load_local_model()
    if loaded is None:
        return None
    arch_json, state = loaded
    for name in prefer:
        try:
            if name == "torch":
                return TorchPredictor(arch_json, state)
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
