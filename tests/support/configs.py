"""A coordinator configuration from layers of settings, for tests whose helpers give defaults that callers refine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coordinator.config import CoordinatorConfig


def config(*layers: Mapping[str, Any]) -> CoordinatorConfig:
    """:class:`CoordinatorConfig` from ``layers``, each later one over the earlier ones table by table.

    A table given as a mapping is merged key by key onto the earlier layers' (``timing={"round_timeout_s": 5}`` over
    a layer that set ``start_timeout_s`` keeps both); one given as its settings dataclass replaces the table whole.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = dict(value) if isinstance(value, Mapping) else value
    return CoordinatorConfig(**merged)
