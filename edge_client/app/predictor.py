"""The Live screen's predictor: the device's current local model, behind one function.

:func:`load_predictor` returns an object with ``predict(x) -> probabilities``. Today it
runs the model with PyTorch (``har_models.model``) where PyTorch is installed (desktop,
Raspberry Pi); on a phone, where PyTorch does not exist, it returns None until the
training backends (numpy reference, ExecuTorch) provide the same ``predict``; swapping
this one function is all the app needs.
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
        :class:`~har_models.model.ArchSpec` as JSON (as stored with the local model).
    state : dict name -> ndarray
        The model's tensors.

    Raises
    ------
    ValueError
        If the tensors do not match the architecture.
    """

    def __init__(self, arch_json: str, state: dict[str, np.ndarray]):
        import torch

        from har_models.model import ArchSpec, build_model, check_state

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


def load_predictor(store: ClientStore) -> Predictor | None:
    """A predictor for the store's current local model, or None (no model yet, or no runtime here)."""
    loaded = store.load_local_model()
    if loaded is None:
        return None
    arch_json, state = loaded
    try:
        return TorchPredictor(arch_json, state)
    except ImportError:
        log.info("no PyTorch on this device: live predictions wait for a numpy or ExecuTorch backend")
        return None
    except ValueError as exc:
        log.error("the stored local model cannot be used for predictions: %s", exc)
        return None
