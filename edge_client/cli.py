"""``fedhar-client``: run one edge client (a device, or a replayed dataset subject)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from edge_client.agent import BACKENDS, ClientConfig, EdgeAgent
from edge_client.backends.factory import choose_backend
from edge_client.freshness import SensingHealthMeter
from edge_client.power import battery_percent_linux, charging_linux
from edge_client.pte_fetch import PROGRAM_MODES
from edge_client.recorder import RECORDED_LOG, recorded_labels, sync_to_store
from edge_client.sent_log import SENT_KEY
from edge_client.server_state import follow_server
from edge_client.sources import ingest_source
from edge_client.store import ClientStore, StateFolderUnusable, StoreInUseError
from edge_client.window_log import WindowLog
from har_io import exit_codes
from har_io.blob_http import BlobCache
from har_io.broker_config import BrokerConfig
from har_io.cli import HelpFormatter, add_broker_arguments, add_logging_arguments, broker_from_args, setup_logging
from har_io.enrolment import EnrolmentBundle, EnrolmentRefused, read_bundle
from har_io.exit_codes import Exit, fail
from har_io.install_hints import torch_hint
from har_io.mqtt_link import BrokerRefused
from har_io.refusal_words import bundle_login_refused
from har_models.data.splits import DEFAULT_SPLIT, DEFAULT_SPLIT_SEED, SplitSpec
from har_models.data.subjects import parse_source
from har_models.wire.chunking import SharedTransfers

log = logging.getLogger("fedhar.client")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedhar-client",
        description="fedhar edge client: local HAR training in a federation over MQTT",
        epilog=exit_codes.epilog(exit_codes.CLIENT),
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--client-id", default=None, help="stable device id (letters, digits, _ . -); required unless --enrolment gives it")
    ap.add_argument(
        "--federation", default=None, help="federation name, topic prefix fedhar/v1/<name> (default: the bundle's, else default)"
    )
    ap.add_argument(
        "--enrolment",
        type=Path,
        default=None,
        metavar="FILE",
        help="enrolment bundle (fedhar-coordinator enrol NAME writes it): broker, TLS CA, federation, client id and "
        "password in one file, so no other broker option is needed; an option that contradicts it is refused",
    )
    ap.add_argument(
        "--source",
        required=True,
        help="labelled recordings to replay: hapt:PATH/userXX.npz or realworld:ROOT:probandN[:position,...]; "
        "or recorded:LABELSET for the windows recorded on this device (fedhar-record, fedhar-app) in --state-dir",
    )
    ap.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="folder for windows, local model and round state (survives restarts); one client at a time may use it "
        "(default: $XDG_DATA_HOME/fedhar/<client id>, or ~/.local/share/fedhar/<client id>)",
    )
    ap.add_argument(
        "--split-seed",
        type=int,
        default=DEFAULT_SPLIT_SEED,
        help="seed of the stratified 80/20 train/test split; the coordinator must use the same (default %(default)s)",
    )
    ap.add_argument(
        "--split",
        default=DEFAULT_SPLIT,
        help="train/test split of a replayed source: blocks (leak-free) or paper (FedDist, random, leaky), "
        "optionally +label_skew (keep 2-3 classes) or +label_skew2 (exactly 2); the coordinator must use the same (default %(default)s)",
    )
    ap.add_argument(
        "--replay-speed",
        type=float,
        default=None,
        help="replay the recordings paced at this multiple of real time (1 = 50 Hz wall clock) before joining; "
        "default: as fast as possible",
    )
    ap.add_argument("--threads", type=int, default=0, help="PyTorch CPU threads of the torch backend (0 = PyTorch default)")
    ap.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="training backend: PyTorch eager, ExecuTorch programs, or the numpy reference (no PyTorch needed); "
        "default: the best installed, in that order (the start-up log names it)",
    )
    ap.add_argument("--program-cache", default=None, help="folder for exported ExecuTorch programs (default: the backend's own)")
    ap.add_argument(
        "--programs",
        choices=PROGRAM_MODES,
        default="auto",
        help="ExecuTorch programs: export them here, fetch them from the coordinator (into --program-cache, else "
        "<state-dir>/programs), or auto: fetch where PyTorch is missing; executorch-android always fetches (default %(default)s)",
    )
    ap.add_argument("--exit-after-run", default=None, help="exit once the coordinator announces this run id finished")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this many seconds (default: run until stopped)")
    add_logging_arguments(ap, progress=False)
    add_broker_arguments(ap, default=None, broker_help=f"MQTT broker HOST:PORT (default: the bundle's, else {DEFAULT_BROKER})")
    return ap


def default_state_dir(client_id: str) -> Path:
    """A client's default state folder: per client id, so two clients on one machine never share one."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "fedhar" / client_id


