"""Training backends against PyTorch eager: inference latency at batch 1 and SGD step time at batch 32.

Baseline (measured in the same run): the ``"torch"`` backend (PyTorch eager, today's training
path). Candidates: the ``"executorch"`` backend (exported programs, Python runtime: XNNPACK
inference program, portable/BLAS training program) and the ``"numpy"`` reference. Each number
is the median over repeats, with the backends interleaved so that load from other processes
hits them alike.

* inference: ``predict`` on one window ``(1, 6, T)`` (probabilities out), per call;
* training step: ``train_epoch`` over ``steps`` batches of 32 windows with class weights and
  dropout, divided by ``steps`` (so it includes each backend's per-batch host work).

Ratios are candidate time / eager time (below 1 = faster than eager). The last line is
``et_train_step_vs_eager=<ratio> et_infer_vs_eager=<ratio>``.

Run: ``python benchmarks/bench_backends.py`` (the paper CNN, ArchSpec defaults; ``--small`` for
8 filters / 16 units; ``--json`` for machine-readable rows). Needs ``pip install '.[executorch]'``;
programs are exported into ``--cache-dir`` on first use (timed separately).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

from edge_client.backends import BackendOptions, TrainingBackend, make_backend
from har_models.nn.model import ArchSpec, init_state
from har_models.nn.training import balanced_class_weights


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark; print the table and the result line; return the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="8 filters, 16 hidden units instead of the paper's 196 / 1024")
    ap.add_argument("--steps", type=int, default=4, help="batches of 32 per timed epoch (4)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are taken over them (5)")
    ap.add_argument("--infer-calls", type=int, default=30, help="batch-1 predictions per round (30)")
    ap.add_argument("--cache-dir", default=None, help="program cache (default: a temporary folder)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (also MKL's, which the ExecuTorch runtime uses); numpy's BLAS follows OPENBLAS_NUM_THREADS")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON before the result line")
    args = ap.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    spec = ArchSpec(n_classes=8, conv_filters=8, dense_units=16) if args.small else ArchSpec(n_classes=8)
    rng = np.random.default_rng(0)
    n = 32 * args.steps
    x = (rng.normal(size=(n, spec.n_channels, spec.window)) * 3).astype(np.float32)
    y = rng.integers(0, spec.n_classes, n).astype(np.int64)
    cw = balanced_class_weights(y, spec.n_classes)
    w0 = {k: v.numpy() for k, v in init_state(spec, 0).items()}

    cache = args.cache_dir or tempfile.mkdtemp(prefix="fedhar-programs-")
    t0 = time.perf_counter()
    backends: dict[str, TrainingBackend] = {"eager": make_backend("torch", spec, w0)}
    backends["executorch"] = make_backend("executorch", spec, w0, BackendOptions(program_cache=cache))
    export_s = time.perf_counter() - t0
    backends["numpy"] = make_backend("numpy", spec, w0)

    infer: dict[str, list[float]] = {k: [] for k in backends}
    step: dict[str, list[float]] = {k: [] for k in backends}
    one = x[:1]
    for b in backends.values():  # warm-up (allocations, XNNPACK packing, BLAS threads)
        b.predict(one)
        b.train_epoch(x[:32], y[:32], np.arange(32), lr=1e-3, batch_size=32, class_weights=cw, dropout_seed=0)
    for r in range(args.rounds):
        order = rng.permutation(n)
        for name, b in backends.items():
            b.set_weights(w0)
            infer[name].append(_median_time(functools.partial(b.predict, one), args.infer_calls))
            t0 = time.perf_counter()
            b.train_epoch(x, y, order, lr=1e-3, batch_size=32, class_weights=cw, dropout_seed=r)
            step[name].append((time.perf_counter() - t0) / args.steps)

    med = {k: (statistics.median(infer[k]), statistics.median(step[k])) for k in backends}
    base_i, base_s = med["eager"]
    rows = [
        {"backend": k, "infer_ms": 1e3 * i, "infer_vs_eager": i / base_i, "step_ms": 1e3 * s, "step_vs_eager": s / base_s}
        for k, (i, s) in med.items()
    ]
    label = "small CNN (8 filters, 16 units)" if args.small else "paper CNN (196 filters, 1024 units)"
    print(f"Backends vs PyTorch eager, {label}, {spec.n_parameters():,} parameters; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians of {args.rounds} interleaved rounds")
    print(f"programs ready (exported now unless cached in --cache-dir, then loaded): {export_s:.1f} s")
    print(f"{'backend':<11} {'infer b=1 ms':>13} {'vs eager':>9} {'train step b=32 ms':>19} {'vs eager':>9}")
    for row in rows:
        print(f"{row['backend']:<11} {row['infer_ms']:>13.3f} {row['infer_vs_eager']:>9.2f} {row['step_ms']:>19.1f} "
              f"{row['step_vs_eager']:>9.2f}")
    if args.json:
        print(json.dumps(rows, indent=2))
    et_i, et_s = med["executorch"]
    ratios = {"et_train_step_vs_eager": et_s / base_s, "et_infer_vs_eager": et_i / base_i}
    print(f"et_train_step_vs_eager={ratios['et_train_step_vs_eager']:.3f} et_infer_vs_eager={ratios['et_infer_vs_eager']:.3f}")
    return ratios


if __name__ == "__main__":
    main()
