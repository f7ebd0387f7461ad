"""``fedhar-coordinator enrol | invite | pending | approve | revoke | forget | devices | versions | pin | rollback``: devices and versions.

* ``enrol NAME [--owner PERSON]`` (``enroll`` is an alias): creates the device's broker account and ACL (and reloads the
  broker) through :mod:`coordinator.server.broker_admin`, records it in the registry, and writes
  its enrolment bundle (:mod:`har_io.enrolment`) as ``<data>/enrolment/NAME.json`` and its QR code
  as ``NAME.png`` (both mode 0600); prints the QR code on the terminal and where the files are.
  The password is in the bundle only, never in a log line or on the terminal as text.
* ``reissue NAME``: a new password for an enrolled device (the old one refused at once), a new
  bundle and QR code; its history stays (:func:`reissue`).
* ``rename OLD NEW``: the device under a new name with its history (:func:`rename`).
* ``invite``, ``pending``, ``approve CODE [--owner PERSON]``: enrolment by certificate, where no device
  secret travels (:mod:`coordinator.server.enrol_desk`; docs/protocol.md, "Enrolment by certificate").
* ``revoke NAME``: puts a device certificate, if it has one, on the device CA's revocation list,
  removes the account and ACL and reloads the broker (Mosquitto drops the live
  session), clears the device's retained status and models, and records it revoked for good: a
  running ``serve`` refuses everything it sends from then on (the registry is asked at every message).
* ``forget NAME``: revokes it and deletes what the server holds of it: its personalised models in
  the run's state, its spilled updates, its enrolment files, its participation rows and its
  entries in the run's round records and reports.
* ``devices [--json]``: deletes enrolment bundles no longer needed
  (:func:`~coordinator.server.lifecycle.prune_bundles`), then lists enrolled, online (from the retained statuses on the broker, when it can
  be reached, else unknown) and revoked devices.
* ``versions [--json]``: the kept model versions with their figures, marking the newest and the
  quality guard's best (:mod:`coordinator.guard`).
* ``pin VERSION``: a running ``serve`` continues from that version at its next round (devices receive
  it); ``rollback [VERSION]``: the same with a halved server step, by default to the guard's best
  version. Both write a request (:mod:`coordinator.server.model_request`) that survives a restart.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from coordinator.server.audit import audit
from coordinator.server.figures import read_figures
from coordinator.server.registry import Registry, RegistryDamaged
from coordinator.server.settings import ServeFile, default_data_dir, read_serve_file
from coordinator.state import StateDamaged
from har_io.broker_config import BrokerConfig
from har_io.cli import add_logging_arguments, setup_logging
from har_io.exit_codes import ErrorExits, Exit, exit_status_of
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.devices")

ALIASES = {"enroll": "enrol"}
"""Other spellings of a command: ``enroll`` runs ``enrol``."""


class DeviceCommandError(RuntimeError):
    """A device command cannot be done as asked; the message names the fix."""


def _parser(cmd: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"fedhar-coordinator {cmd}", description=(__doc__ or "").split("\n\n")[0])
    if cmd in ("enrol", "revoke", "forget", "reissue"):
        ap.add_argument("name", help="the device's name: its client id and MQTT user name (letters, digits, '_', '.', '-')")
    if cmd == "rename":
        ap.add_argument("old", help="the device's current name")
        ap.add_argument("new", help="its new name (never used before: letters, digits, '_', '.', '-')")
    if cmd == "approve":
        ap.add_argument("code", help="the enrolment code the device shows (ABCDE-FGHJK; case and dashes do not matter)")
    if cmd in ("enrol", "approve"):
        ap.add_argument("--owner", default=None, help="the person the device belongs to (shown on the status page)")
    if cmd == "invite":
        ap.add_argument("--host", default=None, help="the broker's host name devices use (default [server] public_host, else the broker's)")
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


def _admin(file: ServeFile) -> Any:
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

    s = _admin(file).settings()
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


def _write_private(path: Path, data: bytes) -> None:
    from har_models.files import atomic_write_bytes

    atomic_write_bytes(path, data)
    os.chmod(path, 0o600)


def enrol(data: Path, file: ServeFile, name: str, owner: str | None) -> tuple[Path, Path, str]:
    """Enrol ``name``: broker account, registry row, bundle JSON and QR PNG (mode 0600).

    Returns ``(json_path, png_path, terminal QR text)``.

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
        password = _admin(file).add_device(name)
        # The registry row comes before the bundle: a running serve prunes, at the end of every round, the bundles of
        # names the registry does not hold as enrolled, and would delete a bundle written first (the soak test saw it).
        reg.enrol(name, owner)
        js, png, qr = write_bundle(data, file, name, password)
    finally:
        reg.close()
    audit(data, "enrol", name, f"owner {owner}" if owner else "")
    return js, png, qr


