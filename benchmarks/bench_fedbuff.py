"""Buffered asynchronous rounds (FedBuff) against synchronous rounds on the main job: macro-F1 against wall time.

Runs ``fedhar-simulate`` twice with the same clients, data and settings (the main job's unless
told otherwise): once in synchronous rounds, once in buffered rounds of ``--buffer-size`` K
(:mod:`coordinator.rounds.buffered`). The buffered run gets ``--rounds x clients / K`` rounds, so both
runs train about the same number of client updates. Each completed round's global macro-F1 (the
union test set) is put against the run's wall time so far (the sum of the rounds' seconds,
evaluation included), written as a table and a plot (``fedbuff.png``) to ``--out``.

Printed last, as one line of ``key=value``: each run's final macro-F1 and wall time, the buffered
run's best macro-F1 reached by the synchronous run's wall time (``fedbuff_f1_at_sync_wall``) and the
wall time each run needed to first reach ``--target`` macro-F1 (``nan`` if it never did)::

    python benchmarks/bench_fedbuff.py --out /tmp/fedbuff
    python benchmarks/bench_fedbuff.py --clients 6 --rounds 4 --buffer-size 3 --out /tmp/fedbuff-small

Baseline: the synchronous run alongside; the ratio of the two wall times to the target is
``time_to_target_ratio`` (below 1: buffered rounds get there sooner).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_job(out: Path, name: str, extra: list[str]) -> tuple[list[tuple[float, float]], float]:
    """Run ``fedhar-simulate`` into ``out/name``; its (cumulative wall s, global macro-F1) per round, and its whole wall s."""
    run_dir = out / name
    argv = [sys.executable, "-m", "simulation.simulate", "--no-progress", "--run-dir", str(run_dir), "--run-id", name, *extra]
    t0 = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"bench_fedbuff: {name} exited {rc}; see {out / f'{name}.log'}")
    return curve(run_dir), wall


def curve(run_dir: Path) -> list[tuple[float, float]]:
    """(cumulative wall s, global macro-F1) of each round of the run in ``run_dir`` (its ``report.json``)."""
    doc = json.loads((run_dir / "report.json").read_text())
    series, t = [], 0.0
    for r in doc["rounds"]:
        t += float(r["seconds"])
        series.append((t, float((r.get("global") or {}).get("macro_f1", math.nan))))
    return series


def first_reaching(series: list[tuple[float, float]], target: float) -> float:
    """Wall time (s) of the first round whose macro-F1 is at least ``target``; nan if none."""
    return next((t for t, f in series if f >= target), math.nan)


def best_by(series: list[tuple[float, float]], wall: float) -> float:
    """Best macro-F1 of the rounds completed by ``wall`` seconds; nan if none."""
    return max((f for t, f in series if t <= wall), default=math.nan)


def plot(out: Path, curves: dict[str, list[tuple[float, float]]]) -> None:
    """Macro-F1 against wall time, one line per run, to ``out/fedbuff.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, series in curves.items():
        ax.plot([t for t, _ in series], [f for _, f in series], marker=".", label=name)
    ax.set_xlabel("wall time (s, sum of rounds)")
    ax.set_ylabel("global macro-F1")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fedbuff.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=30, help="clients, one HAPT subject each (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the synchronous run (default %(default)s)")
    ap.add_argument("--buffer-size", type=int, default=15, help="K of the buffered run (default %(default)s)")
    ap.add_argument("--max-staleness", type=int, default=4, help="max_staleness of the buffered run (default %(default)s)")
    ap.add_argument("--target", type=float, default=0.85, help="macro-F1 (0-1) to time both runs to (default %(default)s)")
    ap.add_argument("--out", default="runs/bench-fedbuff", help="folder for both runs, the table and the plot")
    ap.add_argument("--buffered-args", default="",
                    help="more fedhar-simulate options for the buffered run only, one string (e.g. '--aggregation fedavg')")
    ap.add_argument("--sync-run", default=None,
                    help="the run folder of a synchronous run made before with the same options: its report is read, not run again")
    ap.add_argument("extra", nargs="*", help="more fedhar-simulate options for both runs (after --)")
    args = ap.parse_args(argv)
    if not 1 <= args.buffer_size <= args.clients:
        ap.error(f"--buffer-size must be in [1, --clients]; got {args.buffer_size}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--clients", str(args.clients), *args.extra]
    buffered_rounds = math.ceil(args.rounds * args.clients / args.buffer_size)
    if args.sync_run:
        sync, sync_wall = curve(Path(args.sync_run)), math.nan
    else:
        sync, sync_wall = run_job(out, "sync", [*common, "--rounds", str(args.rounds)])
    buff, buff_wall = run_job(out, "fedbuff", [*common, "--rounds", str(buffered_rounds), "--buffer-size", str(args.buffer_size),
                                               "--max-staleness", str(args.max_staleness), *args.buffered_args.split()])  # fmt: skip
    rows = [{"run": name, "round": i, "wall_s": round(t, 2), "macro_f1": f}
            for name, series in (("sync", sync), ("fedbuff", buff)) for i, (t, f) in enumerate(series)]  # fmt: skip
    (out / "curves.json").write_text(json.dumps(rows, indent=1))
    plot(out, {"synchronous": sync, f"FedBuff K={args.buffer_size}": buff})
    for name, series in (("sync", sync), ("fedbuff", buff)):
        print(f"{name}: " + ", ".join(f"{t:.0f}s {f:.3f}" for t, f in series))
    t_sync, t_buff = first_reaching(sync, args.target), first_reaching(buff, args.target)
    figures = {
        "sync_final_f1": round(sync[-1][1], 4),
        "sync_wall_s": round(sync[-1][0], 1),
        "fedbuff_final_f1": round(buff[-1][1], 4),
        "fedbuff_wall_s": round(buff[-1][0], 1),
        "fedbuff_f1_at_sync_wall": round(best_by(buff, sync[-1][0]), 4),
        "sync_s_to_target": round(t_sync, 1),
        "fedbuff_s_to_target": round(t_buff, 1),
        "time_to_target_ratio": round(t_buff / t_sync, 3) if t_sync > 0 else math.nan,
        "process_wall_s": f"{sync_wall:.0f}/{buff_wall:.0f}",
    }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
