"""FedDWA server step at scale: Gram-matrix distances against a direct double loop.

Baseline (measured in the same run): for every target i and source j, sum over tensors of
``((ŵ_i - w_j) ** 2).sum()`` in float32, i.e. n^2 Python-level passes over the parameters
(what the authors' ``cal_norm`` does). Candidate: :func:`coordinator.feddwa.distances`
(one blocked float64 Gram product). The loop over 100 full-size models (10,000 pairs of
6.45 M parameters) takes most of a minute, so by default it is measured on 20 clients and,
for 100 clients, extrapolated by the n^2 pair count (marked "extrap."); ``--full-loop``
measures it at 100 too. A small model is measured with both methods at the full client count.
The loop works in float32 like the authors' code; "max rel diff" compares it with the
float64 Gram result.

Also times the rest of the server step (weights with top-K, personalised mixes).

Run: ``python benchmarks/bench_feddwa.py`` (``--quick`` for a smaller run, ``--json`` for
machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from coordinator.feddwa import distances, personalise, weights
from har_models.nn.model import ArchSpec

State = dict[str, torch.Tensor]
T = TypeVar("T")


def make_states(spec: ArchSpec, n: int, seed: int) -> tuple[list[State], list[State]]:
    """n trained models and their guidance models (trained + a small step), float32."""
    g = torch.Generator().manual_seed(seed)
    trained, guidance = [], []
    for _ in range(n):
        w = {k: torch.empty(s).uniform_(-0.05, 0.05, generator=g) for k, s in spec.shapes().items()}
        trained.append(w)
        guidance.append({k: v + torch.empty_like(v).uniform_(-1e-3, 1e-3, generator=g) for k, v in w.items()})
    return trained, guidance


def loop_distances(guidance: Sequence[State], trained: Sequence[State]) -> torch.Tensor:
    """The baseline: D[j, i] by a double loop over clients, per-tensor squared norms in float32."""
    n = len(trained)
    d = torch.empty(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            d[j, i] = float(sum(((guidance[i][k] - trained[j][k]) ** 2).sum() for k in trained[j]))
    return d


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=100, help="clients in the full-size run (100)")
    ap.add_argument("--loop-clients", type=int, default=20, help="clients for the full-size loop baseline (20)")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--full-loop", action="store_true", help="also measure the loop at --clients (about a minute at 100)")
    ap.add_argument("--quick", action="store_true", help="30 clients, loop on 10: a run of about a minute")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.clients, args.loop_clients = 30, 10

    full = ArchSpec(n_classes=8)
    small = ArchSpec(n_classes=8, conv_filters=16, dense_units=64)
    rows: list[dict[str, object]] = []

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def compare(spec: ArchSpec, n: int, loop_ns: Sequence[int], label: str, server_step: bool) -> None:
        log(f"[{label}] building {n} trained + {n} guidance models of {spec.n_parameters():,} parameters")
        trained, guidance = make_states(spec, n, seed=0)
        d_full: torch.Tensor | None = None
        t_loop, m = 0.0, 1
        for m in sorted(set(loop_ns)):
            g_m, w_m = guidance[:m], trained[:m]
            t_loop, d_loop = timed(lambda: loop_distances(g_m, w_m))  # noqa: B023 (called at once)
            t_gram, d = timed(lambda: distances(g_m, w_m))  # noqa: B023
            err = float(((d - d_loop).abs() / d_loop.abs().clamp(min=1e-30)).max())
            rows.append(dict(model=label, params=spec.n_parameters(), clients=m, loop_s=t_loop, gram_s=t_gram,
                             speedup=t_loop / t_gram, loop="measured", max_rel_diff=err))
            log(f"[{label}] {m} clients: loop {t_loop:.2f} s, Gram {t_gram:.2f} s")
            if m == n:
                d_full = d
        if d_full is None:
            t_gram, d_full = timed(lambda: distances(guidance, trained))
            t_est = t_loop * (n / m) ** 2
            rows.append(dict(model=label, params=spec.n_parameters(), clients=n, loop_s=t_est, gram_s=t_gram,
                             speedup=t_est / t_gram, loop="extrap.", max_rel_diff=None))
            log(f"[{label}] {n} clients: Gram {t_gram:.2f} s")
        if server_step:
            assert d_full is not None
            d_n = d_full
            row = rows[-1]
            t_w, p = timed(lambda: weights(d_n, top_k=args.top_k))
            t_p, _ = timed(lambda: personalise(trained, p))
            row.update(weights_s=t_w, personalise_s=t_p, total_s=float(str(row["gram_s"])) + t_w + t_p)
            log(f"[{label}] {n} clients: weights {t_w:.3f} s, personalise {t_p:.2f} s")

    compare(small, args.clients, [args.clients], "small F=16 H=64", server_step=False)
    loops = [args.loop_clients, args.clients] if args.full_loop else [args.loop_clients]
    compare(full, args.clients, loops, "paper CNN F=196 H=1024", server_step=True)

    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"FedDWA distances: Gram path vs double-loop baseline (torch {torch.__version__}, {torch.get_num_threads()} threads)")
    print(f"{'model':<24} {'params':>10} {'clients':>7} {'loop s':>9} {'':8} {'gram s':>8} {'speed-up':>9} {'max rel diff':>13}")
    for r in rows:
        diff = "" if r["max_rel_diff"] is None else f"{r['max_rel_diff']:.1e}"
        print(f"{r['model']:<24} {r['params']:>10,} {r['clients']:>7} {r['loop_s']:>9.2f} {r['loop']:8} "
              f"{r['gram_s']:>8.2f} {r['speedup']:>8.1f}x {diff:>13}")
    for r in rows:
        if "total_s" in r:
            print(f"server step at {r['clients']} clients ({r['model']}): distances {r['gram_s']:.2f} s + weights "
                  f"{r['weights_s']:.3f} s + personalise (top-{args.top_k}) {r['personalise_s']:.2f} s = {r['total_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