BUNDLE_OWNS = ("client_id", "federation", "broker", "username", "password_file", "tls_ca")
"""Options an enrolment bundle gives (a contradicting explicit one is refused; ``tls_ca`` is checked against it); each
defaults to None in :func:`build_parser`, so a value that is not None was given."""

DEFAULT_BROKER = "127.0.0.1:1883"
"""The broker without ``--broker`` or ``--enrolment``."""


def apply_enrolment(args: argparse.Namespace, bundle: EnrolmentBundle) -> None:
    """Take the client id and federation from ``bundle`` into ``args``; refuse explicit options that contradict it.

    Raises
    ------
    EnrolmentRefused
        ``wrong_federation`` / ``ca_mismatch`` (:meth:`EnrolmentBundle.check`), ``bad_value`` for a
        ``--client-id``, ``--username``, ``--broker`` or ``--password-file`` other than the bundle's.
    OSError
        If ``--tls-ca`` or ``--password-file`` cannot be read.
    """
    given = {name for name in BUNDLE_OWNS if getattr(args, name) is not None}
    bundle.check(federation=args.federation)
    if "client_id" in given and args.client_id != bundle.client_id:
        raise EnrolmentRefused("bad_value", f"--client-id {args.client_id} contradicts the bundle's client id {bundle.client_id}: "
                               f"drop --client-id, or use {args.client_id}'s bundle")  # fmt: skip
    if "username" in given and args.username != bundle.username:
        raise EnrolmentRefused("bad_value", f"--username {args.username} contradicts the bundle, which logs in as {bundle.username}: "
                               f"drop --username")  # fmt: skip
    if "broker" in given and args.broker != f"{bundle.host}:{bundle.port}":
        raise EnrolmentRefused("bad_value", f"--broker {args.broker} contradicts the bundle's broker {bundle.host}:{bundle.port}: "
                               f"drop --broker (or enrol the device again for that broker)")  # fmt: skip
    if "password_file" in given and args.password_file.read_text().strip() != bundle.password:
        raise EnrolmentRefused("bad_value", f"--password-file {args.password_file} holds another password than the bundle: "
                               f"drop --password-file (the bundle's password is the device's)")  # fmt: skip
    if "tls_ca" in given:
        bundle.check(ca_file=args.tls_ca)
    args.client_id = bundle.client_id
    args.federation = bundle.federation


def enrolled_broker(args: argparse.Namespace, bundle: EnrolmentBundle) -> BrokerConfig:
    """The broker settings of ``bundle``, its inline CA written to ``<state-dir>/enrolment/``; ``--tls-ca`` for a fingerprint-only bundle.

    Raises as :meth:`EnrolmentBundle.broker_config` and :class:`BrokerConfig`.
    """
    return bundle.broker_config(
        Path(args.state_dir) / "enrolment",
        ca_file=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        max_message_bytes=args.max_message_bytes,
        mqtt_version=args.mqtt_version,
    )


