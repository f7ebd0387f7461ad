"""What every client trainer shares (PyTorch or backend): the round's outcome and its seeds. No PyTorch here."""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_client.store import ClientStore
from har_models import codec
from har_models.arch import ArchSpec
from har_models.messages import RoundAnnouncement

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
