"""What every client trainer shares (PyTorch or backend): the round's outcome and its seeds. No PyTorch here."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from har_models.messages import RoundAnnouncement


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
