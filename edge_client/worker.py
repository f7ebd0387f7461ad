"""Host several edge clients in one process: the simulation's virtual clients.

Each hosted client is exactly a ``fedhar-client`` (the same options, its own MQTT
connection, client id, state folder and random generators) running in its own thread;
they share one training lock, so the worker trains one client at a time and holds only
that client's training in memory. Under the lock each training sees the same PyTorch
thread count and global RNG it would see alone, so a federation run in workers gives
the same figures as one process per client, to the last digit.

Usage (``fedhar-simulate --engine workers`` starts these)::

    python -m edge_client.worker --clients FILE --status-dir DIR --threads 1

where FILE holds a JSON list of ``fedhar-client`` argument lists. When a hosted client
stops, its exit status is written to ``DIR/<client id>.exit`` so the launcher knows it is
gone (a client that cannot train exits 3 there, like the command).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from edge_client.cli import PreparedClient, prepare, serve
from har_io.cli import setup_logging
from har_models.files import atomic_write_bytes

log = logging.getLogger("fedhar.worker")

def _client_id(argv: list[str], k: int) -> str:
    try:
        return argv[argv.index("--client-id") + 1]
    except (ValueError, IndexError):
        return f"client-{k}"


def _record_exit(status_dir: Path | None, cid: str, status: int) -> None:
    if status_dir is not None:
        try:
            atomic_write_bytes(status_dir / f"{cid}.exit", f"{status}\n")
        except OSError as exc:  # the launcher then learns it from the worker's own exit
            log.warning("cannot record the exit status of %s in %s: %s", cid, status_dir, exc)


def host(client_argvs: list[list[str]], stop: threading.Event, status_dir: Path | None = None) -> int:
    """Prepare and serve every client of ``client_argvs`` in threads until all stopped; 0 if all ended normally.

    Parameters
    ----------
    client_argvs : list of list of str
        One ``fedhar-client`` argument list per hosted client.
    stop : threading.Event
        Set to stop every client (SIGTERM/SIGINT do).
    status_dir : Path, optional
        Where each client's exit status is written as ``<client id>.exit``.
    """
    lock = threading.Lock()
    statuses: dict[int, int] = {}
    threads = []

    def run_one(k: int, argv: list[str]) -> None:
        status = 1
        try:
            with lock:  # ingesting also allocates: one client at a time
                client: PreparedClient | int = prepare(argv)
            status = client if isinstance(client, int) else serve(client, stop, train_lock=lock)
        except Exception:
            log.exception("hosted client %s failed", _client_id(argv, k))
        finally:
            statuses[k] = status
            _record_exit(status_dir, _client_id(argv, k), status)

    for k, argv in enumerate(client_argvs):
        t = threading.Thread(target=run_one, args=(k, argv), name=f"client-{k}", daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    bad = {k: s for k, s in statuses.items() if s != 0}
    if bad:
        log.warning("%d of %d hosted client(s) ended with a non-zero status", len(bad), len(client_argvs))
    return 0 if not bad else max(bad.values())


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m edge_client.worker --clients FILE [--threads N]``."""
    ap = argparse.ArgumentParser(prog="fedhar-worker", description="host several fedhar clients in one process")
    ap.add_argument("--clients", type=Path, required=True, help="JSON file: a list of fedhar-client argument lists")
    ap.add_argument("--status-dir", type=Path, default=None, help="folder for each client's exit status (<client id>.exit)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads for the worker (default 1)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    try:
        client_argvs = json.loads(args.clients.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"fedhar-worker: cannot read {args.clients}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(client_argvs, list) or not all(isinstance(a, list) and all(isinstance(x, str) for x in a) for a in client_argvs):
        print(f"fedhar-worker: {args.clients} must hold a JSON list of argument lists", file=sys.stderr)
        return 2
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return host(client_argvs, stop, args.status_dir)


if __name__ == "__main__":
    sys.exit(main())
