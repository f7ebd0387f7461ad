"""Host several edge clients in one process: the simulation's virtual clients.

Each hosted client is exactly a ``fedhar-client`` (the same options, its own MQTT
connection, client id, state folder and random generators) running in its own thread;
they share one training lock, so the worker trains one client at a time and holds only
that client's training in memory. Under the lock each training sees the same PyTorch
thread count and global RNG it would see alone, so a federation run in workers gives
the same figures as one process per client, to the last digit. They also share a
:class:`~har_models.wire.chunking.SharedTransfers`: every hosted client receives the global
model over its own connection, and the worker holds one copy of it, not one per client.

Usage (``fedhar-simulate --engine workers`` starts these)::

    python -m simulation.worker --clients FILE --status-dir DIR --threads 1

where FILE holds a JSON list of ``fedhar-client`` argument lists. When a hosted client
stops, its exit status is written to ``DIR/<client id>.exit`` so the launcher knows it is
gone (a client that cannot train exits 3 there, like the command).

:class:`HostedWorker` is the same host as an object, for ``fedhar-simulate --engine ray``,
which runs one per Ray actor and asks it which clients stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from edge_client.cli import PreparedClient, prepare, serve
from har_io.cli import add_logging_arguments, setup_logging
from har_io.exit_codes import Exit
from har_models.files import atomic_write_bytes
from har_models.wire.chunking import SharedTransfers

log = logging.getLogger("fedhar.worker")

#: How long (seconds) a thread may hold the interpreter lock while another waits for it.
#: Python's default is 5 ms. A worker trains one client while the network threads of the
#: others receive and send model chunks; the training thread gives the lock up around every
#: PyTorch operation and, at 5 ms, waits up to that long to get it back each time. Measured
#: here (paper CNN, one client's local epoch of 234 windows, one PyTorch thread): 0.29 s
#: alone, 1.84 s beside one thread running Python code without pause at 5 ms, 0.44 s at
#: 0.5 ms, 0.34 s at 0.2 ms.
SWITCH_INTERVAL_S = 0.0002


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


def host(
    client_argvs: list[list[str]],
    stop: threading.Event,
    status_dir: Path | None = None,
    on_exit: Callable[[str, int], None] | None = None,
) -> int:
    """Prepare and serve every client of ``client_argvs`` in threads until all stopped; 0 if all ended normally.

    Parameters
    ----------
    client_argvs : list of list of str
        One ``fedhar-client`` argument list per hosted client.
    stop : threading.Event
        Set to stop every client (SIGTERM/SIGINT do).
    status_dir : Path, optional
        Where each client's exit status is written as ``<client id>.exit``.
    on_exit : callable (client id, exit status), optional
        Called as each client stops (the Ray engine reports exits this way: its nodes share no folder).
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    lock = threading.Lock()
    shared = SharedTransfers()  # the global model all hosted clients receive is held once
    statuses: dict[int, int] = {}
    threads = []

    def run_one(k: int, argv: list[str]) -> None:
        status = 1
        try:
            with lock:  # ingesting also allocates: one client at a time
                client: PreparedClient | int = prepare(argv)
            status = client if isinstance(client, int) else serve(client, stop, train_lock=lock, shared_transfers=shared)
        except Exception:
            log.exception("hosted client %s failed", _client_id(argv, k))
        finally:
            statuses[k] = status
            _record_exit(status_dir, _client_id(argv, k), status)
            if on_exit is not None:
                on_exit(_client_id(argv, k), status)

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


class HostedWorker:
    """One worker as a long-lived object: what a Ray actor of ``fedhar-simulate --engine ray`` runs.

    The same :func:`host` as the worker process, driven by method calls instead of a
    command line, so the launcher can ask a worker on another machine which clients
    stopped (there is no shared status folder) and stop it. :meth:`run` blocks for the
    whole run; the other methods are called from other threads meanwhile (the actor is
    threaded), so they only touch a lock-guarded dict and an event.

    Parameters
    ----------
    name : str
        The worker's name (``worker-<k>``), used in its log.
    threads : int
        PyTorch CPU threads of this process (as ``--threads``); 0 leaves PyTorch's default.
    """

    def __init__(self, name: str, threads: int) -> None:
        self.name = name
        self._stop = threading.Event()
        self._exits: dict[str, int] = {}
        self._lock = threading.Lock()
        if threads > 0:
            import torch

            torch.set_num_threads(threads)

    def _on_exit(self, cid: str, status: int) -> None:
        with self._lock:
            self._exits[cid] = status

    def run(self, client_argvs: list[list[str]], log_file: str, log_level: str = "INFO") -> int:
        """Host ``client_argvs`` (one ``fedhar-client`` argument list each) until all stopped; :func:`host`'s status.

        ``log_file`` is created on the node this runs on (its folder too): the worker's and
        its clients' log lines go there.
        """
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(log_level)
        try:
            log.info("%s hosting %d client(s)", self.name, len(client_argvs))
            return host(client_argvs, self._stop, on_exit=self._on_exit)
        finally:
            root.removeHandler(handler)
            handler.close()

    def exited(self) -> dict[str, int]:
        """Exit status of each hosted client that stopped so far, by client id."""
        with self._lock:
            return dict(self._exits)

    def stop(self) -> None:
        """Ask every hosted client to stop (what SIGTERM does to a worker process)."""
        self._stop.set()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m simulation.worker --clients FILE [--threads N]``."""
    ap = argparse.ArgumentParser(prog="fedhar-worker", description="host several fedhar clients in one process")
    ap.add_argument("--clients", type=Path, required=True, help="JSON file: a list of fedhar-client argument lists")
    ap.add_argument("--status-dir", type=Path, default=None, help="folder for each client's exit status (<client id>.exit)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads for the worker (default 1)")
    add_logging_arguments(ap, progress=False)
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    try:
        client_argvs = json.loads(args.clients.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"fedhar-worker: cannot read {args.clients}: {exc}", file=sys.stderr)
        return Exit.USAGE
    if not isinstance(client_argvs, list) or not all(isinstance(a, list) and all(isinstance(x, str) for x in a) for a in client_argvs):
        print(f"fedhar-worker: {args.clients} must hold a JSON list of argument lists", file=sys.stderr)
        return Exit.USAGE
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return host(client_argvs, stop, args.status_dir)


if __name__ == "__main__":
    sys.exit(main())
