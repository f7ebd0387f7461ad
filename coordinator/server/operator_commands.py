"""The operator commands that change the running federation, and where their parts are done.

The :data:`ROUTED` commands run :func:`perform` in the operator's command, which holds the rights the
registry, the device CA and the broker accounts need. Their live side is done where the federation
is: a command that takes the data folder's lock does it on the folders (FolderSide), holding the lock
so no server starts meanwhile; one that cannot asks the running server over its operator channel
(RemoteSide). Either way the lines and exit statuses (:data:`COMMAND_ERRORS`) are the same.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from coordinator.server.audit import audit
from coordinator.server.device_commands import Bundle, DeviceCommandError, Side, existing_registry, forget, reissue, rename, revoke
from coordinator.server.registry import RegistryDamaged
from coordinator.server.settings import ServeFile
from coordinator.server.sqlite_faults import DatabaseBusy
from coordinator.state import StateDamaged
from har_io.exit_codes import ErrorExits, Exit, exit_status_of

ROUTED = ("revoke", "reissue", "rename", "forget", "pin", "rollback", "approve", "release")
"""The commands a running server does itself (the rest read, or add what the server reads at every message)."""
ANSWER_WAIT_S = 60.0
"""How long (s) a command waits for a server holding the data folder to answer on its socket (it may be starting)."""

COMMAND_ERRORS: ErrorExits = [
    ((RegistryDamaged, StateDamaged, DatabaseBusy), Exit.FOLDER_UNUSABLE),
    ((ValueError, OSError, DeviceCommandError), Exit.USAGE),
    (RuntimeError, Exit.BROKER_REFUSED),  # BrokerAdminError (a RuntimeError): the broker could not be administered
]
"""Exceptions of a device command and the exit status each gives, first match wins (the same in and out of the server)."""


def status_of(exc: BaseException) -> int | None:
    """The exit status :data:`COMMAND_ERRORS` gives ``exc``; None for an exception none names (a bug)."""
    for kinds, code in COMMAND_ERRORS:
        if isinstance(exc, kinds):
            return int(code)
    return None


def _bundle_lines(bundle: Bundle, said: str) -> list[str]:
    js, png, qr = bundle
    return [qr, said, f"  {js}  (fedhar-client --enrolment {js.name})", f"  {png}  (the same bundle as a QR code image)",
            "Both files hold the device's password (mode 0600); they are deleted once the device has joined."]  # fmt: skip


def _certificate_lines(name: str, what: str, data: Path) -> list[str]:
    return [f"{name} {what}. It was enrolled by certificate, so it gets no bundle: on the device, make a new key and ask",
            f"  fedhar-client request-certificate --invitation invitation.json --client-id {name} --new-key   (or the app)",
            f"then compare the code it shows with fedhar-coordinator pending --data {data}, and approve it:",
            f"  fedhar-coordinator approve CODE --data {data}"]  # fmt: skip


def check_model_request(data: Path, action: str, version: int | None) -> None:
    """Refuse a ``pin``/``rollback`` that cannot be done: a version that is not kept, or no best version to roll back to.

    Raises
    ------
    DeviceCommandError
        Naming the versions kept, or the command that names one.
    """
    from coordinator.guard import BEST_FILE
    from coordinator.server.device_tables import version_table

    kept = [r["version"] for r in version_table(data)]
    if version is not None and version not in kept:
        raise DeviceCommandError(f"version {version} is not kept in {data} (kept: {kept or 'none'}); see fedhar-coordinator versions")
    if version is None and not (data / "run" / BEST_FILE).exists():
        raise DeviceCommandError(f"the quality guard of {data} holds no best version (it is off, or judged none yet); "
                                 f"name one: fedhar-coordinator rollback VERSION (see fedhar-coordinator versions)")  # fmt: skip


def perform(command: str, args: dict[str, Any], data: Path, file: ServeFile, side: Side) -> list[str]:
    """Do routed ``command`` with ``args`` (``name``, ``old``/``new``, ``code``/``owner``, ``version``); the lines it prints.

    Raises
    ------
    Exception
        Those of :data:`COMMAND_ERRORS` (the command's own: a bad name, the broker refusing, ...).
    """
    if command == "revoke":
        return revoke(data, file, str(args["name"]), side)
    if command == "forget":
        return forget(data, file, str(args["name"]), side)
    if command == "reissue":
        name = str(args["name"])
        got = reissue(data, file, name)
        if got is None:
            return _certificate_lines(name, "re-issued: its certificate is refused from now on", data)
        return _bundle_lines(got, f"{name} re-issued: its old password is refused from now on. Scan the code above with the app, "
                                  "or give the device")  # fmt: skip
    if command == "rename":
        old, new = str(args["old"]), str(args["new"])
        done, bundle = rename(data, file, old, new, side)
        if bundle is None:
            return done + _certificate_lines(new, f"renamed from {old}", data)
        return done + _bundle_lines(bundle, f"{old} renamed to {new}. The device must load its new bundle: scan the code above, or give it")
    if command == "approve":
        from coordinator.server import enrol_desk

        return enrol_desk.approve(data, file, str(args["code"]), args.get("owner"))
    if command in ("pin", "rollback"):
        version = None if args.get("version") is None else int(args["version"])
        check_model_request(data, command, version)
        lines = side.model_request(command, version)
        audit(data, command, None, f"{command} to " + (f"version {version}" if version is not None else "the best version"))
        return lines
    if command == "release":
        name = str(args["name"])
        existing_registry(data)
        lines = side.release(name)
        audit(data, "release", name, "from quarantine")
        return lines
    raise DeviceCommandError(f"{command} is not a command the server does (one of {', '.join(ROUTED)})")


def route(command: str, args: dict[str, Any], data: Path, file: ServeFile) -> int:
    """Run routed ``command`` with its live side where the federation is (see the module docstring); print its lines;
    return its exit status. Never logs in to the broker as the coordinator while a server may run: only under the lock.
    """
    from coordinator.server.data_lock import DataLock
    from coordinator.server.folder_side import FolderSide
    from coordinator.server.operator_channel import ChannelClosed, RemoteSide, ask

    prog = f"fedhar-coordinator {command}"
    if not Path(data).is_dir():
        print(f"{prog}: data folder {data} does not exist: name the server's data folder with --data "
              "(the unit's StateDirectory, /var/lib/fedhar)", file=sys.stderr)  # fmt: skip
        return int(Exit.USAGE)
    lock = DataLock(data, prog)
    end = time.monotonic() + ANSWER_WAIT_S
    while True:
        if lock.try_acquire():
            try:
                return exit_status_of(prog, lambda: _print(perform(command, args, data, file, FolderSide(data, file))), COMMAND_ERRORS)
            finally:
                lock.release()
        try:
            ask(data, "ping", {})
        except ChannelClosed as exc:
            if time.monotonic() >= end:
                print(f"{prog}: {data} is held by {lock.holder()}, which does not answer ({exc}); if it is a serve that is "
                      "starting, try again in a minute; nothing was done", file=sys.stderr)  # fmt: skip
                return int(Exit.FOLDER_UNUSABLE)
            time.sleep(0.2)
            continue
        return exit_status_of(prog, lambda: _print(perform(command, args, data, file, RemoteSide(data))), COMMAND_ERRORS)


def _print(lines: list[str]) -> None:
    for line in lines:
        print(line)
