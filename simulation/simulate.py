"""``fedhar-simulate``: the main job. A real federation on one machine.

A broker on a loopback port (embedded amqtt, Mosquitto, or ``--broker``), one edge client per
dataset subject replaying its recordings through the device pipeline (``--engine``), and the
coordinator, which also holds the union of the test splits (FedDist protocol); they talk only
over MQTT, as on devices.

SIGINT/SIGTERM stop the run at the coordinator's next safe point (forced after
:data:`FORCE_STOP_S`; a round is recorded in one SQLite transaction, so that is safe too);
clients are terminated, then killed after :data:`KILL_AFTER_S`; the exit status is 128 + the
signal and ``--resume`` continues. A second signal stops at once.

:func:`plan` turns the options into a :class:`SimulationPlan` and starts nothing; :func:`run`
starts each resource on one :class:`contextlib.ExitStack`.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import psutil

from coordinator.cli import add_federation_arguments, config_from_args
from coordinator.config import CoordinatorConfig
from coordinator.evaluation import Evaluator
from coordinator.record import RoundRecord, records
from coordinator.service import Coordinator, CoordinatorError, StateError
from coordinator.state import RunState
from har_io import exit_codes
from har_io.broker_config import BrokerConfig
from har_io.cli import HelpFormatter, add_broker_arguments, add_logging_arguments, broker_from_args, plain, setup_logging
from har_io.exit_codes import Exit
from har_io.memory import bound_mmap_threshold
from har_io.threads import join_started
from har_models.data.splits import DEFAULT_SPLIT, SplitSpec
from har_models.data.subjects import DEFAULT_HAPT, drop_empty_sources, subject_sources, union_test_set
from simulation.broker import LOCAL_BROKERS
from simulation.fleet import ENGINES, Fleet

log = logging.getLogger("fedhar.simulate")

PROJECT_ROOT = Path(__file__).resolve().parents[1]

FORCE_STOP_S = 3.0
"""Seconds after SIGINT/SIGTERM before the coordinator is interrupted wherever it is, if it reached no safe point."""
KILL_AFTER_S = 5.0
"""Seconds a client process has to exit after SIGTERM before it is killed, when the run was interrupted."""


class Interrupted(KeyboardInterrupt):
    """A stop signal (a KeyboardInterrupt, so every ``finally`` applies); ``signum`` gives exit status 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """SIGINT and SIGTERM handling of one simulation (a context manager; main thread only).

    The first signal sets :attr:`signum` and :meth:`check` (at safe points) raises
    :class:`Interrupted`; without a safe point within ``force_after_s`` s, or at a second signal,
    the main thread is interrupted where it is. After that, signals are only logged so the
    clean-up is not cut short.
    """

    def __init__(self, force_after_s: float = FORCE_STOP_S):
        self.force_after_s = force_after_s
        self.signum: int | None = None
        self.requested = threading.Event()
        """Set by the first signal (for waits that should end early, e.g. :meth:`Fleet.stop`'s grace)."""
        self._raised = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach only the main thread; a caller in another thread handles them itself
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
            self.requested.set()
        if self._raised:
            log.warning("received %s while stopping; the clean-up is bounded, please wait", signal.Signals(signum).name)
            return
        if first:
            log.warning(
                "received %s: stopping the simulation (the coordinator at its next safe point, then clients and broker)",
                signal.Signals(signum).name,
            )
            self._timer = threading.Timer(self.force_after_s, _thread.interrupt_main, args=(signum,))
            self._timer.daemon = True
            self._timer.start()
            return
        self._raise()  # a second signal, or no safe point in time

    def _raise(self) -> None:
        assert self.signum is not None
        self._raised = True
        if self._timer is not None:
            self._timer.cancel()
        raise Interrupted(self.signum)

    def hold(self) -> None:
        """From now on only record signals (for the clean-up, which must not be cut short)."""
        self._raised = True
        if self._timer is not None:
            self._timer.cancel()

    def check(self) -> None:
        """A safe point: raise :class:`Interrupted` if a stop signal came."""
        if self.signum is not None and not self._raised:
            self._raise()