def write_bundle(data: Path, file: ServeFile, name: str, password: str) -> tuple[Path, Path, str]:
    """Write ``name``'s enrolment bundle ``<data>/enrolment/NAME.json`` and QR code ``NAME.png`` (mode 0600).

    Returns ``(json_path, png_path, terminal QR text)``.

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
    _write_private(js, bundle.to_json().encode())
    png = write_qr_png(bundle, folder / f"{name}.png")
    os.chmod(png, 0o600)
    return js, png, qr_terminal(bundle)


def reissue(data: Path, file: ServeFile, name: str) -> tuple[Path, Path, str] | None:
    """Give enrolled device ``name`` new credentials; its history stays.

    A device enrolled by password gets a new password and a new bundle and QR code: the broker
    account is given the new password and reloaded (from then on the old password is refused and
    a session logged in with it is closed). A device enrolled by certificate gets no secret from
    the server: its certificate is revoked (refused from the reload done here), and the name may
    be approved once more for a key the device makes anew (``fedhar-client request-certificate``
    or the app, then ``approve CODE``; :func:`coordinator.broker.device_ca.await_new_key`).
    Either way the registry row, participation and the run's records keep the name, so the device
    goes on as the same device.

    Returns ``(json_path, png_path, terminal QR text)`` of the new bundle, or None for a device
    enrolled by certificate (no bundle: it asks for a certificate).

    Raises
    ------
    ValueError
        If ``name`` is not enrolled (never, or revoked: a revoked device is not brought back).
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered.
    """
    check_client_id(name)
    _existing_registry(data)
    reg = Registry(data)
    try:
        if not reg.is_enrolled(name):
            why = "was revoked, and is not brought back" if reg.is_revoked(name) else "is not enrolled"
            raise ValueError(f"device {name!r} {why}: enrol it (under a new name) with fedhar-coordinator enrol NAME")
    finally:
        reg.close()
    admin = _admin(file)
    if _by_certificate(admin, name):
        _revoke_certificate(admin, name, await_new_key=True)
        admin.reload_broker()  # the broker re-reads the revocation list
        audit(data, "reissue", name, "certificate revoked; the name awaits a new key (approve its request)")
        return None
    revoked = _revoke_certificate(admin, name)  # a certificate it was enrolled with is refused from the reload below on
    password = admin.add_device(name, replace=True)
    out = write_bundle(data, file, name, password)
    audit(data, "reissue", name, "new password; the old one is refused" + ("; its certificate revoked" if revoked else ""))
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


def rename(data: Path, file: ServeFile, old: str, new: str) -> tuple[list[str], tuple[Path, Path, str] | None]:
    """Rename enrolled device ``old`` to ``new``, keeping its history; returns (what was done, new bundle or None).

    A device id is its MQTT user name and its topics' id, so the broker gets an account and ACL
    for ``new`` (a new password) and loses ``old``'s; the registry moves the row and
    participation to ``new`` and keeps ``old`` revoked for good (``renamed_to``); the kept
    personalised models move to the new name; ``old``'s retained status and models are cleared
    and its bundle deleted. A device enrolled by password gets a bundle for ``new`` and must load
    it. A device enrolled by certificate gets none (the bundle is None): its certificate is revoked
    and it asks for one under ``new`` with a key it makes anew, which ``approve`` accepts.

    Raises
    ------
    ValueError
        If a name is invalid, ``old`` is not enrolled, or ``new`` was ever used.
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered (nothing in the registry changed when the new account failed).
    """
    from coordinator.server.lifecycle import delete_bundle, move_personal_models

    check_client_id(old)
    check_client_id(new)
    _existing_registry(data)
    reg = Registry(data)
    try:
        if not reg.is_enrolled(old):
            raise ValueError(f"device {old!r} is not enrolled (see fedhar-coordinator devices); only an enrolled device is renamed")
        if reg.is_enrolled(new) or reg.is_revoked(new):
            raise ValueError(f"the name {new!r} is taken already (enrolled, revoked or forgotten): choose another new name")
        admin = _admin(file)
        by_certificate = _by_certificate(admin, old)
        password = admin.add_device(new)
        reg.rename(old, new)
    finally:
        reg.close()
    done = [f"{new}: broker account and ACL created", f"registry: {old} is now {new} (participation kept; {old} stays refused)"]
    if _revoke_certificate(admin, old, await_new_key=new if by_certificate else False):
        done.append(f"{old}'s certificate put on the device CA's revocation list")
    if by_certificate:
        done.append(f"{new} may be approved for a key the device makes anew (it was enrolled by certificate: no bundle)")
    if old in admin.devices():
        admin.remove_device(old)
        done.append(f"{old}'s broker account and ACL removed; broker reloaded ({file.server.broker_reload})")
    moved = move_personal_models(data, old, new)
    done.append(f"{moved} kept personalised model(s) moved to {new}")
    seen = _retained(file, wait_s=1.0)
    if seen is not None and seen[1]:  # a login as the coordinator would knock the running serve off the broker
        done.append(f"the running server clears {old}'s retained status and models (and refuses the old name from now on)")
    elif _clear_retained(file, old):
        done.append(f"{old}'s retained status and models cleared")
    else:
        done.append(f"the broker could not be reached to clear {old}'s retained status (a running serve refuses it anyway)")
    delete_bundle(data, old)
    bundle = None if by_certificate else write_bundle(data, file, new, password)
    audit(data, "rename", new, f"was {old}")
    return done, bundle


def _existing_registry(data: Path) -> None:
    """Raise :class:`DeviceCommandError` unless ``data`` holds a device registry (so no stray database is created).

    Raises
    ------
    DeviceCommandError
        Naming the folder looked in and the option that names another.
    """
    from coordinator.server.registry import DB_NAME

    if not (data / DB_NAME).is_file():
        raise DeviceCommandError(
            f"{data / DB_NAME} does not exist: no device was enrolled in data folder {data}; name the server's data folder "
            "with --data (the unit's StateDirectory, /var/lib/fedhar)"
        )


def _clear_retained(file: ServeFile, name: str) -> bool:
    """Clear ``name``'s retained status and models on the broker (as the coordinator); False if it cannot be reached."""
    from coordinator.server.broker_admin import clear_device_topics
    from har_io.mqtt_link import MqttLink
    from har_models.wire.topics import Topics

    admin = _admin(file)
    broker = coordinator_broker(admin.broker_dir)
    link = MqttLink(broker, f"fedhar-admin-{os.getpid()}", subscriptions=[])
    if not link.start(wait_s=15.0):
        link.stop()
        return False
    try:
        clear_device_topics(link, Topics(admin.federation), name)
    finally:
        link.stop()
    return True


