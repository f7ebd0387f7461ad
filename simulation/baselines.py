"""Centralised and local-only baselines of the FedDist evaluation (no federation, no MQTT).

* **centralised**: one CNN trained on the union of all subjects' training windows, then
  measured like a federation: global = on the union test set; personalisation = on each
  subject's test set (mean over subjects); generalisation = global (one model).
* **local-only**: every subject trains its own CNN on its own training windows only;
  personalisation = each model on its own test set, generalisation = each on the union
  test set (means over subjects); there is no global model.

Ek et al. (PerCom 2021) report both as bounds (algorithms.md section 3.8: their exact
protocols are not in the public code). Both use the same windows, split, CNN, loss and
optimiser as the federated runs; the number of epochs is a setting (by default the
same number of passes over the data as the federated run: rounds x local epochs).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from coordinator.config import CoordinatorConfig
from coordinator.report import write_report
from har_io.cli import plain
from har_io.exit_codes import Exit
from har_models.data.splits import DEFAULT_SPLIT, DEFAULT_SPLIT_SEED, SplitSpec
from har_models.data.subjects import DEFAULT_HAPT, load_windows, parse_source, split, subject_sources
from har_models.data.windowing import ChannelStats, WindowSet
from har_models.nn.metrics import mean_over_clients, summarise
from har_models.nn.model import ArchSpec, init_state
from har_models.nn.training import TrainConfig, balanced_class_weights, evaluate, make_loss, train_local
from har_models.settings import LocalTraining

log = logging.getLogger("fedhar.baselines")


def load_subjects(
    sources: dict[str, str], seed: int = DEFAULT_SPLIT_SEED, *, spec: SplitSpec | None = None
) -> dict[str, tuple[WindowSet, WindowSet]]:
    """``client id -> (train, test)`` for every subject, split as the clients split (``spec``, else the paper's with ``seed``)."""
    if spec is None:
        return {cid: split(load_windows(parse_source(text)), seed) for cid, text in sources.items()}
    return {cid: parse_source(text, spec).train_test() for cid, text in sources.items()}


def _spec(subjects: dict[str, tuple[WindowSet, WindowSet]], conv_filters: int, dense_units: int) -> ArchSpec:
    trains = [tr for tr, _ in subjects.values() if len(tr)]
    stats = ChannelStats.of(trains[0].x)
    for tr in trains[1:]:
        stats = stats + ChannelStats.of(tr.x)
    mean, std = stats.mean_std()
    return ArchSpec(n_classes=len(trains[0].labels), conv_filters=conv_filters, dense_units=dense_units, input_mean=mean, input_std=std)


def _row(round_: int, global_: Any, personalisation: Any, generalisation: Any, spec: ArchSpec, n: int, t0: float) -> dict[str, Any]:
    """One summary row, with the keys of the federation's round rows; ``seconds`` counted from ``t0``."""
    return {"round": round_, "global": global_, "personalisation": personalisation, "generalisation": generalisation,
            "updates": n, "selected": n, "seconds": time.monotonic() - t0, "conv_filters": spec.conv_filters,
            "dense_units": spec.dense_units, "arch_version": 0}  # fmt: skip


def centralised(
    subjects: dict[str, tuple[WindowSet, WindowSet]],
    epochs: int,
    lr: float = LocalTraining.lr,
    batch_size: int = LocalTraining.batch_size,
    seed: int = 1,
    conv_filters: int = ArchSpec.conv_filters,
    dense_units: int = ArchSpec.dense_units,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train one model on all training windows; one summary row per epoch (measured as a round)."""
    spec, labels = _spec(subjects, conv_filters, dense_units), next(iter(subjects.values()))[0].labels
    train = WindowSet.concat([tr for tr, _ in subjects.values()], labels)
    union = WindowSet.concat([te for _, te in subjects.values()], labels)
    loss = make_loss(balanced_class_weights(train.y, spec.n_classes))
    state = init_state(spec, seed)
    rows = []
    for e in tqdm(range(epochs), desc="centralised", unit="epoch", disable=not progress):
        t0 = time.monotonic()
        state = train_local(spec, state, train, TrainConfig(1, lr, batch_size, seed=seed * 1000 + e), loss).state
        per = {cid: evaluate(spec, state, te) for cid, (_, te) in subjects.items()}
        g = summarise(evaluate(spec, state, union))
        rows.append(_row(e, g, mean_over_clients(list(per.values())), g, spec, len(subjects), t0))
        log.info("centralised epoch %d: union acc %.3f F1 %.3f", e, g["accuracy"], g["macro_f1"])
    return rows


def local_only(
    subjects: dict[str, tuple[WindowSet, WindowSet]],
    epochs: int,
    lr: float = LocalTraining.lr,
    batch_size: int = LocalTraining.batch_size,
    seed: int = 1,
    conv_filters: int = ArchSpec.conv_filters,
    dense_units: int = ArchSpec.dense_units,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Each subject trains alone for ``epochs``; one summary row (personalisation and generalisation)."""
    spec, labels = _spec(subjects, conv_filters, dense_units), next(iter(subjects.values()))[0].labels
    union = WindowSet.concat([te for _, te in subjects.values()], labels)
    own, gen = {}, {}
    t0 = time.monotonic()
    for cid, (tr, te) in tqdm(subjects.items(), desc="local-only", unit="client", disable=not progress):
        loss = make_loss(balanced_class_weights(tr.y, spec.n_classes))
        state = train_local(spec, init_state(spec, seed), tr, TrainConfig(epochs, lr, batch_size, seed=seed), loss).state
        own[cid] = evaluate(spec, state, te)
        gen[cid] = evaluate(spec, state, union)
    return [_row(epochs - 1, None, mean_over_clients(list(own.values())), mean_over_clients(list(gen.values())), spec, len(subjects), t0)]


def main(argv: list[str] | None = None) -> int:
    """``fedhar-baseline``: centralised or local-only training with the federation's data and model."""
    ap = argparse.ArgumentParser(prog="fedhar-baseline", description=plain(__doc__.split("\n\n")[0]))
    ap.add_argument("mode", choices=("centralised", "local-only"))
    ap.add_argument("--dataset", choices=("hapt", "realworld"), default="hapt")
    ap.add_argument("--data", type=Path, default=None, help="dataset location (default: the committed datasets/hapt)")
    ap.add_argument("--clients", type=int, default=0, help="use only the first N subjects (0 = all)")
    defaults = CoordinatorConfig(run_dir=Path("."))
    ap.add_argument(
        "--epochs",
        type=int,
        default=defaults.rounds * defaults.training.local_epochs,
        help="passes over the training data (default %(default)s: the federation's rounds x local epochs)",
    )
    ap.add_argument("--lr", type=float, default=defaults.training.lr, help="SGD learning rate (default %(default)s)")
    ap.add_argument("--batch-size", type=int, default=defaults.training.batch_size, help="(default %(default)s)")
    ap.add_argument("--seed", type=int, default=defaults.seed, help="training seed (default %(default)s)")
    ap.add_argument(
        "--split-seed", type=int, default=defaults.evaluation.split_seed, help="80/20 split seed, as the clients' (default %(default)s)"
    )
    ap.add_argument(
        "--split", default=DEFAULT_SPLIT, help="paper | blocks, optionally +label_skew[2], as the clients' (default %(default)s)"
    )
    ap.add_argument("--conv-filters", type=int, default=defaults.model.conv_filters, help="(default %(default)s)")
    ap.add_argument("--dense-units", type=int, default=defaults.model.dense_units, help="(default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="PyTorch threads (0 = default)")
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (for logs: the results are printed either way)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    data = args.data or DEFAULT_HAPT
    try:
        sources = subject_sources(args.dataset, Path(data))
    except (FileNotFoundError, ValueError) as exc:
        print(f"fedhar-baseline: {exc}", file=sys.stderr)
        return Exit.DATA
    if args.clients:
        sources = dict(list(sources.items())[: args.clients])
    try:
        spec = SplitSpec.parse(args.split, seed=args.split_seed)
    except ValueError as exc:
        print(f"fedhar-baseline: {exc}", file=sys.stderr)
        return Exit.USAGE
    subjects = load_subjects(sources, spec=spec)
    fn = centralised if args.mode == "centralised" else local_only
    t0 = time.monotonic()
    rows = fn(subjects, args.epochs, args.lr, args.batch_size, args.seed, args.conv_filters, args.dense_units, not args.no_progress)
    run_dir = args.run_dir or Path("runs") / f"{args.dataset}-{args.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    header = {
        "run_id": run_dir.name,
        "dataset": f"{args.dataset} ({data})",
        "clients": len(subjects),
        "strategy": args.mode,
        "seed": args.seed,
        "split": spec.text,
        "wall_seconds": round(time.monotonic() - t0, 1),
        "command": "fedhar-baseline " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    doc = write_report(run_dir, header, rows)
    print(json.dumps({"run_dir": str(run_dir), "final": doc.get("final")}, indent=2))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
