"""``fedhar-coordinator``: run the coordinator of a federation against a broker (home server).

Subcommands: ``run`` (the default when none is given: a research run of ``--rounds`` rounds),
``serve`` (a federation that never ends, :mod:`coordinator.server.serve`), ``broker`` (the
federation's Mosquitto configuration, :mod:`coordinator.broker.cli`), and the home server's
device commands ``enrol`` (alias ``enroll``), ``revoke``, ``forget``, ``release``, ``devices``, ``versions``, ``pin`` and
``rollback`` (:mod:`coordinator.server.devices_cli`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

from coordinator import strategies
from coordinator.admission import OPEN, Admission
from coordinator.config import CoordinatorConfig
from har_io import exit_codes
from har_io.cli import (
    HelpFormatter,
    add_broker_arguments,
    add_logging_arguments,
    add_settings_arguments,
    broker_from_args,
    read_settings_file,
    settings_from,
    setup_logging,
)
from har_io.exit_codes import Exit
from har_io.mqtt_link import BrokerRefused
from har_models.data.splits import DEFAULT_SPLIT

log = logging.getLogger("fedhar.coordinator")


def add_federation_arguments(ap: argparse.ArgumentParser) -> None:
    """Options shared by ``fedhar-coordinator`` and ``fedhar-simulate``, generated from :class:`CoordinatorConfig`."""
    ap.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"TOML file of federation settings (the same names as the options; [ala] and the strategies' settings "
        f"{', '.join(f'[{t}]' for t in sorted(strategies.settings_tables()))} as tables); "
        "options given on the command line win. A run folder's config.toml is such a file.",
    )
    add_settings_arguments(ap.add_argument_group("federation"), CoordinatorConfig)


def config_from_args(args: argparse.Namespace, **fields: Any) -> CoordinatorConfig:
    """Resolve the :class:`CoordinatorConfig`: dataclass defaults, then ``--config FILE``, then options, then ``fields``.

    Raises
    ------
    ValueError
        For an unknown key or wrong type (the key is named), a value out of range, or an
        unreadable ``--config`` file.
    """
    file: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        try:
            file = read_settings_file(args.config)
        except OSError as exc:
            raise ValueError(f"--config {args.config}: {exc.strerror or exc}") from None
    return settings_from(CoordinatorConfig, args, file=file, what=str(args.config) if file else "options", **fields)


SUBCOMMANDS = ("run", "serve", "broker", "enrol", "enroll", "reissue", "rename", "revoke", "forget", "devices", "versions",
               "pin", "rollback", "release", "invite", "pending", "approve",
               "backup", "restore")
"""The first word that selects a subcommand; anything else (no subcommand) is ``run``."""

_DESCRIPTION = (
    "fedhar coordinator: runs federated rounds over MQTT.\n\n"
    "fedhar-coordinator [run] OPTIONS     a run of --rounds rounds (the default; the options below)\n"
    "fedhar-coordinator serve [OPTIONS]   the home server: a federation that never ends (serve --help)\n"
    "fedhar-coordinator broker ACTION     the federation's Mosquitto: init, add, remove, rotate, list (broker --help)\n"
    "fedhar-coordinator enrol NAME        enrol a device: broker account and an enrolment bundle + QR code (alias: enroll)\n"
    "fedhar-coordinator invite            enrolment by certificate: a QR code with no device secret; pending; approve CODE\n"
    "fedhar-coordinator reissue NAME      a new password and bundle for a device (same history); rename OLD NEW\n"
    "fedhar-coordinator revoke NAME       revoke a device for good; forget NAME also deletes what the server holds of it\n"
    "fedhar-coordinator backup DEST       copy the data folder (safe while serve runs) and the broker folder; restore SRC\n"
    "fedhar-coordinator devices           enrolled, online and revoked devices; versions: the kept model versions\n"
    "fedhar-coordinator pin VERSION       serve continues from that version; rollback [VERSION]: also a smaller step\n"
    "fedhar-coordinator release NAME      a quarantined device's updates count again\n"
    "A running serve does revoke, reissue, rename, forget, pin, rollback, approve and release itself, between rounds."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``fedhar-coordinator [run]``."""
    ap = argparse.ArgumentParser(
        prog="fedhar-coordinator",
        description=_DESCRIPTION,
        epilog=exit_codes.epilog(exit_codes.COORDINATOR),
        formatter_class=HelpFormatter,
    )
    from har_io.entry import version_line

    ap.add_argument("--version", action="version", version=version_line("fedhar-coordinator"), help="print the release and exit")
    ap.add_argument("--federation", default="default", help="topic namespace fedhar/v1/<federation>")
    ap.add_argument("--run-id", default=None, help="run identifier (default: <aggregation>-<timestamp>)")
    ap.add_argument("--run-dir", type=Path, default=None, help="run folder (default: runs/<run id>)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --run-dir after its last completed round")
    ap.add_argument("--expected-clients", type=int, default=None, help="start as soon as this many clients are online")
    ap.add_argument("--broker-dir", type=Path, default=None,
                    help="the folder fedhar-coordinator broker made: a device it no longer lists (removed, revoked) is "
                         "refused from its next message on")  # fmt: skip
    ap.add_argument(
        "--eval-data",
        default=None,
        help="research harness: dataset (hapt:FOLDER or realworld:PATH) whose subjects' test splits form the union "
        "test set for the global and generalisation measures",
    )
    ap.add_argument(
        "--eval-split",
        default=DEFAULT_SPLIT,
        help="with --eval-data: the clients' --split (blocks, paper, optionally +label_skew or +label_skew2), so the union test set holds "
        "exactly their test windows (default %(default)s)",
    )
    add_logging_arguments(ap)
    add_broker_arguments(ap)
    add_federation_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-coordinator``; returns the exit status (:mod:`har_io.exit_codes`, the table of every code).

    The first argument may name a subcommand (:data:`SUBCOMMANDS`); without one it is ``run``, so
    every command line written before the subcommands means what it meant.

    0 ok, 2 usage, 3 data, 4 broker refused the login or TLS failed (not retried), 5 federation failed,
    6 run folder unusable, 7 a required module is not installed, 130 SIGINT; systemd does not restart on
    2, 3, 4, 6 or 7.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in SUBCOMMANDS:
        cmd, rest = words[0], words[1:]
        if cmd == "serve":
            return serve_main(rest)
        if cmd == "broker" and rest[:1] == ["renew"]:  # it also reloads the broker and writes the audit log
            from coordinator.server.devices_cli import renew_main

            return renew_main(rest[1:])
        if cmd == "broker":
            from coordinator.broker import cli as broker_cli

            return broker_cli.main(rest)
        if cmd in ("backup", "restore"):
            from coordinator.server import backup_cli

            return backup_cli.main(cmd, rest)
        if cmd != "run":
            from coordinator.server import devices_cli

            return devices_cli.main(cmd, rest)
        return run_main(rest, argv)
    return run_main(words, argv)


