"""What ``enrol``, ``reissue``, ``rename``, ``revoke`` and ``forget`` do to a device, in the registry and on the broker.

* ``enrol NAME``: the device's broker account and ACL (the broker reloaded), its registry row, and
  its enrolment bundle ``<data>/enrolment/NAME.json`` with its QR code ``NAME.png`` (both mode
  0600). The password is in the bundle only, never in a log line or on the terminal as text.
* ``reissue NAME``: new credentials for the same device (:func:`reissue`).
* ``rename OLD NEW``: the device under a new name, with its history (:func:`rename`).
* ``revoke NAME``: the registry first (from that moment the server refuses everything it sends),
  then its certificate, if it has one, on the device CA's revocation list, its account and ACL
  removed and the broker reloaded (Mosquitto closes a password session; a certificate session is
  closed by :func:`coordinator.server.broker_session.close_session`), then what the broker retains of it.
* ``forget NAME``: revoke, and delete what the server holds of it.

What a command does to the federation's live side (the broker's retained topics of the device, its
personalised models, the run's records) goes through a :class:`Side`: the running server's
(:class:`coordinator.server.operator_desk.ServerSide`, in its serving loop) when ``serve`` holds the
data folder, else the folder's own (:class:`coordinator.server.folder_side.FolderSide`), so no
command ever logs in as the coordinator while a server may run (:mod:`coordinator.server.operator_commands`).
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
    """What a device command does to the federation's live side (the running server's, or the folders' when none runs)."""

    def clear_device(self, name: str) -> str:
        """Delete what the broker retains of device ``name`` and forget it in memory; the line that says what was done."""
        ...

    def forget_device(self, name: str) -> list[str]:
        """Delete the device's personalised models, spilled updates and its entries in the run's records; lines."""
        ...

    def rename_device(self, old: str, new: str) -> list[str]:
        """Move ``old``'s personalised models to ``new`` and clear ``old`` on the broker; lines."""
        ...

    def release(self, name: str) -> list[str]:
        """Release device ``name`` from quarantine; lines."""
        ...

    def model_request(self, action: str, version: int | None) -> list[str]:
        """Have the federation continue from a version (``pin``) or go back with a smaller step (``rollback``); lines."""
        ...


