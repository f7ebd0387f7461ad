"""``fedhar-coordinator enrol | invite | pending | approve | reissue | rename | revoke | forget | release | devices | versions | pin
| rollback``: devices and versions on the home server.

Devices: :mod:`coordinator.server.device_commands` (by password) and :mod:`coordinator.server.enrol_desk`
(by certificate, docs/protocol.md); ``devices`` prunes bundles no longer needed, then lists devices
(:mod:`coordinator.server.device_tables`); ``versions``, ``pin`` and ``rollback`` act on the kept
model versions. Commands that change the live federation go through the running server when one
holds the data folder, else act on the folders under its lock (:mod:`coordinator.server.operator_commands`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from coordinator.server.audit import audit
from coordinator.server.device_commands import DeviceCommandError, enrol, existing_registry, write_private
from coordinator.server.device_tables import device_table, print_table, version_table, when
from coordinator.server.figures import read_figures
from coordinator.server.operator_commands import COMMAND_ERRORS, ROUTED, route
from coordinator.server.ownership import match_data_owner
from coordinator.server.settings import ServeFile, default_data_dir, read_serve_file
from har_io.cli import add_logging_arguments, setup_logging
from har_io.exit_codes import Exit, exit_status_of

log = logging.getLogger("fedhar.devices")

__all__ = ["DeviceCommandError", "main", "renew", "renew_main"]

ALIASES = {"enroll": "enrol"}
"""Other spellings of a command: ``enroll`` runs ``enrol``."""


def _parser(cmd: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"fedhar-coordinator {cmd}", description=(__doc__ or "").split("\n\n")[0])
    if cmd in ("enrol", "revoke", "forget", "reissue", "release"):
        ap.add_argument("name", help="the device's name: its client id and MQTT user name (letters, digits, '_', '.', '-')")
    if cmd == "rename":
        ap.add_argument("old", help="the device's current name")
        ap.add_argument("new", help="its new name (never used before: letters, digits, '_', '.', '-')")
    if cmd == "approve":
        ap.add_argument("code", help="the enrolment code the device shows (ABCDE-FGHJK; case and dashes do not matter)")
    if cmd in ("enrol", "approve"):
        ap.add_argument("--owner", default=None, help="the person the device belongs to (shown on the status page)")
    if cmd == "invite":
        from coordinator.server.lifecycle import INVITATION_DAYS

        ap.add_argument("--host", default=None, help="the broker's host name devices use (default [server] public_host, else the broker's)")
        ap.add_argument("--days", type=float, default=INVITATION_DAYS, help="how long the invitation lives (default %(default)s days)")
        ap.add_argument("--revoke", action="store_true", help="delete the invitation's files now")
    if cmd == "pin":
        ap.add_argument("version", type=int, help="the model version to continue from (see fedhar-coordinator versions)")
    if cmd == "rollback":
        ap.add_argument("version", type=int, nargs="?", default=None,
                        help="the model version to go back to (default: the quality guard's best)")  # fmt: skip
    if cmd in ("devices", "versions", "pending"):
        ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    if cmd == "devices":
        ap.add_argument(
            "--keep-bundles",
            action="store_true",
            help="do not delete enrolment bundles no longer needed (joined, revoked, or older than a week)",
        )
    ap.add_argument("--data", type=Path, default=None, help=f"data folder (default $STATE_DIRECTORY, else {default_data_dir({})})")
    ap.add_argument("--config", type=Path, default=None, metavar="FILE", help="settings file (default <data>/server.toml)")
    add_logging_arguments(ap, progress=False)
    return ap


def renew(out: Path, ca_key: Path, days: int, data: Path | None) -> list[str]:
    """``fedhar-coordinator broker renew``: a new server certificate from the same CA, the broker reloaded, the audit written; lines.

    Raises SetupError if the certificate cannot be renewed (nothing replaced).
    """
    from coordinator.broker.certificates import renew_server_certificate
    from coordinator.server.broker_admin import BrokerAdmin, BrokerAdminError

    got = renew_server_certificate(out, ca_key, days)
    until = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(got.not_after_unix))
    done = [f"new server certificate {got.path}, valid until {until}, signed by the same CA: devices keep connecting"]
    try:
        BrokerAdmin(out, reload="auto").reload_broker()
        done.append("the broker was reloaded and serves it now")
    except BrokerAdminError as exc:
        done.append(f"the broker was not reloaded ({exc}); it serves the new certificate after: systemctl reload mosquitto")
    if data is not None:
        audit(data, "renew", None, f"server certificate until {until}")
    return done


def renew_main(argv: list[str]) -> int:
    """``fedhar-coordinator broker renew ...`` (the options of the broker tooling's ``renew``); 0, or 2 with the reason."""
    from coordinator.broker.cli import PROG, build_broker_parser
    from coordinator.broker.settings import SetupError

    args = build_broker_parser().parse_args(["renew", *argv])
    setup_logging("warning")
    try:
        for line in renew(args.out, args.ca_key, args.days, args.data):
            print(line)
    except SetupError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return Exit.OK


def _desk_command(cmd: str, args: argparse.Namespace, data: Path, file: ServeFile) -> None:
    """``invite`` and ``pending``: enrolment by certificate (:mod:`coordinator.server.enrol_desk`); ``approve`` is routed."""
    from coordinator.server import enrol_desk
    from coordinator.server.lifecycle import INVITATION, drop_invitation, note_invitation

    if cmd == "pending":
        reqs = enrol_desk.pending(file)
        if args.json:
            print(json.dumps([{k: v for k, v in asdict(r).items() if k != "csr_pem"} for r in reqs], indent=1))
        elif not reqs:
            print("no request waits (a device asks with fedhar-client request-certificate or the app)")
        for r in [] if args.json else reqs:
            print(f"{r.code}  {r.client_id or '?'}  key {r.fingerprint or '?'}" + (f"  NOT APPROVABLE: {r.problem}" if r.problem else ""))
        return
    from coordinator.server.qr import invitation_payload, text_qr

    if args.revoke:
        n = drop_invitation(data)
        audit(data, "invite", None, "revoked: its files deleted")
        print(f"the invitation's files are deleted ({n})" if n else "there was no invitation in the data folder")
        print("A code already handed out still lets a device ask; nothing is enrolled without fedhar-coordinator approve.")
        return
    if args.days <= 0:
        raise ValueError(f"--days {args.days}: give how many days the invitation lives (at least 1)")
    inv = enrol_desk.invitation(file, args.host)
    payload = invitation_payload(inv)
    folder = data / "enrolment"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    js, png = folder / f"{INVITATION}.json", folder / f"{INVITATION}.png"
    write_private(js, inv.to_json().encode())
    expires = time.time() + args.days * 86400.0
    note_invitation(data, expires)
    audit(data, "invite", None, f"until {when(expires)}")
    code = text_qr(payload)
    from har_models.files import atomic_write

    atomic_write(png, lambda tmp: code.save(str(tmp), kind="png", scale=8, border=4), mode=0o600)
    try:
        enrol_desk.publish_ca(file, inv)
        ca_note = "the CA is also on the broker for devices that fetch it"
    except enrol_desk.DeskUnreachable as exc:
        ca_note = f"the CA could not be left on the broker ({exc}); a device whose code has only the fingerprint needs ca.crt"
    import io

    out = io.StringIO()
    code.terminal(out=out, compact=True, border=2)
    print(out.getvalue())
    inline = '"tls_ca_pem"' in payload
    print(f"Invitation to federation {inv.federation} at {inv.host}:{inv.port} (devices log in on {inv.device_port} once approved).")
    print(f"  {js}  (fedhar-client request-certificate --invitation {js.name} --client-id NAME)")
    print(f"  {png}  (the code above)")
    print("The code holds the broker's address, the enrolment account (it can only ask) and the CA "
          + ("certificate itself." if inline else f"fingerprint (SHA-256 {inv.tls_ca_sha256}); {ca_note}."))
    print("It holds no device's secret: each device makes its own key; approve it with fedhar-coordinator approve CODE.")
    print(f"It lives until {when(expires)} (--days), or until fedhar-coordinator invite --revoke; devices enrolled with it stay.")


def main(cmd: str, argv: list[str]) -> int:
    """``fedhar-coordinator CMD ...`` for CMD in enrol, invite, pending, approve, reissue, rename, revoke, forget, release,
    devices, versions, pin, rollback. ``enroll`` is an alias of ``enrol`` (the one spelling in messages and docs).

    0 done; 2 bad options, settings or name (the message says which); 4 the broker refused the
    administration; 6 a damaged database, or one another program held too long.
    """
    cmd = ALIASES.get(cmd, cmd)
    args = _parser(cmd).parse_args(argv)
    setup_logging(args.log_level)
    data = args.data or default_data_dir()
    prog = f"fedhar-coordinator {cmd}"
    try:
        return exit_status_of(prog, lambda: _command(cmd, args, data), COMMAND_ERRORS)
    finally:
        match_data_owner(data)


def _command(cmd: str, args: argparse.Namespace, data: Path) -> int | None:
    file = read_serve_file(args.config or data / "server.toml")
    if cmd in ROUTED:
        wanted = {k: getattr(args, k) for k in ("name", "old", "new", "code", "owner", "version") if hasattr(args, k)}
        return route(cmd, wanted, data, file)
    if cmd == "enrol":
        js, png, qr = enrol(data, file, args.name, args.owner)
        print(qr)
        print(f"{args.name} enrolled. Scan the code above with the app (Federation > Enrol), or give the device")
        print(f"  {js}  (fedhar-client --enrolment {js.name})")
        print(f"  {png}  (the same as a QR code image)")
        print("Both files hold the device's password (mode 0600); they are deleted once the device has joined, or after a week.")
    elif cmd in ("invite", "pending"):
        _desk_command(cmd, args, data, file)
    elif cmd == "devices":
        _devices(args, data, file)
    elif cmd == "versions":
        vrows = version_table(data)
        if args.json:
            print(json.dumps(vrows, indent=1))
            return None
        for r in vrows:
            f = read_figures(r["figures"])  # older releases wrote personalization_*
            r["created"] = when(r["created_unix"])
            r["pers_f1"] = None if f.get("personalisation_macro_f1") is None else f"{100 * f['personalisation_macro_f1']:.1f}%"
            r["global_f1"] = None if f.get("global_macro_f1") is None else f"{100 * f['global_macro_f1']:.1f}%"
            r["updates"] = f.get("updates")
        print_table(vrows, ["version", "mark", "round", "created", "arch_version", "updates", "pers_f1", "global_f1", "path"])
    else:
        print(f"fedhar-coordinator {cmd}: unknown command", file=sys.stderr)
        return Exit.USAGE
    return None


def _devices(args: argparse.Namespace, data: Path, file: ServeFile) -> None:
    from coordinator.server.broker_view import online_states
    from coordinator.server.lifecycle import leave_lines, prune_bundles

    existing_registry(data)
    online = online_states(file)
    if not args.keep_bundles:
        joined = {n for n, st in (online or {}).items() if st != "offline"}
        for name in prune_bundles(data, joined):
            print(f"deleted the enrolment bundle of {name} (joined, revoked or older than a week)", file=sys.stderr)
    rows = device_table(data, online)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        r["enrolled"], r["revoked"] = when(r["enrolled_unix"]), when(r["revoked_unix"])
        r["quarantine"] = "yes" if r["quarantined"] else None
    print_table(rows, ["name", "owner", "state", "online", "rounds", "last_round", "clipped", "rejected", "quarantine", "enrolled",
                       "revoked", "renamed_to"])  # fmt: skip
    for line in leave_lines(data):
        print(line)
    for r in rows:
        if r["quarantine"]:
            print(f"{r['name']} is quarantined: its updates are left out of the shared model; fedhar-coordinator release "
                  f"{r['name']} lets them count again")  # fmt: skip