def _from_status_page(file: ServeFile, timeout_s: float = 3.0) -> tuple[dict[str, str], bool] | None:
    """Device states and whether the coordinator is online, from a running server's status page JSON API.

    Returns ``({device: state}, serving)`` as :func:`_retained` does (an offline device's state is
    ``"offline"``), or None when ``[server] http_port`` is 0 or the page does not answer (no
    ``serve`` runs, or an older one). A page on a wildcard address is asked on 127.0.0.1; the
    ``[server] token`` is sent when set.
    """
    import urllib.error
    import urllib.request

    if file.server.http_port == 0:
        return None
    host = file.server.http_bind
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    base = f"http://{f'[{host}]' if ':' in host else host}:{file.server.http_port}"
    headers = {"Authorization": f"Bearer {file.server.token}"} if file.server.token else {}

    def get(path: str) -> Any:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=timeout_s) as r:
            return json.loads(r.read())

    try:
        devices, current = get("/api/devices"), get("/api/round")
        out = {str(d["name"]): (str(d.get("status") or "online") if d.get("online") else "offline") for d in devices}
        return out, bool(current["coordinator"]["online"])
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None


def _retained(file: ServeFile, wait_s: float = 2.0) -> tuple[dict[str, str], bool] | None:
    """Device states and whether a ``serve`` runs: from its status page, else the broker's retained statuses.

    Returns ``({device: state}, serving)`` where ``serving`` is True when the coordinator's status
    says online and is fresh (a ``serve`` runs); None if neither can be read. A running server's
    status page (:func:`_from_status_page`) is asked first: its own monitor session holds the
    monitor account, and the generated broker takes user names as client ids, so a second login
    with it would disconnect the page's session (seen on a fresh install: each ``revoke`` and
    ``devices`` knocked the page's monitor off for a second or two). Without a page, the broker is
    read with the read-only monitor account (never the coordinator's, which would disconnect a
    running coordinator), and the retained statuses go through the coordinator's client table
    (:class:`coordinator.client_table.ClientTable`): a device whose status has expired (it vanished
    without its last will) is "offline" there, as on the page.
    """
    page = _from_status_page(file)
    if page is not None:
        return page
    if not file.server.broker_dir:
        return None
    from coordinator.client_table import ClientTable
    from coordinator.server.broker_admin import BrokerAdminError
    from har_io.mqtt_link import MqttLink
    from har_models.wire.messages import CoordinatorStatus, MessageError, fresh_until
    from har_models.wire.topics import Topics

    try:
        admin = _admin(file)
        user, password = admin.monitor_credentials()
        s = admin.settings()
        topics = Topics(admin.federation)
    except (DeviceCommandError, BrokerAdminError):
        return None
    broker = BrokerConfig.parse(f"127.0.0.1:{int(s.port)}", username=user, password=password)
    link = MqttLink(broker, f"fedhar-admin-{os.getpid()}",
                    subscriptions=[(topics.client_status("+"), 1), (topics.coordinator_status, 1)])  # fmt: skip
    table = ClientTable()
    serving = False
    try:
        if not link.start(wait_s=10.0):
            return None
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                topic, payload, retained = link.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                if topic == topics.coordinator_status:
                    if not payload:
                        continue
                    co = CoordinatorStatus.from_bytes(payload)
                    until = fresh_until(co.sent_unix, co.refresh_s, retained, time.monotonic(), time.time())
                    serving = co.state == "online" and (until is None or until > time.monotonic())
                    continue
                parsed = topics.parse_client_topic(topic)
                if parsed is not None and parsed[1] == "status":
                    table.note(parsed[0], payload, retained)  # an empty payload: a status cleared while reading
            except MessageError:
                continue
    finally:
        link.stop()
    now = time.monotonic()
    return {cid: st.state if table.online(cid, now) else "offline" for cid, st in table.items()}, serving