def coordinator_broker(broker_dir: Path) -> BrokerConfig:
    """How a program on the server reaches the broker as the coordinator: the plain listener on
    loopback with the coordinator's account (its password from the broker folder).

    Raises
    ------
    DeviceCommandError
        If the broker folder or the coordinator's password cannot be read.
    """
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
    """The :class:`coordinator.server.broker_admin.BrokerAdmin` of ``[server] broker_dir``.

    Raises
    ------
    DeviceCommandError
        Without ``[server] broker_dir``.
    """
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
    """The :class:`har_io.enrolment.EnrolmentBundle` of device ``name``: the broker's TLS listener (its plain
    one when it has none) at ``[server] public_host`` (else the generator's, else this host's name), with the CA inline.

    Raises
    ------
    DeviceCommandError
        If the broker folder's settings or its CA certificate cannot be read.
    har_io.enrolment.EnrolmentRefused
        If a field is not valid in a bundle.
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
    """Write ``name``'s enrolment bundle ``<data>/enrolment/NAME.json`` and QR code ``NAME.png`` (mode 0600).

    Raises
    ------
    DeviceCommandError
        If the broker folder's settings or CA cannot be read (see :func:`make_bundle`).
    """
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

    Raises
    ------
    ValueError
        If the name is invalid, enrolled already, or was revoked (a revoked name is not used again).
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered.
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
    """Put ``name``'s device certificate, if it was enrolled by certificate, on the device CA's revocation list.

    The broker refuses the certificate from its next reload (the caller's). False if ``name`` has none.
    ``await_new_key``: True, or the name the device carries from now on (a rename), lets that name be
    approved once more for a key the device makes anew.
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
    """After ``name``'s certificate was revoked: reload the broker (it reads the revocation list) and end the device's live
    session (:func:`coordinator.server.broker_session.close_session`); the line that says so, or None without an account."""
    from coordinator.server.broker_session import close_session

    if name not in admin.devices():
        return None
    admin.reload_broker()
    login = BrokerConfig.parse(f"127.0.0.1:{int(admin.settings().port)}", username=name, password=admin.password(name))
    if close_session(login, name):
        return f"{name}'s live connection closed (its certificate is refused from now on)"
    return f"{name}'s live connection could not be closed (the broker refused the login); it ends when the device leaves"


def reissue(data: Path, file: ServeFile, name: str) -> Bundle | None:
    """Give enrolled device ``name`` new credentials; its history stays.

    A device enrolled by password gets a new password and a new bundle and QR code: the broker
    account is given the new password and reloaded (from then on the old password is refused and
    a session logged in with it is closed). A device enrolled by certificate gets no secret from
    the server: its certificate is revoked (refused from the reload done here, its live session
    closed), and the name may be approved once more for a key the device makes anew
    (``fedhar-client request-certificate`` or the app, then ``approve CODE``;
    :func:`coordinator.broker.device_ca.await_new_key`). Either way the registry row, participation
    and the run's records keep the name, so the device goes on as the same device.

    Returns the new bundle, or None for a device enrolled by certificate (no bundle: it asks for a certificate).

    Raises
    ------
    ValueError
        If ``name`` is not enrolled (never, or revoked: a revoked device is not brought back).
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered.
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

    A device id is its MQTT user name and its topics' id, so the broker gets an account and ACL
    for ``new`` (a new password) and loses ``old``'s; the registry moves the row and
    participation to ``new`` and keeps ``old`` revoked for good (``renamed_to``); ``side`` moves the
    kept personalised models to the new name and clears ``old``'s retained status and models; its
    bundle is deleted. A device enrolled by password gets a bundle for ``new`` and must load it.
    A device enrolled by certificate gets none (the bundle is None): its certificate is revoked,
    its live session closed, and it asks for one under ``new`` with a key it makes anew, which
    ``approve`` accepts.

    Raises
    ------
    ValueError
        If a name is invalid, ``old`` is not enrolled, or ``new`` was ever used.
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered (nothing in the registry changed when the new account failed).
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
    if _revoke_certificate(admin, old, await_new_key=new if by_certificate else False):
        done.append(f"{old}'s certificate put on the device CA's revocation list")
        closed = _close_certificate_session(admin, old)
        done += [closed] if closed else []
    if by_certificate:
        done.append(f"{new} may be approved for a key the device makes anew (it was enrolled by certificate: no bundle)")
    if old in admin.devices():
        admin.remove_device(old)
        done.append(f"{old}'s broker account and ACL removed; broker reloaded ({file.server.broker_reload})")
    done += side.rename_device(old, new)
    delete_bundle(data, old)
    bundle = None if by_certificate else write_bundle(data, file, new, password)
    audit(data, "rename", new, f"was {old}")
    return done, bundle


def revoke(data: Path, file: ServeFile, name: str, side: Side) -> list[str]:
    """Revoke ``name`` for good; returns what was done, as lines.

    The registry row goes first: from that moment a running ``serve`` refuses the device, whatever
    the broker does next. Then its certificate (revoked, the broker reloaded, its live session
    closed), its broker account and ACL (and a reload), then the retained topics through ``side``.

    Raises
    ------
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered (the registry row is written already).
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
    if _revoke_certificate(admin, name):  # before the reload below, at which the broker reads the new list
        done.append(f"{name}'s certificate put on the device CA's revocation list")
        closed = _close_certificate_session(admin, name)
        done += [closed] if closed else []
    if name in admin.devices():
        admin.remove_device(name)
        done.append(f"{name}'s broker account and ACL removed; broker reloaded ({file.server.broker_reload})")
    else:
        done.append(f"{name} had no broker account")
    done.append(side.clear_device(name))
    return done


def forget(data: Path, file: ServeFile, name: str, side: Side) -> list[str]:
    """Revoke ``name`` and delete what the server holds of it; returns what was done, as lines.

    Deleted: its participation rows (the registry keeps the name alone, so it stays refused), and,
    through ``side``, its personalised models in every kept round of ``<data>/run/models``, its
    spilled updates in ``<data>/run/spill``, its enrolment files, and its entries in the run's records
    (``state.sqlite``, hence ``/api/rounds`` and the page, ``report.json``, ``report.md``:
    :func:`coordinator.server.lifecycle.scrub_run`; counts stay, anonymous).

    Raises
    ------
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered (the registry row is revoked already).
    coordinator.state.StateDamaged
        If the run's database cannot be rewritten.
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
