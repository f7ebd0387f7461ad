"""What the serving loop looks after between rounds: devices revoked elsewhere, devices that left, refused devices' models."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from coordinator.server.registry import Registry

log = logging.getLogger("fedhar.serve")


class DeviceUpkeep:
    """The serving loop's look at the devices between rounds.

    Parameters
    ----------
    data_dir : Path
    registry : Registry
    grid : coordinator.grid.Grid
    runner : coordinator.runner.FederationRunner
    """

    def __init__(self, data_dir: Path, registry: Registry, grid: Any, runner: Any):
        self.data_dir, self.registry, self.grid, self.runner = Path(data_dir), registry, grid, runner
        self._revoked_seen: set[str] = set()

    def start(self) -> None:
        """Take the devices revoked before this start as seen (the earlier runs cleared them)."""
        self._revoked_seen = set(self.registry.revoked_names())

    def look(self) -> None:
        """Clear on the broker the devices revoked since the last look, and keep the word of devices that left."""
        self.clear_new_revocations()
        self.note_leave_requests()

    def clear_new_revocations(self) -> None:
        """For each device revoked since the last look (the registry is shared with the operator's commands): clear its
        retained status and personalised model chunks on the broker, through this server's own session."""
        now = self.registry.revoked_names()
        for cid in sorted(now - self._revoked_seen):
            self.grid.forget(cid)
            if self.grid.clear_device(cid):
                log.info("device %s was revoked: what the broker retained of it is cleared", cid)
        self._revoked_seen = set(now)

    def note_leave_requests(self) -> None:
        """Keep the word of each device that left from its app (:meth:`coordinator.grid.Grid.leaving`) in the data folder.

        Nothing is deleted here: ``fedhar-coordinator devices`` lists the requests, and the operator
        answers one with ``forget NAME`` (or ``revoke NAME``). A device that left is offline, so it
        is not selected meanwhile.
        """
        from coordinator.server.lifecycle import note_leave_request

        for cid, st in sorted(self.grid.leaving().items()):
            if self.registry.is_revoked(cid):
                continue
            try:
                if note_leave_request(self.data_dir, cid, st.left == "forget", st.sent_unix) and st.left == "forget":
                    log.warning("device %s asks to be forgotten: fedhar-coordinator forget %s deletes what the server holds of it",
                                cid, cid)  # fmt: skip
            except OSError as exc:
                log.error("device %s left, but its request cannot be kept in %s: %s", cid, self.data_dir, exc)

    def drop_refused_models(self) -> None:
        """Forget the personalised models of devices revoked or forgotten since they were made (not saved again)."""
        for cid in self.runner.personal_ids():
            if self.registry.is_revoked(cid) and self.runner.forget_client(cid):
                log.info("the personalised model of revoked device %s is dropped", cid)
