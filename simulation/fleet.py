"""The simulation's client fleet: one process per client, or virtual clients hosted in a few workers.

Every client is a ``fedhar-client`` with its own MQTT connection, id and state folder; engines:

- ``processes``: one Python process per client (nothing shared).
- ``workers``: W worker processes (:mod:`simulation.worker`) hosting the clients in threads,
  training one at a time (memory of W trainings, not N); a dead worker is restarted.
- ``ray``: the same workers as Ray actors on an existing cluster (``ray_address``). The
  embedded broker listens on loopback only; for several machines give ``--broker HOST:PORT``
  reachable from every node, each with fedhar installed and the dataset at the same path.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from har_io.install_hints import install_hint

log = logging.getLogger("fedhar.simulate")

ENGINES = ("workers", "processes", "ray")
MAX_RESTARTS = 3
"""Restarts of one worker before its clients are given up."""
PLACEMENT_TIMEOUT_S = 90.0
"""``ray``: how long (seconds) an actor may wait for a node with free CPUs before it counts as unplaceable."""


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
    engine : {"workers", "processes", "ray"}
    workers : int
        Worker processes or actors, at most one per client; 0 with ``ray``: the cluster's CPUs / ``threads``.
    threads : int
        PyTorch threads per process.
    log_dir : Path
        ``<client id>.log`` (processes) or ``worker-<k>.log`` (workers).
    ray_address : str, optional
        ``HOST:PORT`` as ``ray start --head`` prints it, or ``auto``.

    Raises
    ------
    ValueError
        Unknown engine, ``workers`` < 1 (< 0 with ``ray``), or ``ray`` without ``ray_address``.
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
    _restarted_at: dict[str, float] = field(default_factory=dict)  # process name -> wall time of its last restart (s)
    ray_address: str | None = None
    _stopping: bool = False
    _ray: Any = None  # the ray module, once connected
    _actors: dict[str, Any] = field(default_factory=dict)  # worker name -> actor handle
    _runs: dict[str, Any] = field(default_factory=dict)  # worker name -> ObjectRef of its run()
    _exit_polls: dict[str, Any] = field(default_factory=dict)  # worker name -> ObjectRef of exited()
    _exited: dict[str, dict[str, int]] = field(default_factory=dict)  # worker name -> client id -> status
    _codes: dict[str, int] = field(default_factory=dict)  # worker name -> last exit status (ray)
    _placing: dict[str, tuple[Any, float]] = field(default_factory=dict)  # worker name -> (where() ref, deadline)
    placement: list[dict[str, Any]] = field(default_factory=list)
    """``ray`` engine: one entry per actor start (worker, node id, node address, pid, clients)."""
    given_up: list[dict[str, str]] = field(default_factory=list)
    """``ray`` engine: clients left out for the rest of the run (client, worker, reason), e.g. after the 4th death."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.workers < (0 if self.engine == "ray" else 1):
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.engine == "ray" and not self.ray_address:
            raise ValueError("--engine ray needs --ray-address HOST:PORT of a running Ray cluster (ray start --head prints it)")

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
            cmd = [sys.executable, "-m", "simulation.worker", "--clients", str(spec), "--status-dir", str(self._status_dir),
                   "--threads", str(self.threads)]
        with open(self.log_dir / f"{name}.log", "ab") as out:
            # Clients run at lower priority, so the broker and coordinator keep messages moving while they train.
            self._procs[name] = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env(), cwd=self.cwd, preexec_fn=_lower_priority
            )

    def start(self) -> None:
        """Start every client (round-robin over the workers).

        Raises
        ------
        RuntimeError
            ``ray``: Ray is not installed, or the cluster cannot be reached.
        ValueError
            ``ray``: the broker is on loopback but a node is on another machine.
        """
        ids = list(self.clients)
        self._status_dir.mkdir(parents=True, exist_ok=True)
        for cid in ids:
            (self._status_dir / f"{cid}.exit").unlink(missing_ok=True)
        workers = self.workers
        if self.engine == "ray":
            workers = self._connect_ray()
        if self.engine == "processes":
            self._members = {cid: [cid] for cid in ids}
        else:
            w = min(workers, len(ids))
            self._members = {f"worker-{k}": ids[k::w] for k in range(w)}
        for name in self._members:
            if self.engine == "ray":
                self._spawn_actor(name)
            else:
                self._spawn(name)
        if self.engine == "ray":
            self._record_placement(list(self._members))
        kind = {"processes": "processes", "workers": "workers", "ray": "Ray actors"}[self.engine]
        log.info("started %d client(s) in %d %s", len(ids), len(self._members), kind)

    # ------------------------------------------------------------------------------ ray engine
    def _connect_ray(self) -> int:
        """Connect to the cluster, check the broker is reachable from its nodes; the number of workers to start."""
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError(f"--engine ray needs Ray on this machine and every node: {install_hint('ray')}") from exc
        try:
            ray.init(address=self.ray_address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RuntimeError(f"cannot join the Ray cluster at {self.ray_address}: {exc}") from exc
        self._ray = ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        host = _broker_host(next(iter(self.clients.values()), []))
        if host is not None and _is_loopback(host):
            here = _local_addresses()
            away = sorted({n["NodeManagerAddress"] for n in nodes if not _is_loopback(n["NodeManagerAddress"])} - here)
            if away:
                raise ValueError(
                    f"the clients' broker {host} is loopback, but Ray nodes at {', '.join(away)} are on other machines: "
                    "give --broker HOST:PORT of a Mosquitto that every node can reach"
                )
        need = max(1, self.threads)
        fits = {n["NodeManagerAddress"]: int(n.get("Resources", {}).get("CPU", 0) // need) for n in nodes}
        capacity = sum(fits.values())
        if capacity < 1 or self.workers > capacity:
            per_node = ", ".join(f"{ip}: {int(n.get('Resources', {}).get('CPU', 0))} CPUs" for ip, n in
                                 ((n["NodeManagerAddress"], n) for n in nodes)) or "no live node"
            raise ValueError(
                f"the Ray cluster at {self.ray_address} can hold {capacity} actor(s) of {need} CPU(s) each ({per_node}), "
                f"but {self.workers or 'at least 1'} were asked for: lower --workers or --threads-per-client, or add nodes"
            )
        return self.workers or capacity

    def _spawn_actor(self, name: str) -> None:
        from simulation.worker import HostedWorker

        ray = self._ray
        # A threaded actor: run() blocks for the whole run while exited() and stop() answer beside it.
        # SPREAD puts the actors on as many nodes as there are; each reserves its PyTorch threads as CPUs.
        actor_cls = ray.remote(_RayNode.wrap(HostedWorker))
        env = {"OMP_NUM_THREADS": str(self.threads), "MALLOC_ARENA_MAX": "2", "PYTHONUNBUFFERED": "1"}
        actor = actor_cls.options(
            num_cpus=max(1, self.threads), max_concurrency=4, scheduling_strategy="SPREAD", runtime_env={"env_vars": env},
        ).remote(name, self.threads)
        self._actors[name] = actor
        self._exited[name] = {}
        self._exit_polls.pop(name, None)
        argvs = [self.clients[c] for c in self._members[name]]
        self._runs[name] = actor.run.remote(argvs, str(self.log_dir / f"{name}.log"))

    def _record_placement(self, names: list[str]) -> None:
        """Wait (at most :data:`PLACEMENT_TIMEOUT_S`) until every actor of ``names`` runs on a node; record where (RuntimeError if none)."""
        ray = self._ray
        refs = {n: self._actors[n].where.remote() for n in names}
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=PLACEMENT_TIMEOUT_S)
        late = [n for n, r in refs.items() if not ray.wait([r], timeout=0)[0]]
        if late:
            free = ray.available_resources().get("CPU", 0)
            raise RuntimeError(
                f"{len(late)} of {len(names)} Ray actor(s) ({', '.join(late)}) found no node with {max(1, self.threads)} free "
                f"CPU(s) within {PLACEMENT_TIMEOUT_S:.0f} s (the cluster has {free:g} CPU(s) free; other tasks or actors hold "
                "the rest): free them, or lower --workers or --threads-per-client"
            )
        for name, ref in refs.items():
            self._placed(name, ray.get(ref))

    def _placed(self, name: str, w: dict[str, Any]) -> None:
        entry = {"worker": name, **w, "clients": list(self._members[name])}
        self.placement.append(entry)
        log.info("%s on Ray node %s (%s, pid %s): %s", name, w["node_id"], w["node_ip"], w["pid"], ", ".join(entry["clients"]))

    def _give_up(self, name: str, reason: str) -> None:
        members = self._members[name]
        log.error("%s: giving up its clients %s for the rest of the run: %s", name, ", ".join(members), reason)
        self.given_up.extend({"client": c, "worker": name, "reason": reason} for c in members)

    def _check_placing(self, name: str) -> bool:
        """Whether the replacement actor ``name`` is still waiting for a node (gives its clients up past the deadline)."""
        ray = self._ray
        ref, deadline = self._placing[name]
        if ray.wait([ref], timeout=0)[0]:
            del self._placing[name]
            with contextlib.suppress(ray.exceptions.RayError):  # died before it answered: its run() says so
                self._placed(name, ray.get(ref))
            return False
        if time.monotonic() < deadline:
            return True
        del self._placing[name]
        with contextlib.suppress(Exception):
            ray.kill(self._actors[name], no_restart=True)
        self._codes[name] = -1
        self._give_up(name, f"its replacement found no node with {max(1, self.threads)} free CPU(s) within "
                            f"{PLACEMENT_TIMEOUT_S:.0f} s")  # fmt: skip
        return False

    def describe(self) -> str:
        """The engine in one phrase for the report header, e.g. ``ray (4 actors on 2 nodes)``."""
        if self.engine == "processes":
            return "processes"
        if self.engine == "workers":
            return f"workers ({len(self._members)} processes)"
        nodes = {p["node_id"] for p in self.placement}
        return f"ray ({len(self._members)} actors on {len(nodes)} node{'s' if len(nodes) != 1 else ''}, cluster {self.ray_address})"

    def _ray_gone(self) -> set[str]:
        ray = self._ray
        gone: set[str] = set()
        for name in list(self._runs):
            members = self._members[name]
            if name in self._codes:  # ended for good
                gone |= set(members)
                continue
            if name in self._placing and self._check_placing(name):
                continue  # not running yet: its clients are offline, which the coordinator sees by itself
            if name in self._codes:  # its replacement could not be placed
                gone |= set(members)
                continue
            ready, _ = ray.wait([self._runs[name]], timeout=0)
            if not ready:
                poll = self._exit_polls.get(name)
                if poll is not None and ray.wait([poll], timeout=0)[0]:
                    with contextlib.suppress(ray.exceptions.RayError):  # the actor died: its run() says so next
                        self._exited[name] = ray.get(poll)
                    poll = None
                if poll is None:
                    self._exit_polls[name] = self._actors[name].exited.remote()
                gone |= set(self._exited[name])
                continue
            try:
                code = int(ray.get(self._runs[name]))
            except ray.exceptions.RayError as exc:  # the actor's process or node died
                log.warning("%s: %s", name, str(exc).splitlines()[0])
                code = -9
            if code != 0 and not self._stopping and self._restarts.get(name, 0) < MAX_RESTARTS:
                self._restarts[name] = self._restarts.get(name, 0) + 1
                self._restarted_at[name] = time.time()
                log.warning("%s (clients %s) exited with %s; restarting it (%d/%d)", name, ", ".join(members), code,
                            self._restarts[name], MAX_RESTARTS)
                with contextlib.suppress(Exception):
                    ray.kill(self._actors[name], no_restart=True)
                gone |= set(members)
                self._spawn_actor(name)
                # Placed in the background: the coordinator never waits here for a node that may not come.
                self._placing[name] = (self._actors[name].where.remote(), time.monotonic() + PLACEMENT_TIMEOUT_S)
                continue
            if code != 0 and not self._stopping:
                self._give_up(name, f"worker died {self._restarts.get(name, 0) + 1} times (last exit status {code})")
            self._codes[name] = code
            gone |= set(members)
        return gone

    def _stop_ray(self, grace_s: float, kill_after_s: float = 10.0) -> None:
        ray = self._ray
        for name in list(self._placing):  # never placed: nothing to wait for
            del self._placing[name]
            with contextlib.suppress(Exception):
                ray.kill(self._actors[name], no_restart=True)
            self._codes[name] = -1
        pending = [r for n, r in self._runs.items() if n not in self._codes]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=max(0.1, grace_s))
        for name, ref in self._runs.items():
            if not ray.wait([ref], timeout=0)[0]:
                log.warning("%s still running; stopping it", name)
                with contextlib.suppress(ray.exceptions.RayError):
                    self._actors[name].stop.remote()
        pending = [r for r in self._runs.values() if not ray.wait([r], timeout=0)[0]]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=max(0.1, kill_after_s))
        for actor in self._actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        ray.shutdown()

    def gone(self) -> tuple[set[str], str | None]:
        """Clients that stopped, and the error to stop the run with when none is left.

        A dead worker is restarted up to :data:`MAX_RESTARTS` times; meanwhile its clients count as
        gone. ``ray``: the error comes only once every client is gone for good.
        """
        if self.engine == "ray":
            gone = self._ray_gone()
            # Clients of a replacement being placed are coming back: not every client is gone for good.
            coming = {c for n in self._placing for c in self._members[n]}
            if len(gone - coming) < len(self.clients) or not self.clients:
                return gone, None
            return gone, self._fatal()
        gone = set()
        for name, p in self._procs.items():
            code = p.poll()
            members = self._members[name]
            if code is None:
                if self.engine == "workers":
                    gone |= {c for c in members if (self._status_dir / f"{c}.exit").exists()}
                continue
            if self.engine == "workers" and code != 0 and not self._stopping and self._restarts.get(name, 0) < MAX_RESTARTS:
                self._restarts[name] = self._restarts.get(name, 0) + 1
                self._restarted_at[name] = time.time()
                log.warning("%s (clients %s) exited with %s; restarting it (%d/%d)", name, ", ".join(members), code,
                            self._restarts[name], MAX_RESTARTS)
                gone |= set(members)
                self._spawn(name)
                continue
            gone |= set(members)
        if len(gone) < len(self.clients) or not self.clients:
            return gone, None
        return gone, self._fatal()

    def restarted(self) -> dict[str, float]:
        """Clients whose worker was restarted and is not ended for good: client id -> when (s since the epoch).

        Deaths are noticed by :meth:`gone`; call it regularly.
        """
        back: dict[str, float] = {}
        for name, at in self._restarted_at.items():
            if self.engine == "ray":
                if name in self._codes:
                    continue
            elif self._procs[name].poll() is not None:  # dead again: gone() restarts it (a new time) or it ended
                continue
            back.update(dict.fromkeys(self._members[name], at))
        return back

    def _fatal(self) -> str:
        if self.engine == "ray":
            given = "; ".join(sorted({f"{g['worker']}: {g['reason']}" for g in self.given_up}))
            return (
                f"every Ray actor's clients stopped before the run ended (exit statuses {sorted(set(self._codes.values()))}"
                + (f"; given up: {given}" if given else "")
                + f"); see the worker logs under {self.log_dir} on each node"
            )
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
        if self.engine == "ray":
            self._ray.kill(self._actors[name], no_restart=True)
            return
        self._procs[name].kill()

    @property
    def names(self) -> Sequence[str]:
        """Process names (``worker-<k>`` or client ids)."""
        return list(self._actors if self.engine == "ray" else self._procs)

    def stop(self, grace_s: float, kill_after_s: float = 10.0, hurry: threading.Event | None = None) -> None:
        """Let clients exit by themselves, then terminate the rest; returns once every process is reaped.

        Waits up to ``grace_s`` s in all (or until ``hurry`` is set), then SIGTERM (and SIGCONT), and
        SIGKILL ``kill_after_s`` s later. ``ray``: the actors get ``stop()`` and are killed likewise.
        """
        self._stopping = True
        if self.engine == "ray":
            if self._ray is not None:
                self._stop_ray(grace_s, kill_after_s)
            return
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(p.poll() is None for p in self._procs.values()):
            if hurry is not None and hurry.is_set():
                break
            time.sleep(0.1)
        for name, p in self._procs.items():
            if p.poll() is None:
                log.warning("%s still running; terminating it", name)
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
                    os.kill(p.pid, signal.SIGCONT)
        end = time.monotonic() + kill_after_s
        for name, p in self._procs.items():
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit %.0f s after SIGTERM; killing it", name, kill_after_s)
                p.kill()
                p.wait()


