"""The simulation's client fleet: one process per client, or virtual clients hosted in a few workers.

Either way every client is a ``fedhar-client`` with its own MQTT connection, client id
and state folder; only the hosting differs:

- ``processes``: one Python process per client (the most faithful: nothing shared).
- ``workers``: W worker processes (:mod:`edge_client.worker`), each hosting its share of the
  clients in threads and training one at a time. Memory is that of W trainings, not N.
  A worker that dies mid-run is restarted (its clients miss the round in progress and
  are back for the next one).

:class:`Fleet` tells the coordinator which clients are gone (``gone``) and stops them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("fedhar.simulate")

ENGINES = ("workers", "processes")
MAX_RESTARTS = 3
"""Restarts of one worker before its clients are given up."""


def _lower_priority() -> None:
    with contextlib.suppress(OSError):  # not permitted: run at normal priority
        os.nice(5)


@dataclass
class Fleet:
    """Client processes of one simulation.

    Parameters
    ----------
    clients : dict client id -> list of str
        Each client's ``fedhar-client`` options.
    engine : {"workers", "processes"}
    workers : int
        Worker processes (``workers`` engine); at most one per client.
    threads : int
        PyTorch threads per process.
    log_dir : Path
        ``<client id>.log`` (processes) or ``worker-<k>.log`` (workers).
    cwd : Path
        Working folder of the processes (the project root, so ``-m`` finds the packages).
    """

    clients: dict[str, list[str]]
    engine: str
    workers: int
    threads: int
    log_dir: Path
    cwd: Path
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # process name -> process
    _members: dict[str, list[str]] = field(default_factory=dict)  # process name -> client ids
    _restarts: dict[str, int] = field(default_factory=dict)
    _stopping: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")

    def _env(self) -> dict[str, str]:
        # MALLOC_ARENA_MAX: one arena per thread would keep each client's round peak resident.
        return {**os.environ, "OMP_NUM_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2"}

    @property
    def _status_dir(self) -> Path:
        return self.log_dir / "exit-status"

    def _spawn(self, name: str) -> None:
        if self.engine == "processes":
            (cid,) = self._members[name]
            cmd = [sys.executable, "-m", "edge_client.cli", *self.clients[cid], "--threads", str(self.threads)]
        else:
            spec = self.log_dir / f"{name}.clients.json"
            spec.write_text(json.dumps([self.clients[c] for c in self._members[name]]))
            cmd = [sys.executable, "-m", "edge_client.worker", "--clients", str(spec), "--status-dir", str(self._status_dir),
                   "--threads", str(self.threads)]
        with open(self.log_dir / f"{name}.log", "ab") as out:
            # Clients run at lower priority, so the broker and coordinator keep messages moving while they train.
            self._procs[name] = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env(), cwd=self.cwd, preexec_fn=_lower_priority
            )

    def start(self) -> None:
        """Start every client (round-robin over the workers in the ``workers`` engine)."""
        ids = list(self.clients)
        self._status_dir.mkdir(parents=True, exist_ok=True)
        for cid in ids:
            (self._status_dir / f"{cid}.exit").unlink(missing_ok=True)
        if self.engine == "processes":
            self._members = {cid: [cid] for cid in ids}
        else:
            w = min(self.workers, len(ids))
            self._members = {f"worker-{k}": ids[k::w] for k in range(w)}
        for name in self._members:
            self._spawn(name)
        log.info("started %d client(s) in %d %s", len(ids), len(self._members), "processes" if self.engine == "processes" else "workers")

    def gone(self) -> tuple[set[str], str | None]:
        """Clients that stopped, and the error to stop the run with when none is left.

        A worker that died (non-zero exit) is restarted up to :data:`MAX_RESTARTS` times;
        meanwhile its clients count as gone for the round in progress.
        """
        gone: set[str] = set()
        for name, p in self._procs.items():
            code = p.poll()
            members = self._members[name]
            if code is None:
                if self.engine == "workers":
                    gone |= {c for c in members if (self._status_dir / f"{c}.exit").exists()}
                continue
            if self.engine == "workers" and code != 0 and not self._stopping and self._restarts.get(name, 0) < MAX_RESTARTS:
                self._restarts[name] = self._restarts.get(name, 0) + 1
                log.warning("%s (clients %s) exited with %s; restarting it (%d/%d)", name, ", ".join(members), code,
                            self._restarts[name], MAX_RESTARTS)
                gone |= set(members)
                self._spawn(name)
                continue
            gone |= set(members)
        if len(gone) < len(self.clients) or not self.clients:
            return gone, None
        return gone, self._fatal()

    def _fatal(self) -> str:
        name = sorted(self._procs)[0]
        try:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            lines = []
        if self.engine == "workers":  # each hosted client's own status, as its worker recorded it
            codes = sorted({int(f.read_text().strip() or 1) for f in self._status_dir.glob("*.exit")})
        else:
            codes = sorted({p.returncode for p in self._procs.values() if p.returncode is not None})
        return (
            f"every client process exited (exit codes {codes}) before the run ended; {name} said: "
            + (" | ".join(lines) or "nothing")
            + f". Logs: {self.log_dir}"
        )

    def kill(self, name: str) -> None:
        """Kill one process by name (``worker-0``, or a client id): the fault tests' crash."""
        self._procs[name].kill()

    @property
    def names(self) -> Sequence[str]:
        """Process names (``worker-<k>`` or client ids)."""
        return list(self._procs)

    def stop(self, grace_s: float) -> None:
        """Let clients exit by themselves (they do once the run is finished), then terminate the rest."""
        self._stopping = True
        end = time.monotonic() + grace_s
        for name, p in self._procs.items():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s still running; terminating it", name)
                p.terminate()
        for p in self._procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
