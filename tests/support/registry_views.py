"""What a home server's device registry (``<data>/server.sqlite``) holds, read the way the tests compare it."""

from __future__ import annotations

from pathlib import Path

from coordinator.server.registry import Registry


def kept_versions(data: Path) -> list[tuple[int, int]]:
    """(version, round) of every kept model version in data folder ``data``, oldest first; [] without a registry."""
    if not (data / "server.sqlite").exists():
        return []
    reg = Registry(data)
    try:
        return [(v.version, v.round) for v in reg.versions()]
    finally:
        reg.close()
