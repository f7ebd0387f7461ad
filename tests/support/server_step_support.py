"""What the server-step tests build their rounds from: a float32 tensor, a client's update of one tensor ``w``, a federation."""

from __future__ import annotations

import torch

from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec


def tensor(*v: float) -> torch.Tensor:
    """A float32 vector of ``v``."""
    return torch.tensor(v, dtype=torch.float32)


def update(cid: str, n: int, w: torch.Tensor) -> ClientUpdate:
    """Client ``cid``'s round-0 update of the one tensor ``w``, trained on ``n`` windows."""
    return ClientUpdate(cid, 0, 0, n, 2, {"w": w}, None, size=100)


def federation(w: torch.Tensor) -> Federation:
    """A federation whose global model is the one tensor ``w``."""
    spec = ArchSpec(n_classes=6)
    return Federation(spec, spec, {"w": w})
