"""Devices and service accounts of a broker folder: the whole folder written at once (:func:`generate`), or one device at a time.

:func:`add_device` and :func:`remove_device` (called by :mod:`coordinator.server.broker_admin`, which
reloads the broker) regenerate ``passwd`` and ``acl`` under the folder's lock, every file replaced
atomically, so they never interleave with a run of ``fedhar-coordinator broker``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator.broker.certificates import install_tls_files
from coordinator.broker.device_ca import ensure_device_ca
from coordinator.broker.files import folder_lock, grant_broker_access, write_broker_file, write_file
from coordinator.broker.passwords import PASSWORD_BYTES, find_mosquitto_passwd, read_password, read_password_file, write_passwd
from coordinator.broker.render import acl_text, config_text
from coordinator.broker.settings import (
    ENROL_DESK_USER,
    ENROL_USER,
    HOME_ASSISTANT_USER,
    MANIFEST_NAME,
    PASSWORD_SUFFIX,
    UPSTREAM_SECRET,
    BrokerSettings,
    SetupError,
    check_settings,
    checked_id,
    load_manifest,
    merge_settings,
    require_manifest,
)
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.broker")


@dataclass
class Outcome:
    """What one run of the generator did: the folder, settings, configured devices (sorted) and the users added, rotated, revoked, kept."""

    out: Path
    settings: BrokerSettings
    clients: list[str]
    added: list[str] = field(default_factory=list)
    rotated: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def password_file(self, user: str) -> Path:
        """Path of ``user``'s password file."""
        return self.out / "credentials" / f"{user}{PASSWORD_SUFFIX}"


