"""What ``enrol``, ``reissue``, ``rename``, ``revoke`` and ``forget`` do to a device, in the registry and on the broker.

Bundles (``<data>/enrolment/NAME.json`` and ``NAME.png``, mode 0600) hold the password, which never
appears in a log line or as terminal text. ``revoke`` writes the registry first (from then on the
server refuses the device), then the certificate, account and retained topics. What a command does
to the live side (retained topics, personalised models, run records) goes through a :class:`Side`:
the running server's when ``serve`` holds the folder, else the folder's own, so no command logs in
as the coordinator while a server may run.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Protocol

from coordinator.server.audit import audit
from coordinator.server.registry import Registry
from coordinator.server.settings import ServeFile
from har_io.broker_config import BrokerConfig
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.devices")

Bundle = tuple[Path, Path, str]
"""An enrolment bundle as written: (JSON file, PNG file, the QR code as terminal text)."""


class DeviceCommandError(RuntimeError):
    """A device command cannot be done as asked; the message names the fix."""


class Side(Protocol):
    """What a device command does to the federation's live side; each method returns the lines saying what was done."""

    def clear_device(self, name: str) -> str:
        """Delete what the broker retains of device ``name`` and forget it in memory; the line that says what was done."""
        ...

    def forget_device(self, name: str) -> list[str]:
        """Delete the device's personalised models, spilled updates and entries in the run's records."""
        ...

    def rename_device(self, old: str, new: str) -> list[str]:
        """Move ``old``'s personalised models to ``new`` and clear ``old`` on the broker."""
        ...

    def release(self, name: str) -> list[str]:
        """Release device ``name`` from quarantine."""
        ...

    def model_request(self, action: str, version: int | None) -> list[str]:
        """Continue from a version (``pin``) or go back with a smaller step (``rollback``)."""
        ...


def coordinator_broker(broker_dir: Path) -> BrokerConfig:
    """The coordinator's login on the plain loopback listener (password from the broker folder); DeviceCommandError if unreadable."""
    from coordinator.server.broker_admin import BrokerAdmin, BrokerAdminError

    admin = BrokerAdmin(Path(broker_dir), reload="none")
    try:
        s = admin.settings()
        user = str(s.coordinator_user)
        password = admin.password(user)
    except BrokerAdminError as exc:
        raise DeviceCommandError(f"[server] broker_dir: {exc}") from None
    return BrokerConfig.parse(f"127.0.0.1:{int(s.port)}", username=user, password=password)


def admin_of(file: ServeFile) -> Any:
    """The :class:`coordinator.server.broker_admin.BrokerAdmin` of ``[server] broker_dir``; DeviceCommandError without one."""
    if not file.server.broker_dir:
        raise DeviceCommandError(
            "[server] broker_dir is not set: name the folder fedhar-coordinator broker init wrote (--out) in server.toml"
        )
    from coordinator.server.broker_admin import BrokerAdmin

    return BrokerAdmin(Path(file.server.broker_dir), reload=file.server.broker_reload)


def existing_registry(data: Path) -> None:
    """Raise :class:`DeviceCommandError` unless ``data`` holds a device registry (so no stray database is created)."""
    from coordinator.server.registry import DB_NAME

    if not (data / DB_NAME).is_file():
        raise DeviceCommandError(
            f"{data / DB_NAME} does not exist: no device was enrolled in data folder {data}; name the server's data folder "
            "with --data (the unit's StateDirectory, /var/lib/fedhar)"
        )


