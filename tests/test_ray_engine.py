"""The Ray engine on a real two-node Ray cluster started on this machine with ``ray start``.

Both nodes listen on loopback addresses: the head on 127.0.0.2, the second node on
127.0.0.3 (Ray rewrites a literal 127.0.0.1 or localhost into the machine's outward
address when a node joins, so two loopback addresses of their own keep the cluster
off the network; distinct addresses also make the two nodes look like two machines).
The cluster is torn down by the process ids this module started (SIGTERM to each
``ray start --block``, which ends its node's processes, then SIGKILL to anything left
in their sessions), never by a name-wide ``ray stop`` that would end other Ray users'
processes on a shared machine.

Skipped when Ray is not installed; with ``FEDHAR_REQUIRE_RAY=1`` (CI) that is a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import ray_driver
from support.small_federation import assert_upload_bytes_close, round_figures, simulate_args

HAS_RAY = importlib.util.find_spec("ray") is not None
if not HAS_RAY and os.environ.get("FEDHAR_REQUIRE_RAY") == "1":
    pytest.fail("FEDHAR_REQUIRE_RAY=1 but Ray is not installed: pip install -e '.[ray]'", pytrace=False)
pytestmark = [
    pytest.mark.slow,  # a two-node cluster started and two federations on it
    pytest.mark.ray,
    pytest.mark.skipif(not HAS_RAY, reason="Ray not installed (pip install -e '.[ray]')"),
]

HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"
START_WAIT_S = 90.0
SMALL = [*simulate_args(start_timeout_s=180), "--threads-per-client", "1"]  # 180 s: actors start on a second node


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _ray_start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    ray_bin = Path(sys.executable).parent / "ray"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(ray_bin), "start", "--block", "--disable-usage-stats", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    end = time.monotonic() + START_WAIT_S
    while time.monotonic() < end:
        if "Ray runtime started" in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    _teardown([proc])
    raise RuntimeError(f"ray start did not come up within {START_WAIT_S:.0f} s: {log.read_text(errors='replace')[-2000:]}")


def _teardown(procs: list[subprocess.Popen[bytes]]) -> None:
    """End the nodes this module started, by their process ids and sessions only."""
    for p in reversed(procs):  # the second node first, then the head
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)
    sessions = {p.pid for p in procs}  # start_new_session: each node's processes share its session id
    for q in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(q.pid) in sessions:
                q.kill()
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@contextlib.contextmanager
def _cluster(
    head_cpus: int, node_cpus: int, head_ip: str = HEAD_IP, node_ip: str = NODE_IP
) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A head node and a second node with the CPUs given (``ray start --num-cpus``); the head's address and both processes.

    ``head_ip`` and ``node_ip`` are the nodes' loopback addresses; a module that may run beside
    this one (tests in parallel processes) passes its own, so two clusters never share an address.
    """
    tmp = Path(tempfile.mkdtemp(prefix="fr-", dir="/tmp"))  # Ray's socket paths must stay short
    gcs, *p = _free_ports(9)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_ray_start(
            ["--head", "--node-ip-address", head_ip, "--port", str(gcs), "--num-cpus", str(head_cpus), "--include-dashboard",
             "false", "--dashboard-agent-listen-port", str(p[0]), "--dashboard-agent-grpc-port", str(p[1]),
             "--runtime-env-agent-port", str(p[2]), "--metrics-export-port", str(p[3]), "--temp-dir", str(tmp / "head")],
            tmp / "head.log"))
        procs.append(_ray_start(
            ["--address", f"{head_ip}:{gcs}", "--node-ip-address", node_ip, "--num-cpus", str(node_cpus),
             "--dashboard-agent-listen-port", str(p[4]), "--dashboard-agent-grpc-port", str(p[5]), "--runtime-env-agent-port",
             str(p[6]), "--metrics-export-port", str(p[7]), "--temp-dir", str(tmp / "node")], tmp / "node.log"))
        yield f"{head_ip}:{gcs}", procs
    finally:
        _teardown(procs)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A head node and a second node, 1 CPU each; yields the head's address."""
    with _cluster(1, 1) as (address, _):
        yield address


