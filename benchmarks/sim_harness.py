"""Run ``fedhar-simulate`` for a benchmark: optionally with HAPT subjects cut into shards, and
with the coordinator process's own peak memory recorded.

Sharding (``--shards k``): every HAPT subject file ``userXX.npz`` is cut into k files, shard j
holding the j-th of k contiguous, equal stretches of every session (``exp``) of the subject,
with all keys kept (acc, gyro, label, exp, sample), so each shard replays through the
device pipeline like a short recording of that subject. 30 subjects x k shards give up to
30k clients (``hapt-XX-sJ``); ``--clients N`` keeps the first N. The shard files go to a
folder of their own (``--shard-dir``); the committed data and the default discovery of
``fedhar-simulate`` are untouched: this harness hands the shard list to the simulation in
place of its subject discovery (which only knows ``userXX.npz`` names, i.e. at most 100
files). Shards of a subject are not independent clients statistically (same person), which
does not matter for memory and time.

After the run it writes ``coordinator_peak.json`` into the run folder: the peak resident set
of this process (the coordinator and its evaluator; the broker and the clients are other
processes), from ``getrusage`` (bytes).

    python benchmarks/sim_harness.py [--shards k --shard-dir DIR] -- <fedhar-simulate options>
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from har_models.data.hapt import hapt_subject_ids  # noqa: E402
from har_models.data.subjects import DEFAULT_HAPT  # noqa: E402
from simulation import simulate  # noqa: E402

KEYS = ("acc", "gyro", "label", "exp", "sample")


def write_shards(src: Path, dst: Path, k: int) -> dict[str, str]:
    """Cut every ``userXX.npz`` under ``src`` into ``k`` shard files under ``dst``; client id -> source text.

    Raises
    ------
    ValueError
        If ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"--shards must be >= 1, got {k}")
    dst.mkdir(parents=True, exist_ok=True)
    sources: dict[str, str] = {}
    for sid in hapt_subject_ids(src):
        with np.load(src / f"user{sid}.npz", allow_pickle=False) as d:
            arrays = {key: np.asarray(d[key]) for key in KEYS}
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for e in np.unique(arrays["exp"]):
            idx = np.flatnonzero(arrays["exp"] == e)  # samples of one session, in order
            for j, chunk in enumerate(np.array_split(idx, k)):
                parts[j].append(chunk)
        for j in range(k):
            sel = np.concatenate(parts[j])
            path = dst / f"user{sid}-s{j}.npz"
            if not path.exists():
                np.savez(path, **{key: arrays[key][sel] for key in KEYS})
            sources[f"hapt-{sid}-s{j}"] = f"hapt:{path}"
    # Order shards so the first N clients spread over subjects: shard 0 of every subject, then shard 1, ...
    return dict(sorted(sources.items(), key=lambda kv: (int(kv[0].rsplit("-s", 1)[1]), kv[0])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=1, help="cut each HAPT subject into k clients (1: the committed files as they are)")
    ap.add_argument("--shard-dir", type=Path, default=Path("/tmp/fedhar-hapt-shards"), help="where the shard files go")
    ap.add_argument("simulate_args", nargs=argparse.REMAINDER, help="-- then fedhar-simulate's options (with --run-dir)")
    args = ap.parse_args()
    sim_args = [a for a in args.simulate_args if a != "--"]
    if args.shards > 1:
        shards = write_shards(DEFAULT_HAPT, args.shard_dir / f"k{args.shards}", args.shards)
        simulate.subject_sources = lambda dataset, data, positions="": shards
    rc = simulate.main(sim_args)
    run_dir = Path(sim_args[sim_args.index("--run-dir") + 1]) if "--run-dir" in sim_args else None
    if run_dir is not None and run_dir.is_dir():
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        (run_dir / "coordinator_peak.json").write_text(json.dumps({"coordinator_peak_rss_bytes": peak}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
