"""A device command's live side when no ``serve`` runs: the folders themselves, and the broker as the coordinator.

Used only while the command holds the data folder's lock: no server uses the folder then, so logging
in as the coordinator disconnects no one. With a server running, commands go through its ServerSide.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from coordinator.server.settings import ServeFile

RELEASES = "release_requests.json"
"""Devices released from quarantine while no server ran, for ``serve`` to release at its next start."""


def note_release(data: Path, name: str) -> None:
    """Keep ``name`` in :data:`RELEASES` (written atomically) for the next start of ``serve``."""
    from har_models.files import atomic_write_bytes

    names = sorted(set(pending_releases(data)) | {name})
    atomic_write_bytes(Path(data) / RELEASES, json.dumps(names).encode())


def pending_releases(data: Path) -> list[str]:
    """The names in :data:`RELEASES` ([] without the file, or when it does not read as a list of names)."""
    try:
        names = json.loads((Path(data) / RELEASES).read_text())
    except (OSError, ValueError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


def clear_releases(data: Path) -> None:
    """Delete :data:`RELEASES` (``serve`` released them)."""
    (Path(data) / RELEASES).unlink(missing_ok=True)


def clear_retained(file: ServeFile, name: str) -> bool:
    """Clear ``name``'s retained status and models on the broker as the coordinator (lock held); False if unreachable."""
    from coordinator.server.broker_session import clear_device_topics
    from coordinator.server.device_commands import admin_of, coordinator_broker
    from har_io.mqtt_link import MqttLink
    from har_models.wire.topics import Topics

    admin = admin_of(file)
    link = MqttLink(coordinator_broker(admin.broker_dir), f"fedhar-admin-{os.getpid()}", subscriptions=[])
    if not link.start(wait_s=15.0):
        link.stop()
        return False
    try:
        clear_device_topics(link, Topics(admin.federation), name)
    finally:
        link.stop()
    return True


class FolderSide:
    """The live side of a command run while no server runs, on the data folder whose lock the command holds."""

    def __init__(self, data: Path, file: ServeFile):
        self.data, self.file = Path(data), file

    def clear_device(self, name: str) -> str:
        """Clear the device's retained status and models as the coordinator (no server runs)."""
        if not self.file.server.broker_dir:
            return f"no broker folder is set: {name}'s retained status stays on the broker (serve ignores it)"
        if clear_retained(self.file, name):
            return f"{name}'s retained status and models cleared"
        return f"the broker could not be reached to clear {name}'s retained status (serve ignores it anyway)"

    def forget_device(self, name: str) -> list[str]:
        """Delete the device's files and its entries in the run's records (:func:`coordinator.server.lifecycle.scrub_run`)."""
        from coordinator.server.lifecycle import forget_files, scrub_run

        removed = forget_files(self.data, name)
        rounds = scrub_run(self.data / "run", name)
        return [f"deleted {removed} file(s) of {name} (personalised models, spilled updates, enrolment)",
                f"removed {name} from {rounds} round record(s) of {self.data / 'run'} (state.sqlite, report.json, report.md)"]  # fmt: skip

    def rename_device(self, old: str, new: str) -> list[str]:
        """Move ``old``'s kept personalised models to ``new`` and clear ``old`` on the broker."""
        from coordinator.server.lifecycle import move_personal_models

        moved = move_personal_models(self.data, old, new)
        return [f"{moved} kept personalised model(s) moved to {new}", self.clear_device(old)]

    def release(self, name: str) -> list[str]:
        """Note the release for ``serve``'s next start (the quarantine lives in the running server)."""
        note_release(self.data, name)
        return [f"no server runs: {name} is released from quarantine when serve starts"]

    def model_request(self, action: str, version: int | None) -> list[str]:
        """Write the request ``serve`` takes up before its next round (:mod:`coordinator.server.model_request`)."""
        from coordinator.server import model_request

        req = model_request.write_request(self.data, action, version)
        return [f"{req.describe()} requested: serve takes it up before its next round when it starts"]