def revoke(data: Path, file: ServeFile, name: str) -> list[str]:
    """Revoke ``name`` for good; returns what was done, as lines.

    The registry row goes first: from that moment a running ``serve`` refuses the device, whatever
    the broker does next. Then the broker account and ACL (and a reload), then the retained topics.

    Raises
    ------
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered (the registry row is written already).
    """
    from coordinator.server.lifecycle import delete_bundle, drop_leave_request

    _existing_registry(data)
    done = []
    reg = Registry(data)
    try:
        reg.revoke(name)
    finally:
        reg.close()
    done.append(f"{name} recorded as revoked in {data / 'server.sqlite'}")
    if drop_leave_request(data, name):
        done.append(f"{name}'s request from its app, to leave, is answered")
    if delete_bundle(data, name):
        done.append(f"{name}'s enrolment bundle and QR code deleted (they held its password)")
    audit(data, "revoke", name)
    admin = _admin(file)
    if _revoke_certificate(admin, name):  # before the reload below, at which the broker reads the new list
        done.append(f"{name}'s certificate put on the device CA's revocation list")
    if name in admin.devices():
        admin.remove_device(name)
        done.append(f"{name}'s broker account and ACL removed; broker reloaded ({file.server.broker_reload})")
    else:
        done.append(f"{name} had no broker account")
    seen = _retained(file, wait_s=1.0)
    if seen is not None and seen[1]:
        done.append(f"the running server clears {name}'s retained status and models (and refuses it from now on)")
    elif _clear_retained(file, name):
        done.append(f"{name}'s retained status and models cleared")
    else:
        done.append("the broker could not be reached to clear the retained status (a running serve ignores it anyway)")
    return done