@dataclass
class PreparedClient:
    """A client ready to serve: its settings, its open store and its parsed options."""

    cfg: ClientConfig
    store: ClientStore
    args: argparse.Namespace
    health: SensingHealthMeter | None = None  # what a paced replay's pipeline received (--replay-speed)


def prepare(argv: list[str] | None) -> PreparedClient | int:
    """Parse ``fedhar-client`` options and ingest the client's windows; else an exit status: 2 usage, 3 data
    (including "nothing to train on"), 6 state folder in use."""
    args = build_parser().parse_args(argv)
    bundle: EnrolmentBundle | None = None
    if args.enrolment is not None:
        try:
            bundle = read_bundle(args.enrolment)
            apply_enrolment(args, bundle)
        except EnrolmentRefused as exc:
            return fail(f"fedhar-client: {args.enrolment}: {exc}")
        except OSError as exc:
            return fail(f"fedhar-client: cannot read the enrolment bundle {args.enrolment}: {exc.strerror or exc}")
    elif args.client_id is None:
        return fail("fedhar-client: give --client-id (the device's id), or --enrolment FILE (a bundle that holds it)")
    if args.federation is None:
        args.federation = "default"
    if args.broker is None:
        args.broker = DEFAULT_BROKER
    if args.state_dir is None:
        args.state_dir = default_state_dir(args.client_id)
    try:
        backend, why = choose_backend(args.backend)
        broker = broker_from_args(args) if bundle is None else enrolled_broker(args, bundle)
        cfg = ClientConfig(
            client_id=args.client_id,
            broker=broker,
            federation=args.federation,
            exit_after_run=args.exit_after_run,
            backend=backend,
            program_cache=args.program_cache,
            programs=args.programs,
        )
        split = SplitSpec.parse(args.split, seed=args.split_seed)
        source = None if args.source.startswith("recorded:") else parse_source(args.source, split)
        labels = recorded_labels(args.source) if source is None else source.labels
    except (ValueError, OSError) as exc:
        return fail(f"fedhar-client: {exc}")
    if bundle is not None:
        log.info("[%s] enrolled by %s: coordinator %r, federation %r, broker %s (%s)", args.client_id, args.enrolment,
                 bundle.coordinator, bundle.federation, broker.address,
                 f"TLS, CA sha256 {bundle.ca_fingerprint()}" if bundle.uses_tls else "plain MQTT")  # fmt: skip
    log.info("[%s] training backend: %s (%s)", args.client_id, backend, why)
    try:
        store = ClientStore(args.state_dir, labels, owner=args.client_id)
    except (StoreInUseError, StateFolderUnusable) as exc:
        return fail(f"fedhar-client: {exc}", Exit.FOLDER_UNUSABLE)
    except (ValueError, OSError) as exc:
        return fail(f"fedhar-client: cannot open the state folder: {exc}", Exit.DATA)
    health: SensingHealthMeter | None = None
    try:
        if source is None:  # windows the owner recorded on this device (fedhar-record, fedhar-app)
            n_train, n_test = sync_to_store(WindowLog(args.state_dir / RECORDED_LOG, labels), store, split_seed=args.split_seed)
        else:
            health = SensingHealthMeter() if args.replay_speed is not None else None
            n_train, n_test = ingest_source(store, source, speed=args.replay_speed, health=health)
    except StateFolderUnusable as exc:
        store.close()
        return fail(f"fedhar-client: {exc}", Exit.FOLDER_UNUSABLE)
    except (ValueError, OSError) as exc:
        store.close()
        return fail(f"fedhar-client: cannot prepare the local data: {exc}", Exit.DATA)
    log.info("[%s] %d training and %d test windows from %s", args.client_id, n_train, n_test, args.source)
    if n_train == 0:
        store.close()
        print(
            f"fedhar-client: {args.client_id}: {args.source} gives no labelled training window (check that it holds "
            f"both accelerometer and gyroscope recordings of known activities); nothing to train on",
            file=sys.stderr,
        )
        return Exit.DATA
    return PreparedClient(cfg, store, args, health)