@dataclass
class MemoryMonitor:
    """Samples the memory of a process (this one by default) and all its descendants (psutil), bytes.

    ``peak_rss`` sums RSS (shared pages counted per process); ``peak_pss`` sums PSS, the better
    figure. PSS is expensive to read, so it is read only when the summed RSS exceeds the peak PSS
    so far (PSS <= RSS: the peaks are the same). ``peak_procs``: most processes in one sample.
    """

    interval_s: float = 1.0
    pid: int | None = None
    peak_rss: int = 0
    peak_pss: int = 0
    peak_procs: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="memory-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        join_started(self._thread, 10)

    def _loop(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs, rss = [root, *root.children(recursive=True)], 0
            except psutil.NoSuchProcess:  # the root ended
                return
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, len(procs))
            if rss > self.peak_pss:  # only then can the summed PSS be a new peak
                self.peak_pss = max(self.peak_pss, self._pss(procs))
            self.samples += 1
            self._stop.wait(self.interval_s)

    @staticmethod
    def _pss(procs: list[psutil.Process]) -> int:
        """Summed PSS of ``procs`` (RSS where the platform has no PSS), bytes; gone processes count 0."""
        pss = 0
        for p in procs:
            try:
                mi = p.memory_full_info()
                pss += getattr(mi, "pss", mi.rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return pss

    def as_dict(self) -> dict[str, Any]:
        return {"peak_rss_mb": round(self.peak_rss / 2**20), "peak_pss_mb": round(self.peak_pss / 2**20), "samples": self.samples}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedhar-simulate",
        description=plain(__doc__.split("\n\n")[0]),
        epilog=exit_codes.epilog(exit_codes.SIMULATE),
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--dataset", choices=("hapt", "realworld"), default="hapt", help="dataset to replay (default hapt)")
    ap.add_argument("--data", type=Path, default=None, help="dataset location (default: the committed datasets/hapt)")
    ap.add_argument("--positions", default="", help="REALWORLD body positions to pool, comma-separated (default: all 7)")
    ap.add_argument(
        "--split",
        default=DEFAULT_SPLIT,
        help="every client's train/test split, also used for the union test set: blocks (leak-free contiguous blocks "
        "with a gap) or paper (FedDist, random, leaky), optionally +label_skew (each client keeps 2-3 classes) or +label_skew2 (exactly 2) "
        "(default %(default)s)",
    )
    ap.add_argument("--clients", type=int, default=0, help="use only the first N subjects (0 = all)")
    ap.add_argument("--federation", default=None, help="federation name (default: the run id)")
    ap.add_argument(
        "--credentials-dir",
        type=Path,
        default=None,
        help="with --broker: folder of <user>.password files (firmware_scripts/mosquitto_config.py writes credentials/); "
        "each client logs in as its id, the coordinator as --username (default coordinator)",
    )
    ap.add_argument("--run-dir", type=Path, default=None, help="run folder (default: runs/<run id>)")
    ap.add_argument(
        "--run-id", default=None, help="run identifier (default: <dataset>-<aggregation>-<timestamp>; with --resume: the run's own)"
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir after its last completed round (e.g. after Ctrl-C), with the same options",
    )
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default="workers",
        help="host the clients as virtual clients in --workers processes (each client keeps its own MQTT connection, "
        "id and state folder; they train one at a time per worker), as one process per client, or in --workers Ray actors "
        "spread over the Ray cluster at --ray-address (default workers)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (workers engine; default: cores) or Ray actors (ray engine; default: the cluster's CPUs "
        "divided by --threads-per-client)",
    )
    ap.add_argument(
        "--ray-address",
        default=None,
        help="ray engine: the Ray cluster, HOST:PORT as `ray start --head` prints it, or auto. Clients must reach the broker "
        "from every node: the embedded broker listens on loopback, so on a multi-machine cluster pass --broker HOST:PORT "
        "of a Mosquitto that all nodes reach",
    )
    ap.add_argument("--threads-per-client", type=int, default=1, help="PyTorch threads per client process or worker (default 1)")
    ap.add_argument("--json", action="store_true", help="print the final summary as JSON on stdout")
    add_logging_arguments(ap)
    add_broker_arguments(ap, default=None, broker_help="external broker HOST:PORT, e.g. a Mosquitto (default: start the embedded broker)")
    ap.add_argument(
        "--local-broker",
        choices=tuple(LOCAL_BROKERS),
        default="amqtt",
        help="without --broker: the broker started for the run on loopback, the embedded Python one (amqtt) or the "
        "installed Mosquitto (use it for hundreds of clients with the paper CNN: docs/benchmarks-server.md, section 4) "
        "(default %(default)s)",
    )
    add_federation_arguments(ap)
    return ap