def forget(data: Path, file: ServeFile, name: str) -> list[str]:
    """Revoke ``name`` and delete what the server holds of it; returns what was done, as lines.

    Deleted: its personalised models in every kept round of ``<data>/run/models``, its spilled
    updates in ``<data>/run/spill``, its enrolment files, its participation rows (the registry
    keeps the name alone, so it stays refused), and its entries in the run's records
    (``state.sqlite``, hence ``/api/rounds`` and the page, ``report.json``, ``report.md``:
    :func:`coordinator.server.lifecycle.scrub_run`; counts stay, anonymous).

    Raises
    ------
    DeviceCommandError, coordinator.server.broker_admin.BrokerAdminError
        If the broker cannot be administered (the registry row is revoked already).
    coordinator.state.StateDamaged
        If the run's database cannot be rewritten.
    """
    from coordinator.server.lifecycle import forget_files, scrub_run

    done = revoke(data, file, name)
    removed = forget_files(data, name)
    reg = Registry(data)
    try:
        n_rows = len(reg.participation(name))
        reg.forget(name)
    finally:
        reg.close()
    rounds = scrub_run(data / "run", name)
    done.append(f"deleted {removed} file(s) of {name} (personalised models, spilled updates, enrolment) and {n_rows} participation row(s)")
    done.append(f"removed {name} from {rounds} round record(s) of {data / 'run'} (state.sqlite, report.json, report.md)")
    audit(data, "forget", name, f"{n_rows} participation rows, {rounds} round records")
    return done


