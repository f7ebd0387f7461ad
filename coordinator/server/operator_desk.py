"""Operator commands inside a running ``serve``: their live side, taken from its socket, done in its loop between rounds.

A command does what needs the operator's rights itself (registry, broker accounts and reload) and asks
the running server for its live side (:class:`ServerSide`): retained topics cleared through the
server's own session (a second coordinator login would take it over and lose queued updates), the
device forgotten by grid and runner, records rewritten, a quarantine released, a pin or rollback
taken up. :class:`OperatorDesk` queues requests from the operator channel; the serving loop runs
:meth:`OperatorDesk.serve_pending` in its own thread.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.server.folder_side import FolderSide
from coordinator.server.operator_channel import Job, OperatorChannel
from coordinator.server.operator_commands import status_of
from coordinator.server.settings import ServeFile

log = logging.getLogger("fedhar.serve")

OPERATIONS = ("clear_device", "forget_device", "rename_device", "release", "model_request")
"""The live-side operations the desk does (the methods of :class:`ServerSide`)."""


class ServerSide:
    """A command's live side inside the running server (:class:`coordinator.server.device_commands.Side`)."""

    def __init__(self, data: Path, file: Callable[[], ServeFile], grid: Any, runner: Any, take_request: Callable[[], list[str]]):
        self.data, self._file, self.grid, self.runner, self._take = Path(data), file, grid, runner, take_request

    def clear_device(self, name: str) -> str:
        """Forget the device in grid and runner and clear what the broker retains of it, through the server's session."""
        self.grid.forget(name)
        self.runner.forget_client(name)
        if self.grid.clear_device(name):
            return f"the running server cleared {name}'s retained status and models (and refuses it from now on)"
        return f"the running server could not clear {name}'s retained status now (it refuses {name} anyway)"

    def forget_device(self, name: str) -> list[str]:
        """Delete the device's files and run records; the runner is between rounds, its models of the device dropped."""
        return FolderSide(self.data, self._file()).forget_device(name)

    def rename_device(self, old: str, new: str) -> list[str]:
        """Move ``old``'s kept personalised models to ``new`` (the runner forgets ``old``'s) and clear ``old``."""
        from coordinator.server.lifecycle import move_personal_models

        moved = move_personal_models(self.data, old, new)
        self.runner.rename_client(old, new)  # the personalised model in memory goes with it
        return [f"{moved} kept personalised model(s) moved to {new}", self.clear_device(old)]

    def release(self, name: str) -> list[str]:
        """Release the device from the runner's quarantine."""
        if self.runner.release(name):
            return [f"{name} released from quarantine: its updates count again from the next round"]
        return [f"{name} was not quarantined; nothing changed"]

    def model_request(self, action: str, version: int | None) -> list[str]:
        """Write the request and take it up now: the next round starts from the version."""
        from coordinator.server import model_request

        model_request.write_request(self.data, action, version)
        return self._take()


class OperatorDesk:
    """The running server's desk for the live side of operator commands; ``busy(command)`` says why a request waits."""

    def __init__(self, data: Path, side: ServerSide, busy: Callable[[str], str | None]):
        self.data, self.side = Path(data), side
        self.channel = OperatorChannel(self.data, self._jobs_put, busy)
        self._jobs: queue.Queue[Job] = queue.Queue()

    def _jobs_put(self, job: Job) -> None:
        self._jobs.put(job)

    def start(self) -> None:
        """Listen for commands (logged and left out when the socket cannot be made: commands then say so)."""
        try:
            self.channel.start()
        except OSError as exc:
            log.error("operator commands cannot reach this server: %s cannot be made (%s); they wait and then say so",
                      self.channel.path, exc)  # fmt: skip

    def stop(self) -> None:
        """Stop listening; a request still queued is answered that the server stopped."""
        self.channel.stop()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            job.answer([], 5, "the server stopped before it did this; nothing was done: run the command again")

    def serve_pending(self, during_round: bool = False) -> None:
        """Do the queued requests now, each answered with its lines and status.

        ``during_round`` (between an open round's messages) holds a pin or rollback back until the round
        closes (it changes the model updates are checked against); everything else is done at once.
        """
        later: list[Job] = []
        try:
            self._serve(later, during_round)
        finally:
            for job in later:
                self._jobs.put(job)

    def _serve(self, later: list[Job], during_round: bool) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if during_round and job.command == "model_request":
                later.append(job)
                continue
            log.info("operator command from %s: %s %s", job.by, job.command, " ".join(f"{k}={v}" for k, v in sorted(job.args.items())))
            if job.command not in OPERATIONS:
                job.answer([], 2, f"{job.command!r} is not something this server does for a command (one of {', '.join(OPERATIONS)})")
                continue
            try:
                got = getattr(self.side, job.command)(**job.args)
            except Exception as exc:
                status = status_of(exc)
                if status is None:  # a bug: the server goes on, the operator learns where to look
                    log.exception("operator command %s failed", job.command)
                    job.answer([], 1, f"unexpected error ({type(exc).__name__}: {exc}); see the server's log")
                else:
                    log.warning("operator command %s: %s", job.command, exc)
                    job.answer([], status, str(exc))
                continue
            job.answer([got] if isinstance(got, str) else list(got))
