"""``fedhar-coordinator``: run the coordinator of a federation against a broker (home server)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from coordinator.config import AGGREGATIONS, CLIENT_INITS, GROWTH_MODES, GROWTHS, CoordinatorConfig
from coordinator.service import Coordinator, CoordinatorError
from har_io.cli import HelpFormatter, add_broker_arguments, broker_from_args, setup_logging

log = logging.getLogger("fedhar.coordinator")


def add_federation_arguments(ap: argparse.ArgumentParser) -> None:
    """Options shared by ``fedhar-coordinator`` and ``fedhar-simulate`` (same names as :class:`CoordinatorConfig`)."""
    g = ap.add_argument_group("federation")
    g.add_argument("--rounds", type=int, default=10, help="communication rounds R")
    g.add_argument("--local-epochs", type=int, default=1, help="local epochs E per round")
    g.add_argument("--lr", type=float, default=0.01, help="local SGD learning rate")
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--class-weights", choices=("balanced", "none"), default="balanced")
    g.add_argument("--aggregation", choices=AGGREGATIONS, default="fedavg")
    g.add_argument("--growth", choices=GROWTHS, default="none")
    g.add_argument("--client-init", choices=CLIENT_INITS, default="overwrite")
    g.add_argument("--prox-mu", type=float, default=0.01, help="FedProx mu")
    g.add_argument("--top-k", type=int, default=5, help="FedDWA K")
    g.add_argument(
        "--feddist-mode",
        choices=GROWTH_MODES,
        default="auto",
        help="outgoing weights of new units: copied + intermediate rounds (paper) or zero (function_preserving); "
        "auto = paper for plain FedDist, function_preserving when combined with FedDWA/FedPer/ALA",
    )
    g.add_argument("--feddist-max-width", type=float, default=2.0, help="cap on each layer's width, as a multiple of round 0's")
    g.add_argument("--feddist-k0", type=float, default=3.0, help="FedDist k_0 (k_r = k_0 + delta * floor(r / period))")
    g.add_argument("--feddist-delta", type=float, default=0.25)
    g.add_argument("--feddist-period", type=int, default=5)
    g.add_argument("--ala", default="{}", help='FedALA settings as JSON, e.g. \'{"eta": 1.0, "rand_percent": 80}\'')
    g.add_argument("--conv-filters", type=int, default=196, help="initial conv filters F")
    g.add_argument("--dense-units", type=int, default=1024, help="initial hidden units H")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--fraction", type=float, default=1.0, help="share of eligible clients selected per round")
    g.add_argument("--round-timeout", type=float, default=900.0, help="seconds before a round closes without the missing updates")
    g.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for clients before the first round")
    g.add_argument("--generalisation-every", type=int, default=5, help="rounds between generalisation evaluations (0 = last only)")


def config_from_args(args: argparse.Namespace, **fields: Any) -> CoordinatorConfig:
    """Build a :class:`CoordinatorConfig` from parsed options plus explicit ``fields``.

    Raises
    ------
    ValueError
        If an option is out of range or ``--ala`` is not a JSON object.
    """
    try:
        ala = json.loads(args.ala)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--ala is not valid JSON: {exc}") from None
    if not isinstance(ala, dict):
        raise ValueError("--ala must be a JSON object")
    return CoordinatorConfig(
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        class_weights=args.class_weights,
        aggregation=args.aggregation,
        growth=args.growth,
        client_init=args.client_init,
        prox_mu=args.prox_mu,
        top_k=args.top_k,
        feddist_mode=args.feddist_mode,
        feddist_k0=args.feddist_k0,
        feddist_delta=args.feddist_delta,
        feddist_period=args.feddist_period,
        feddist_max_width_factor=args.feddist_max_width,
        ala=ala,
        conv_filters=args.conv_filters,
        dense_units=args.dense_units,
        seed=args.seed,
        fraction=args.fraction,
        round_timeout_s=args.round_timeout,
        start_timeout_s=args.start_timeout,
        generalisation_every=args.generalisation_every,
        **fields,
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedhar-coordinator",
        description="fedhar coordinator: runs federated rounds over MQTT",
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--federation", default="default", help="topic namespace fedhar/v1/<federation>")
    ap.add_argument("--run-id", default=None, help="run identifier (default: <aggregation>-<timestamp>)")
    ap.add_argument("--run-dir", type=Path, default=None, help="run folder (default: runs/<run id>)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --run-dir after its last completed round")
    ap.add_argument("--min-clients", type=int, default=2, help="fewest clients a round may start with")
    ap.add_argument("--expected-clients", type=int, default=None, help="start as soon as this many clients are online")
    ap.add_argument(
        "--eval-data",
        default=None,
        help="research harness: dataset (hapt:FOLDER or realworld:PATH) whose subjects' test splits form the union "
        "test set for the global and generalisation measures",
    )
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--log-level", default="INFO")
    add_broker_arguments(ap)
    add_federation_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-coordinator``: 0 ok, 2 usage, 3 data, 4 broker, 5 federation failed."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    run_id = args.run_id or f"{args.aggregation}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume and args.run_dir is None:
        print("fedhar-coordinator: --resume needs --run-dir (and the same --run-id)", file=sys.stderr)
        return 2
    try:
        broker = broker_from_args(args)
        cfg = config_from_args(
            args,
            run_dir=args.run_dir or Path("runs") / run_id,
            broker=broker,
            federation=args.federation,
            run_id=run_id,
            min_clients=args.min_clients,
            expected_clients=args.expected_clients,
            resume=args.resume,
        )
    except (ValueError, OSError) as exc:
        print(f"fedhar-coordinator: {exc}", file=sys.stderr)
        return 2
    evaluator = None
    if args.eval_data:
        from coordinator.evaluation import Evaluator
        from har_models.subjects import subject_sources, union_test_set

        kind, _, path = args.eval_data.partition(":")
        try:
            evaluator = Evaluator(union_test_set(subject_sources(kind, Path(path)), seed=1))
        except (ValueError, OSError) as exc:
            print(f"fedhar-coordinator: --eval-data {args.eval_data}: {exc}", file=sys.stderr)
            return 3
    try:
        Coordinator(
            cfg,
            evaluator,
            progress=not args.no_progress,
            report_header={"command": "fedhar-coordinator " + " ".join(argv if argv is not None else sys.argv[1:])},
        ).run()
    except CoordinatorError as exc:
        print(f"fedhar-coordinator: {exc}", file=sys.stderr)
        return 5
    except KeyboardInterrupt:
        print(f"fedhar-coordinator: interrupted; completed rounds are kept in {cfg.run_dir} (resume with --resume)", file=sys.stderr)
        return 130
    print(f"fedhar-coordinator: run {run_id} finished; report: {cfg.run_dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
