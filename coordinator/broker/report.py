"""What a run of the broker tooling did, for a person (:func:`report`) or a program (:func:`summary`, ``--json``)."""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

from coordinator.broker.accounts import Outcome
from coordinator.broker.settings import PID_FILE_NAME


def commands(outcome: Outcome) -> dict[str, Any]:
    """Shell commands that start the broker and the fedhar programs with the generated credentials.

    Returns
    -------
    dict
        ``broker``, ``reload``, ``coordinator`` (strings) and ``clients`` (client id -> command).
        Device commands name the password file as it is on this machine: copy it to the device.
    """
    s, out = outcome.settings, outcome.out
    host = s.public_host or socket.gethostname()
    local = s.plain_bind if s.plain_bind not in ("", "0.0.0.0", "::") else "127.0.0.1"
    coordinator = [
        program("fedhar-coordinator"), "--broker", f"{local}:{s.port}", "--federation", s.federation,
        "--username", s.coordinator_user, "--password-file", str(outcome.password_file(s.coordinator_user)),
    ]  # fmt: skip
    device_broker = f"{host}:{s.tls_port}" if s.tls else f"{host}:{s.port}"
    tls = ["--tls-ca", s.tls_ca] if s.tls and s.tls_ca else []
    clients = {
        cid: shlex.join(
            ["fedhar-client", "--client-id", cid, "--broker", device_broker, *tls, "--federation", s.federation,
             "--username", cid, "--password-file", str(outcome.password_file(cid)),
             # The windows the device's owner recorded (fedhar-app, fedhar-record); state in ~/.local/share/fedhar/<id>.
             "--source", "recorded:hapt6"]
        )
        for cid in outcome.clients
    }  # fmt: skip
    return {
        "broker": shlex.join(["mosquitto", "-c", str(out / "mosquitto.conf")]),
        "reload": f"kill -HUP $(cat {shlex.quote(str(out / PID_FILE_NAME))})    # or: sudo systemctl reload mosquitto",
        "coordinator": shlex.join(coordinator),
        "clients": clients,
    }


def summary(outcome: Outcome) -> dict[str, Any]:
    """Machine-readable account of ``outcome`` (what ``--json`` prints)."""
    return {
        "out": str(outcome.out),
        "federation": outcome.settings.federation,
        "config": str(outcome.out / "mosquitto.conf"),
        "acl": str(outcome.out / "acl"),
        "passwd": str(outcome.out / "passwd"),
        "coordinator_user": outcome.settings.coordinator_user,
        "clients": outcome.clients,
        "monitor_user": outcome.settings.monitor_user,
        "password_files": {u: str(outcome.password_file(u)) for u in [*outcome.settings.service_users, *outcome.clients]},
        "added": outcome.added,
        "rotated": outcome.rotated,
        "revoked": outcome.revoked,
        "kept": outcome.kept,
        "settings": asdict(outcome.settings),
        "commands": commands(outcome),
    }


def program(name: str) -> str:
    """How to run fedhar's console script ``name`` as written, also under sudo (whose PATH has no venv).

    The full path of the script beside the running Python (a venv's ``bin/``), else in the
    checkout's ``.venv/bin/`` (``sudo python3 firmware_scripts/mosquitto_config.py`` runs the
    system Python), else the bare name (installed on PATH).
    """
    import sys

    here = Path(__file__).resolve().parents[2]
    for candidate in (Path(sys.executable).parent / name, here / ".venv" / "bin" / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return name


def report(outcome: Outcome) -> str:
    """Human-readable account of ``outcome``: what changed and the commands to run next."""
    s, cmd = outcome.settings, commands(outcome)
    listeners = f"port {s.port} on {s.plain_bind or 'all interfaces'}"
    if s.tls:
        listeners += f", TLS port {s.tls_port} on {s.tls_bind or 'all interfaces'}"
    if s.tls and s.device_cert_port is not None:
        listeners += f", device-certificate port {s.device_cert_port}"
    lines = [
        f"fedhar broker configuration for federation {s.federation!r} in {outcome.out}",
        f"  listeners: {listeners}; {len(outcome.clients)} devices and the coordinator ({s.coordinator_user!r})",
        f"  read-only monitor account {s.monitor_user!r}: {outcome.password_file(s.monitor_user)}",
    ]
    for what, users in (("added", outcome.added), ("new password", outcome.rotated), ("revoked", outcome.revoked)):
        if users:
            lines.append(f"  {what}: {', '.join(users)}")
    if outcome.revoked:
        # The broker sends no last will for a device it disconnects on reload; the coordinator stops
        # counting it once its status is three refresh periods old (docs/reliability.md).
        lines.append("  after the reload the broker closes a revoked device's live session and refuses its old password;")
        lines.append("  its retained status stays until cleared (fedhar-coordinator revoke clears it); until then it")
        lines.append("  stops counting as present within three status periods (90 s by default)")
    lines += [
        "",
        "Start the broker:",
        f"  {cmd['broker']}",
        "After any later run of this generator, reload a running broker:",
        f"  {cmd['reload']}",
    ]
    if s.upstream:
        lines += ["", f"This is a regional broker: its bridge ({s.upstream_user!r}) connects to the coordinator's broker at {s.upstream}",
                  "(TLS, checked with " + s.upstream_ca + ")" if s.upstream_ca else "(no TLS)",
                  "and the coordinator runs there, not here (docs/scale.md, Regional brokers)."]  # fmt: skip
    else:
        lines += [
            "",
            "The home server (on the broker's host): name this folder in its server.toml and enrol devices as root:",
            f"  [server] broker_dir = \"{outcome.out}\"",
            f"  sudo {program('fedhar-coordinator')} enrol NAME --data /var/lib/fedhar",
            *(["or by certificate, with no device secret in a code (docs/protocol.md, Enrolment by certificate):",
               f"  sudo {program('fedhar-coordinator')} invite --data /var/lib/fedhar    (then pending, approve CODE)"]
              if s.device_cert_port is not None else []),
            "A research run of a fixed number of rounds against this broker instead:",
            f"  {cmd['coordinator']}",
        ]
    if cmd["clients"]:
        lines += ["", "Devices (copy credentials/<id>.password" + (" and the CA certificate" if s.tls else "") + " to each device):"]
        lines += [f"  {c}" for c in cmd["clients"].values()]
    return "\n".join(lines)
