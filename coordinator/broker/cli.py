"""``fedhar-coordinator broker``: the federation's Mosquitto configuration from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from coordinator.broker.accounts import configured_devices, generate
from coordinator.broker.bridge import init_bridge
from coordinator.broker.certificates import OPENSSL_HELP
from coordinator.broker.report import report, summary
from coordinator.broker.settings import (
    DEFAULTS,
    HOME_ASSISTANT_USER,
    SetupError,
    parse_ids,
    read_clients_file,
    read_settings,
    require_manifest,
)
from har_io.exit_codes import Exit

log = logging.getLogger("fedhar.broker")


PROG = "fedhar-coordinator broker"
"""The subcommands' program name; the wrapper ``firmware_scripts/mosquitto_config.py`` keeps its own (:func:`build_parser`)."""
DESCRIPTION = (
    "Write a Mosquitto configuration for a fedhar federation: no anonymous access, one password per "
    "device, an ACL that lets each device write only under its own client id, optional TLS. Re-running on the same "
    "--out folder adds devices and keeps existing passwords and every setting not given again."
)


def add_setting_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of :class:`~coordinator.broker.settings.BrokerSettings` (unset: None, so a re-run keeps earlier ones)."""
    ap.add_argument("--federation", help="federation name: topics under fedhar/v1/<name> (required on the first run)")
    ap.add_argument("--coordinator-user", help=f"the coordinator's user name (default {DEFAULTS['coordinator_user']})")
    ap.add_argument(
        "--monitor-user", help=f"the read-only monitor account's user name, for a status page (default {DEFAULTS['monitor_user']})"
    )
    # Removed: an old command line with --home-assistant gets an error that says so; --no-home-assistant asks for what
    # every run now does (a folder's Home Assistant account is removed), so it is accepted.
    ap.add_argument("--home-assistant", action=argparse.BooleanOptionalAction, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=f"plain MQTT port (default {DEFAULTS['port']})")
    ap.add_argument("--bind", help="address of the plain listener (default: 127.0.0.1 with TLS, else all interfaces)")
    ap.add_argument("--tls-cert", help="server certificate (PEM); with --tls-key adds a TLS listener")
    ap.add_argument("--tls-key", help="the server certificate's private key (PEM)")
    ap.add_argument("--tls-ca", help="CA certificate (PEM) that signed the server (and device) certificates")
    ap.add_argument("--tls-port", type=int, help=f"TLS port (default {DEFAULTS['tls_port']})")
    ap.add_argument("--tls-bind", help="address of the TLS listener (default: all interfaces)")
    ap.add_argument(
        "--require-client-cert", action=argparse.BooleanOptionalAction, default=None, help="mutual TLS: devices present certificates"
    )
    ap.add_argument(
        "--device-cert-port", type=int,
        help="add a listener where devices enrolled by certificate log in (fedhar-coordinator approve), e.g. 8884",
    )  # fmt: skip
    ap.add_argument("--no-tls", action="store_true", help="drop the TLS listener configured by an earlier run")
    ap.add_argument("--broker-user", help=f"account Mosquitto runs as after starting as root (default {DEFAULTS['broker_user']})")
    ap.add_argument(
        "--max-message-bytes",
        type=int,
        help=f"largest payload the fedhar programs publish, their --max-message-bytes (default {DEFAULTS['max_message_bytes']})",
    )
    ap.add_argument("--max-queued-messages", type=int, help=f"QoS 1 messages queued per client (default {DEFAULTS['max_queued_messages']})")
    ap.add_argument("--public-host", help="host name devices use for the broker, for the printed commands (default: this host)")


def add_client_arguments(ap: argparse.ArgumentParser) -> None:
    """``--clients`` and ``--clients-file``: device ids to add."""
    ap.add_argument("--clients", action="append", default=[], metavar="ID,ID,...", help="device ids to add (repeatable)")
    ap.add_argument("--clients-file", type=Path, action="append", default=[], help="file of device ids, one per line, # comments")


def add_common_arguments(ap: argparse.ArgumentParser, out_help: str = "output folder (created if missing)") -> None:
    """``--out``, ``--mosquitto-passwd``, ``--json`` and ``--log-level``, which every form of the command takes."""
    ap.add_argument("--out", type=Path, required=True, help=out_help)
    ap.add_argument("--mosquitto-passwd", help="path of mosquitto_passwd (default: searched on PATH)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    ap.add_argument("--log-level", default="WARNING")


def build_parser(prog: str = "mosquitto_config.py") -> argparse.ArgumentParser:
    """The one-command parser of ``firmware_scripts/mosquitto_config.py`` (every action as an option, as before the subcommands).

    Options left unset default to None so a re-run can keep earlier settings.
    """
    ap = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=OPENSSL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(ap)
    add_client_arguments(ap)
    ap.add_argument("--rotate", nargs="?", const="*", metavar="ID,ID,...", help="new passwords for these users (no value: all)")
    ap.add_argument("--revoke", metavar="ID,ID,...", help="remove these devices")
    add_setting_arguments(ap)
    return ap


def build_broker_parser() -> argparse.ArgumentParser:
    """The parser of ``fedhar-coordinator broker init|add|remove|rotate|list|bridge`` (the same actions as :func:`build_parser`)."""
    existing = "a broker folder written by 'init'"
    ap = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION + "\n\n"
        f"{PROG} init --out DIR --federation NAME [--clients ID,...] [settings]   write the folder, or change its settings\n"
        f"{PROG} add --out DIR ID [ID ...]        accounts for new devices (passwords in DIR/credentials/)\n"
        f"{PROG} remove --out DIR ID [ID ...]     remove devices (alias: revoke); reload the broker afterwards\n"
        f"{PROG} rotate --out DIR [ID ...]        new passwords for these users (none named: every user)\n"
        f"{PROG} list --out DIR                   the devices and service accounts of the folder\n"
        f"{PROG} renew --out DIR --ca-key KEY     a new server certificate from the same CA (devices keep working)\n"
        f"{PROG} bridge init --out REGIONAL --upstream-dir DIR --upstream HOST:PORT --name REGION [--clients ID,...]\n"
        "                                          a regional broker for devices, bridged to the coordinator's (docs/scale.md)",
        epilog=OPENSSL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="action", required=True, metavar="{init,add,remove,rotate,list,renew,bridge}")
    init = sub.add_parser("init", help="write the broker folder (or change its settings)", description=DESCRIPTION,
                          epilog=OPENSSL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_common_arguments(init)
    add_client_arguments(init)
    add_setting_arguments(init)
    add = sub.add_parser("add", help="accounts for new devices")
    add_common_arguments(add, existing)
    add.add_argument("ids", nargs="*", metavar="ID", help="device ids (commas also separate them)")
    add.add_argument("--clients-file", type=Path, action="append", default=[], help="file of device ids, one per line, # comments")
    remove = sub.add_parser("remove", aliases=["revoke"], help="remove devices")
    add_common_arguments(remove, existing)
    remove.add_argument("ids", nargs="+", metavar="ID", help="device ids")
    rotate = sub.add_parser("rotate", help="new passwords (devices, the coordinator, the monitor)")
    add_common_arguments(rotate, existing)
    rotate.add_argument("ids", nargs="*", metavar="ID", help="user names (none: every user)")
    renew = sub.add_parser("renew", help="a new server certificate from the same CA, without re-enrolling devices")
    renew.add_argument("--out", type=Path, required=True, help=existing + ", with TLS")
    renew.add_argument("--ca-key", type=Path, required=True, help="the CA's private key (ca.key of the openssl recipe; only read)")
    renew.add_argument("--days", type=int, default=825, help="validity of the new certificate in days (default %(default)s)")
    renew.add_argument("--data", type=Path, default=None, help="the server's data folder, to record the renewal in its audit log")
    listing = sub.add_parser("list", help="the folder's devices and service accounts")
    listing.add_argument("--out", type=Path, required=True, help=existing)
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")
    bridge = sub.add_parser("bridge", help="a regional broker for devices, bridged to the coordinator's broker")
    bridge_sub = bridge.add_subparsers(dest="bridge_action", required=True, metavar="{init}")
    binit = bridge_sub.add_parser(
        "init",
        help="write the regional broker's folder and the bridge account in the coordinator's broker folder",
        description="Write a regional broker for devices whose bridge forwards only the federation's topics the coordinator "
        "needs to the coordinator's broker (docs/scale.md, Regional brokers). The regional folder takes the same settings "
        "as 'init' (its own devices, ports and TLS) and is managed afterwards with add, remove and rotate like any other.",
        epilog=OPENSSL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_common_arguments(binit, "the regional broker's folder (created if missing)")
    binit.add_argument("--upstream-dir", type=Path, required=True, help="the coordinator's broker folder (written by 'init')")
    binit.add_argument("--upstream", required=True, metavar="HOST:PORT", help="where the regional broker reaches the coordinator's broker")
    binit.add_argument("--name", required=True, help="the region's name; its bridge logs in upstream as bridge-NAME")
    binit.add_argument("--upstream-ca", type=Path, help="CA certificate of the coordinator's broker: the bridge uses TLS and checks it")
    add_client_arguments(binit)
    add_setting_arguments(binit)
    return ap


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (None: not given), ``--no-tls`` turned into empty TLS paths.

    Raises
    ------
    SetupError
        If ``--no-tls`` comes with a TLS file, or for the removed ``--home-assistant``.
    """
    if getattr(args, "home_assistant", None):
        raise SetupError(
            f"--home-assistant was removed: fedhar publishes no Home Assistant entities. Leave the option out (the next run "
            f"removes the {HOME_ASSISTANT_USER!r} account it made)"
        )
    given = {key: getattr(args, key, None) for key in DEFAULTS}
    if getattr(args, "no_tls", False):
        if any(given[k] is not None for k in ("tls_cert", "tls_key", "tls_ca")):
            raise SetupError("--no-tls contradicts --tls-cert/--tls-key/--tls-ca")
        given.update(tls_cert="", tls_key="", tls_ca="", require_client_cert=False)
    return given


