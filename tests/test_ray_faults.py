"""The Ray engine when actors and nodes die, when CPUs run short, and over a long run (docs/reliability.md).

Each test starts its own local two-node cluster with the helpers of ``test_ray_engine``
(loopback addresses, torn down by the process ids it started, never by a name-wide
``ray stop``), so killing a node in one test cannot break another. Every Ray driver (the
runs, the store probe) runs in a process of its own (``support.ray_driver``), never in pytest's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from support import ray_driver

pytest.importorskip("ray")
from test_ray_engine import SMALL
from test_ray_engine import _cluster as _engine_cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROUND_TIMEOUT_S = 60.0
HEAD_IP, NODE_IP = "127.0.0.4", "127.0.0.5"  # not test_ray_engine's: the two modules may run at once in parallel test processes


def _cluster(head_cpus: int, node_cpus: int) -> contextlib.AbstractContextManager[tuple[str, list[subprocess.Popen[bytes]]]]:
    """test_ray_engine's two-node cluster on this module's own loopback addresses."""
    return _engine_cluster(head_cpus, node_cpus, HEAD_IP, NODE_IP)


def _report(run: Path) -> dict:
    try:
        return json.loads((run / "report.json").read_text())
    except (OSError, ValueError):  # not written yet, or being rewritten
        return {}


def _placed_at_least(run: Path, worker: str, k: int) -> bool:
    return len(_placed_pids(run, worker)) >= k


def _wait(pred: Callable[[], bool], stop: threading.Event, limit_s: float = 600.0) -> bool:
    end = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _placed_pids(run: Path, worker: str) -> list[int]:
    """Pids of ``worker``'s actors in the order they were placed, from the coordinator's log."""
    try:
        text = (run / "logs" / "coordinator.log").read_text(errors="replace")
    except OSError:
        return []
    return [int(m) for m in re.findall(rf"{worker} on Ray node \S+ \(\S+, pid (\d+)\)", text)]


def _stop_node(proc: subprocess.Popen[bytes]) -> None:
    """The node goes as a machine would: SIGKILL to its raylet, its actors and every other process of its session."""
    for q in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(q.pid) == proc.pid:
                q.kill()


def _gone_within(pids: list[int], limit_s: float) -> list[int]:
    end = time.monotonic() + limit_s
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    return alive


def test_actors_and_a_node_that_die_are_replaced_and_a_worker_dead_four_times_is_given_up(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stop, events = threading.Event(), list[str]()
    with _cluster(2, 1) as (address, procs):

        def faults() -> None:
            # Round 1: SIGKILL the actor on the head. Round 2: stop the other node (its raylet and actor go).
            if not _wait(lambda: len(_report(run).get("rounds", [])) >= 1, stop):
                return
            placed = _report(run)["ray_workers"]
            on_head = next(w for w in placed if w["node_ip"] == HEAD_IP)
            on_node = next(w for w in placed if w["node_ip"] == NODE_IP)
            psutil.Process(on_head["pid"]).kill()
            events.append(f"killed {on_head['worker']}")
            if not _wait(lambda: len(_report(run).get("rounds", [])) >= 2, stop):
                return
            _stop_node(procs[1])
            events.append(f"stopped node of {on_node['worker']}")
            # Then kill the node's worker as soon as each replacement runs: deaths 2, 3 and 4.
            for k in (2, 3, 4):
                if not _wait(functools.partial(_placed_at_least, run, on_node["worker"], k), stop):
                    return
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(_placed_pids(run, on_node["worker"])[-1]).kill()
                events.append(f"killed {on_node['worker']}")

        killer = threading.Thread(target=faults, daemon=True)
        killer.start()
        t0 = time.monotonic()
        try:
            argv = [*SMALL, "--rounds", "30", "--clients", "4", "--local-epochs", "15", "--server-lr", "1",
                    "--engine", "ray", "--ray-address", address,
                    "--workers", "2", "--min-clients", "1", "--round-timeout", str(int(ROUND_TIMEOUT_S)),
                    "--run-dir", str(run), "--run-id", "die"]  # fmt: skip
            done = ray_driver.simulate(argv)
        finally:
            stop.set()
            killer.join(10)
        rc = done.rc
        wall = time.monotonic() - t0
        doc = json.loads((run / "report.json").read_text())
        pids = [w["pid"] for w in doc["ray_workers"]]
        left = _gone_within(pids, 20.0)  # every actor process, the killed ones and the replacements, has ended
    assert rc == 0, (events, done.err[-3000:])
    a, b = events[0].split()[-1], events[1].split()[-1]
    assert events == [f"killed {a}", f"stopped node of {b}", f"killed {b}", f"killed {b}", f"killed {b}"]
    assert left == []
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == list(range(30))
    # No round waited on a dead actor past its deadline (plus the evaluation after it closed).
    assert all(r["seconds"] < ROUND_TIMEOUT_S + 30 for r in rounds), [r["seconds"] for r in rounds]
    members = {w["worker"]: w["clients"] for w in doc["ray_workers"]}
    # b's clients are given up with the reason; a's replacement brought its clients back.
    assert doc["given_up"] == [{"client": c, "worker": b, "reason": doc["given_up"][0]["reason"]} for c in members[b]]
    assert doc["given_up"][0]["reason"].startswith("worker died 4 times")
    assert rounds[-1]["updates"] == len(members[a]) == 2
    text = (run / "logs" / "coordinator.log").read_text()
    assert f"{a} (clients" in text and "restarting it (1/3)" in text and "restarting it (3/3)" in text
    assert len(_placed_pids(run, b)) == 4 and len(_placed_pids(run, a)) == 2
    print(f"faults run: {wall:.0f} s wall, round seconds {[r['seconds'] for r in rounds]}")


def test_with_every_actor_gone_the_run_ends_with_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    """The head has no CPUs: once the only node with CPUs stops, no replacement can be placed anywhere."""
    run = tmp_path / "run"
    stop = threading.Event()
    with _cluster(0, 2) as (address, procs):

        def stop_node() -> None:
            if _wait(lambda: len(_report(run).get("rounds", [])) >= 1, stop):
                _stop_node(procs[1])

        killer = threading.Thread(target=stop_node, daemon=True)
        killer.start()
        t0 = time.monotonic()
        try:
            argv = [*SMALL, "--rounds", "10", "--clients", "2", "--local-epochs", "15", "--server-lr", "1",
                    "--engine", "ray", "--ray-address", address,
                    "--workers", "2",
                    "--min-clients", "1", "--round-timeout", str(int(ROUND_TIMEOUT_S)), "--run-dir", str(run), "--run-id", "all"]
            done = ray_driver.simulate(argv, placement_timeout_s=20.0)
            took = time.monotonic() - t0
        finally:
            stop.set()
            killer.join(10)
    rc, err = done.rc, done.err
    assert rc == 5
    # Whichever comes first ends it: the fleet's error once the replacements' placement bound passes, or the
    # coordinator's after three rounds in a row with every selected client offline.
    assert ("every Ray actor's clients stopped before the run ended" in err
            and "its replacement found no node with 1 free CPU(s) within 20 s" in err) or "failed 3 times in a row" in err, err
    assert took < 240, took  # start, round 0, the node's death, the 20 s placement bound: no wait on the dead actors
    print(f"every actor gone: exit {rc} after {took:.0f} s")
    doc = _report(run)
    assert len(doc["rounds"]) < 10  # it did not run on without clients


def _hold_cpus(address: str, cpus: int, node_ip: str) -> subprocess.Popen[str]:
    """Another Ray job that holds ``cpus`` CPUs of the node at ``node_ip`` until it is killed."""
    code = (
        "import ray, sys, time\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "node = next(n['NodeID'] for n in ray.nodes() if n['Alive'] and n['NodeManagerAddress'] == sys.argv[1])\n"
        "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A\n"
        "@ray.remote\n"
        "class Hold:\n"
        "    def ping(self):\n"
        "        return 1\n"
        f"h = Hold.options(num_cpus={cpus}, scheduling_strategy=A(node, soft=False)).remote()\n"
        "ray.get(h.ping.remote())\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, node_ip], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


@pytest.fixture(scope="module")
def cluster_2_8() -> object:
    """A 2-CPU head and an 8-CPU node (declared: the machine has fewer cores)."""
    with _cluster(2, 8) as (address, _):
        yield address


def test_placement_respects_each_nodes_cpus_and_never_waits_forever(cluster_2_8: str, tmp_path: Path) -> None:
    address = cluster_2_8
    base = [*SMALL, "--engine", "ray", "--ray-address", address, "--threads-per-client", "2"]
    # A: 2 + 8 CPUs at 2 threads per actor hold 1 + 4 actors: 5 by default, each on a node with room for it.
    run = tmp_path / "a"
    done = ray_driver.simulate([*base, "--clients", "10", "--rounds", "1", "--workers", "0", "--run-dir", str(run), "--run-id", "a"])
    assert done.rc == 0, done.err[-3000:]
    doc = json.loads((run / "report.json").read_text())
    placed = doc["ray_workers"]
    per_node = Counter(w["node_ip"] for w in placed)
    assert len(placed) == 5 and per_node[HEAD_IP] <= 1 and per_node[NODE_IP] <= 4 and sum(per_node.values()) == 5
    assert all(w["node_id"] and w["node_ip"] in (HEAD_IP, NODE_IP) for w in placed)
    assert sorted(c for w in placed for c in w["clients"]) == [f"hapt-{k:02d}" for k in range(1, 11)]
    assert doc["rounds"][0]["updates"] == 10
    # More actors than the nodes can ever hold: refused at once, naming the capacity and the fix.
    done = ray_driver.simulate([*base, "--clients", "6", "--rounds", "1", "--workers", "6", "--run-dir", str(tmp_path / "b")])
    rc, err = done.rc, done.err
    assert rc == 2 and "can hold 5 actor(s) of 2 CPU(s) each" in err and "lower --workers or --threads-per-client" in err
    # B: another job holds the 8-CPU node: the second actor's CPUs are not coming; the start fails in bounded time.
    holder = _hold_cpus(address, 8, NODE_IP)
    try:
        t0 = time.monotonic()
        done = ray_driver.simulate([*base, "--clients", "2", "--rounds", "1", "--workers", "2", "--run-dir", str(tmp_path / "c")],
                                   placement_timeout_s=15.0)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait(10)
    rc, err = done.rc, done.err
    assert rc == 4 and "1 of 2 Ray actor(s)" in err and "found no node with 2 free CPU(s) within 15 s" in err
    assert took < 15 + 60  # the placement bound, starting the driver's interpreter, joining the cluster, stopping the actor


def test_object_store_stays_flat_over_fifty_rounds(cluster_2_8: str, tmp_path: Path) -> None:
    """Per node, the store's bytes and objects (and the driver's references) after rounds 10 to 50 stay within 10 % of round 10's."""
    if importlib.util.find_spec("grpc") is None:  # Ray's core wheel without the ray extra's grpcio
        if os.environ.get("FEDHAR_REQUIRE_RAY") == "1":
            pytest.fail("FEDHAR_REQUIRE_RAY=1 but grpcio is missing: pip install -e '.[ray]'", pytrace=False)
        pytest.skip("reading Ray's object store needs grpcio: pip install -e '.[ray]'")
    address, run = cluster_2_8, tmp_path / "run"
    probe = ray_driver.store_probe(address, tmp_path / "probe.json")
    print(f"store probe on the head: {probe}")
    assert probe["during_bytes"] - probe["before_bytes"] >= 2**20 and probe["during_objects"] == probe["before_objects"] + 1
    assert probe["after_bytes"] == probe["before_bytes"] and probe["after_objects"] == probe["before_objects"]
    argv = [*SMALL, "--clients", "2", "--rounds", "50", "--local-epochs", "1", "--conv-filters", "4", "--dense-units", "16",
            "--engine", "ray", "--ray-address", address, "--workers", "2", "--run-dir", str(run), "--run-id", "long"]
    # completed rounds -> {"nodes": {node ip: [bytes used, objects]}, "refs": the driver's references}, read in the driver
    sampled = ray_driver.sampled_run(argv, run, tmp_path / "samples.json")
    assert sampled["rc"] == 0
    samples, wall = sampled["samples"], sampled["wall_s"]
    doc = json.loads((run / "report.json").read_text())
    assert len(doc["rounds"]) == 50
    assert {w["node_ip"] for w in doc["ray_workers"]} == {HEAD_IP, NODE_IP}  # both nodes host an actor: both stores count
    after = {n: s for n, s in samples.items() if n >= 10}
    assert len(after) >= 30 and min(after) <= 12, sorted(samples)
    r10 = after[min(after)]
    series = {ip: [(n, *s["nodes"][ip]) for n, s in sorted(samples.items())] for ip in (HEAD_IP, NODE_IP)}
    print(f"50 rounds in {wall:.0f} s; object store per node, (round, bytes used, objects): {series}; "
          f"driver references: {[(n, s['refs']) for n, s in sorted(samples.items())]}")
    assert all(s["nodes"].keys() == {HEAD_IP, NODE_IP} for s in after.values())

    def within(v: int, base: int) -> bool:
        return base * 0.9 <= v <= base * 1.1

    for ip in (HEAD_IP, NODE_IP):
        base_bytes, base_objects = r10["nodes"][ip]
        assert all(within(s["nodes"][ip][0], base_bytes) for s in after.values()), (ip, series[ip])
        assert all(within(s["nodes"][ip][1], base_objects) for s in after.values()), (ip, series[ip])
    assert r10["refs"] > 0  # the sampler read the run's own driver
    # The driver's references are a small count (4 here), and a sample can fall while one more is in flight (a 5 among 4s
    # at round 17, once in CI): flat means the same median early and late and no sample more than 2 apart; a leak of one
    # reference per round would be 40 apart by round 50.
    refs = [s["refs"] for _, s in sorted(after.items())]
    assert statistics.median(refs[:10]) == statistics.median(refs[-10:]) and max(refs) - min(refs) <= 2, after