def generate(
    out: Path,
    given: dict[str, Any],
    clients: list[str],
    rotate: list[str] | None = None,
    revoke: list[str] | None = None,
    mosquitto_passwd: str | None = None,
) -> Outcome:
    """Write (or update) the broker configuration in ``out`` (created if missing).

    ``given`` holds command-line settings (None: not given; :func:`merge_settings`); ``clients`` are
    added (earlier ones stay); ``rotate`` users get new passwords (``["*"]``: everyone); ``revoke``
    devices lose theirs. Service accounts missing from an older folder are created. Files are replaced
    atomically (``passwd`` first) under the folder's lock; a running broker reads them when it reloads.

    Raises SetupError for invalid ids or settings, a device named like a service account, rotating or
    revoking an unknown user, or a missing or failing ``mosquitto_passwd``.
    """
    rotate = list(rotate or [])
    revoke = list(revoke or [])
    out = out.expanduser().resolve()
    before = load_manifest(out)
    settings = check_settings(merge_settings(given, out))
    services = settings.service_users
    for cid in [*clients, *revoke]:
        checked_id(cid)
        _check_not_service(cid, settings)
    clash = sorted(set(clients) & set(revoke))
    if clash:
        raise SetupError(f"{', '.join(clash)}: both added and revoked; pick one")
    before_settings = before.get("settings", {})
    if "monitor_user" not in before_settings and settings.monitor_user in before.get("clients", []):
        raise SetupError(
            f"{out} has a device named {settings.monitor_user!r}, the monitor account's default name: "
            "pass --monitor-user with another name (e.g. --monitor-user fedhar-monitor)"
        )
    taken = sorted(set(before.get("clients", [])) & {ENROL_USER, ENROL_DESK_USER}) if settings.device_cert_port is not None else []
    if taken:
        raise SetupError(f"{out} has a device named {', '.join(taken)}, an enrolment account's name: rename or remove that device first")
    # Home Assistant's account, which the removed --home-assistant made: not a device, so it goes.
    dropped = {HOME_ASSISTANT_USER} - set(services) if before_settings.get("home_assistant") else set()
    for user in sorted(dropped):
        log.warning("removing the account %r that --home-assistant made: fedhar no longer publishes Home Assistant entities", user)

    tool = find_mosquitto_passwd(mosquitto_passwd)
    created_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    creds = out / "credentials"
    creds.mkdir(mode=0o700, exist_ok=True)
    os.chmod(creds, 0o700)
    (out / "data").mkdir(exist_ok=True)

    with folder_lock(out):
        existing = {p.name[: -len(PASSWORD_SUFFIX)] for p in creds.glob(f"*{PASSWORD_SUFFIX}")} - set(services) - dropped
        for user in sorted(existing):
            try:
                check_client_id(user)
            except ValueError:
                raise SetupError(f"{creds / (user + PASSWORD_SUFFIX)}: not a device's password file (invalid id); move it away") from None
            _check_not_service(user, settings, where=f" ({creds / (user + PASSWORD_SUFFIX)} is a device's)")
        unknown = sorted(set(revoke) - existing)
        if unknown:
            raise SetupError(f"--revoke {', '.join(unknown)}: no such device in {out}")
        devices = sorted((existing | set(clients)) - set(revoke))
        users = [*services, *devices]
        everyone = rotate == ["*"]
        if not everyone:
            for user in rotate:
                if user not in users:
                    raise SetupError(f"--rotate {user}: no such user in {out} (known: {', '.join(users)})")

        outcome = Outcome(out, settings, devices, revoked=sorted(revoke))
        passwords: dict[str, str] = {}
        fresh: dict[str, str] = {}  # written to credentials/ only once passwd holds them, so the two never disagree
        for user in users:
            path = outcome.password_file(user)
            if path.exists() and not (everyone or user in rotate):
                passwords[user] = read_password_file(path)
                outcome.kept.append(user)
                continue
            passwords[user] = fresh[user] = secrets.token_urlsafe(PASSWORD_BYTES)
            (outcome.rotated if path.exists() else outcome.added).append(user)
        write_passwd(out / "passwd", passwords, tool)
        for user, password in fresh.items():
            write_file(outcome.password_file(user), password + "\n", 0o600)
        for user in [*revoke, *sorted(dropped)]:
            outcome.password_file(user).unlink(missing_ok=True)
        settings = outcome.settings = install_tls_files(out, settings)
        if settings.device_cert_port is not None and ensure_device_ca(out, settings.federation):
            log.info("made the device CA in %s", out / "tls")
        write_broker_file(out / "acl", acl_text(settings, devices))
        upstream_password = _upstream_password(out) if settings.upstream else None
        # A regional broker's configuration holds its bridge's password: readable by the broker only.
        write_file(out / "mosquitto.conf", config_text(settings, out, upstream_password), 0o644 if upstream_password is None else 0o600)
        grant_broker_access(out, created_out, settings)
        manifest = {"settings": asdict(settings), "clients": devices, "generator": "fedhar-coordinator broker"}
        write_file(out / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n", 0o644)
    for user in outcome.added:
        log.info("added %s", user)
    for user in outcome.rotated:
        log.info("new password for %s", user)
    for user in outcome.revoked:
        log.info("revoked %s", user)
    return outcome


def _upstream_password(out: Path) -> str:
    """The bridge password kept in the regional folder ``out``; SetupError (saying how to make it again) if missing."""
    path = out / UPSTREAM_SECRET
    if not path.is_file():
        raise SetupError(
            f"{path} is missing: this regional broker's bridge has no password; run fedhar-coordinator broker bridge init "
            f"--out {out} --upstream-dir <the coordinator's broker folder> --upstream HOST:PORT again"
        )
    return read_password_file(path)


def _check_not_service(cid: str, settings: BrokerSettings, where: str = "") -> None:
    """Raise SetupError if the device id ``cid`` is the name of an account that is not a device."""
    if cid == settings.coordinator_user:
        raise SetupError(f"client id {cid!r}{where} is the coordinator's user name; rename the device or pass another --coordinator-user")
    if cid == settings.monitor_user:
        raise SetupError(f"client id {cid!r}{where} is the monitor account's user name; rename the device or pass another --monitor-user")
    if cid in settings.bridge_users:
        raise SetupError(f"client id {cid!r}{where} is a regional broker's bridge account; rename the device")
    if cid in settings.service_users:
        raise SetupError(f"client id {cid!r}{where} is the enrolment service's account; rename the device")


def configured_devices(out: Path) -> list[str]:
    """The device ids configured in ``out`` (sorted), from its manifest; SetupError if it holds none."""
    doc = require_manifest(out)
    clients = doc.get("clients", [])
    if not isinstance(clients, list) or not all(isinstance(c, str) for c in clients):
        raise SetupError(f"{out / MANIFEST_NAME}: 'clients' is not a list of ids; re-run fedhar-coordinator broker init --out {out} on it")
    return sorted(clients)


def add_device(out: Path, name: str, replace: bool = False, mosquitto_passwd: str | None = None) -> tuple[Outcome, str]:
    """Give device ``name`` an account in the generated folder ``out``; return the outcome and its password.

    With ``replace`` an existing account gets a new password instead of a refusal. Raises SetupError if
    ``out`` is not a generated folder, ``name`` is invalid or a service account's, the device exists
    (without ``replace``), or ``mosquitto_passwd`` fails.
    """
    require_manifest(out)
    exists = name in configured_devices(out)
    if exists and not replace:
        raise SetupError(
            f"device {name!r} already has an account in {out}; remove it first, or give it a new password "
            f"(fedhar-coordinator broker rotate --out {out} {name})"
        )
    if exists:
        outcome = generate(out, {}, [], rotate=[name], mosquitto_passwd=mosquitto_passwd)
    else:
        outcome = generate(out, {}, [name], mosquitto_passwd=mosquitto_passwd)
    return outcome, read_password(out, name)


def remove_device(out: Path, name: str, mosquitto_passwd: str | None = None) -> Outcome:
    """Remove device ``name``'s account from ``out``; once the broker reloads it cannot log in and Mosquitto 2 closes its session.

    Raises SetupError if ``out`` is not a generated folder, ``name`` has no account, or ``mosquitto_passwd`` fails.
    """
    require_manifest(out)
    if name not in configured_devices(out):
        raise SetupError(f"device {name!r} has no account in {out} (devices: {', '.join(configured_devices(out)) or 'none'})")
    return generate(out, {}, [], revoke=[name], mosquitto_passwd=mosquitto_passwd)
