"""The served federation's model versions: each completed round's model kept as the next numbered version, and the
operator's pin or rollback taken up before a round.

``<data>/versions/v000001.safetensors`` ... hold the global models, the registry their rows and
figures; the newest ``[server] keep_versions`` stay. A pin or rollback is taken up once per request
and process, and noted done when the round that started from it completes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator import state as run_state
from coordinator.record import RoundRecord
from coordinator.server import model_request
from coordinator.server.lifecycle import prune_bundles
from coordinator.server.registry import Registry, VersionRow

log = logging.getLogger("fedhar.serve")

REQUEST_DONE_KEY = "model_request_done"
"""Key in the run's database: the id of the last operator pin/rollback whose round completed."""


def version_path(data_dir: Path, version: int) -> Path:
    """``<data>/versions/v000001.safetensors`` for version 1."""
    return Path(data_dir) / "versions" / f"v{version:06d}.safetensors"


class VersionKeeper:
    """Keeps the versions of a served federation and takes up the operator's model requests (``keep_versions`` read at each use)."""

    def __init__(self, data_dir: Path, registry: Registry, runner: Any, run_id: str, epoch: int, keep_versions: Callable[[], int]):
        self.data_dir, self.registry, self.runner = Path(data_dir), registry, runner
        self.run_id, self.epoch, self._keep = run_id, epoch, keep_versions
        self._request_taken = ""  # id of the operator's pin/rollback taken up by this process
        self._request_pending: model_request.ModelRequest | None = None  # taken up, its round not yet completed

    def newest(self) -> VersionRow | None:
        """The newest kept version, or None."""
        rows = self.registry.versions(newest=1)
        return rows[-1] if rows else None

    def keep(self, record: RoundRecord, opened_unix: float | None = None) -> int:
        """Keep the round's global model as the next version, note each device's part, apply the retention; the version.

        ``opened_unix`` (the round's opening, default now) dates the participation rows, so a bundle reissued
        while the round was open is not taken as used. Raises StorageFull if the file cannot be written
        (nothing recorded; the same call succeeds once there is space).
        """
        spec, global_state = self.runner.model()
        newest = self.newest()
        version = 1 if newest is None else newest.version + 1
        path = version_path(self.data_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        run_state.save_state_file(path, spec, global_state,
                                  extra={"version": str(version), "round": str(record.round), "run_id": self.run_id})  # fmt: skip
        ev = record.evaluation
        figures: dict[str, Any] = {
            "round": record.round,
            "updates": record.participation.updates,
            "selected": record.participation.selected,
            "personalisation_accuracy": ev.personalisation.accuracy if ev.personalisation else None,
            "personalisation_macro_f1": ev.personalisation.macro_f1 if ev.personalisation else None,
            "global_accuracy": ev.global_.accuracy if ev.global_ else None,
            "global_macro_f1": ev.global_.macro_f1 if ev.global_ else None,
            "epoch": self.epoch,
        }
        figures = {k: (None if isinstance(v, float) and v != v else v) for k, v in figures.items()}  # NaN is not JSON
        self.registry.add_version(version, record.round, spec.version, path, figures)
        for cid, m in sorted(ev.personalisation_clients.items()):
            self.registry.note_participation(record.round, cid, m.accuracy, m.macro_f1, t=opened_unix)
        prune_bundles(self.data_dir)  # devices that contributed have joined: their bundles (passwords) go
        log.info("round %d: model version %d kept in %s", record.round, version, path)
        rows = self.registry.versions()
        for old in rows[: max(0, len(rows) - self._keep())]:
            old.path.unlink(missing_ok=True)
            self.registry.delete_version(old.version)
        return version

    def catch_up(self, last: int) -> None:
        """Give round ``last`` its version when a stop fell between the round's commit and its version file; StorageFull as :meth:`keep`."""
        newest = self.newest()
        if last < 0 or (newest is not None and newest.round >= last):
            return
        done = [r for r in self.runner.records() if r.round == last]
        if done:
            log.info("round %d was completed but not kept as a version (the server stopped in between); keeping it now", last)
            self.keep(done[0])

    # ------------------------------------------------------------------------------------------ operator's model requests
    def take_request(self) -> list[str]:
        """Take up an operator's pending pin or rollback before a round (once per request and process); the lines done.

        A request already done is deleted; one that cannot be done (version no longer kept, no best version)
        is logged, deleted and raised as ValueError, and the federation goes on as it was.
        """
        from coordinator.runner import CoordinatorError

        try:
            req = model_request.read_request(self.data_dir)
        except ValueError as exc:
            log.error("%s", exc)
            raise
        if req is None or req.id == self._request_taken:
            return []
        if self.runner.state.get(REQUEST_DONE_KEY) == req.id:
            model_request.clear_request(self.data_dir, req)
            return []
        try:
            self.runner.ensure_federation()
            if req.version is None:
                best = self.runner.best_model()
                if best is None:
                    raise ValueError("the quality guard holds no best version yet (it is off, or no version was judged)")
                spec, state = best
            else:
                rows = {v.version: v for v in self.registry.versions()}
                if req.version not in rows:
                    raise ValueError(f"version {req.version} is not kept (kept: {sorted(rows)})")
                spec, state = run_state.load_state_file(rows[req.version].path)
            self.runner.adopt(spec, state, rollback_id=req.id if req.action == "rollback" else None,
                              keep_best=req.version is None)  # fmt: skip
        except (ValueError, OSError, CoordinatorError) as exc:
            log.error("operator's %s cannot be done: %s; the request is dropped", req.describe(), exc)
            model_request.clear_request(self.data_dir, req)
            raise ValueError(f"{req.describe()} cannot be done: {exc}; the request is dropped") from None
        self._request_taken = req.id
        self._request_pending = req
        step = " with a halved server step" if req.action == "rollback" else ""
        log.warning("operator's %s: the next round starts from it%s", req.describe(), step)
        return [f"{req.describe()}: the server's next round starts from it{step}"]

    def finish_request(self) -> None:
        """The round that started from a requested model completed: note the request done and delete its file."""
        req = self._request_pending
        if req is None:
            return
        self.runner.state.put(REQUEST_DONE_KEY, req.id)
        model_request.clear_request(self.data_dir, req)
        self._request_pending = None