def renew(out: Path, ca_key: Path, days: int, data: Path | None) -> list[str]:
    """``fedhar-coordinator broker renew``: a new server certificate from the same CA, the broker reloaded, the audit log written.

    Returns what was done, as lines. See :func:`coordinator.broker.certificates.renew_server_certificate`.

    Raises
    ------
    coordinator.broker.settings.SetupError
        If the certificate cannot be renewed (nothing was replaced then).
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


def version_table(data: Path) -> list[dict[str, Any]]:
    """The kept versions (oldest first) as JSON-ready rows, each with ``mark``: "newest", "best", "best, newest" or "".

    The best is the newest version of the quality guard's best round (``<data>/run/guard_best.safetensors``).

    Raises
    ------
    DeviceCommandError
        If ``data`` holds no server database.
    """
    from coordinator import guard

    _existing_registry(data)
    reg = Registry(data)
    try:
        rows = [{**asdict(v), "path": str(v.path)} for v in reg.versions()]
    finally:
        reg.close()
    try:
        best = guard.load_best(data / "run")
    except ValueError as exc:
        log.warning("%s", exc)
        best = None
    best_version = max((r["version"] for r in rows if best is not None and r["round"] == best.round), default=None)
    for r in rows:
        marks = (["best"] if r["version"] == best_version else []) + (["newest"] if r is rows[-1] else [])
        r["mark"] = ", ".join(marks)
    return rows


def request_model(data: Path, action: str, version: int | None) -> list[str]:
    """``pin VERSION`` / ``rollback [VERSION]``: write the request a running ``serve`` takes up at its next round.

    Raises
    ------
    DeviceCommandError
        If ``data`` holds no server database, the version is not kept, or a rollback without a version finds no
        best version of the quality guard.
    """
    from coordinator.guard import BEST_FILE
    from coordinator.server import model_request

    rows = version_table(data)
    kept = [r["version"] for r in rows]
    if version is not None and version not in kept:
        raise DeviceCommandError(f"version {version} is not kept in {data} (kept: {kept or 'none'}); "
                                 f"see fedhar-coordinator versions")  # fmt: skip
    if version is None and not (data / "run" / BEST_FILE).exists():
        raise DeviceCommandError(f"the quality guard of {data} holds no best version (it is off, or judged none yet); "
                                 f"name one: fedhar-coordinator rollback VERSION (see fedhar-coordinator versions)")  # fmt: skip
    req = model_request.write_request(data, action, version)
    audit(data, action, None, req.describe())
    return [f"{req.describe()} requested: a running serve takes it up before its next round (also after a restart)"]


def device_table(data: Path, online: dict[str, str] | None) -> list[dict[str, Any]]:
    """One row per registered device: name, owner, state, online ("yes"/"no"/"unknown"), rounds taken part in, times,
    and ``left``: "forget" or "keep" for a device that left from its app (:func:`.lifecycle.leave_requests`), else None."""
    from coordinator.server.lifecycle import leave_requests

    left = leave_requests(data)
    reg = Registry(data)
    try:
        rows = []
        for d in reg.devices():
            took = reg.participation(d.name)
            seen = "unknown" if online is None else ("yes" if online.get(d.name) not in (None, "offline") else "no")
            rows.append({**asdict(d), "online": seen if d.state == "enrolled" else "no", "rounds": len(took),
                         "last_round": took[-1].round if took else None,
                         "left": ("forget" if left[d.name].get("forget") else "keep") if d.name in left else None})  # fmt: skip
        return rows
    finally:
        reg.close()


def online_states(file: ServeFile, wait_s: float = 2.0) -> dict[str, str] | None:
    """Each device's state from a running server's status page, else its retained status on the broker (read-only
    monitor account); None if neither can be read."""
    seen = _retained(file, wait_s)
    return None if seen is None else seen[0]


def _print_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c) if r.get(c) is not None else "-")) for r in rows)) for c in cols} if rows else {}
    if not rows:
        print("(none)")
        return
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c) if r.get(c) is not None else "-").ljust(widths[c]) for c in cols))


def _when(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def match_data_owner(data: Path) -> list[Path]:
    """Give what root created under ``data`` to the data folder's owner; returns the paths changed.

    The operator runs ``enrol``/``revoke``/``forget`` with sudo (they rewrite the broker's
    accounts and reload it), while ``serve`` runs as the unprivileged user that owns the data
    folder (the unit's ``User=fedhar``): a database or enrolment file created by root would
    then be unwritable for the server. Only files owned by root are changed, and only when
    this process is root and the folder belongs to someone else.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not data.is_dir():
        return []
    st = data.stat()
    if st.st_uid == 0:
        return []
    changed = []
    for path in [data, *data.rglob("*")]:
        try:
            if path.lstat().st_uid == 0 and not path.is_symlink():
                os.chown(path, st.st_uid, st.st_gid)
                changed.append(path)
        except OSError as exc:
            log.warning("could not give %s to the data folder's owner (uid %d): %s", path, st.st_uid, exc)
    return changed


def _desk_command(cmd: str, args: argparse.Namespace, data: Path, file: ServeFile) -> None:
    """``invite``, ``pending`` and ``approve``: enrolment by certificate (:mod:`coordinator.server.enrol_desk`)."""
    from coordinator.server import enrol_desk

    if cmd == "approve":
        for line in enrol_desk.approve(data, file, args.code, args.owner):
            print(line)
        return
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

    inv = enrol_desk.invitation(file, args.host)
    payload = invitation_payload(inv)
    folder = data / "enrolment"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    js, png = folder / "invitation.json", folder / "invitation.png"
    _write_private(js, inv.to_json().encode())
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


def main(cmd: str, argv: list[str]) -> int:
    """``fedhar-coordinator CMD ...`` for CMD in enrol, invite, pending, approve, reissue, rename, revoke, forget, devices, versions.

    ``enroll`` is an alias of ``enrol`` (the one spelling in messages and docs).

    0 done; 2 bad options, settings or name (the message says which); 4 the broker refused the
    administration; 6 a damaged database.
    """
    cmd = ALIASES.get(cmd, cmd)
    args = _parser(cmd).parse_args(argv)
    setup_logging(args.log_level)
    data = args.data or default_data_dir()
    prog = f"fedhar-coordinator {cmd}"
    try:
        return _run(cmd, args, data, prog)
    finally:
        match_data_owner(data)


def _run(cmd: str, args: argparse.Namespace, data: Path, prog: str) -> int:
    errors: ErrorExits = [
        ((RegistryDamaged, StateDamaged), Exit.FOLDER_UNUSABLE),
        ((ValueError, OSError, DeviceCommandError), Exit.USAGE),
        (RuntimeError, Exit.BROKER_REFUSED),  # BrokerAdminError (a RuntimeError): the broker could not be administered
    ]
    return exit_status_of(prog, lambda: _command(cmd, args, data, prog), errors)


def _command(cmd: str, args: argparse.Namespace, data: Path, prog: str) -> int | None:
    file = read_serve_file(args.config or data / "server.toml")
    if cmd == "enrol":
        js, png, qr = enrol(data, file, args.name, args.owner)
        print(qr)
        print(f"{args.name} enrolled. Scan the code above with the app (Federation > Enrol), or give the device")
        print(f"  {js}  (fedhar-client --enrolment {js.name})")
        print(f"  {png}  (the same as a QR code image)")
        print("Both files hold the device's password (mode 0600); they are deleted once the device has joined, or after a week.")
    elif cmd in ("reissue", "rename"):
        if cmd == "reissue":
            name, bundle = args.name, reissue(data, file, args.name)
            said = f"{name} re-issued: its old password is refused from now on. Scan the code above with the app, or give the device"
        else:
            name = args.new
            done, bundle = rename(data, file, args.old, args.new)
            for line in done:
                print(line)
            said = f"{args.old} renamed to {name}. The device must load its new bundle: scan the code above, or give it"
        if bundle is None:  # enrolled by certificate: no secret from the server
            what = "re-issued: its certificate is refused from now on" if cmd == "reissue" else f"renamed from {args.old}"
            print(f"{name} {what}. It was enrolled by certificate, so it gets no bundle: on the device, make a new key and ask")
            print(f"  fedhar-client request-certificate --invitation invitation.json --client-id {name} --new-key   (or the app)")
            print(f"then compare the code it shows with {prog.rsplit(' ', 1)[0]} pending --data {data}, and approve it:")
            print(f"  {prog.rsplit(' ', 1)[0]} approve CODE --data {data}")
            return None
        js, png, qr = bundle
        print(qr)
        print(said)
        print(f"  {js}  (fedhar-client --enrolment {js.name})")
        print(f"  {png}  (the same bundle as a QR code image)")
        print("Both files hold the device's password (mode 0600); they are deleted once the device has joined.")
    elif cmd in ("invite", "pending", "approve"):
        _desk_command(cmd, args, data, file)
    elif cmd in ("revoke", "forget"):
        for line in (revoke if cmd == "revoke" else forget)(data, file, args.name):
            print(line)
    elif cmd == "devices":
        from coordinator.server.lifecycle import prune_bundles

        _existing_registry(data)
        online = online_states(file)
        if not args.keep_bundles:
            joined = {n for n, st in (online or {}).items() if st != "offline"}
            for name in prune_bundles(data, joined):
                print(f"deleted the enrolment bundle of {name} (joined, revoked or older than a week)", file=sys.stderr)
        rows = device_table(data, online)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                r["enrolled"], r["revoked"] = _when(r["enrolled_unix"]), _when(r["revoked_unix"])
            _print_table(rows, ["name", "owner", "state", "online", "rounds", "last_round", "enrolled", "revoked", "renamed_to"])
            from coordinator.server.lifecycle import leave_lines

            for line in leave_lines(data):
                print(line)
    elif cmd == "versions":
        vrows = version_table(data)
        if args.json:
            print(json.dumps(vrows, indent=1))
        else:
            for r in vrows:
                f = read_figures(r["figures"])  # older releases wrote personalization_*
                r["created"] = _when(r["created_unix"])
                r["pers_f1"] = None if f.get("personalisation_macro_f1") is None else f"{100 * f['personalisation_macro_f1']:.1f}%"
                r["global_f1"] = None if f.get("global_macro_f1") is None else f"{100 * f['global_macro_f1']:.1f}%"
                r["updates"] = f.get("updates")
            _print_table(vrows, ["version", "mark", "round", "created", "arch_version", "updates", "pers_f1", "global_f1", "path"])
    elif cmd in ("pin", "rollback"):
        for line in request_model(data, cmd, args.version):
            print(line)
    else:
        print(f"{prog}: unknown command", file=sys.stderr)
        return Exit.USAGE
    return Exit.OK
