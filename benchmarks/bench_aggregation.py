"""Coordinator server step at scale: FedDWA's ``aggregate_fit`` against FedAvg's, paper CNN, 10 to 100 clients.

Baseline (measured in the same run): FedAvg's server step, ``make_strategy("fedavg").aggregate_fit``
(the weighted average of the trained models, streamed tensor by tensor). Candidate: FedDWA's,
``make_strategy("feddwa").aggregate_fit`` (the shadow FedAvg average, guidance distances by a
blocked Gram product, weights with top-K, one personalised mix per client; coordinator/feddwa.py).
Issue 13 asks for FedDWA at most 2x FedAvg.

The updates are what the service hands a strategy: :class:`coordinator.updates.ClientUpdate`
objects whose models were spilled to disk on arrival (:func:`coordinator.spill.spill_update`),
so each ``state`` (and FedDWA's ``guidance``) is a :class:`coordinator.spill.SpilledState` that
reads its tensors from a safetensors file (in the page cache here, as on a server with free
memory). The models are the paper CNN (HAPT's 6 classes: 196 filters, 1024 units, 6,448,714
float32 parameters, 25.8 MB): a Glorot-initialised base model plus a per-client Gaussian
perturbation with 5 % of each weight tensor's standard deviation (0.01 for the bias vectors,
which start at zero), and for each client a guidance model one small step further (a fifth
of that).
The files are written once for the largest client count; every case reads the first n.

Each (strategy, n) runs in a fresh subprocess: it builds the spilled updates, resets its peak
resident set (``/proc/self/clear_refs``), runs ``aggregate_fit`` ``--reps`` times and reports
the median repetition (the lower median for an even count): its wall seconds, its CPU
seconds (all threads of the process; on a shared machine the wall clock also measures the
neighbours) and the peak RSS over the repetitions (``VmHWM``; it includes the process's own
~0.3 GB of Python and PyTorch, given as ``base GB``). For FedDWA it also reports where the
time goes, by timing the functions ``aggregate_fit`` calls: a separate shadow FedAvg average
(if any), the distances (reading trained and guidance models from their files included), the
weights, and the personalised mixes. ``--threads`` sets torch's threads in every case (on a
machine whose cores are busy with other work, 1 thread avoids measuring OpenMP threads that
wait for each other).

``--dwa-gram float64`` times FedDWA with the exact Gram product instead of the default float32 one
(coordinator/feddwa.py, ``DEFAULT_GRAM``).

Run: ``python benchmarks/bench_aggregation.py`` (100 clients take about 5 GB of disk for the
spilled files and up to ~9 GB of memory in the FedDWA case; ``--clients 10,30`` for a smaller
run, ``--json`` for machine-readable output). The last line is ``feddwa_vs_fedavg=<wall ratio at
the largest client count> feddwa_vs_fedavg_cpu=<CPU ratio there>``.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import coordinator.feddwa as feddwa_mod
import coordinator.strategies.feddwa as strategy_mod
from coordinator.spill import SpilledState, spill_update
from coordinator.strategies import Federation, make_strategy
from coordinator.strategies.feddwa import FedDWASettings
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks' own helpers
from benchmarks.machine_load import LoadLog

SPEC = ArchSpec(n_classes=6)
"""The paper CNN for HAPT's 6 classes: 196 filters, 1024 units, 6,448,714 parameters."""

SPREAD = 0.05
"""Per-client perturbation, as a fraction of each weight tensor's standard deviation."""

GUIDANCE_STEP = 0.2
"""The guidance model's extra step, as a fraction of :data:`SPREAD`."""

PHASES = ("shadow_fedavg", "distances", "weights", "personalise")


def client_id(j: int) -> str:
    """Client id of the j-th simulated client."""
    return f"c{j:03d}"


def n_train_of(j: int) -> int:
    """Training windows of client j (150..349, so FedAvg's weights differ between clients)."""
    return 150 + (37 * j) % 200


def write_updates(folder: Path, n: int, seed: int = 0) -> None:
    """Spill the updates (trained and guidance models) of ``n`` clients to ``folder`` as the service does.

    Each model: the base model plus a Gaussian perturbation (std :data:`SPREAD` times the
    tensor's std; biases, which start at zero, 0.01); the guidance model adds another one of
    :data:`GUIDANCE_STEP` times that. float32, :data:`SPEC`'s shapes.
    """
    base = init_state(SPEC, seed)
    scale = {k: SPREAD * float(v.std()) if float(v.std()) > 0 else 0.01 for k, v in base.items()}
    g = torch.Generator().manual_seed(seed + 1)
    for j in range(n):
        w = {k: v + scale[k] * torch.randn(v.shape, generator=g) for k, v in base.items()}
        guid = {k: v + GUIDANCE_STEP * scale[k] * torch.randn(v.shape, generator=g) for k, v in w.items()}
        spill_update(ClientUpdate(client_id(j), 1, 0, n_train_of(j), 40, w, guid, size=0), folder)