def make_bundle(file: ServeFile, name: str, password: str) -> Any:
    """The :class:`har_io.enrolment.EnrolmentBundle` of device ``name``, with the CA inline.

    The broker's TLS listener (else its plain one) at ``[server] public_host``, else the generator's, else
    this host's name. Raises DeviceCommandError if the broker folder's settings or CA cannot be read,
    EnrolmentRefused if a field is not valid in a bundle.
    """
    from har_io.enrolment import EnrolmentBundle

    s = admin_of(file).settings()
    ca_pem = None
    if s.tls and s.tls_ca:
        try:
            ca_pem = Path(str(s.tls_ca)).read_text()
        except OSError as exc:
            raise DeviceCommandError(f"the broker's CA certificate {s.tls_ca}: {exc.strerror or exc}") from None
    host = file.server.public_host or s.public_host or socket.gethostname()
    port = int(s.tls_port) if s.tls else int(s.port)
    return EnrolmentBundle(
        coordinator=file.server.name, federation=str(s.federation), client_id=name, password=password,
        host=str(host), port=port, tls_ca_pem=ca_pem,
    )  # fmt: skip


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` atomically with mode 0600 (it holds a secret)."""
    from har_models.files import atomic_write_bytes

    atomic_write_bytes(path, data)
    os.chmod(path, 0o600)


def write_bundle(data: Path, file: ServeFile, name: str, password: str) -> Bundle:
    """Write ``name``'s enrolment bundle and QR code (mode 0600); DeviceCommandError as :func:`make_bundle`."""
    from coordinator.server.qr import qr_terminal, write_qr_png

    bundle = make_bundle(file, name, password)
    folder = data / "enrolment"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    js = folder / f"{name}.json"
    write_private(js, bundle.to_json().encode())
    png = write_qr_png(bundle, folder / f"{name}.png")
    os.chmod(png, 0o600)
    return js, png, qr_terminal(bundle)


def enrol(data: Path, file: ServeFile, name: str, owner: str | None) -> Bundle:
    """Enrol ``name``: broker account, registry row, bundle JSON and QR PNG (mode 0600).

    Raises ValueError if the name is invalid, enrolled or was revoked; DeviceCommandError or
    BrokerAdminError if the broker cannot be administered.
    """
    check_client_id(name)
    reg = Registry(data)
    try:
        if reg.is_revoked(name):
            raise ValueError(f"device {name!r} was revoked; a revoked name is not enrolled again: enrol it under a new name")
        if reg.is_enrolled(name):
            raise ValueError(
                f"device {name!r} is already enrolled: for a new password and bundle (a reset or lost device), "
                f"run fedhar-coordinator reissue {name}"
            )
        password = admin_of(file).add_device(name)
        # The registry row comes before the bundle: a running serve prunes, at the end of every round, the bundles of
        # names the registry does not hold as enrolled, and would delete a bundle written first (the soak test saw it).
        reg.enrol(name, owner)
        out = write_bundle(data, file, name, password)
    finally:
        reg.close()
    audit(data, "enrol", name, f"owner {owner}" if owner else "")
    return out


def _revoke_certificate(admin: Any, name: str, await_new_key: str | bool = False) -> bool:
    """Put ``name``'s device certificate, if any, on the revocation list (refused from the next reload); False if none.

    ``await_new_key`` (True, or the device's new name) lets that name be approved once more for a new key.
    """
    from coordinator.broker import device_ca
    from coordinator.broker.files import folder_lock

    with folder_lock(admin.broker_dir):
        revoked = device_ca.revoke_device(admin.broker_dir, name)
        if await_new_key:
            device_ca.await_new_key(admin.broker_dir, name if await_new_key is True else str(await_new_key))
        return revoked


def _by_certificate(admin: Any, name: str) -> bool:
    """Whether ``name`` was enrolled by certificate (the device CA issued it one), so it never gets a password bundle."""
    from coordinator.broker import device_ca

    return device_ca.enrolled_by_certificate(admin.broker_dir, name)


def _close_certificate_session(admin: Any, name: str) -> str | None:
    """Reload the broker and end ``name``'s live session after its certificate was revoked; the line, or None without an account."""
    from coordinator.server.broker_session import close_session

    if name not in admin.devices():
        return None
    admin.reload_broker()
    login = BrokerConfig.parse(f"127.0.0.1:{int(admin.settings().port)}", username=name, password=admin.password(name))
    if close_session(login, name):
        return f"{name}'s live connection closed (its certificate is refused from now on)"
    return f"{name}'s live connection could not be closed (the broker refused the login); it ends when the device leaves"


def _cut_off_certificate(admin: Any, name: str, await_new_key: str | bool = False) -> list[str]:
    """Revoke ``name``'s certificate, if any, and close its live session; the lines done."""
    if not _revoke_certificate(admin, name, await_new_key):
        return []
    closed = _close_certificate_session(admin, name)
    return [f"{name}'s certificate put on the device CA's revocation list", *([closed] if closed else [])]


def _remove_account(admin: Any, file: ServeFile, name: str) -> list[str]:
    """Remove ``name``'s broker account and ACL (the broker reloaded), if it has one; the lines done."""
    if name not in admin.devices():
        return []
    admin.remove_device(name)
    return [f"{name}'s broker account and ACL removed; broker reloaded ({file.server.broker_reload})"]


def reissue(data: Path, file: ServeFile, name: str) -> Bundle | None:
    """Give enrolled device ``name`` new credentials; its registry row, participation and records keep the name.

    By password: a new password (the old one refused from the reload) and a new bundle, returned. By
    certificate: the certificate is revoked, the session closed, and the name awaits a new key
    (:func:`coordinator.broker.device_ca.await_new_key`); returns None. Raises ValueError if ``name`` is
    not enrolled (a revoked device is not brought back); DeviceCommandError or BrokerAdminError if the
    broker cannot be administered.
    """
    check_client_id(name)
    existing_registry(data)
    reg = Registry(data)
    try:
        if not reg.is_enrolled(name):
            why = "was revoked, and is not brought back" if reg.is_revoked(name) else "is not enrolled"
            raise ValueError(f"device {name!r} {why}: enrol it (under a new name) with fedhar-coordinator enrol NAME")
    finally:
        reg.close()
    admin = admin_of(file)
    if _by_certificate(admin, name):
        _revoke_certificate(admin, name, await_new_key=True)
        if _close_certificate_session(admin, name) is None:
            admin.reload_broker()  # the broker re-reads the revocation list
        audit(data, "reissue", name, "certificate revoked; the name awaits a new key (approve its request)")
        return None
    revoked = _revoke_certificate(admin, name)  # a certificate it was enrolled with is refused from the reload below on
    password = admin.add_device(name, replace=True)
    out = write_bundle(data, file, name, password)
    audit(data, "reissue", name, "new password; the old one is refused" + ("; its certificate revoked" if revoked else ""))
    return out


def rename(data: Path, file: ServeFile, old: str, new: str, side: Side) -> tuple[list[str], Bundle | None]:
    """Rename enrolled device ``old`` to ``new``, keeping its history; returns (what was done, new bundle or None).

    ``new`` gets a broker account (a new password) and ``old`` loses its own; the registry keeps ``old``
    revoked for good; ``side`` moves the personalised models. A device enrolled by certificate gets no
    bundle: its certificate is revoked and it asks anew under ``new``. Raises ValueError if a name is
    invalid, ``old`` is not enrolled or ``new`` was ever used; DeviceCommandError or BrokerAdminError if
    the broker cannot be administered (the registry is unchanged when the new account failed).
    """
    from coordinator.server.lifecycle import delete_bundle

    check_client_id(old)
    check_client_id(new)
    existing_registry(data)
    reg = Registry(data)
    try:
        if not reg.is_enrolled(old):
            raise ValueError(f"device {old!r} is not enrolled (see fedhar-coordinator devices); only an enrolled device is renamed")
        if reg.is_enrolled(new) or reg.is_revoked(new):
            raise ValueError(f"the name {new!r} is taken already (enrolled, revoked or forgotten): choose another new name")
        admin = admin_of(file)
        by_certificate = _by_certificate(admin, old)
        password = admin.add_device(new)
        reg.rename(old, new)
    finally:
        reg.close()
    done = [f"{new}: broker account and ACL created", f"registry: {old} is now {new} (participation kept; {old} stays refused)"]
    done += _cut_off_certificate(admin, old, await_new_key=new if by_certificate else False)
    if by_certificate:
        done.append(f"{new} may be approved for a key the device makes anew (it was enrolled by certificate: no bundle)")
    done += _remove_account(admin, file, old)
    done += side.rename_device(old, new)
    delete_bundle(data, old)
    bundle = None if by_certificate else write_bundle(data, file, new, password)
    audit(data, "rename", new, f"was {old}")
    return done, bundle


def revoke(data: Path, file: ServeFile, name: str, side: Side) -> list[str]:
    """Revoke ``name`` for good: registry row first, then certificate, account and ACL, retained topics; the lines done.

    Raises DeviceCommandError or BrokerAdminError if the broker cannot be administered (the row is written already).
    """
    from coordinator.server.lifecycle import delete_bundle, drop_leave_request

    existing_registry(data)
    reg = Registry(data)
    try:
        reg.revoke(name)
    finally:
        reg.close()
    done = [f"{name} recorded as revoked in {data / 'server.sqlite'}"]
    if drop_leave_request(data, name):
        done.append(f"{name}'s request from its app, to leave, is answered")
    if delete_bundle(data, name):
        done.append(f"{name}'s enrolment bundle and QR code deleted (they held its password)")
    audit(data, "revoke", name)
    admin = admin_of(file)
    done += _cut_off_certificate(admin, name)  # before the reload below, at which the broker reads the new list
    done += _remove_account(admin, file, name) or [f"{name} had no broker account"]
    done.append(side.clear_device(name))
    return done


def forget(data: Path, file: ServeFile, name: str, side: Side) -> list[str]:
    """Revoke ``name`` and delete what the server holds of it (participation, models, spill, bundle, run records); the lines.

    Counts in the records stay, anonymous (:func:`coordinator.server.lifecycle.scrub_run`). Raises as
    :func:`revoke`, and StateDamaged if the run's database cannot be rewritten.
    """
    done = revoke(data, file, name, side)
    reg = Registry(data)
    try:
        n_rows = len(reg.participation(name))
        reg.forget(name)
    finally:
        reg.close()
    done += side.forget_device(name)
    done.append(f"deleted {n_rows} participation row(s) of {name}")
    audit(data, "forget", name, f"{n_rows} participation rows")
    return done