def _ids(texts: list[str], files: list[Path]) -> list[str]:
    """Device ids from comma-separated ``texts`` and ``--clients-file`` files, in order, without repeats."""
    ids: list[str] = []
    for text in texts:
        ids += [c for c in parse_ids(text) if c not in ids]
    for path in files:
        ids += [c for c in read_clients_file(path) if c not in ids]
    return ids


def _refused(name: str, exc: SetupError | OSError) -> int:
    """Print ``exc`` as ``name``'s one-line error; the exit status: a SetupError's own, else 2 (a file that cannot be used)."""
    print(f"{name}: error: {exc}", file=sys.stderr)
    return exc.exit_code if isinstance(exc, SetupError) else int(Exit.USAGE)


def _generate(name: str, args: argparse.Namespace, clients: list[str], rotate: list[str], revoke: list[str]) -> int:
    """Run :func:`generate` for the parsed ``args`` and print what it did; the exit status (errors: 2, mosquitto_passwd: 3)."""
    try:
        outcome = generate(args.out, _given(args), clients, rotate=rotate, revoke=revoke, mosquitto_passwd=args.mosquitto_passwd)
    except (SetupError, OSError) as exc:
        return _refused(name, exc)
    if not outcome.settings.tls:
        log.warning("no TLS: passwords cross the network in clear text; add --tls-cert/--tls-key/--tls-ca for devices on a network")
        sys.stderr.flush()
    print(json.dumps(summary(outcome), indent=2) if args.json else report(outcome))
    return int(Exit.OK)


