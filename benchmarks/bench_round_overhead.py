"""Round overhead: a federated round's wall time over the pure training compute of that round.

Runs the main job (``fedhar-simulate``, workers engine, embedded broker, HAPT) with N
clients (through ``benchmarks/sim_harness.py``, which also records the coordinator's peak),
then measures the baseline in this process, with no broker and no other process:
for every round r >= 1 and every client that sent an update in r, one call of
:func:`har_models.nn.training.train_local` (whose numbers :class:`edge_client.trainer.ClientTrainer`'s
torch backend reproduces bit for bit) from the global model the round started from (``models/r{r-1}``, or the nearest kept
one of the same shapes when the coordinator pruned it), on that client's
stored training windows (its store from the run), with the round's settings and seed
(:func:`edge_client.trainer.derive_seed`) and one PyTorch thread, as each client has.
The compute of a round is the sum over its clients; round 0 is left out (its starting
model is not stored, and it carries the start-up), and one untimed call first pays
PyTorch's one-off set-up, as the run's clients did in round 0.

Columns: ``wall s`` the round's duration in the report (announcement to close), ``compute s``
the summed baseline, ``ratio`` their quotient. Last line: ``round_wall_vs_compute=<ratio>``,
summed wall over summed compute of the quiet rounds (goal of issue 10: at most 1.3): rounds in
which the coordinator also evaluates every client's model on the union test set
(``--generalisation-every`` and the last round) are shown but left out of it.

    python benchmarks/bench_round_overhead.py [--clients 30] [--rounds 3] [--local-epochs 1]
        [--conv-filters 196 --dense-units 1024] [--workers W] [--run-dir DIR] [--reuse DIR]

``--reuse DIR`` measures the baseline of a finished run instead of running one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine_load import LoadLog  # noqa: E402


def run_simulation(args: argparse.Namespace, run_dir: Path) -> None:
    """The main job with the benchmark's settings (a subprocess, exactly as the command runs)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sim_harness.py"), "--", "--clients", str(args.clients), "--rounds", str(args.rounds),
           "--local-epochs", str(args.local_epochs), "--conv-filters", str(args.conv_filters), "--dense-units",
           str(args.dense_units), "--engine", "workers", "--no-progress", "--run-dir", str(run_dir), "--run-id", "bench"]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_round_overhead: fedhar-simulate failed ({done.returncode}):\n{done.stdout[-3000:]}")
    print(f"simulation: {time.monotonic() - t0:.0f} s (fedhar-simulate {' '.join(cmd[3:])})", flush=True)


def compute_baseline(run_dir: Path, rounds: list[dict]) -> dict[int, tuple[int, float]]:
    """Round -> (clients trained, summed seconds of train_local) for rounds >= 1, in this process."""
    import torch

    from coordinator.config import CoordinatorConfig
    from coordinator.state import load_state_file
    from coordinator.strategies import make_strategy
    from edge_client.store import ClientStore
    from edge_client.trainer import derive_seed
    from har_models.data.labels import HAPT_LABELS
    from har_models.nn.training import TrainConfig, balanced_class_weights, make_loss, train_local
    from har_models.settings import from_mapping
    from har_models.wire.messages import TrainingPlan

    torch.set_num_threads(1)
    saved = json.loads((run_dir / "report.json").read_text())["config"]
    saved.pop("feddist_mode_in_force", None)  # a fact the report adds beside the settings, not one of them
    cfg = from_mapping(CoordinatorConfig, CoordinatorConfig.migrate(saved))
    t = cfg.training
    # The clients' proximal weight as the run's strategy set it (0 unless the strategy asks for one).
    prox_mu = make_strategy(cfg.aggregation, cfg.strategies).configure_fit(0, TrainingPlan()).prox_mu
    stores: dict[str, ClientStore] = {}
    out: dict[int, tuple[int, float]] = {}
    warm = False
    try:
        for r in rounds:
            rnd = r["round"]
            if rnd < 1:
                continue
            spec, received = load_state_file(_model_before(run_dir, rnd))
            trained = sorted(r.get("personalisation_clients") or {})  # every accepted update has an entry
            total = 0.0
            for cid in trained:
                if cid not in stores:
                    stores[cid] = ClientStore(run_dir / "clients" / cid, HAPT_LABELS, owner=f"bench-{cid}")
                train = stores[cid].windows("train")
                weights = balanced_class_weights(train.y, spec.n_classes) if t.class_weights == "balanced" else None
                tc = TrainConfig(epochs=t.local_epochs, lr=t.lr, batch_size=t.batch_size,
                                 prox_mu=prox_mu,
                                 seed=derive_seed(cfg.seed, cid, rnd, 0))
                if not warm:  # PyTorch's first call pays one-off set-up; the run's clients paid it in round 0
                    train_local(spec, received, train, tc, make_loss(weights))
                    warm = True
                t0 = time.perf_counter()
                train_local(spec, received, train, tc, make_loss(weights), prox_ref=received if tc.prox_mu > 0 else None)
                total += time.perf_counter() - t0
            out[rnd] = (len(trained), total)
    finally:
        for s in stores.values():
            s.close()
    return out


