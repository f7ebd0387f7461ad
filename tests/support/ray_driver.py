"""Ray drivers for the tests, each in a Python process of its own: never in pytest's.

A process that connects to a Ray cluster (``ray.init``), disconnects (``ray.shutdown``) and
connects again, with other threads calling into Ray meanwhile, can be left with a core worker
freed under those threads; Ray documents this as unsafe (ray-project/ray#31145). In pytest's
process it showed as a segmentation fault at interpreter exit, after every test had passed
(exit status 139 of the whole suite). So every test that drives a federation on the Ray engine,
or reads Ray's object store, runs that driver here, in a fresh interpreter, and gets plain
values back: an exit status and stderr, or JSON. The test's own threads (killing actors,
stopping nodes) act on process ids and the run's files, which work across processes.

Run as a script for the two drivers that need to be in the run's process::

    python ray_driver.py probe ADDRESS OUT.json
    python ray_driver.py sampled-run OUT.json RUN_DIR -- <fedhar-simulate options>
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_THIS = Path(__file__).resolve()


@dataclass(frozen=True)
class Exited:
    """A child's exit status and what it wrote to stderr (text)."""

    rc: int
    err: str


def _run_child(args: list[str], timeout_s: float) -> Exited:
    env = dict(os.environ)
    env["PYTHONFAULTHANDLER"] = "1"  # a crash in the child prints every thread's stack into ``err``
    proc = subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=timeout_s, check=False)  # fmt: skip
    return Exited(proc.returncode, proc.stderr)


def simulate(argv: list[str], *, placement_timeout_s: float | None = None, timeout_s: float = 1500.0) -> Exited:
    """Run ``fedhar-simulate argv`` in a fresh interpreter; its exit status and stderr.

    ``placement_timeout_s`` sets ``simulation.fleet.PLACEMENT_TIMEOUT_S`` [s] in the child (the
    bound on waiting for a Ray actor's CPUs). Raises ``subprocess.TimeoutExpired`` after ``timeout_s``.
    """
    code = "import sys\nfrom simulation import fleet, simulate\n"
    if placement_timeout_s is not None:
        code += f"fleet.PLACEMENT_TIMEOUT_S = {float(placement_timeout_s)!r}\n"
    code += "sys.exit(simulate.main(sys.argv[1:]))\n"
    return _run_child(["-c", code, *argv], timeout_s)


def _json_from_child(args: list[str], out: Path, timeout_s: float) -> Any:
    done = _run_child([str(_THIS), *args], timeout_s)
    if done.rc != 0:
        raise AssertionError(f"the Ray driver {args[0]!r} exited {done.rc}: {done.err[-3000:]}")
    return json.loads(out.read_text())


def store_probe(address: str, out: Path, *, timeout_s: float = 300.0) -> dict[str, int]:
    """The object store on the head node before, during and after a 1 MiB ``ray.put`` made by a fresh driver.

    Checks that :func:`simulation.fleet.ray_object_store` reads the real store. Returns
    ``before_bytes``, ``before_objects``, ``during_*`` and ``after_*`` (bytes used, objects).
    """
    result: dict[str, int] = _json_from_child(["probe", address, str(out)], out, timeout_s)
    return result


def sampled_run(argv: list[str], run_dir: Path, out: Path, *, timeout_s: float = 1500.0) -> dict[str, Any]:
    """Run ``fedhar-simulate argv`` (which must write to ``run_dir``) while sampling Ray's stores from the same driver.

    After each completed round (read from ``run_dir/report.json``) the child records each live
    node's store (bytes used, objects) and the driver's own object references. Returns
    ``{"rc": exit status, "wall_s": seconds, "samples": {rounds completed: {"nodes": {ip: [bytes, objects]}, "refs": n}}}``.
    """
    doc: dict[str, Any] = _json_from_child(["sampled-run", str(out), str(run_dir), "--", *argv], out, timeout_s)
    doc["samples"] = {int(k): v for k, v in doc["samples"].items()}
    return doc


def _driver_refs() -> int:
    """Object references this process (the run's Ray driver) holds: each pins its object in a store or in its own memory.

    Read from the core worker's reference table (what ``ray memory`` lists per process). Small
    results (an actor's exit statuses) live there inline and never reach the plasma store.
    """
    import ray

    worker: Any = ray._private.worker.global_worker  # private: the per-process table behind `ray memory`
    return len(worker.core_worker.get_all_reference_counts())


def _probe(address: str) -> dict[str, int]:
    import logging

    import numpy as np
    import ray

    from simulation import fleet

    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    head_ip = address.split(":")[0]
    try:

        def head() -> dict[str, Any]:
            return next(n for n in fleet.ray_object_store() if n["node_ip"] == head_ip)

        before = head()
        ref = ray.put(np.zeros(2**17))  # 2**17 float64 = 1 MiB: over the inline limit, so it goes to the driver node's store
        during = head()
        del ref
        after = head()
        end = time.monotonic() + 10
        while after["objects"] != before["objects"] and time.monotonic() < end:  # the free is asynchronous
            time.sleep(0.1)
            after = head()
    finally:
        ray.shutdown()
    return {"before_bytes": before["bytes_used"], "before_objects": before["objects"], "during_bytes": during["bytes_used"],
            "during_objects": during["objects"], "after_bytes": after["bytes_used"], "after_objects": after["objects"]}


def _report(run: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((run / "report.json").read_text())
    except (OSError, ValueError):  # not written yet, or being rewritten
        return {}
    return doc


def _sampled_run(run: Path, argv: list[str]) -> dict[str, Any]:
    import ray

    from simulation import fleet, simulate

    samples: dict[int, dict[str, Any]] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            n = len(_report(run).get("rounds", []))
            if n and n not in samples and ray.is_initialized():
                try:
                    nodes = {s["node_ip"]: [s["bytes_used"], s["objects"]] for s in fleet.ray_object_store()}
                    # The least of three readings: an exit poll's reference is briefly doubled while it is renewed.
                    samples[n] = {"nodes": nodes, "refs": min(_driver_refs() for _ in range(3))}
                except RuntimeError:  # the driver is connecting or leaving: this round goes unsampled
                    pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        rc = simulate.main(argv)
    finally:
        stop.set()
        sampler.join(10)
    return {"rc": rc, "wall_s": time.monotonic() - t0, "samples": samples}


def main(args: list[str]) -> int:
    """The child's entry: ``probe ADDRESS OUT`` or ``sampled-run OUT RUN_DIR -- ARGV...``; writes JSON to OUT."""
    if args[:1] == ["probe"]:
        _, address, out = args
        Path(out).write_text(json.dumps(_probe(address)))
        return 0
    if args[:1] == ["sampled-run"] and args[3:4] == ["--"]:
        out, run = args[1], Path(args[2])
        Path(out).write_text(json.dumps(_sampled_run(run, args[4:])))
        return 0
    print(f"usage: {_THIS.name} probe ADDRESS OUT | sampled-run OUT RUN_DIR -- ARGV...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
