"""``fedhar-client``: run one edge client (a device, or a replayed dataset subject)."""

from __future__ import annotations

import argparse
import logging
import signal
import ssl
import sys
import threading
from pathlib import Path

from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.sources import ingest_source
from edge_client.store import ClientStore
from har_io.cli import HelpFormatter, add_broker_arguments, broker_from_args, setup_logging
from har_models.subjects import parse_source

log = logging.getLogger("fedhar.client")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedhar-client", description="fedhar edge client: local HAR training in a federation over MQTT", formatter_class=HelpFormatter
    )
    ap.add_argument("--client-id", required=True, help="stable device id (letters, digits, _ . -)")
    ap.add_argument("--federation", default="default", help="federation name, topic prefix fedhar/v1/<name> (default %(default)s)")
    ap.add_argument(
        "--source",
        required=True,
        help="labelled recordings to replay: hapt:PATH/userXX.npz or realworld:ROOT:probandN[:position,...]",
    )
    ap.add_argument("--state-dir", type=Path, required=True, help="folder for windows, local model and round state (survives restarts)")
    ap.add_argument("--split-seed", type=int, default=1, help="seed of the stratified 80/20 train/test split (default %(default)s)")
    ap.add_argument(
        "--replay-speed",
        type=float,
        default=None,
        help="replay the recordings paced at this multiple of real time (1 = 50 Hz wall clock) before joining; "
        "default: as fast as possible",
    )
    ap.add_argument("--threads", type=int, default=0, help="PyTorch CPU threads (0 = PyTorch default)")
    ap.add_argument("--exit-after-run", default=None, help="exit once the coordinator announces this run id finished")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this many seconds (default: run until stopped)")
    ap.add_argument("--log-level", default="INFO")
    add_broker_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-client``; returns the exit status: 0 ok, 2 usage, 3 data, 4 the broker
    refused the login or TLS failed, 5 another process uses this client id (4 and 5 are not retried)."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    try:
        broker = broker_from_args(args)
        cfg = ClientConfig(client_id=args.client_id, broker=broker, federation=args.federation, exit_after_run=args.exit_after_run)
        source = parse_source(args.source)
    except (ValueError, OSError) as exc:
        print(f"fedhar-client: {exc}", file=sys.stderr)
        return 2
    try:
        store = ClientStore(args.state_dir, source.labels)
        n_train, n_test = ingest_source(store, source, split_seed=args.split_seed, speed=args.replay_speed)
    except (ValueError, OSError) as exc:
        print(f"fedhar-client: cannot prepare the local data: {exc}", file=sys.stderr)
        return 3
    log.info("[%s] %d training and %d test windows from %s", args.client_id, n_train, n_test, args.source)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        try:
            agent = EdgeAgent(cfg, store)
        except (ssl.SSLError, OSError) as exc:  # unreadable certificate or key
            print(f"fedhar-client: cannot set up TLS: {exc}", file=sys.stderr)
            return 2
        return agent.run(stop, max_seconds=args.max_seconds)
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
