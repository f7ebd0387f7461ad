"""Update encodings against float32: bytes uploaded per round and final macro-F1, same seed.

Baseline (measured in the same run): a federation whose clients upload float32 updates,
the default. Candidates: the same federation (same seed, clients, windows, rounds) with
``--update-encoding float16`` and ``--update-encoding int8_delta``. Each run is the real
main job (``fedhar-simulate``: broker, coordinator, clients in worker processes); only the
encoding differs. Reported per encoding: mean bytes up per round and its ratio to float32,
the final global and personalisation macro-F1, and the F1 difference in points (100 x).
Issue 10 makes an encoding the default only if it costs at most 0.5 points.

Default size: 6 HAPT clients, 5 rounds, a small CNN (32 filters, 128 hidden units), which
takes a few minutes on two cores; ``--paper`` uses the paper's CNN (196 filters, 1024
units), 30 clients and 10 rounds (the main job's size: long, and several GB of memory).

Run: ``python benchmarks/bench_update_encoding.py`` (``--json`` for machine-readable output).
The last line is ``f1_points_int8_delta=<d> f1_points_float16=<d> bytes_ratio_int8_delta=<r> bytes_ratio_float16=<r>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from har_models.wire.messages import UPDATE_ENCODINGS
from simulation import simulate


def run_one(encoding: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Run one federation with ``encoding``; its bytes and F1 figures (raises RuntimeError if the run fails)."""
    run_dir = folder / encoding
    argv = [
        "--clients", str(args.clients), "--rounds", str(args.rounds), "--conv-filters", str(args.conv_filters),
        "--dense-units", str(args.dense_units), "--seed", str(args.seed), "--update-encoding", encoding,
        "--generalisation-every", "0", "--no-progress", "--log-level", "WARNING",
        "--run-dir", str(run_dir), "--run-id", f"bench-{encoding.replace('_', '-')}", *args.extra,
    ]  # fmt: skip
    t0 = time.monotonic()
    rc = simulate.main(argv)
    if rc != 0:
        raise RuntimeError(f"fedhar-simulate with --update-encoding {encoding} exited with {rc}; see {run_dir / 'logs'}")
    doc = json.loads((run_dir / "report.json").read_text())
    rounds = doc["rounds"]
    return {
        "encoding": encoding,
        "bytes_up_per_round": sum(r["bytes_up"] for r in rounds) / len(rounds),
        "bytes_down_per_round": sum(r["bytes_down"] for r in rounds) / len(rounds),
        "global_f1": doc["final"]["global"]["macro_f1"],
        "personal_f1": doc["final"].get("personalisation", {}).get("macro_f1", float("nan")),
        "global_acc": doc["final"]["global"]["accuracy"],
        "seconds": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paper", action="store_true", help="the paper's CNN, 30 clients, 10 rounds")
    ap.add_argument("--clients", type=int, default=None, help="HAPT subjects (default 6; 30 with --paper)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 10 with --paper)")
    ap.add_argument("--conv-filters", type=int, default=None, help="default 32 (196 with --paper)")
    ap.add_argument("--dense-units", type=int, default=None, help="default 128 (1024 with --paper)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("extra", nargs="*", help="further fedhar-simulate options, after --")
    args = ap.parse_args(argv)
    for name, small, paper in (("clients", 6, 30), ("rounds", 5, 10), ("conv_filters", 32, 196), ("dense_units", 128, 1024)):
        if getattr(args, name) is None:
            setattr(args, name, paper if args.paper else small)

    with tempfile.TemporaryDirectory(prefix="bench-encoding-") as tmp:
        folder = args.keep or Path(tmp)
        rows = [run_one(enc, args, folder) for enc in UPDATE_ENCODINGS]
    base = rows[0]
    assert base["encoding"] == "float32"
    for r in rows:
        r["bytes_ratio"] = r["bytes_up_per_round"] / base["bytes_up_per_round"]
        r["f1_points"] = 100.0 * (r["global_f1"] - base["global_f1"])
        r["personal_f1_points"] = 100.0 * (r["personal_f1"] - base["personal_f1"])

    size = f"{args.clients} clients, {args.rounds} rounds, CNN {args.conv_filters} filters / {args.dense_units} units, seed {args.seed}"
    if args.json:
        print(json.dumps({"size": size, "rows": rows}, indent=2))
    else:
        print(f"update encodings against float32 (baseline, same run): {size}")
        print(f"{'encoding':<11} {'bytes up/round':>15} {'ratio':>6} {'global F1':>10} {'d points':>9} {'personal F1':>12} "
              f"{'d points':>9} {'seconds':>8}")  # fmt: skip
        for r in rows:
            print(f"{r['encoding']:<11} {r['bytes_up_per_round']:>15,.0f} {r['bytes_ratio']:>6.3f} {r['global_f1']:>10.4f} "
                  f"{r['f1_points']:>+9.2f} {r['personal_f1']:>12.4f} {r['personal_f1_points']:>+9.2f} {r['seconds']:>8.1f}")  # fmt: skip
    by = {r["encoding"]: r for r in rows}
    print(
        f"f1_points_int8_delta={by['int8_delta']['f1_points']:.2f} f1_points_float16={by['float16']['f1_points']:.2f} "
        f"bytes_ratio_int8_delta={by['int8_delta']['bytes_ratio']:.3f} bytes_ratio_float16={by['float16']['bytes_ratio']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
