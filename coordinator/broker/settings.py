"""The settings of one federation's broker folder: what they are, how they are checked, and where they are kept.

The folder's manifest (:data:`MANIFEST_NAME`) remembers :class:`BrokerSettings`, so a later run with
only ``--out`` keeps every setting not given again (:func:`merge_settings`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from har_io.exit_codes import Exit
from har_models.wire.chunking import DEFAULT_MAX_MESSAGE_BYTES
from har_models.wire.topics import Topics, check_client_id

MANIFEST_NAME = "fedhar-broker.json"


PASSWORD_SUFFIX = ".password"


PACKET_MARGIN_BYTES = 64 * 1024
"""Room in ``max_packet_size`` above the largest fedhar payload for the topic and MQTT headers (bytes)."""


PID_FILE_NAME = "data/mosquitto.pid"
"""Where the broker writes its process id (``pid_file``), for a reload; in ``data/``, the one folder
``broker_user`` owns (a PID file it cannot write stops the broker at start)."""


LOCK_NAME = ".fedhar-broker.lock"
"""Lock file in the output folder: one generator run at a time."""


TLS_DIR = "tls"
"""Folder holding the broker's copies of its certificate, key and CA."""


ENROL_USER = "enrol"
"""The shared enrolment account of a folder with device certificates: it may only leave requests
(``.../enrol/<code>``), read replies and the CA; its password is in the invitation."""

ENROL_DESK_USER = "enrol-desk"
"""The account ``fedhar-coordinator pending`` and ``approve`` log in with (loopback): reads requests, writes replies."""


UPSTREAM_SECRET = "credentials/upstream.secret"
"""A regional broker's password for the upstream broker (mode 0600; not a ``.password`` file, so never a device's)."""


HOME_ASSISTANT_USER = "homeassistant"
"""The account of the removed ``--home-assistant`` option; the next run removes it from a folder that has it."""


class SetupError(Exception):
    """The configuration cannot be written; the message says what was wrong and how to fix it.

    ``exit_code`` is :attr:`Exit.USAGE` (2) for bad arguments or files, :attr:`Exit.DATA` (3) when
    ``mosquitto_passwd`` is missing or fails.
    """

    def __init__(self, message: str, exit_code: int = Exit.USAGE):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class BrokerSettings:
    """Everything that shapes the generated broker configuration.

    ``federation``: topics live under ``fedhar/v1/{federation}``. ``bind`` None is 127.0.0.1 with TLS,
    else all interfaces (""). ``tls_cert``/``tls_key`` enable the TLS listener; ``tls_ca`` is what clients
    verify the broker with, and with ``require_client_cert`` what signs device certificates.
    ``max_message_bytes`` is the largest payload fedhar programs publish (bytes); ``max_queued_messages``
    the QoS 1 queue per client. ``public_host`` only shapes the printed commands. ``monitor_user`` is the
    read-only account of the status page. ``bridge_users`` (coordinator's broker) and ``upstream``,
    ``upstream_user``, ``upstream_ca`` (a regional broker, :mod:`coordinator.broker.bridge`) set up
    bridges. ``device_cert_port`` adds a certificate listener (CN as user name) with the device CA and the
    enrolment accounts; it needs TLS. No device may use a service account.
    """

    federation: str
    coordinator_user: str = "coordinator"
    port: int = 1883
    bind: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_port: int = 8883
    tls_bind: str = ""
    require_client_cert: bool = False
    broker_user: str = "mosquitto"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_queued_messages: int = 10_000
    public_host: str | None = None
    monitor_user: str = "monitor"
    bridge_users: tuple[str, ...] = ()
    upstream: str | None = None
    upstream_user: str | None = None
    upstream_ca: str | None = None
    device_cert_port: int | None = None

    @property
    def service_users(self) -> list[str]:
        """The accounts that are not devices: coordinator, monitor, bridges and, with device certificates, enrolment."""
        enrol = (ENROL_USER, ENROL_DESK_USER) if self.device_cert_port is not None else ()
        return [self.coordinator_user, self.monitor_user, *self.bridge_users, *enrol]

    @property
    def upstream_address(self) -> tuple[str, int] | None:
        """(host, port) of :attr:`upstream`, or None; SetupError unless ``HOST:PORT`` with a port in 1..65535."""
        if self.upstream is None:
            return None
        host, sep, port = self.upstream.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SetupError(f"--upstream {self.upstream!r}: expected HOST:PORT of the coordinator's broker, e.g. broker.example.org:8883")
        return host, int(port)

    @property
    def tls(self) -> bool:
        """True when the TLS listener is configured."""
        return self.tls_cert is not None

    @property
    def plain_bind(self) -> str:
        """Address of the plain listener ("" = all interfaces)."""
        if self.bind is not None:
            return self.bind
        return "127.0.0.1" if self.tls else ""

    @property
    def max_packet_size(self) -> int:
        """Mosquitto's ``max_packet_size``: the largest fedhar payload plus :data:`PACKET_MARGIN_BYTES`."""
        return self.max_message_bytes + PACKET_MARGIN_BYTES


