"""One local round on the emulated arm64 board against the same round on this host, per model and backend.

Baseline (measured in the same run): the host (x86-64, the development venv). Candidate: the
board of ``firmware_scripts/pi_emulated/`` (Debian bookworm arm64 booted with systemd under
qemu-user-static), with a venv made from the aarch64 wheelhouse. qemu translates every arm64
instruction, so the board's times are far slower than a real Raspberry Pi's would be: the
ratios bound a Pi's cost from above; they do not predict it.

One local round is what a client does in a round with the default plan (``LocalTraining``:
E = 1 epoch, lr 0.1, batch 32, balanced class weights) on 234 training windows, the size of
HAPT user01's training split, then the predictions on its 70 test windows. Models: the small
CNN the tests and the board's federation use (8 filters, 32 units) and the paper's CNN
(``ArchSpec`` defaults). Backends: every one importable on each side (numpy everywhere; torch
where installed). Each time is the median of ``--repeats`` rounds after one warm-up round.

Memory: the peak resident set (``ru_maxrss``) of the board's worker process after all its
rounds, against the 400 MB budget of a client on a 1 GB board. Under qemu-user this includes
the emulator's own memory and its translation cache, so it overstates a real Pi's.

Run (root; builds and caches the board and wheelhouse on first use, ~10 min)::

    sudo python benchmarks/bench_board.py            # prints the table and the result line
    python benchmarks/bench_board.py --worker        # the per-machine part alone, JSON lines

The last line is ``board_vs_host_small_numpy=<ratio> board_vs_host_paper_numpy=<ratio> board_peak_rss_mb=<MB>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BOARD = ROOT / "firmware_scripts" / "pi_emulated" / "board.sh"
CACHE = Path(os.environ.get("FEDHAR_BOARD_CACHE", Path.home() / ".cache" / "fedhar"))
BOARD_ROOT = Path(os.environ.get("FEDHAR_BOARD_ROOT", CACHE / "pi-rootfs"))
WHEELHOUSE = CACHE / "wheelhouse-aarch64"
RSS_BUDGET_MB = 400.0
N_TRAIN, N_TEST = 234, 70
MODELS: dict[str, dict[str, int]] = {"small": {"conv_filters": 8, "dense_units": 32}, "paper": {}}


def worker(repeats: int, models: list[str]) -> list[dict[str, Any]]:
    """Time one local round per (model, backend) on this machine; rows with seconds and the process's peak RSS."""
    import numpy as np

    from edge_client.backends import make_backend
    from har_models.data.labels import balanced_class_weights
    from har_models.nn.arch import ArchSpec
    from har_models.settings import LocalTraining

    plan = LocalTraining()
    backends = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") is not None else [])
    rows: list[dict[str, Any]] = []
    for model in models:
        spec = ArchSpec(n_classes=6, **MODELS[model])  # type: ignore[arg-type]
        rng = np.random.default_rng(0)
        x = (rng.normal(size=(N_TRAIN + N_TEST, spec.n_channels, spec.window)) * 3).astype(np.float32)
        y = rng.integers(0, spec.n_classes, N_TRAIN).astype(np.int64)
        cw = balanced_class_weights(y, spec.n_classes)
        for name in backends:
            b = make_backend(name, spec)
            times = []
            for r in range(repeats + 1):  # the first is the warm-up
                order = rng.permutation(N_TRAIN)
                t0 = time.perf_counter()
                b.train_epoch(x[:N_TRAIN], y, order, lr=plan.lr, batch_size=plan.batch_size, class_weights=cw, dropout_seed=r)
                b.predict(x[N_TRAIN:])
                times.append(time.perf_counter() - t0)
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
            rows.append({"machine": platform.machine(), "model": model, "backend": name, "parameters": spec.n_parameters(),
                         "round_s": statistics.median(times[1:]), "peak_rss_mb": peak_mb})  # fmt: skip
    return rows