def serve(
    client: PreparedClient,
    stop: threading.Event,
    train_lock: threading.Lock | None = None,
    shared_transfers: SharedTransfers | None = None,
    blob_cache: BlobCache | None = None,
) -> int:
    """Run a prepared client until ``stop`` is set, its ``--max-seconds`` pass or its run finished; close its store.

    ``train_lock``, ``shared_transfers`` and ``blob_cache`` are shared by the clients one worker process hosts
    (:mod:`simulation.worker`): one training at a time, and each model received or fetched once for all of them.
    """
    try:
        try:
            agent = EdgeAgent(client.cfg, client.store, train_lock=train_lock, shared_transfers=shared_transfers,
                              blob_cache=blob_cache)  # fmt: skip
        except (ssl.SSLError, OSError) as exc:  # unreadable certificate or key
            return fail(f"fedhar-client: cannot set up TLS: {exc}")
        if client.health is not None:
            agent.sensing_health = client.health.snapshot
        if train_lock is None:  # a device of its own: its power supply is this machine's (a virtual client's is not)
            agent.charging = charging_linux
            agent.battery = battery_percent_linux  # a board on a battery (a UPS HAT): its drain per day in the status
            follow_server(agent, stop)  # the home server's state in the log, in words ("home server offline since 14:02")
        code = agent.run(stop, max_seconds=client.args.max_seconds)
        took_part = bool(client.store.get_meta(SENT_KEY, []))
        hint = enrolment_refusal_hint(getattr(client.args, "enrolment", None), agent.refusal, client.cfg.client_id, took_part)
        if hint:
            print(f"fedhar-client: {hint}", file=sys.stderr)
        return code
    finally:
        client.store.close()


def enrolment_refusal_hint(
    enrolment: str | None, refusal: BrokerRefused | None, client_id: str = "", accepted_before: bool = False
) -> str | None:
    """What a device enrolled by a bundle should do when the broker refuses its login, or None.

    The link's message speaks of ``--username`` and ``--password-file``, which a device started with
    ``--enrolment FILE`` never gave; ``accepted_before``: it took part under ``client_id`` before
    (:func:`har_io.refusal_words.bundle_login_refused`).
    """
    if enrolment is None or refusal is None or refusal.kind != "auth":
        return None
    return f"{enrolment}: {bundle_login_refused(client_id, accepted_before)}"


# A module the chosen backend needs is not installed: a restart cannot help, the install has to change.
EXIT_MISSING_MODULE = Exit.MISSING_MODULE


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-client`` (``request-certificate``: :func:`edge_client.cert_enrol.main`); returns the exit
    status (:mod:`har_io.exit_codes`); the systemd unit restarts on none but 0 and 1."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["request-certificate"]:  # enrolment by certificate (edge_client/cert_enrol.py); no other option is a bare word
        from edge_client import cert_enrol

        return cert_enrol.main(words[1:])
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        print(
            f"fedhar-client: the Python module {exc.name!r} is not installed in {sys.prefix}, and this run needs it "
            f"({exc}). Install it (torch: {torch_hint()}) or pick "
            f"a backend that is installed, e.g. --backend numpy",
            file=sys.stderr,
        )
        return EXIT_MISSING_MODULE


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    client = prepare(argv)
    if isinstance(client, int):
        return client
    if args.threads > 0:
        if client.cfg.backend == "torch":  # only the torch backend imports PyTorch
            import torch

            torch.set_num_threads(args.threads)
        else:
            log.info("[%s] --threads %d ignored: it sets the threads PyTorch trains with, and the %s backend does not train with PyTorch",
                     client.cfg.client_id, args.threads, client.cfg.backend)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return serve(client, stop)


if __name__ == "__main__":
    sys.exit(main())