def _model_before(run_dir: Path, rnd: int) -> Path:
    """The global model round ``rnd`` started from, or the nearest one kept (the coordinator prunes old rounds' models;
    SGD's arithmetic, hence its time, depends on the shapes, not on the values)."""
    kept = sorted((run_dir / "models").glob("r[0-9][0-9][0-9][0-9]/global.safetensors"))
    if not kept:
        raise FileNotFoundError(f"no global model kept under {run_dir / 'models'}")
    want = run_dir / "models" / f"r{rnd - 1:04d}" / "global.safetensors"
    return want if want in kept else min(kept, key=lambda p: abs(int(p.parent.name[1:]) - (rnd - 1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--conv-filters", type=int, default=196, help="F of the CNN (paper: 196)")
    ap.add_argument("--dense-units", type=int, default=1024, help="H of the CNN (paper: 1024)")
    ap.add_argument("--workers", type=int, default=0, help="worker processes (default: fedhar-simulate's, the cores)")
    ap.add_argument("--run-dir", type=Path, default=None, help="keep the run here (default: a temporary folder)")
    ap.add_argument("--reuse", type=Path, default=None, help="measure the baseline of this finished run; run nothing")
    args = ap.parse_args()
    if args.rounds < 2 and args.reuse is None:
        sys.exit("bench_round_overhead: --rounds must be >= 2 (round 0 is not measured)")
    tmp = None
    load = LoadLog()
    if args.reuse is not None:
        run_dir = args.reuse.resolve()
    else:
        run_dir = (args.run_dir or Path(tmp := tempfile.mkdtemp(prefix="bench-overhead-"))).resolve()
        with load.around("the federation (fedhar-simulate)"):
            run_simulation(args, run_dir)
    doc = json.loads((run_dir / "report.json").read_text())
    rounds = doc["rounds"]
    with load.around("the baseline (train_local calls)"):
        base = compute_baseline(run_dir, rounds)
    print(f"\nround overhead: {doc.get('clients')} HAPT clients, {doc.get('engine')}, "
          f"CNN F={rounds[0].get('conv_filters')} H={rounds[0].get('dense_units')}, E={doc['config']['training']['local_epochs']}; "
          f"peak memory {doc.get('peak_memory')}")
    print("baseline: the same clients' train_local calls of each round, summed, in one process, one thread, no broker\n")
    print(f"{'round':>5} {'updates':>8} {'wall s':>8} {'compute s':>10} {'ratio':>6}  note")
    wall_sum = comp_sum = all_wall = all_comp = 0.0
    for r in rounds:
        if r["round"] not in base:
            continue
        n, comp = base[r["round"]]
        evaluated = r.get("generalisation") is not None
        all_wall, all_comp = all_wall + r["seconds"], all_comp + comp
        if not evaluated:
            wall_sum, comp_sum = wall_sum + r["seconds"], comp_sum + comp
        note = "generalisation evaluated (every client's model on the union test set): not a quiet round" if evaluated else ""
        print(f"{r['round']:>5} {n:>8} {r['seconds']:>8.1f} {comp:>10.1f} {r['seconds'] / comp:>6.2f}  {note}")
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    if comp_sum <= 0:
        sys.exit("bench_round_overhead: no quiet round >= 1 with updates to measure (use --rounds 3 or more)")
    print(f"{'all':>5} {'':>8} {all_wall:>8.1f} {all_comp:>10.1f} {all_wall / all_comp:>6.2f}  every measured round")
    print(f"{'quiet':>5} {'':>8} {wall_sum:>8.1f} {comp_sum:>10.1f} {wall_sum / comp_sum:>6.2f}  rounds without the generalisation "
          f"evaluation (cores here: {os.cpu_count()})")
    for line in load.lines():
        print(line)
    print(f"round_wall_vs_compute={wall_sum / comp_sum:.2f}")


if __name__ == "__main__":
    main()