def build_serve_parser() -> argparse.ArgumentParser:
    """The parser of ``fedhar-coordinator serve``."""
    from coordinator.server.settings import default_data_dir

    ap = argparse.ArgumentParser(
        prog="fedhar-coordinator serve",
        description="The home server: a federation that never ends.\n\n"
        "Rounds start when enough enrolled devices are eligible and the [schedule] of the settings file\n"
        "allows; state, model versions and the device registry live in the data folder and survive a\n"
        "restart (no --resume). SIGHUP (systemctl reload) re-reads the [server] and [schedule] tables.",
        epilog=exit_codes.epilog(exit_codes.COORDINATOR),
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--data", type=Path, default=None,
                    help=f"data folder (default $STATE_DIRECTORY, else {default_data_dir({})})")  # fmt: skip
    ap.add_argument("--config", type=Path, default=None, metavar="FILE",
                    help="settings file: the federation's settings at the top level, [server] and [schedule] tables "
                    "(default <data>/server.toml; a missing file means the defaults)")  # fmt: skip
    ap.add_argument("--federation", default=None,
                    help="topic namespace fedhar/v1/<federation> (default: the broker folder's, else 'default')")  # fmt: skip
    add_logging_arguments(ap)
    add_broker_arguments(ap)
    return ap


def serve_main(argv: list[str]) -> int:
    """``fedhar-coordinator serve``; the exit statuses of :func:`main` (130 after SIGINT or SIGTERM)."""
    from coordinator.grid import CoordinatorError, StateError
    from coordinator.server.data_lock import FolderInUse
    from coordinator.server.registry import RegistryDamaged
    from coordinator.server.serve import Server, install_signals
    from coordinator.server.settings import default_data_dir
    from coordinator.server.sqlite_faults import DatabaseAccess, DatabaseBusy
    from coordinator.state import StateDamaged

    args = build_serve_parser().parse_args(argv)
    setup_logging(args.log_level)
    data = args.data or default_data_dir()
    federation = args.federation
    try:
        broker = broker_from_args(args)
        from coordinator.server.settings import read_serve_file

        broker_dir = read_serve_file(args.config or data / "server.toml").server.broker_dir
        if broker_dir and federation is None:
            from coordinator.server.broker_admin import BrokerAdmin, BrokerAdminError

            try:
                federation = BrokerAdmin(Path(broker_dir), reload="none").federation
            except BrokerAdminError as exc:
                raise ValueError(f"[server] broker_dir: {exc}") from None
        if args.username is None:  # the broker folder of [server] broker_dir names the coordinator's account
            from coordinator.server.device_commands import DeviceCommandError, coordinator_broker

            if broker_dir:
                try:
                    broker = dataclasses.replace(broker, **{k: getattr(coordinator_broker(Path(broker_dir)), k)
                                                            for k in ("host", "port", "username", "password")})  # fmt: skip
                except DeviceCommandError as exc:
                    raise ValueError(str(exc)) from None
    except (ValueError, OSError) as exc:
        print(f"fedhar-coordinator serve: {exc}", file=sys.stderr)
        return Exit.USAGE
    prog = "fedhar-coordinator serve"
    # A damaged or foreign folder, one another serve holds, or one this account may not write: a restart cannot help.
    # A database another program held for longer than the wait: a restart (systemd's, after RestartSec) waits again.
    folder: exit_codes.ErrorExits = [((RegistryDamaged, StateDamaged, StateError, FolderInUse, DatabaseAccess), Exit.FOLDER_UNUSABLE),
                                     (DatabaseBusy, Exit.FEDERATION_FAILED)]  # fmt: skip
    built: list[Server] = []

    def build() -> None:
        built.append(Server(data, broker, federation or "default", config=args.config,
                            report_header={"command": "fedhar-coordinator serve " + " ".join(argv)}))  # fmt: skip

    status = exit_codes.exit_status_of(prog, build, [*folder, ((ValueError, OSError), Exit.USAGE)])
    if not built:
        return status
    install_signals(built[0])
    return exit_codes.exit_status_of(
        prog, built[0].run, [*folder, (BrokerRefused, Exit.BROKER_REFUSED), (CoordinatorError, Exit.FEDERATION_FAILED)],
        interrupted=f"stopped; everything completed is kept in {data}",
    )  # fmt: skip