def generator_main(argv: list[str] | None = None) -> int:
    """``firmware_scripts/mosquitto_config.py``: 0 written, 2 bad arguments or files, 3 ``mosquitto_passwd`` missing or failed."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        clients = _ids(args.clients, args.clients_file)
        rotate = ["*"] if args.rotate == "*" else parse_ids(args.rotate or "")
        revoke = parse_ids(args.revoke or "")
    except SetupError as exc:
        return _refused("mosquitto_config", exc)
    return _generate("mosquitto_config", args, clients, rotate, revoke)


def main(argv: list[str] | None = None) -> int:
    """``fedhar-coordinator broker ACTION``: 0 done, 2 bad arguments or files, 3 ``mosquitto_passwd`` missing or failed."""
    args = build_broker_parser().parse_args(argv)
    if args.action == "list":
        return _list(args.out, args.json)
    if args.action == "renew":
        return _renew(args.out, args.ca_key, args.days)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.action == "init":
            return _generate(PROG, args, _ids(args.clients, args.clients_file), [], [])
        if args.action == "bridge":
            return _bridge(args)
        if args.action == "add":
            clients = _ids(args.ids, args.clients_file)
            if not clients:
                raise SetupError("add: name at least one device id (or --clients-file)")
            require_manifest(args.out)
            return _generate(PROG, args, clients, [], [])
        ids = _ids(args.ids, [])
        require_manifest(args.out)
        if args.action == "rotate":
            return _generate(PROG, args, [], ids or ["*"], [])
        return _generate(PROG, args, [], [], ids)  # remove / revoke
    except SetupError as exc:
        return _refused(PROG, exc)


def _bridge(args: argparse.Namespace) -> int:
    """``broker bridge init``: write both folders and print what was done to each; 0, 2 or 3 as :func:`_generate`."""
    try:
        up, regional = init_bridge(args.out, args.upstream_dir, args.upstream, args.name, _given(args),
                                   _ids(args.clients, args.clients_file), args.upstream_ca, args.mosquitto_passwd)  # fmt: skip
    except (SetupError, OSError) as exc:
        return _refused(PROG, exc)
    if not regional.settings.upstream_ca:
        log.warning("the bridge does not use TLS: its password crosses the network in clear text; add --upstream-ca")
    if args.json:
        print(json.dumps({"upstream": summary(up), "regional": summary(regional)}, indent=2))
    else:
        user = regional.settings.upstream_user
        print(f"upstream {up.out}: bridge account {user} ({'new' if user in up.added else 'kept'}); reload that broker\n")
        print(report(regional))
    return int(Exit.OK)


def _renew(out: Path, ca_key: Path, days: int) -> int:
    """Renew the server certificate of broker folder ``out`` (:func:`renew_server_certificate`); 0, or 2 with the reason.

    ``fedhar-coordinator broker renew`` itself runs :func:`coordinator.server.devices_cli.renew`,
    which also reloads the broker and writes the audit log; this is the broker tooling's own
    path (standard library only), which leaves the reload to the operator.
    """
    from coordinator.broker.certificates import renew_server_certificate

    try:
        got = renew_server_certificate(out, ca_key, days)
    except SetupError as exc:
        return _refused(PROG, exc)
    print(f"new server certificate {got.path}, valid until {_date(got.not_after_unix)}, signed by the same CA: devices keep connecting.")
    print("Reload the broker to serve it: systemctl reload mosquitto")
    return int(Exit.OK)


def _date(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(t))


def _list(out: Path, as_json: bool) -> int:
    """Print the devices and service accounts of the broker folder ``out``; 0, or 2 if it is not one."""
    try:
        settings = read_settings(out)
        devices = configured_devices(out)
    except SetupError as exc:
        return _refused(PROG, exc)
    if as_json:
        print(json.dumps({"out": str(out.expanduser().resolve()), "federation": settings.federation,
                          "service_users": settings.service_users, "clients": devices}, indent=2))  # fmt: skip
    else:
        print(f"federation {settings.federation!r} in {out.expanduser().resolve()}")
        print(f"  service accounts: {', '.join(settings.service_users)}")
        print(f"  devices ({len(devices)}): {', '.join(devices) or 'none'}")
    return int(Exit.OK)