class _RayNode:
    """Adds ``where()`` (which Ray node runs this actor) to the hosted-worker class, without edge_client importing Ray."""

    @staticmethod
    def wrap(cls: type) -> type:
        class RayWorker(cls):
            def where(self) -> dict[str, Any]:
                import ray

                return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                        "pid": os.getpid()}

        RayWorker.__name__ = RayWorker.__qualname__ = "FedharWorker"
        return RayWorker


def ray_object_store(timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Each live node's object store (plasma) as its raylet counts it: what ``ray memory --stats-only`` sums.

    Asks each raylet for its node stats over gRPC as ``ray memory`` does (Ray 2.60.0, the ``ray``
    extra); inline objects (under 100 KiB) are not in the store. Needs ``ray.init`` first.

    Returns
    -------
    list of dict
        One per live node: ``node_id``, ``node_ip``, ``bytes_used``, ``bytes_primary``,
        ``bytes_avail``, ``objects``, ``bytes_fallback``, ``bytes_spilled`` (bytes).

    Raises
    ------
    RuntimeError
        Ray or ``grpcio`` missing, not connected, or a raylet silent for ``timeout_s`` s.
    """
    try:
        import ray
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc
    except ImportError as exc:  # grpcio is missing from Ray's core wheel
        raise RuntimeError(f"reading Ray's object store needs Ray with grpcio: {install_hint('ray')} ({exc})") from exc
    if not ray.is_initialized():
        raise RuntimeError("reading Ray's object store needs a connected driver: call ray.init(address=...) first")
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        address = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        channel = init_grpc_channel(address)
        try:
            stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
            request: Any = node_manager_pb2.GetNodeStatsRequest  # type: ignore[attr-defined]  # generated at build time
            reply = stub.GetNodeStats(request(include_memory_info=False), timeout=timeout_s)
        except Exception as exc:  # grpc.RpcError: the node is going, or too slow to answer
            raise RuntimeError(f"the raylet of Ray node {node['NodeID']} at {address} did not report its object store: {exc}") from exc
        finally:
            channel.close()
        st = reply.store_stats
        out.append({
            "node_id": node["NodeID"],
            "node_ip": node["NodeManagerAddress"],
            "bytes_used": int(st.object_store_bytes_used),
            "bytes_primary": int(st.object_store_bytes_primary_copy),
            "bytes_avail": int(st.object_store_bytes_avail),
            "objects": int(st.num_local_objects),
            "bytes_fallback": int(st.object_store_bytes_fallback),
            "bytes_spilled": int(st.spilled_bytes_total),
        })  # fmt: skip
    return out


def _broker_host(argv: list[str]) -> str | None:
    try:
        return argv[argv.index("--broker") + 1].rsplit(":", 1)[0].strip("[]")
    except (ValueError, IndexError):
        return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _local_addresses() -> set[str]:
    """Addresses of this machine's network interfaces."""
    import psutil

    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