def run_main(words: list[str], argv: list[str] | None = None) -> int:
    """``fedhar-coordinator [run]`` with ``words`` (the options); ``argv`` as given to :func:`main`, for the report."""
    # A missing extra (torch, tqdm, ...) is exit 7 with its fix, in the script's entry (har_io.entry).
    from coordinator.service import Coordinator, CoordinatorError, StateError
    args = build_parser().parse_args(words)
    setup_logging(args.log_level)
    run_id = args.run_id or f"{getattr(args, 'aggregation', strategies.DEFAULT_AGGREGATION)}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume and args.run_dir is None:
        print("fedhar-coordinator: --resume needs --run-dir (and the same --run-id)", file=sys.stderr)
        return Exit.USAGE
    try:
        broker = broker_from_args(args)
        cfg = config_from_args(
            args, run_dir=args.run_dir or Path("runs") / run_id, broker=broker, federation=args.federation, run_id=run_id,
            resume=args.resume,
        )  # fmt: skip
        cfg = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, expected_clients=args.expected_clients))
        admission = OPEN
        if args.broker_dir is not None:
            from coordinator.broker.roster import Roster

            admission = Admission(revoked=Roster(args.broker_dir).refused)
    except (ValueError, OSError) as exc:
        print(f"fedhar-coordinator: {exc}", file=sys.stderr)
        return Exit.USAGE
    evaluator = None
    if args.eval_data:
        from coordinator.evaluation import Evaluator
        from har_models.data.splits import SplitSpec
        from har_models.data.subjects import subject_sources, union_test_set

        kind, _, path = args.eval_data.partition(":")
        try:
            split = SplitSpec.parse(args.eval_split, seed=cfg.evaluation.split_seed)
            sources = subject_sources(kind, Path(path))
            evaluator = Evaluator(union_test_set(sources, split=split), clients=sources)
        except (ValueError, OSError) as exc:
            print(f"fedhar-coordinator: --eval-data {args.eval_data}: {exc}", file=sys.stderr)
            return Exit.DATA

    def run() -> None:
        Coordinator(
            cfg,
            evaluator,
            admission=admission,
            progress=not args.no_progress,
            report_header={"command": "fedhar-coordinator " + " ".join(argv if argv is not None else sys.argv[1:])},
        ).run()

    status = exit_codes.exit_status_of(
        "fedhar-coordinator", run,
        [(StateError, Exit.FOLDER_UNUSABLE), (BrokerRefused, Exit.BROKER_REFUSED), (CoordinatorError, Exit.FEDERATION_FAILED)],
        interrupted=f"interrupted; completed rounds are kept in {cfg.run_dir} (resume with --resume)",
    )  # fmt: skip
    if status != Exit.OK:
        return status
    print(f"fedhar-coordinator: run {run_id} finished; report: {cfg.run_dir / 'report.md'}")
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
