"""What every client trainer shares (PyTorch or backend): the round's outcome and its seeds. No PyTorch here."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_client.store import ClientStore
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.update_encoding import encode_update

RESIDUAL_NAME = "encoding_residual"
"""Store name of int8_delta's error-feedback residual (:meth:`ClientStore.save_tensors`)."""

log = logging.getLogger("fedhar.client.trainer")


@dataclass(frozen=True)
class RoundOutcome:
    """What a trainer's ``run_round`` produced.

    Attributes
    ----------
    envelope : bytes
        The update envelope to upload.
    summary : dict
        Small JSON-able summary for logs (accuracy before/after, loss, seconds).
    """

    envelope: bytes
    summary: dict[str, Any]


class Trainer(Protocol):
    """A client trainer: :class:`edge_client.trainer.LocalTrainer` (PyTorch) or :class:`edge_client.backend_trainer.BackendTrainer`."""

    def run_round(self, ann: RoundAnnouncement, received_np: dict[str, np.ndarray]) -> RoundOutcome:
        """Train for round ``ann`` from the received parameters; raise ValueError if they do not fit the announcement."""
        ...


def derive_seed(base: int, client_id: str, round_: int, stage: int, purpose: str = "train") -> int:
    """Deterministic per-client, per-round seed (CRC-32 of the tuple)."""
    return zlib.crc32(f"{base}:{client_id}:{round_}:{stage}:{purpose}".encode())


def stored_local_model(store: ClientStore, run_id: str, client_id: str) -> tuple[ArchSpec, dict[str, np.ndarray]] | None:
    """The client's previous local model of run ``run_id`` and its architecture, as stored; None if there is none.

    A new run forgets the old run's state first, so nothing of it leaks in. A stored model
    that does not match its own architecture is logged and ignored (the round then starts
    from the received model). Padding after a FedDist growth is the trainer's business.
    """
    if store.get_meta("run_id") != run_id:
        store.forget_run_state()
        return None
    loaded = store.load_local_model()
    if loaded is None:
        return None
    arch_json, state = loaded
    try:
        old = ArchSpec.from_json(arch_json)
        codec.check_tensors(old.shapes(), state)
    except ValueError as exc:
        log.error("[%s] stored local model is inconsistent (%s); using the received model", client_id, exc)
        return None
    return old, state


def encode_for_upload(
    store: ClientStore, ann: RoundAnnouncement, tensors: Mapping[str, Any], received: Mapping[str, np.ndarray]
) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """Apply the plan's update encoding to an update's tensors, keeping int8_delta's residual in ``store``.

    Parameters
    ----------
    store : ClientStore
        Holds the residual e under :data:`RESIDUAL_NAME`, tagged with the run id: a residual
        of another run is ignored (and :meth:`ClientStore.forget_run_state` deletes it).
    ann : RoundAnnouncement
        ``ann.plan.update_encoding`` chooses the encoding.
    tensors : mapping name -> array or torch tensor
        The update's tensors (trained model, ``guidance/`` tensors).
    received : mapping name -> float32 array
        The model received in this exchange, as decoded from its envelope.

    Returns
    -------
    arrays : mapping name -> array
        For float32, ``tensors`` itself (the envelope stays byte for byte as without encodings).
    meta : dict
        Fields to add to the envelope metadata (``{}`` for float32).

    Raises
    ------
    ValueError
        From :func:`har_models.wire.update_encoding.encode_update` (a value beyond float16, a
        tensor the received model lacks); the caller skips the round as for any bad input.

    Notes
    -----
    The residual is saved when the update is built. If the upload is then lost, the next
    delta still carries e' (at most half a quantisation step per element): a small
    correction the coordinator never needed, not an error that grows.
    """
    encoding = ann.plan.update_encoding
    if encoding == "float32":
        return tensors, {}
    residual: dict[str, np.ndarray] = {}
    if encoding == "int8_delta":
        loaded = store.load_tensors(RESIDUAL_NAME)
        if loaded is not None and loaded[1].get("run_id") == ann.run_id:
            residual = loaded[0]
    plain = {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)) for k, v in tensors.items()}
    arrays, meta, new_residual = encode_update(plain, received, encoding, residual)
    if encoding == "int8_delta":
        store.save_tensors(RESIDUAL_NAME, new_residual, {"run_id": ann.run_id, "round": ann.round, "stage": ann.stage})
    return arrays, meta