def _board(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["bash", str(BOARD), *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"board.sh {args[0]} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return r


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark on the host and the board; print the table and the result line; return the numbers."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="time this machine only and print JSON lines")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per case after one warm-up; medians (3)")
    ap.add_argument("--models", default="small,paper", help="comma-separated: small, paper (default %(default)s)")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if args.worker:
        for row in worker(args.repeats, models):
            print(json.dumps(row), flush=True)
        return {}

    if not any(WHEELHOUSE.glob("numpy-*.whl")):
        subprocess.run(["bash", str(ROOT / "firmware_scripts/pi_emulated/wheelhouse.sh"), str(WHEELHOUSE)], check=True)
    _board("build", "--root", str(BOARD_ROOT))
    t0 = time.perf_counter()
    _board("boot", "--root", str(BOARD_ROOT), "--ephemeral", "--bind-ro", f"{WHEELHOUSE}:/mnt/wheelhouse", timeout=600)
    boot_s = time.perf_counter() - t0
    try:
        venv = ("python3 -m venv /root/bench && /root/bench/bin/pip install -q --no-index --find-links /mnt/wheelhouse "
                "numpy scipy safetensors paho-mqtt tomli-w")  # fmt: skip
        _board("exec", "--root", str(BOARD_ROOT), "--", "/bin/sh", "-c", venv, timeout=1800)
        # Host and board in turn, per model, so that load from other processes hits both alike.
        host_rows: list[dict[str, Any]] = []
        board_rows: list[dict[str, Any]] = []
        for model in models:
            host_rows += worker(args.repeats, [model])
            cmd = "cd /mnt/fedhar && PYTHONPATH=/mnt/fedhar /root/bench/bin/python benchmarks/bench_board.py --worker"
            cmd += f" --repeats {args.repeats} --models {model}"
            r = _board("exec", "--root", str(BOARD_ROOT), "--", "/bin/sh", "-c", cmd, timeout=7200)
            board_rows += [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    finally:
        _board("stop", "--root", str(BOARD_ROOT), timeout=300)

    host = {(r["model"], r["backend"]): r for r in host_rows}
    peak = max(float(r["peak_rss_mb"]) for r in board_rows)
    print(f"One local round (E=1, {N_TRAIN} training + {N_TEST} test windows, batch 32): emulated arm64 board vs this host")
    print(f"host {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}; board: qemu-user-static arm64, "
          f"booted in {boot_s:.0f} s; medians of {args.repeats} rounds. qemu is far slower than a real Raspberry Pi.")  # fmt: skip
    print(f"{'model':<6} {'parameters':>11} {'backend':<7} {'host s':>8} {'board s':>9} {'board/host':>11}")
    result: dict[str, float] = {}
    for row in board_rows:
        key = (row["model"], row["backend"])
        h = host.get(key)
        ratio = float(row["round_s"]) / float(h["round_s"]) if h else float("nan")
        result[f"board_vs_host_{key[0]}_{key[1]}"] = ratio
        hs = f"{float(h['round_s']):8.2f}" if h else f"{'-':>8}"
        print(f"{key[0]:<6} {int(row['parameters']):>11,} {key[1]:<7} {hs} {float(row['round_s']):9.2f} {ratio:11.1f}")
    host_only = sorted(set(host) - {(r["model"], r["backend"]) for r in board_rows})
    for key in host_only:
        print(f"{key[0]:<6} {int(host[key]['parameters']):>11,} {key[1]:<7} {float(host[key]['round_s']):8.2f} "
              f"{'(not on the board)':>21}")  # fmt: skip
    print(f"board worker peak RSS {peak:.0f} MB (qemu included) against a budget of {RSS_BUDGET_MB:.0f} MB: "
          f"{'within' if peak <= RSS_BUDGET_MB else 'OVER'}")  # fmt: skip
    result["board_peak_rss_mb"] = peak
    print(" ".join(f"{k}={v:.3f}" if k != "board_peak_rss_mb" else f"{k}={v:.0f}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
