"""Memory of the simulation against the number of clients: the whole job and the coordinator.

For each N of ``--sizes`` runs the main job (``fedhar-simulate``, workers engine, embedded
broker, FedAvg) through ``benchmarks/sim_harness.py``, with HAPT subjects cut into
``ceil(N / 30)`` shards each once N passes the 30 subjects. Per run it reports:

- ``job PSS MB``: peak PSS of the whole job, as the run report records it (header
  ``peak_memory``: this process tree, sampled each second);
- ``coord MB``: peak RSS of the coordinator process alone (``getrusage``; the broker and
  the workers are other processes);
- ``round s``: mean duration of the quiet rounds (after round 0 when there are any);
  ``eval round s``: of the rounds in which the coordinator also evaluated every client's
  model on the union test set (``--generalisation-every`` and the last round); ``wall s``:
  the whole command.

Baseline: the smallest N of the same model in the same invocation; ``xPSS`` and ``xcoord``
are each row's figure over it. With a streaming aggregation the coordinator column stays
flat in N (issue 10); the job's PSS grows with the clients' threads, connections and stores,
not with one model per client.

``--reuse DIR`` adds a finished run (e.g. ``bench_round_overhead.py --run-dir DIR`` with the
paper CNN at 30 clients) as a row without running it again. The default model is the
paper's CNN (F=196, H=1024); ``--conv-filters/--dense-units`` choose a smaller one for
quick runs. The last line gives the key figures as ``key=value`` pairs.

    python benchmarks/bench_sim_memory.py [--sizes 10,30,100,300] [--rounds 3] [--local-epochs 1]
        [--conv-filters 196 --dense-units 1024] [--local-broker amqtt|mosquitto] [--reuse DIR ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulation.broker import LOCAL_BROKERS  # noqa: E402

SUBJECTS = 30


def run(n: int, args: argparse.Namespace, run_dir: Path) -> None:
    """The main job with n clients (shards when n > 30)."""
    shards = max(1, math.ceil(n / SUBJECTS))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sim_harness.py"), "--shards", str(shards), "--",
           "--clients", str(n), "--rounds", str(args.rounds), "--local-epochs", str(args.local_epochs),
           "--conv-filters", str(args.conv_filters), "--dense-units", str(args.dense_units), "--aggregation", "fedavg",
           "--engine", "workers", "--no-progress", "--start-timeout", "1800", "--run-dir", str(run_dir), "--run-id", f"mem{n}",
           "--local-broker", args.local_broker]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_sim_memory: the {n}-client run failed ({done.returncode}):\n{done.stdout[-3000:]}")
    print(f"  ran {n} clients ({shards} shard(s) per subject) in {time.monotonic() - t0:.0f} s", flush=True)


def row(run_dir: Path) -> dict[str, float | int | str]:
    """The figures of one finished run."""
    doc = json.loads((run_dir / "report.json").read_text())
    rounds = doc["rounds"]
    # Quiet rounds: no generalisation evaluation (every client's model on the union test set, which the
    # coordinator does every --generalisation-every rounds and in the last one); after round 0 when there are any.
    quiet = [r for r in rounds if r.get("generalisation") is None]
    quiet = [r for r in quiet if r["round"] >= 1] or quiet
    evaluated = [r["seconds"] for r in rounds if r.get("generalisation") is not None]
    peak_file = run_dir / "coordinator_peak.json"
    coord = json.loads(peak_file.read_text())["coordinator_peak_rss_bytes"] / 2**20 if peak_file.exists() else float("nan")
    return {
        "clients": int(doc["clients"]),
        "model": f"F={rounds[0]['conv_filters']} H={rounds[0]['dense_units']}",
        "job_pss_mb": float(doc["peak_memory"]["peak_pss_mb"]),
        "coord_mb": coord,
        "round_s": sum(r["seconds"] for r in quiet) / len(quiet) if quiet else float("nan"),
        "eval_round_s": sum(evaluated) / len(evaluated) if evaluated else float("nan"),
        "wall_s": float(doc.get("wall_seconds", float("nan"))),
        "updates": f"{rounds[-1]['updates']}/{rounds[-1]['selected']}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,30,100,300", help="client counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--conv-filters", type=int, default=196, help="F of the CNN (paper: 196; e.g. 32 for a quick run)")
    ap.add_argument("--dense-units", type=int, default=1024, help="H of the CNN (paper: 1024; e.g. 128 for a quick run)")
    ap.add_argument("--reuse", type=Path, action="append", default=[], help="a finished run folder to add as a row")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run folders under this folder")
    ap.add_argument("--local-broker", choices=tuple(LOCAL_BROKERS), default="amqtt",
                    help="the broker fedhar-simulate starts (default amqtt, the main job's; mosquitto beyond about 100 clients)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]  # --sizes "" with --reuse: only re-tabulate
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-mem-"))
    rows = [row(d.resolve()) for d in args.reuse]
    for n in sizes:
        run_dir = (base / f"n{n}-f{args.conv_filters}-h{args.dense_units}").resolve()
        run(n, args, run_dir)
        rows.append(row(run_dir))
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)
    baseline: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["clients"]):
        baseline.setdefault(str(r["model"]), r)
    print(f"\nsimulation memory (workers engine, FedAvg, HAPT; shards beyond 30 clients; broker {args.local_broker}); "
          "baseline: smallest N of each model\n")
    print(f"{'clients':>7} {'model':>14} {'updates':>8} {'job PSS MB':>11} {'xPSS':>6} {'coord MB':>9} {'xcoord':>7} "
          f"{'round s':>8} {'eval round s':>13} {'wall s':>7}")
    summary = []
    for r in sorted(rows, key=lambda r: (str(r["model"]), r["clients"])):
        b = baseline[str(r["model"])]
        x_pss, x_coord = r["job_pss_mb"] / b["job_pss_mb"], r["coord_mb"] / b["coord_mb"]
        print(f"{r['clients']:>7} {r['model']:>14} {r['updates']:>8} {r['job_pss_mb']:>11.0f} {x_pss:>6.2f} {r['coord_mb']:>9.0f} "
              f"{x_coord:>7.2f} {r['round_s']:>8.1f} {r['eval_round_s']:>13.1f} {r['wall_s']:>7.0f}")
        tag = str(r["model"]).replace("F=", "f").replace(" H=", "h")
        summary += [f"job_pss_mb_{r['clients']}_{tag}={r['job_pss_mb']:.0f}", f"coord_x_{r['clients']}_{tag}={x_coord:.2f}"]
    print(" ".join(summary))


if __name__ == "__main__":
    main()