def spilled_updates(folder: Path, n: int, guidance: bool) -> list[ClientUpdate]:
    """The first ``n`` spilled updates, as :func:`coordinator.spill.spill_update` returns them.

    FedAvg's updates carry no guidance model (``guidance=None``); FedDWA's read it from the
    ``guidance/`` tensors of the same file.
    """
    names = list(SPEC.shapes())
    out = []
    for j in range(n):
        path = folder / f"{client_id(j)}.safetensors"
        if not path.exists():
            raise FileNotFoundError(f"{path}: spilled update missing; write them first (write_updates)")
        out.append(
            ClientUpdate(
                client_id(j), 1, 0, n_train_of(j), 40,
                SpilledState(path, "", names), SpilledState(path, "guidance/", names) if guidance else None, size=0,
            )
        )  # fmt: skip
    return out


def _status_kib(field: str) -> int | None:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status in KiB (None where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False if it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _timed_phases(acc: dict[str, float]) -> Callable[[], None]:
    """Wrap the functions FedDWA's ``aggregate_fit`` calls so their seconds add up in ``acc``; returns the undo."""
    targets: list[tuple[Any, str, str]] = [
        (strategy_mod, "weighted_average", "shadow_fedavg"),
        (feddwa_mod, "distances", "distances"),
        (feddwa_mod, "weights", "weights"),
        (feddwa_mod, "personalise", "personalise"),
    ]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in targets]

    def wrap(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0

        return timed

    for (mod, name, key), (_, _, fn) in zip(targets, saved, strict=True):
        setattr(mod, name, wrap(fn, key))

    def undo() -> None:
        for mod, name, fn in saved:
            setattr(mod, name, fn)

    return undo


def run_case(folder: Path, strategy: str, n: int, reps: int, gram: str = feddwa_mod.DEFAULT_GRAM) -> dict[str, Any]:
    """Time ``aggregate_fit`` of ``strategy`` over the first ``n`` spilled updates, ``reps`` times (in this process).

    ``gram`` is FedDWA's Gram arithmetic (:data:`coordinator.feddwa.GRAMS`; ignored by other strategies).
    """
    strat = make_strategy(strategy, FedDWASettings(gram=gram) if strategy == "feddwa" else None)
    updates = spilled_updates(folder, n, guidance=strategy == "feddwa")
    fed = Federation(SPEC, SPEC, init_state(SPEC, 0))
    gc.collect()
    base_kib = _status_kib("VmRSS")
    clean = _reset_peak()
    times: list[float] = []
    cpu: list[float] = []
    phases: list[dict[str, float]] = []
    for _ in range(reps):
        acc: dict[str, float] = {}
        undo = _timed_phases(acc) if strategy == "feddwa" else (lambda: None)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            agg = strat.aggregate_fit(1, fed, updates, ())
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        finally:
            undo()
        phases.append(acc)
        if strategy == "feddwa" and len(agg.personal) != n:
            raise RuntimeError(f"FedDWA returned {len(agg.personal)} personalised models for {n} clients")
        del agg
        gc.collect()
    peak_kib = _status_kib("VmHWM")
    order = sorted(range(reps), key=lambda r: times[r])
    med = order[(reps - 1) // 2]  # the median repetition (lower median for an even count)
    return {
        "strategy": strategy,
        "clients": n,
        "reps": reps,
        "seconds": times[med],
        "all_seconds": times,
        "cpu_seconds": cpu[med],
        "phases": phases[med],
        "base_rss_bytes": None if base_kib is None else base_kib * 1024,
        "peak_rss_bytes": None if peak_kib is None or not clean else peak_kib * 1024,
    }


def run_in_subprocess(
    folder: Path, strategy: str, n: int, reps: int, threads: int | None, gram: str = feddwa_mod.DEFAULT_GRAM
) -> dict[str, Any]:
    """:func:`run_case` in a fresh Python process (so its peak RSS is its own); raises RuntimeError if it fails."""
    cmd = [sys.executable, __file__, "--worker", strategy, str(n), str(reps), str(folder), "--dwa-gram", gram]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{strategy} at {n} clients failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _gb(b: object) -> str:
    return "n/a" if b is None else f"{float(b) / 1e9:.2f}"  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="10,30,100", help="client counts, comma-separated (10,30,100)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per case; the median is reported (3)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in each case (default: torch's own)")
    ap.add_argument("--spill-dir", type=Path, default=None, help="where the spilled updates go (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--dwa-gram", choices=feddwa_mod.GRAMS, default=feddwa_mod.DEFAULT_GRAM,
                    help="FedDWA's Gram arithmetic: float32 (the default) or the exact float64 (%(default)s)")  # fmt: skip
    ap.add_argument("--worker", nargs=4, metavar=("STRATEGY", "N", "REPS", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.worker:
        strategy, n, reps, folder = args.worker
        print(json.dumps(run_case(Path(folder), strategy, int(n), int(reps), args.dwa_gram)))
        return 0

    sizes = sorted({int(s) for s in args.clients.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or args.reps < 1:
        ap.error("--clients needs positive counts and --reps must be >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []
    load = LoadLog()
    with tempfile.TemporaryDirectory(prefix="bench-aggregation-", dir=args.spill_dir) as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        log(f"spilling {sizes[-1]} updates (trained + guidance, {SPEC.n_parameters():,} parameters each) to {folder}")
        write_updates(folder, sizes[-1])
        log(f"  written in {time.perf_counter() - t0:.1f} s")
        for n in sizes:
            row: dict[str, Any] = {"clients": n}
            for strategy in ("fedavg", "feddwa"):
                with load.around(f"{strategy} at {n} clients"):
                    r = run_in_subprocess(folder, strategy, n, args.reps, args.threads, args.dwa_gram)
                row[strategy] = r
                log(f"  {strategy} at {n} clients: median {r['seconds']:.2f} s of {[round(t, 2) for t in r['all_seconds']]}, "
                    f"peak RSS {_gb(r['peak_rss_bytes'])} GB")  # fmt: skip
            row["ratio"] = row["feddwa"]["seconds"] / row["fedavg"]["seconds"]
            row["cpu_ratio"] = row["feddwa"]["cpu_seconds"] / row["fedavg"]["cpu_seconds"]
            rows.append(row)

    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"server step (aggregate_fit) on spilled updates, paper CNN ({SPEC.n_parameters():,} parameters, 25.8 MB), "
              f"median of {args.reps}; torch {torch.__version__}, {args.threads or torch.get_num_threads()} threads; "
              f"FedDWA's Gram product in {args.dwa_gram}")  # fmt: skip
        print(f"{'clients':>7} {'FedAvg s':>9} {'FedDWA s':>9} {'ratio':>6} {'FedAvg cpu s':>13} {'FedDWA cpu s':>13} "
              f"{'cpu ratio':>9} {'FedAvg peak GB':>15} {'FedDWA peak GB':>15} {'base GB':>8}")  # fmt: skip
        for row in rows:
            a, d = row["fedavg"], row["feddwa"]
            print(f"{row['clients']:>7} {a['seconds']:>9.2f} {d['seconds']:>9.2f} {row['ratio']:>6.2f} {a['cpu_seconds']:>13.2f} "
                  f"{d['cpu_seconds']:>13.2f} {row['cpu_ratio']:>9.2f} {_gb(a['peak_rss_bytes']):>15} "
                  f"{_gb(d['peak_rss_bytes']):>15} {_gb(a['base_rss_bytes']):>8}")  # fmt: skip
        print()
        print("FedDWA's server step by phase, wall seconds of the median repetition (personalise includes the shadow "
              "FedAvg average where it is mixed in the same pass)")  # fmt: skip
        print(f"{'clients':>7} " + " ".join(f"{p:>13}" for p in PHASES) + f" {'other':>7} {'total':>7}")
        for row in rows:
            d = row["feddwa"]
            ph = [float(d["phases"].get(p, 0.0)) for p in PHASES]
            total = float(d["seconds"])
            print(f"{row['clients']:>7} " + " ".join(f"{x:>13.2f}" for x in ph) + f" {total - sum(ph):>7.2f} {total:>7.2f}")
    for line in load.lines():
        print(line)
    print(f"feddwa_vs_fedavg={rows[-1]['ratio']:.2f} feddwa_vs_fedavg_cpu={rows[-1]['cpu_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