def _run(argv: list[str]) -> int:
    """fedhar-simulate's exit status, run in a process of its own (:mod:`support.ray_driver`: never a Ray driver in pytest's)."""
    done = ray_driver.simulate(argv)
    if done.rc != 0:
        print(done.err[-3000:])
    return done.rc


def test_a_federation_on_a_two_node_ray_cluster_places_clients_on_both_and_matches_the_workers_engine(
    ray_cluster: str, tmp_path: Path
) -> None:
    docs = {}
    for engine, extra in (("ray", ["--ray-address", ray_cluster]), ("workers", [])):
        run = tmp_path / engine
        argv = [*SMALL, "--rounds", "3", "--engine", engine, "--workers", "2", *extra, "--run-dir", str(run), "--run-id", "same"]
        assert _run(argv) == 0
        docs[engine] = json.loads((run / "report.json").read_text())
    doc = docs["ray"]
    assert [r["round"] for r in doc["rounds"]] == [0, 1, 2]
    assert all(r["updates"] == 3 for r in doc["rounds"])
    placed = doc["ray_workers"]
    assert {w["node_ip"] for w in placed} == {HEAD_IP, NODE_IP}  # one actor on each node
    assert len({w["node_id"] for w in placed}) == 2
    assert sorted(c for w in placed for c in w["clients"]) == ["hapt-01", "hapt-02", "hapt-03"]
    assert doc["engine"].startswith("ray (2 actors on 2 nodes")
    # Each actor wrote its log on its node (here the same machine): it names its clients.
    assert "worker-0 hosting 2 client(s)" in (tmp_path / "ray" / "logs" / "worker-0.log").read_text()
    # Hosting in Ray actors changes nothing in the figures (same seed, one PyTorch thread, one training at a time).
    assert round_figures(doc) == round_figures(docs["workers"])
    assert_upload_bytes_close(doc, docs["workers"])


def _kill_actor_when_round_opens(run_dir: Path, round_: int, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL worker-0's actor process (its pid is in the report header) as round ``round_`` opens."""
    while not stop.is_set():
        report = run_dir / "report.json"
        try:
            doc = json.loads(report.read_text()) if report.exists() else {}
        except ValueError:  # being rewritten: look again
            doc = {}
        if len(doc.get("rounds", [])) >= round_:
            pid = next(w["pid"] for w in doc["ray_workers"] if w["worker"] == "worker-0")
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
                killed.append(pid)
            return
        time.sleep(0.05)


def test_a_killed_ray_actor_costs_its_clients_one_round_and_is_replaced(ray_cluster: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    stop, killed = threading.Event(), list[int]()
    killer = threading.Thread(target=_kill_actor_when_round_opens, args=(run, 1, stop, killed), daemon=True)
    killer.start()
    try:
        # eta 1: the main job's FedAvgM eta 3 is chosen for E = 1 (see test_engines' kill test).
        argv = [*SMALL, "--rounds", "6", "--local-epochs", "30", "--server-lr", "1", "--engine", "ray",
                "--ray-address", ray_cluster, "--workers", "2",
                "--min-clients", "1", "--run-dir", str(run), "--run-id", "kill"]
        rc = _run(argv)
    finally:
        stop.set()
        killer.join(10)
    assert rc == 0 and killed
    doc = json.loads((run / "report.json").read_text())
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4, 5]
    hit = [r for r in rounds if r["updates"] < 3]
    # Only worker-0's clients miss rounds: the round of the kill (none if their replacement still answered it), and
    # the next one at most when Ray reports the death after that round has opened.
    assert len(hit) <= 2 and all(set(r["missing"]) <= {"hapt-01", "hapt-03"} for r in hit), [r["updates"] for r in rounds]
    assert rounds[-1]["updates"] == 3  # the replacement actor's clients are back
    assert "restarting it (1/3)" in (run / "logs" / "coordinator.log").read_text()
    # The replacement is a new process, recorded in the header beside the one that was killed.
    pids = [w["pid"] for w in doc["ray_workers"] if w["worker"] == "worker-0"]
    assert pids[0] == killed[0] and len(pids) == 2 and pids[1] != killed[0]