DEFAULTS: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f in fields(BrokerSettings)}
"""Every setting with its default (None: required or derived); a re-run takes those not given from the manifest."""


def checked_id(name: str, what: str = "") -> str:
    """``name`` if it is a valid client id, else SetupError with the rule (after ``what: `` when given)."""
    try:
        return check_client_id(name)
    except ValueError as exc:
        raise SetupError(f"{what}: {exc}" if what else str(exc)) from None


def parse_ids(text: str) -> list[str]:
    """Client ids from a comma- or whitespace-separated string, validated, in order, without duplicates.

    Raises SetupError naming the first invalid id and the allowed characters.
    """
    ids: list[str] = []
    for raw in re.split(r"[,\s]+", text.strip()):
        if not raw:
            continue
        cid = checked_id(raw)
        if cid not in ids:
            ids.append(cid)
    return ids


def read_clients_file(path: Path) -> list[str]:
    """Client ids from a text file: one or more per line (comma or space separated), ``#`` starts a comment.

    Raises SetupError if the file cannot be read, or naming an invalid id and its line.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SetupError(f"--clients-file {path}: {exc.strerror or exc}") from None
    ids: list[str] = []
    for n, line in enumerate(lines, 1):
        try:
            ids += [c for c in parse_ids(line.split("#", 1)[0]) if c not in ids]
        except SetupError as exc:
            raise SetupError(f"--clients-file {path}, line {n}: {exc}") from None
    return ids


def check_settings(settings: BrokerSettings) -> BrokerSettings:
    """Validate ``settings`` and return them with TLS paths made absolute.

    Raises SetupError for a bad name or port, equal ports, a certificate without its key, an unreadable
    TLS file, mutual TLS without a CA, an inconsistent bridge or a message size too small for chunks.
    """
    s = settings
    try:
        Topics(s.federation)
    except ValueError as exc:
        raise SetupError(f"--federation: {exc}") from None
    checked_id(s.coordinator_user, "--coordinator-user")
    checked_id(s.monitor_user, "--monitor-user")
    if s.monitor_user == s.coordinator_user:
        raise SetupError(f"--monitor-user and --coordinator-user are both {s.monitor_user!r}; the monitor needs its own account")
    for user in s.bridge_users:
        checked_id(user, "bridge account")
        if user in (s.coordinator_user, s.monitor_user):
            raise SetupError(f"bridge account {user!r} is the coordinator's or the monitor's user name; name the bridge otherwise")
    if s.upstream is not None:
        _ = s.upstream_address  # raises SetupError for a malformed address
        if s.upstream_user is None:
            raise SetupError("--upstream needs the bridge's account upstream (fedhar-coordinator broker bridge init makes it)")
        checked_id(s.upstream_user, "bridge account")
    elif s.upstream_ca is not None:
        raise SetupError("--upstream-ca without --upstream: only a regional broker's bridge verifies an upstream broker")
    for name, port in (("--port", s.port), ("--tls-port", s.tls_port)):
        if not 0 < port < 65536:
            raise SetupError(f"{name} {port} is not a TCP port (1..65535)")
    if (s.tls_cert is None) != (s.tls_key is None):
        raise SetupError("--tls-cert and --tls-key go together (the server certificate and its private key)")
    if s.tls and s.port == s.tls_port:
        raise SetupError(f"--port and --tls-port are both {s.port}; the plain and the TLS listener need different ports")
    if s.device_cert_port is not None:
        if not s.tls:
            raise SetupError("--device-cert-port needs --tls-cert and --tls-key: devices trust the broker by its certificate")
        if not 0 < s.device_cert_port < 65536 or s.device_cert_port in (s.port, s.tls_port):
            raise SetupError(f"--device-cert-port {s.device_cert_port}: give a TCP port (1..65535) other than --port and --tls-port")
        if s.require_client_cert:
            raise SetupError("--device-cert-port with --require-client-cert: enrolment needs the password listener; drop one of them")
    if s.require_client_cert and not (s.tls and s.tls_ca):
        raise SetupError("--require-client-cert needs --tls-cert, --tls-key and --tls-ca (the CA that signs device certificates)")
    if s.tls_ca and not s.tls:
        raise SetupError("--tls-ca without --tls-cert/--tls-key: the broker needs its own certificate and key to offer TLS")
    def readable(name: str, value: str | None) -> str | None:
        if value is None:
            return None
        p = Path(value).expanduser().resolve()
        if not p.is_file() or not os.access(p, os.R_OK):
            raise SetupError(f"--{name} {value}: no readable file there (see --help for the openssl commands)")
        return str(p)

    if s.max_message_bytes < 1024:
        raise SetupError(f"--max-message-bytes {s.max_message_bytes} is too small; fedhar's default is {DEFAULT_MAX_MESSAGE_BYTES}")
    if s.max_queued_messages < 100:
        raise SetupError(f"--max-queued-messages {s.max_queued_messages} is too small for chunked models; use 1000 or more")
    return replace(
        s, tls_cert=readable("tls-cert", s.tls_cert), tls_key=readable("tls-key", s.tls_key), tls_ca=readable("tls-ca", s.tls_ca),
        upstream_ca=readable("upstream-ca", s.upstream_ca),
    )


def load_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the folder ``out`` as a dict (``{}`` if none yet); SetupError if unreadable or not fedhar's."""
    path = out / MANIFEST_NAME
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SetupError(f"{path} is unreadable ({exc}); remove it and pass every option again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("settings"), dict):
        raise SetupError(f"{path} is not a fedhar broker manifest; use another --out folder")
    return doc


def merge_settings(given: dict[str, Any], out: Path) -> BrokerSettings:
    """Settings for this run: those ``given`` (None = not given), else the manifest's in ``out``, else the defaults.

    Raises SetupError if no federation is known, or ``given`` changes the federation, the coordinator's or
    the monitor's user name of an existing folder (that would orphan its credentials).
    """
    before = load_manifest(out).get("settings", {})
    merged: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        if given.get(key) is not None:
            merged[key] = given[key]
        elif before.get(key) is not None:
            merged[key] = before[key]
        else:
            merged[key] = default
    for key in ("tls_cert", "tls_key", "tls_ca"):
        if merged[key] == "":  # --no-tls
            merged[key] = None
    merged["bridge_users"] = tuple(merged["bridge_users"])  # a JSON list in the manifest
    if merged["federation"] is None:
        raise SetupError("--federation is required on the first run in a folder")
    for key in ("federation", "coordinator_user", "monitor_user"):
        if before.get(key) is not None and merged[key] != before[key]:
            raise SetupError(
                f"{out} was generated with {key.replace('_', '-')} {before[key]!r}, not {merged[key]!r}; "
                "use another --out folder for a different one"
            )
    return BrokerSettings(**merged)


def require_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the broker folder ``out``; SetupError (saying how to generate one) if missing or unreadable."""
    out = out.expanduser().resolve()
    if not (out / MANIFEST_NAME).is_file():
        what = "does not exist" if not out.exists() else f"holds no {MANIFEST_NAME}"
        raise SetupError(
            f"broker folder {out} {what}: generate it first with "
            f"fedhar-coordinator broker init --out {out} --federation NAME"
        )
    return load_manifest(out)


def read_settings(out: Path) -> BrokerSettings:
    """The settings of the generated broker folder ``out`` (manifest, defaults for missing keys); SetupError as above."""
    require_manifest(out)
    return merge_settings({}, out.expanduser().resolve())