class PlanError(Exception):
    """The options cannot make a run; ``status`` is the exit status (2 usage, 3 data, 6 run folder unusable)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SimulationPlan:
    """Everything a simulation needs, decided from its options before anything starts.

    Attributes
    ----------
    options : argparse.Namespace
        The parsed options, paths made absolute.
    sources : dict client id -> replay source text
        One client per subject with labelled windows, in subject order.
    settings : CoordinatorConfig
        The federation's settings; the run adds the broker, run folder and client count.
    split : SplitSpec
        Every client's train/test split, also the union test set's.
    federation : str
        Federation name (topics); the run id unless ``--federation``.
    """

    options: argparse.Namespace
    command: str
    dataset: str
    data: Path
    sources: dict[str, str]
    settings: CoordinatorConfig
    split: SplitSpec
    run_id: str
    run_dir: Path
    federation: str


def plan(args: argparse.Namespace, argv: list[str] | None = None) -> SimulationPlan:
    """Turn parsed options into a :class:`SimulationPlan`; starts nothing, writes nothing.

    Raises
    ------
    PlanError
        Status 2 for unusable options, 3 for a dataset without usable subjects, 6 for an earlier
        run whose ``state.sqlite`` is damaged.
    """
    data = args.data or (DEFAULT_HAPT if args.dataset == "hapt" else None)
    # Clients run in the project folder: every path they get must not depend on where this command was started.
    data = Path(data).resolve() if data is not None else None
    if data is None:
        raise PlanError(Exit.USAGE, "--dataset realworld needs --data PATH (the archive zip or its extracted folder)")
    try:
        sources = subject_sources(args.dataset, Path(data), args.positions)
    except (FileNotFoundError, ValueError) as exc:
        raise PlanError(Exit.DATA, str(exc)) from None
    if args.clients:
        sources = dict(list(sources.items())[: args.clients])
    sources, dropped = drop_empty_sources(sources)
    for cid, why in dropped.items():
        log.warning("client %s dropped at start: %s", cid, why)
    if not sources:
        raise PlanError(Exit.DATA, "no subject has labelled windows to train on; check --data and --positions")
    if args.credentials_dir is not None:
        args.credentials_dir = args.credentials_dir.resolve()
    for opt in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(args, opt):
            setattr(args, opt, str(Path(getattr(args, opt)).resolve()))
    try:
        settings = config_from_args(args, run_dir=Path("."))
        if not hasattr(args, "timing.deadline_margin"):
            # Virtual clients share a worker's training lock: a client's own measured time leaves out its wait behind the
            # others, so deadlines that follow it would cut rounds short under load and change the figures.
            settings = replace(settings, timing=replace(settings.timing, deadline_margin=0.0))
        split = SplitSpec.parse(args.split, seed=settings.evaluation.split_seed)
    except ValueError as exc:
        raise PlanError(Exit.USAGE, str(exc)) from None
    if args.resume:
        if args.run_dir is None or not (args.run_dir / "state.sqlite").is_file():
            raise PlanError(Exit.USAGE, "--resume needs --run-dir of an earlier run (a folder with state.sqlite)")
        try:
            earlier = RunState(args.run_dir)
            args.run_id = args.run_id or earlier.get("run_id")
            earlier.close()
        except sqlite3.DatabaseError as exc:  # coordinator.state.StateDamaged, with the file and the fix
            raise PlanError(Exit.FOLDER_UNUSABLE, str(exc)) from None
        settings = replace(settings, resume=True)
    run_id = args.run_id or f"{args.dataset}-{settings.aggregation}-{time.strftime('%Y%m%d-%H%M%S')}"
    return SimulationPlan(
        options=args,
        command="fedhar-simulate " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        dataset=args.dataset,
        data=data,
        sources=sources,
        settings=settings,
        split=split,
        run_id=run_id,
        run_dir=(args.run_dir or Path("runs") / run_id).resolve(),
        federation=args.federation or run_id,
    )


@dataclass
class _Outcome:
    """What the run step learns as it goes, for the clean-up and the final report."""

    ok: bool = False
    stopped_by: int | None = None
    coord: Coordinator | None = None
    header: dict[str, Any] = field(default_factory=dict)


def run(p: SimulationPlan, t0: float | None = None) -> int:
    """Run the planned simulation; return the exit status (as :func:`main`).

    Resources are stopped in reverse order whatever happens: clients first (a grace period after
    a clean end, none after a stop signal), then the broker and the monitor. ``t0``: when the
    command started (``time.monotonic()``).
    """
    t0 = time.monotonic() if t0 is None else t0
    bound_mmap_threshold()  # the coordinator's process: spilled and published models do not stay in its heap
    run_dir = p.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    out = _Outcome()
    monitor = MemoryMonitor()
    with contextlib.ExitStack() as stack:
        stops = stack.enter_context(StopSignals())
        file_log = logging.FileHandler(run_dir / "logs" / "coordinator.log")
        file_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(file_log)
        stack.callback(_detach_log, file_log)
        log.info(
            "run %s: %d clients (%s), %d rounds, %s; folder %s",
            p.run_id,
            len(p.sources),
            p.dataset,
            p.settings.rounds,
            p.settings.strategy_label,
            run_dir,
        )
        stack.callback(_say_how_it_stopped, out, stops, run_dir)  # once the clients, broker and monitor stopped
        monitor.start()
        stack.callback(monitor.stop)
        try:
            _federate(p, stack, stops, out)
            out.ok = True
        except StateError as exc:
            print(f"fedhar-simulate: {exc}", file=sys.stderr)
            return Exit.FOLDER_UNUSABLE
        except CoordinatorError as exc:
            print(f"fedhar-simulate: {exc}", file=sys.stderr)
            return Exit.FEDERATION_FAILED
        except ValueError as exc:
            print(f"fedhar-simulate: {exc}", file=sys.stderr)
            return Exit.USAGE
        except (RuntimeError, OSError) as exc:
            print(f"fedhar-simulate: {exc}", file=sys.stderr)
            return Exit.BROKER_REFUSED
        except KeyboardInterrupt as exc:
            out.stopped_by = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
        finally:
            stops.hold()  # from here on signals are only recorded: the stack's clean-up is bounded by its own timeouts
    if out.stopped_by is not None:
        return exit_codes.stopped_by(out.stopped_by)
    coord, header = out.coord, out.header
    assert coord is not None  # ok: the coordinator ran to its end
    wall = time.monotonic() - t0
    header.update({"wall_seconds": round(wall, 1), "peak_memory": monitor.as_dict()})
    doc = coord.write_final_report(header)
    summary = {
        "run_id": p.run_id,
        "run_dir": str(run_dir),
        "wall_seconds": round(wall, 1),
        "peak_memory": monitor.as_dict(),
        "final": doc.get("final"),
        "best": doc.get("best"),
        "bytes_per_round": [_traffic_of(r) for r in records(doc["rounds"])],
    }
    if p.options.json:
        print(json.dumps(summary, indent=2))
    else:
        fin = doc.get("final", {}).get("global", {})
        print(
            f"\nfedhar-simulate: {len(doc['rounds'])} rounds with {len(p.sources)} clients in {wall:.0f} s; "
            f"global accuracy {fin.get('accuracy', float('nan')):.3f}, macro-F1 {fin.get('macro_f1', float('nan')):.3f}; "
            f"peak memory {monitor.as_dict()['peak_pss_mb']} MB (PSS, all processes)\nreport: {run_dir / 'report.md'}"
        )
    return Exit.OK


def _federate(p: SimulationPlan, stack: contextlib.ExitStack, stops: StopSignals, out: _Outcome) -> None:
    """Start the broker and the clients (each on ``stack`` before it starts), then run the coordinator to its end."""
    args, run_dir, sources, settings = p.options, p.run_dir, p.sources, p.settings
    if args.credentials_dir is not None and not args.broker:
        raise ValueError("--credentials-dir needs --broker (the embedded broker has no accounts)")
    if args.broker:
        if args.credentials_dir is not None:
            args.username = args.username or "coordinator"
            args.password_file = args.credentials_dir / f"{args.username}.password"
        broker = broker_from_args(args)
    else:
        broker_ctx = LOCAL_BROKERS[args.local_broker](log_file=run_dir / "logs" / "broker.log")
        stack.callback(broker_ctx.stop)  # before it starts, so a broker whose start was interrupted is stopped too
        broker_ctx.__enter__()
        stops.check()
        # MQTT 3.1.1, which both speak (amqtt only that): the run is the same on either.
        broker = BrokerConfig(host=broker_ctx.host, port=broker_ctx.port, max_message_bytes=args.max_message_bytes,
                              mqtt_version="3.1.1")  # fmt: skip
    client_argv = {cid: _client_argv(p, cid, text, broker) for cid, text in sources.items()}
    workers = args.workers if args.workers is not None else (0 if args.engine == "ray" else os.cpu_count() or 1)
    fleet = Fleet(client_argv, args.engine, workers, args.threads_per_client, run_dir / "logs", PROJECT_ROOT,
                  ray_address=args.ray_address)  # fmt: skip

    def stop_fleet() -> None:
        clean = out.ok and stops.signum is None
        fleet.stop(grace_s=60.0 if clean else 0.0, kill_after_s=10.0 if clean else KILL_AFTER_S, hurry=stops.requested)

    stack.callback(stop_fleet)
    fleet.start()
    stops.check()
    log.info("building the union test set for evaluation")
    evaluator = Evaluator(union_test_set(sources, split=p.split), clients=sources)
    stops.check()
    cfg = replace(
        settings,
        run_dir=run_dir,
        broker=broker,
        federation=p.federation,
        run_id=p.run_id,
        min_clients=min(settings.min_clients, len(sources)),
        timing=replace(settings.timing, expected_clients=len(sources)),
    )
    header = out.header = {
        "dataset": f"{p.dataset} ({p.data})",
        "clients": len(sources),
        "command": p.command,
        "broker": "external " + args.broker if args.broker else f"embedded {args.local_broker} (MQTT 3.1.1, loopback)",
        "engine": fleet.describe(),
        "split": f"{p.split.text} (seed {p.split.seed}, test fraction {p.split.test_fraction})",
        "evaluation_set": f"union of the {len(sources)} subjects' test splits ({len(evaluator.union_test)} windows)",
    }
    if fleet.placement:
        header["ray_workers"] = fleet.placement
        header["given_up"] = fleet.given_up  # filled in as workers are given up (the report is rewritten each round)

    def clients_gone() -> tuple[set[str], str | None]:
        stops.check()  # called from the coordinator's wait loops: a safe point to stop at
        return fleet.gone()

    out.coord = Coordinator(cfg, evaluator, progress=not args.no_progress, report_header=header, clients_gone=clients_gone,
                            clients_restarted=fleet.restarted)  # fmt: skip
    out.coord.run()


def _client_argv(p: SimulationPlan, cid: str, source: str, broker: BrokerConfig) -> list[str]:
    """The ``fedhar-client`` options of client ``cid`` (replaying ``source``) in this run."""
    args = p.options
    cmd = [
        "--client-id",
        cid,
        "--broker",
        f"{broker.host}:{broker.port}",
        "--federation",
        p.federation,
        "--source",
        source,
        "--state-dir",
        str(p.run_dir / "clients" / cid),
        "--exit-after-run",
        p.run_id,
        "--max-message-bytes",
        str(args.max_message_bytes),
        "--split-seed",
        str(p.settings.evaluation.split_seed),
        "--mqtt-version",
        broker.mqtt_version,
        "--split",
        p.split.text,
    ]
    if args.credentials_dir is not None:  # per-device accounts, as written by firmware_scripts/mosquitto_config.py
        cmd += ["--username", cid, "--password-file", str(args.credentials_dir / f"{cid}.password")]
    for opt in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(args, opt):
            cmd += ["--" + opt.replace("_", "-"), getattr(args, opt)]
    return cmd


def _say_how_it_stopped(out: _Outcome, stops: StopSignals, run_dir: Path) -> None:
    """After the clean-up: a stop signal (also one during the clean-up of a finished run) is logged with how to resume."""
    if out.stopped_by is None and out.ok:
        out.stopped_by = stops.signum
    if out.stopped_by is not None:
        done = out.coord.state.last_completed_round() + 1 if out.coord is not None else 0
        log.warning(
            "fedhar-simulate: stopped by %s with %d round(s) completed; clients and broker stopped; "
            "continue with the same options plus --resume --run-dir %s (exit %d)",
            signal.Signals(out.stopped_by).name, done, run_dir, 128 + out.stopped_by,
        )  # fmt: skip


def _traffic_of(r: RoundRecord) -> dict[str, int | None]:
    t = r.traffic
    return {"round": r.round, "up": t.bytes_up if t else None, "down": t.bytes_down if t else None}


def _detach_log(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-simulate``; returns the exit status (:mod:`har_io.exit_codes`, the table of every code).

    0 ok, 2 usage, 3 data, 4 broker, 5 federation failed, 6 run folder unusable, 128 + signal number when stopped.
    """
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    t0 = time.monotonic()
    try:
        p = plan(args, argv)
    except PlanError as exc:
        print(f"fedhar-simulate: {exc}", file=sys.stderr)
        return exc.status
    return run(p, t0)


if __name__ == "__main__":
    sys.exit(main())
