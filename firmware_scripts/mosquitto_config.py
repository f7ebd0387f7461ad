#!/usr/bin/env python3
"""Write a Mosquitto configuration for one fedhar federation: per-device passwords, ACLs, optional TLS.

Usage (from a checkout; needs only Python and the ``mosquitto_passwd`` tool that ships with Mosquitto)::

    python3 firmware_scripts/mosquitto_config.py --federation home --clients phone-anna,pi-kitchen --out broker/

The output folder then holds:

* ``mosquitto.conf``: listeners (plain, and TLS when a certificate is given), no anonymous
  access, the password and ACL files, a packet limit sized for fedhar's chunked models,
  persistence under ``data/``, and the broker's ``pid_file`` (``data/mosquitto.pid``), through which
  a reload finds the running broker;
* ``acl``: the coordinator may read and write the whole federation; the read-only monitor
  account (``--monitor-user``, default ``monitor``) may read the whole federation and write
  nothing, so a status page can watch it without logging in as the coordinator (which would
  disconnect the running coordinator: one session per user name); a device may write only its
  own status, update and program-request topics and read the round, the coordinator's status,
  the global model, and its own personalised model, receipts and programs. Every rule is a
  ``topic`` line under its ``user``; a ``%u`` pattern would apply to the monitor too. With
  ``--home-assistant`` the coordinator may also write ``homeassistant/#`` (MQTT discovery) and
  read ``homeassistant/status`` (Home Assistant's birth message), and Home Assistant's account
  ``homeassistant`` reads ``homeassistant/#`` and writes only ``homeassistant/status``;
* ``passwd``: hashed by ``mosquitto_passwd`` (this script never hashes a password itself);
* ``credentials/<user>.password``: each user's password (mode 0600), to copy to its device;
* ``tls/``: copies of the ``--tls-cert``, ``--tls-key`` and ``--tls-ca`` files, which
  ``mosquitto.conf`` names (the key mode 0640, group of ``--broker-user`` when run as root), so the
  broker, which reads them after switching to its own account, never depends on where or with
  which permissions they were made (``/root``, a home folder);
* ``fedhar-broker.json``: the settings, so a re-run with only ``--out`` and new ``--clients``
  keeps everything else (``--home-assistant`` included).

Re-running adds clients and keeps every existing password, unless ``--rotate`` asks for new
ones; ``--revoke`` removes devices. The coordinator's and the monitor's accounts are created on
the first run and on a re-run of a folder that lacks them. Reload a running broker afterwards
(``kill -HUP $(cat <out>/data/mosquitto.pid)``). On that reload Mosquitto 2 closes the live session of
a revoked device (without its last will) and refuses its old password from then on.

The home server changes one device at a time through :func:`add_device` and :func:`remove_device`
(``coordinator/server/broker_admin.py`` calls them and reloads the broker); each regenerates
``passwd`` and ``acl`` (every file replaced atomically) under a lock on the folder, so it never
interleaves with a run of this script.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

try:
    from har_models.files import atomic_write, atomic_write_bytes
    from har_models.wire.chunking import DEFAULT_MAX_MESSAGE_BYTES
    from har_models.wire.topics import Topics, check_client_id
except ImportError:  # run from a checkout without `pip install -e .`: both modules need only the stdlib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from har_models.files import atomic_write, atomic_write_bytes
    from har_models.wire.chunking import DEFAULT_MAX_MESSAGE_BYTES
    from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.mosquitto_config")

MANIFEST_NAME = "fedhar-broker.json"
PASSWORD_SUFFIX = ".password"
PACKET_MARGIN_BYTES = 64 * 1024
"""Room in ``max_packet_size`` above the largest fedhar payload for the topic and MQTT headers (bytes)."""
PID_FILE_NAME = "data/mosquitto.pid"
"""Where in the output folder the broker writes its process id (``pid_file`` in the generated mosquitto.conf), so a
reload can find it. In ``data/``: Mosquitto writes it after switching to ``broker_user``, which owns only that folder
(a PID file it cannot write stops the broker at start)."""
HOME_ASSISTANT_PREFIX = "homeassistant"
"""Home Assistant's default MQTT discovery prefix; its birth and last-will messages go to ``<prefix>/status``."""
HOME_ASSISTANT_USER = "homeassistant"
"""Home Assistant's own account, with ``--home-assistant``: it reads the discovery topics and announces itself."""
LOCK_NAME = ".fedhar-broker.lock"
"""Lock file in the output folder: one generator run (CLI or :func:`add_device`/:func:`remove_device`) at a time."""
PASSWORD_BYTES = 24
"""Random bytes per password (``secrets.token_urlsafe``: 32 characters, 192 bits)."""

OPENSSL_HELP = """\
TLS certificates (once, on the operator's machine; keep ca.key offline). Replace homeserver and
the address with the names and addresses devices use to reach the broker:

  openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=fedhar CA" \\
      -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout ca.key -out ca.crt
  openssl req -newkey rsa:3072 -nodes -subj "/CN=homeserver" -keyout server.key -out server.csr
  printf '%s\\n' "subjectAltName=DNS:homeserver,DNS:homeserver.local,IP:192.168.1.10" \\
      "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \\
      "authorityKeyIdentifier=keyid,issuer" > server.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \\
      -extfile server.ext -out server.crt

then pass --tls-cert server.crt --tls-key server.key --tls-ca ca.crt, and copy ca.crt (never a
key) to every device (fedhar-client --tls-ca ca.crt). The three files are copied into the output
folder's tls/ (the key readable by the broker's account only), so the broker never reads them
where they were made; run this script again with the three options after renewing them.
"""

class SetupError(Exception):
    """The configuration cannot be written; the message says what was wrong and how to fix it.

    ``exit_code`` is 2 for bad arguments or files, 3 when ``mosquitto_passwd`` is missing or fails.
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class BrokerSettings:
    """Everything that shapes the generated broker configuration.

    Parameters
    ----------
    federation : str
        Federation name; topics live under ``fedhar/v1/{federation}``.
    coordinator_user : str
        User name of the coordinator (readwrite on the whole federation). No device may use it.
    port : int
        Port of the plain MQTT listener.
    bind : str, optional
        Address of the plain listener; None = 127.0.0.1 when TLS is on, else all interfaces ("").
    tls_cert, tls_key, tls_ca : str, optional
        Absolute paths of the server certificate, its key and the CA certificate (PEM). Cert and
        key enable the TLS listener; the CA is what clients verify the broker with.
    tls_port : int
        Port of the TLS listener.
    tls_bind : str
        Address of the TLS listener ("" = all interfaces).
    require_client_cert : bool
        Mutual TLS: devices must also present a certificate signed by ``tls_ca``.
    broker_user : str
        Account the broker switches to when started as root (Mosquitto's ``user``).
    max_message_bytes : int
        Largest MQTT payload fedhar programs publish (their ``--max-message-bytes``), bytes.
    max_queued_messages : int
        QoS 1 messages Mosquitto queues per client beyond its in-flight window.
    public_host : str, optional
        Host name devices use for the broker, only for the printed commands; None = this host's name.
    monitor_user : str
        User name of the read-only monitor account (reads the whole federation, writes nothing),
        for a status page that watches the federation without logging in as the coordinator.
        No device may use it.
    home_assistant : bool
        The coordinator may also write Home Assistant's MQTT discovery topics (``homeassistant/#``)
        and read its birth message (``homeassistant/status``); Home Assistant gets an account
        :data:`HOME_ASSISTANT_USER` that reads ``homeassistant/#`` and writes only ``homeassistant/status``.
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
    home_assistant: bool = False

    @property
    def service_users(self) -> list[str]:
        """The accounts that are not devices: coordinator, monitor and (with ``home_assistant``) Home Assistant's."""
        return [self.coordinator_user, self.monitor_user, *([HOME_ASSISTANT_USER] if self.home_assistant else [])]

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
        """Mosquitto's ``max_packet_size``: the largest fedhar payload plus room for topic and headers (bytes)."""
        return self.max_message_bytes + PACKET_MARGIN_BYTES


DEFAULTS: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f in fields(BrokerSettings)}
"""Every setting with its default (None: required or derived). The manifest remembers them, so a re-run takes
each one not given on its command line from there."""


@dataclass
class Outcome:
    """What one run of the generator did.

    Attributes
    ----------
    out : Path
        The output folder (absolute).
    settings : BrokerSettings
    clients : list of str
        Device user names now configured, sorted.
    added, rotated, revoked, kept : list of str
        User names whose password was created, replaced, removed, or left as it was.
    """

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


# ----------------------------------------------------------------------------------- text of the files
def acl_text(settings: BrokerSettings, clients: list[str]) -> str:
    """The Mosquitto ACL file for ``settings.federation`` and the devices ``clients``.

    * The coordinator reads and writes everything under the federation prefix (with
      ``home_assistant`` also writes ``homeassistant/#`` and reads ``homeassistant/status``).
    * The monitor reads everything under the federation prefix and writes nothing.
    * Each device (user name = fedhar client id) reads the round announcement, the coordinator's
      status, the global model, its own personalised model, the receipts for its updates and
      the ExecuTorch programs sent to it; it reads and writes its own status and writes only its
      own update chunks and program requests. It cannot read other devices' statuses (they
      carry label counts and data statistics), updates or models, nor write anything else.
    * With ``home_assistant``, Home Assistant's account reads ``homeassistant/#`` and writes
      only ``homeassistant/status``.

    Whatever is not granted is denied. Every rule is a ``topic`` line under its ``user``: a
    ``pattern`` line (``%u``) would apply to every account, so the monitor could then write
    ``{p}/client/monitor/status`` as if it were a device.

    Parameters
    ----------
    settings : BrokerSettings
    clients : list of str
        Device user names (validated client ids, none of them an account of ``settings.service_users``).

    Returns
    -------
    str
        The file's text.
    """
    t = Topics(settings.federation)
    ha = HOME_ASSISTANT_PREFIX
    lines = [
        f"# Mosquitto ACL of the fedhar federation {settings.federation!r} (topics {t.prefix}/...).",
        "# Written by firmware_scripts/mosquitto_config.py; re-run it rather than editing this file.",
        "# Whatever is not granted here is denied.",
        "",
        "# The coordinator runs the federation: it reads statuses and updates, writes rounds, models and its status.",
        f"user {settings.coordinator_user}",
        f"topic readwrite {t.prefix}/#",
    ]
    if settings.home_assistant:
        lines += [
            "# ... and announces its entities to Home Assistant (MQTT discovery), republishing them on its birth message.",
            f"topic write {ha}/#",
            f"topic read {ha}/status",
        ]
    lines += [
        "",
        "# The monitor (a status page) reads the whole federation and writes nothing.",
        f"user {settings.monitor_user}",
        f"topic read {t.prefix}/#",
        "",
    ]
    if settings.home_assistant:
        lines += [
            "# Home Assistant reads the discovery topics and publishes only its birth and last-will message.",
            f"user {HOME_ASSISTANT_USER}",
            f"topic read {ha}/#",
            f"topic write {ha}/status",
            "",
        ]
    lines += [
        "# Each device reads the round announcement, the coordinator's presence, the global model, its own",
        "# personalised model and the coordinator's receipts for its updates; it reads and writes its own status",
        "# (retained, and its last will; reading it shows a second process using the same id) and writes only its",
        "# own update chunks. An ExecuTorch device asks for programs and reads only those sent to it.",
    ]
    for cid in clients:
        lines += [
            f"user {cid}",
            f"topic read {t.round}",
            f"topic read {t.coordinator_status}",
            f"topic read {t.global_model('+')}",
            f"topic read {t.client_model(cid, '+')}",
            f"topic read {t.client_receipt(cid)}",
            f"topic readwrite {t.client_status(cid)}",
            f"topic write {t.client_update(cid, '+')}",
            f"topic write {t.client_program_request(cid)}",
            f"topic read {t.client_programs(cid, '+')}",
            "",
        ]
    return "\n".join(lines)


def config_text(settings: BrokerSettings, out: Path) -> str:
    """The ``mosquitto.conf`` for ``settings``, naming files inside the absolute folder ``out``.

    Parameters
    ----------
    settings : BrokerSettings
    out : Path
        Absolute output folder; ``passwd``, ``acl`` and ``data/`` are referred to inside it.

    Returns
    -------
    str
        The file's text.
    """
    s = settings
    lines = [
        f"# Mosquitto configuration of the fedhar federation {s.federation!r}.",
        "# Written by firmware_scripts/mosquitto_config.py; re-run it rather than editing this file.",
        f"# Start: mosquitto -c {out / 'mosquitto.conf'}    Reload users and ACL: kill -HUP $(cat {out / PID_FILE_NAME})",
        "",
        "# The broker's process id, for a reload after an account was added or removed (the fedhar server's",
        "# BrokerAdmin reads it from here). A reload drops the live session of a removed account.",
        f"pid_file {out / PID_FILE_NAME}",
        "",
        "# Every client logs in with its own user name and password; the ACL decides what it may read and write.",
        "# The same rules hold on every listener.",
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {out / 'passwd'}",
        f"acl_file {out / 'acl'}",
        "",
        f"# fedhar publishes at most {s.max_message_bytes} payload bytes per message (models travel in chunks);",
        f"# the topic and MQTT headers fit in the {PACKET_MARGIN_BYTES}-byte margin. A larger packet disconnects its sender.",
        f"max_packet_size {s.max_packet_size}",
        "# In a round the coordinator receives every selected device's update chunks at once. QoS 1 messages",
        "# beyond this queue would be dropped and stall a transfer until the round's deadline.",
        "max_inflight_messages 20",
        f"max_queued_messages {s.max_queued_messages}",
        "",
        "# Retained rounds, models and presence survive a broker restart.",
        "persistence true",
        f"persistence_location {out / 'data'}/",
        "autosave_interval 300",
        "",
        "# Started as root, the broker switches to this account (it must be able to read passwd, acl and the TLS key).",
        f"user {s.broker_user}",
        "# stderr is unbuffered (stdout is not): lines reach a terminal or the systemd journal at once.",
        "log_dest stderr",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        "connection_messages true",
        "",
        "# Each listener takes the user name as the session id, so a device cannot take over another device's",
        "# session by connecting with its MQTT client id: one connection per user name. (Set before any",
        "# listener line, use_username_as_clientid would open an extra default listener on port 1883.)",
        "",
        "# Plain MQTT" + (" (loopback only by default: local programs such as the coordinator)" if s.tls else ""),
        f"listener {s.port} {s.plain_bind}".rstrip(),
        "protocol mqtt",
        "use_username_as_clientid true",
    ]
    if s.tls:
        lines += [
            "",
            "# MQTT over TLS, for devices",
            f"listener {s.tls_port} {s.tls_bind}".rstrip(),
            "protocol mqtt",
            "use_username_as_clientid true",
            f"certfile {s.tls_cert}",
            f"keyfile {s.tls_key}",
        ]
        if s.tls_ca:
            lines.append(f"cafile {s.tls_ca}")
        lines += [
            f"require_certificate {'true' if s.require_client_cert else 'false'}",
            "tls_version tlsv1.2",
        ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- inputs
def parse_ids(text: str) -> list[str]:
    """Client ids from a comma- or whitespace-separated string, validated.

    Parameters
    ----------
    text : str
        E.g. ``"hapt-01, hapt-02"``.

    Returns
    -------
    list of str
        The ids in order, duplicates removed.

    Raises
    ------
    SetupError
        Naming the first invalid id and the allowed characters.
    """
    ids: list[str] = []
    for raw in re.split(r"[,\s]+", text.strip()):
        if not raw:
            continue
        try:
            cid = check_client_id(raw)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
        if cid not in ids:
            ids.append(cid)
    return ids


def read_clients_file(path: Path) -> list[str]:
    """Client ids from a text file: one or more per line (comma or space separated), ``#`` starts a comment.

    Raises
    ------
    SetupError
        If the file cannot be read, or naming an invalid id and its line.
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

    Raises
    ------
    SetupError
        For an invalid federation or coordinator name, a port outside 1..65535, equal ports,
        a certificate without its key (or the reverse), a TLS file that cannot be read,
        mutual TLS without a CA, or a message size too small for fedhar's chunks.
    """
    s = settings
    try:
        Topics(s.federation)
    except ValueError as exc:
        raise SetupError(f"--federation: {exc}") from None
    try:
        check_client_id(s.coordinator_user)
    except ValueError as exc:
        raise SetupError(f"--coordinator-user: {exc}") from None
    try:
        check_client_id(s.monitor_user)
    except ValueError as exc:
        raise SetupError(f"--monitor-user: {exc}") from None
    if s.monitor_user == s.coordinator_user:
        raise SetupError(f"--monitor-user and --coordinator-user are both {s.monitor_user!r}; the monitor needs its own account")
    if HOME_ASSISTANT_USER in (s.coordinator_user, s.monitor_user) and s.home_assistant:
        raise SetupError(
            f"{HOME_ASSISTANT_USER!r} is Home Assistant's account with --home-assistant; name the coordinator and the monitor otherwise"
        )
    for name, port in (("--port", s.port), ("--tls-port", s.tls_port)):
        if not 0 < port < 65536:
            raise SetupError(f"{name} {port} is not a TCP port (1..65535)")
    if (s.tls_cert is None) != (s.tls_key is None):
        raise SetupError("--tls-cert and --tls-key go together (the server certificate and its private key)")
    if s.tls and s.port == s.tls_port:
        raise SetupError(f"--port and --tls-port are both {s.port}; the plain and the TLS listener need different ports")
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
        s, tls_cert=readable("tls-cert", s.tls_cert), tls_key=readable("tls-key", s.tls_key), tls_ca=readable("tls-ca", s.tls_ca)
    )


def find_mosquitto_passwd(explicit: str | None = None) -> str:
    """Path of the ``mosquitto_passwd`` executable.

    Parameters
    ----------
    explicit : str, optional
        A path given by the user; else ``$PATH`` and ``/usr/bin`` are searched.

    Raises
    ------
    SetupError
        (exit code 3) If it is not found: it ships with Mosquitto.
    """
    if explicit:
        if shutil.which(explicit):
            return explicit
        raise SetupError(f"--mosquitto-passwd {explicit}: not an executable file", exit_code=3)
    found = shutil.which("mosquitto_passwd") or next(
        (p for p in ("/usr/bin/mosquitto_passwd", "/usr/local/bin/mosquitto_passwd") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise SetupError(
            "mosquitto_passwd not found: install Mosquitto, which ships it (Debian, Ubuntu, Raspberry Pi OS: "
            "sudo apt-get install mosquitto; macOS: brew install mosquitto), or pass --mosquitto-passwd PATH",
            exit_code=3,
        )
    return found


# ----------------------------------------------------------------------------------- writing
def _write_atomic(path: Path, text: str, mode: int) -> None:
    atomic_write_bytes(path, text, mode=mode)


def _broker_access(path: Path) -> tuple[int, int] | None:
    """(permission bits, group id) of the broker-read file ``path`` as it is now, or None if it does not exist.

    A replacement keeps both: when the broker runs as another account that reads ``passwd`` and
    ``acl`` through their group (``chgrp mosquitto``, mode 0640), a file it cannot read would make
    Mosquitto 2 drop every password account on its next reload (measured with 2.0.11: every
    session closed, every login refused).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mode & 0o777, st.st_gid


def _give_access(tmp: Path, target: Path, access: tuple[int, int] | None) -> None:
    """Give the not yet renamed ``tmp`` the mode and group ``target`` had (see :func:`_broker_access`).

    Raises
    ------
    SetupError
        If this account may not give a file that group (it is not a member); ``target`` is untouched.
    """
    if access is None:
        return
    mode, gid = access
    os.chmod(tmp, mode)
    if gid != os.stat(tmp).st_gid:
        try:
            os.chown(tmp, -1, gid)
        except PermissionError:
            raise SetupError(
                f"{target} belongs to group {gid}, through which the broker reads it, and this account cannot give the new "
                f"file that group: add this account to the group (usermod -a -G <group> $USER) or run as the folder's owner"
            ) from None


def _write_broker_file(path: Path, text: str) -> None:
    """Replace the broker-read ``path`` (the ACL) atomically, keeping its mode and group (new files: 0600)."""
    access = _broker_access(path)

    def write(tmp: Path) -> None:
        tmp.write_text(text)
        _give_access(tmp, path, access)

    atomic_write(path, write, mode=None if access else 0o600)


def write_passwd(path: Path, passwords: dict[str, str], mosquitto_passwd: str) -> None:
    """Write Mosquitto's password file for ``passwords`` (user -> clear-text password), hashed by ``mosquitto_passwd``.

    The clear-text lines go to a private temporary file next to ``path`` that ``mosquitto_passwd -U``
    hashes in place (one process, and no password ever appears on a command line); it then
    replaces ``path`` atomically, with the mode and group ``path`` had (new: 0600), so a broker
    that reads it through its group still can. The temporary file is removed whatever happens.

    Parameters
    ----------
    path : Path
        The password file to (re)write.
    passwords : dict of str to str
        User names (fedhar ids, so never containing ``:``) and their passwords.
    mosquitto_passwd : str
        The executable (see :func:`find_mosquitto_passwd`).

    Raises
    ------
    SetupError
        (exit code 3) If ``mosquitto_passwd`` fails or leaves a line unhashed; (exit code 2) if
        the new file cannot be given the old one's group.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".passwd-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{user}:{pw}\n" for user, pw in sorted(passwords.items()))
        r = subprocess.run([mosquitto_passwd, "-U", tmp], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise SetupError(f"{mosquitto_passwd} -U failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()}", exit_code=3)
        lines = Path(tmp).read_text().splitlines()
        hashed = {ln.split(":", 1)[0] for ln in lines if re.match(r"^[^:]+:\$\d+\$", ln)}
        if hashed != set(passwords) or len(lines) != len(passwords):
            raise SetupError(f"{mosquitto_passwd} -U did not hash every password; is it Mosquitto's tool?", exit_code=3)
        _give_access(Path(tmp), path, _broker_access(path))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read_password(path: Path) -> str:
    password = path.read_text().strip()
    if not password or any(c in password for c in ":\n\r"):
        raise SetupError(f"{path}: not a password written by this tool (empty or containing ':'); delete it or use --rotate {path.stem}")
    return password


def _load_manifest(out: Path) -> dict[str, Any]:
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

    Parameters
    ----------
    given : dict
        Keys of :data:`DEFAULTS`; None means "not on the command line".
    out : Path
        The output folder, which may hold the manifest of an earlier run.

    Raises
    ------
    SetupError
        If no federation is known, or ``given`` changes the federation, the coordinator's or the
        monitor's user name of an existing folder (that would orphan its credentials).
    """
    before = _load_manifest(out).get("settings", {})
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
    if merged["federation"] is None:
        raise SetupError("--federation is required on the first run in a folder")
    for key in ("federation", "coordinator_user", "monitor_user"):
        if before.get(key) is not None and merged[key] != before[key]:
            raise SetupError(
                f"{out} was generated with {key.replace('_', '-')} {before[key]!r}, not {merged[key]!r}; "
                "use another --out folder for a different one"
            )
    return BrokerSettings(**merged)


def _grant_broker_access(out: Path, created_out: bool, settings: BrokerSettings) -> None:
    """Started as root, Mosquitto reads passwd and acl and writes data/ as ``broker_user``: give that account access."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return  # the broker runs as the operator, who owns the files
    import pwd

    try:
        account = pwd.getpwnam(settings.broker_user)
    except KeyError:
        raise SetupError(
            f"--broker-user {settings.broker_user}: no such account; install mosquitto (it creates the 'mosquitto' account) "
            "or name the account the broker runs as"
        ) from None
    if account.pw_uid == 0:
        return
    gid = account.pw_gid
    if created_out:
        os.chown(out, 0, gid)
        os.chmod(out, 0o750)
    for name in ("passwd", "acl"):
        os.chown(out / name, 0, gid)
        os.chmod(out / name, 0o640)
    os.chown(out / "data", account.pw_uid, gid)
    os.chmod(out / "data", 0o700)


@contextmanager
def _folder_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out``'s :data:`LOCK_NAME` (blocking), so two runs never interleave their writes."""
    try:
        import fcntl
    except ImportError:  # not on a POSIX system: nothing to lock with
        yield
        return
    with open(out / LOCK_NAME, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def generate(
    out: Path,
    given: dict[str, Any],
    clients: list[str],
    rotate: list[str] | None = None,
    revoke: list[str] | None = None,
    mosquitto_passwd: str | None = None,
) -> Outcome:
    """Write (or update) the broker configuration in ``out``.

    The coordinator's and the monitor's accounts (and Home Assistant's, with
    ``home_assistant``) are created on the first run and on any later run that finds them
    missing, e.g. in a folder written before the monitor account existed. Each file is replaced
    atomically (``passwd`` first, then ``credentials/``, the ACL, ``mosquitto.conf`` and the
    manifest) while the folder's lock is held, so concurrent runs (the CLI and the server's
    :func:`add_device`) take turns. A running broker reads the new files when it reloads.

    Parameters
    ----------
    out : Path
        Output folder; created if missing.
    given : dict
        Settings from the command line (keys of :data:`DEFAULTS`, None = not given); see :func:`merge_settings`.
    clients : list of str
        Device ids to add (validated with :func:`har_models.wire.topics.check_client_id`). Devices
        configured earlier stay configured.
    rotate : list of str, optional
        Users (devices, the coordinator, the monitor) that get a new password; ``["*"]`` = everyone.
    revoke : list of str, optional
        Devices to remove: their password file is deleted and they can no longer log in once
        the broker reloads.
    mosquitto_passwd : str, optional
        Path of ``mosquitto_passwd`` (default: searched, see :func:`find_mosquitto_passwd`).

    Returns
    -------
    Outcome

    Raises
    ------
    SetupError
        For invalid ids or settings, a device named like the coordinator, the monitor or Home
        Assistant's account, rotating or revoking an unknown user, or a missing/failing
        ``mosquitto_passwd``.
    """
    rotate = list(rotate or [])
    revoke = list(revoke or [])
    out = out.expanduser().resolve()
    before = _load_manifest(out)
    settings = check_settings(merge_settings(given, out))
    services = settings.service_users
    for cid in [*clients, *revoke]:
        try:
            check_client_id(cid)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
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
    # Accounts an earlier run made that are not devices (Home Assistant's, when --no-home-assistant drops it).
    dropped = {HOME_ASSISTANT_USER} - set(services) if before_settings.get("home_assistant") else set()

    tool = find_mosquitto_passwd(mosquitto_passwd)
    created_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    creds = out / "credentials"
    creds.mkdir(mode=0o700, exist_ok=True)
    os.chmod(creds, 0o700)
    (out / "data").mkdir(exist_ok=True)

    with _folder_lock(out):
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
                passwords[user] = _read_password(path)
                outcome.kept.append(user)
                continue
            passwords[user] = fresh[user] = secrets.token_urlsafe(PASSWORD_BYTES)
            (outcome.rotated if path.exists() else outcome.added).append(user)
        write_passwd(out / "passwd", passwords, tool)
        for user, password in fresh.items():
            _write_atomic(outcome.password_file(user), password + "\n", 0o600)
        for user in [*revoke, *sorted(dropped)]:
            outcome.password_file(user).unlink(missing_ok=True)
        settings = outcome.settings = install_tls_files(out, settings)
        _write_broker_file(out / "acl", acl_text(settings, devices))
        _write_atomic(out / "mosquitto.conf", config_text(settings, out), 0o644)
        _grant_broker_access(out, created_out, settings)
        manifest = {"settings": asdict(settings), "clients": devices, "generator": "firmware_scripts/mosquitto_config.py"}
        _write_atomic(out / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n", 0o644)
    for user in outcome.added:
        log.info("added %s", user)
    for user in outcome.rotated:
        log.info("new password for %s", user)
    for user in outcome.revoked:
        log.info("revoked %s", user)
    return outcome


TLS_DIR = "tls"
"""Folder of the output folder that holds the broker's copies of its certificate, key and CA."""


def install_tls_files(out: Path, settings: BrokerSettings) -> BrokerSettings:
    """Copy the TLS certificate, key and CA of ``settings`` into ``out/tls/``; return settings naming the copies.

    Mosquitto started as root loads its certificates after switching to ``broker_user``, so a
    key left where it was made (``/root/server.key``, mode 0600) stops the broker at start
    ("Unable to load CA certificates", permission denied). The copies are ``server.crt`` and
    ``ca.crt`` (mode 0644) and ``server.key`` (mode 0640, group of ``broker_user`` when run as
    root, else 0600), each replaced atomically. A file that already is the copy is left alone,
    so a re-run without the TLS options keeps them.

    Parameters
    ----------
    out : Path
        The output folder (absolute, existing).
    settings : BrokerSettings
        Checked settings (:func:`check_settings`: absolute, readable TLS paths, or None).

    Returns
    -------
    BrokerSettings
        ``settings`` with ``tls_cert``, ``tls_key`` and ``tls_ca`` replaced by the copies' paths.

    Raises
    ------
    SetupError
        If ``broker_user`` does not exist when run as root.
    """
    if not settings.tls:
        return settings
    tls = out / TLS_DIR
    tls.mkdir(mode=0o750, exist_ok=True)
    gid = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        try:
            gid = pwd.getpwnam(settings.broker_user).pw_gid
        except KeyError:
            raise SetupError(
                f"--broker-user {settings.broker_user}: no such account; install mosquitto (it creates the 'mosquitto' account) "
                "or name the account the broker runs as"
            ) from None
        os.chown(tls, 0, gid)
    os.chmod(tls, 0o750 if gid is not None else 0o700)
    copies: dict[str, str | None] = {}
    for key, name, secret in (("tls_cert", "server.crt", False), ("tls_key", "server.key", True), ("tls_ca", "ca.crt", False)):
        src = getattr(settings, key)
        if src is None:
            copies[key] = None
            continue
        dst = tls / name
        if Path(src) != dst:
            data = Path(src).read_bytes()

            def write(tmp: Path, data: bytes = data, secret: bool = secret) -> None:
                tmp.write_bytes(data)
                if secret and gid is not None:
                    os.chown(tmp, 0, gid)
                os.chmod(tmp, (0o640 if gid is not None else 0o600) if secret else 0o644)

            atomic_write(dst, write, mode=None)
        copies[key] = str(dst)
    return replace(settings, **copies)  # type: ignore[arg-type]  # the keys are the three str | None TLS fields


def _check_not_service(cid: str, settings: BrokerSettings, where: str = "") -> None:
    """Raise SetupError if the device id ``cid`` is the name of an account that is not a device."""
    if cid == settings.coordinator_user:
        raise SetupError(f"client id {cid!r}{where} is the coordinator's user name; rename the device or pass another --coordinator-user")
    if cid == settings.monitor_user:
        raise SetupError(f"client id {cid!r}{where} is the monitor account's user name; rename the device or pass another --monitor-user")
    if settings.home_assistant and cid == HOME_ASSISTANT_USER:
        raise SetupError(f"client id {cid!r}{where} is Home Assistant's account (--home-assistant); rename the device")


# ----------------------------------------------------------------------------------- one device at a time
def configured_devices(out: Path) -> list[str]:
    """The device ids configured in the output folder ``out`` (sorted), from its manifest.

    Raises
    ------
    SetupError
        If ``out`` holds no manifest (:data:`MANIFEST_NAME`): it is not a generated broker folder.
    """
    doc = _require_manifest(out)
    clients = doc.get("clients", [])
    if not isinstance(clients, list) or not all(isinstance(c, str) for c in clients):
        raise SetupError(f"{out / MANIFEST_NAME}: 'clients' is not a list of ids; re-run this script on the folder")
    return sorted(clients)


def read_settings(out: Path) -> BrokerSettings:
    """The settings of the generated broker folder ``out`` (its manifest, with defaults for keys it lacks).

    Raises
    ------
    SetupError
        If ``out`` holds no manifest, or an unreadable one.
    """
    _require_manifest(out)
    return merge_settings({}, out.expanduser().resolve())


def password_file(out: Path, user: str) -> Path:
    """Path of ``user``'s clear-text password file in the output folder ``out``: ``out/credentials/<user>.password``."""
    return out.expanduser().resolve() / "credentials" / f"{user}{PASSWORD_SUFFIX}"


def read_password(out: Path, user: str) -> str:
    """``user``'s password as generated in ``out``.

    Raises
    ------
    SetupError
        If there is no such password file (the account does not exist) or it is not one of this script's.
    """
    path = password_file(out, user)
    if not path.is_file():
        raise SetupError(f"{path}: no such password file; {user!r} has no account in {out} (re-run this script on the folder)")
    return _read_password(path)


def add_device(out: Path, name: str, replace: bool = False, mosquitto_passwd: str | None = None) -> tuple[Outcome, str]:
    """Give the device ``name`` an account in the existing output folder ``out``; return it and its new password.

    Regenerates ``passwd`` and ``acl`` (each replaced atomically, under the folder's lock) with
    every other setting and password kept. A running broker knows the account once it reloads.

    Parameters
    ----------
    out : Path
        A folder written by this script (holds :data:`MANIFEST_NAME`).
    name : str
        The device's fedhar client id (= its user name).
    replace : bool
        If the device already has an account, give it a new password instead of refusing.
    mosquitto_passwd : str, optional
        Path of ``mosquitto_passwd`` (default: searched).

    Returns
    -------
    (Outcome, str)
        What the run did, and the device's password (clear text; also in ``credentials/<name>.password``).

    Raises
    ------
    SetupError
        If ``out`` is not a generated folder, ``name`` is invalid or an account that is not a
        device's, the device exists already (without ``replace``), or ``mosquitto_passwd`` fails.
    """
    _require_manifest(out)
    exists = name in configured_devices(out)
    if exists and not replace:
        raise SetupError(
            f"device {name!r} already has an account in {out}; remove it first, or give it a new password "
            f"(mosquitto_config.py --out {out} --rotate {name})"
        )
    if exists:
        outcome = generate(out, {}, [], rotate=[name], mosquitto_passwd=mosquitto_passwd)
    else:
        outcome = generate(out, {}, [name], mosquitto_passwd=mosquitto_passwd)
    return outcome, read_password(out, name)


def remove_device(out: Path, name: str, mosquitto_passwd: str | None = None) -> Outcome:
    """Remove the device ``name``'s account (password file, ``passwd`` line, ACL rules) from ``out``.

    Regenerates ``passwd`` and ``acl`` (each replaced atomically, under the folder's lock). Once
    the broker reloads, the device can no longer log in, and Mosquitto 2 closes its live
    session (tests/test_broker_admin.py measures both).

    Raises
    ------
    SetupError
        If ``out`` is not a generated folder, ``name`` has no account there, or ``mosquitto_passwd`` fails.
    """
    _require_manifest(out)
    if name not in configured_devices(out):
        raise SetupError(f"device {name!r} has no account in {out} (devices: {', '.join(configured_devices(out)) or 'none'})")
    return generate(out, {}, [], revoke=[name], mosquitto_passwd=mosquitto_passwd)


def _require_manifest(out: Path) -> dict[str, Any]:
    out = out.expanduser().resolve()
    if not (out / MANIFEST_NAME).is_file():
        what = "does not exist" if not out.exists() else f"holds no {MANIFEST_NAME}"
        raise SetupError(
            f"broker folder {out} {what}: generate it first with "
            f"python3 firmware_scripts/mosquitto_config.py --out {out} --federation NAME"
        )
    return _load_manifest(out)


# ----------------------------------------------------------------------------------- reporting
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
        "fedhar-coordinator", "--broker", f"{local}:{s.port}", "--federation", s.federation,
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
        "home_assistant": outcome.settings.home_assistant,
        "password_files": {u: str(outcome.password_file(u)) for u in [*outcome.settings.service_users, *outcome.clients]},
        "added": outcome.added,
        "rotated": outcome.rotated,
        "revoked": outcome.revoked,
        "kept": outcome.kept,
        "settings": asdict(outcome.settings),
        "commands": commands(outcome),
    }


def report(outcome: Outcome) -> str:
    """Human-readable account of ``outcome``: what changed and the commands to run next."""
    s, cmd = outcome.settings, commands(outcome)
    listeners = f"port {s.port} on {s.plain_bind or 'all interfaces'}"
    if s.tls:
        listeners += f", TLS port {s.tls_port} on {s.tls_bind or 'all interfaces'}"
    lines = [
        f"fedhar broker configuration for federation {s.federation!r} in {outcome.out}",
        f"  listeners: {listeners}; {len(outcome.clients)} devices and the coordinator ({s.coordinator_user!r})",
        f"  read-only monitor account {s.monitor_user!r}: {outcome.password_file(s.monitor_user)}",
    ]
    if s.home_assistant:
        lines.append(f"  Home Assistant's account {HOME_ASSISTANT_USER!r}: {outcome.password_file(HOME_ASSISTANT_USER)}")
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
        "",
        "Coordinator (on the broker's host):",
        f"  {cmd['coordinator']}",
    ]
    if cmd["clients"]:
        lines += ["", "Devices (copy credentials/<id>.password" + (" and the CA certificate" if s.tls else "") + " to each device):"]
        lines += [f"  {c}" for c in cmd["clients"].values()]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (options left unset default to None so a re-run can keep earlier settings)."""
    ap = argparse.ArgumentParser(
        prog="mosquitto_config.py",
        description="Write a Mosquitto configuration for a fedhar federation: no anonymous access, one password per "
        "device, an ACL that lets each device write only under its own client id, optional TLS. Re-running on the same "
        "--out folder adds devices and keeps existing passwords and every setting not given again.",
        epilog=OPENSSL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    ap.add_argument("--federation", help="federation name: topics under fedhar/v1/<name> (required on the first run)")
    ap.add_argument("--clients", action="append", default=[], metavar="ID,ID,...", help="device ids to add (repeatable)")
    ap.add_argument("--clients-file", type=Path, action="append", default=[], help="file of device ids, one per line, # comments")
    ap.add_argument("--rotate", nargs="?", const="*", metavar="ID,ID,...", help="new passwords for these users (no value: all)")
    ap.add_argument("--revoke", metavar="ID,ID,...", help="remove these devices")
    ap.add_argument("--coordinator-user", help=f"the coordinator's user name (default {DEFAULTS['coordinator_user']})")
    ap.add_argument(
        "--monitor-user", help=f"the read-only monitor account's user name, for a status page (default {DEFAULTS['monitor_user']})"
    )
    ap.add_argument(
        "--home-assistant",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the coordinator may write Home Assistant's discovery topics (homeassistant/#) and read homeassistant/status; "
        f"adds Home Assistant's account {HOME_ASSISTANT_USER!r} (kept by later runs until --no-home-assistant)",
    )
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
    ap.add_argument("--no-tls", action="store_true", help="drop the TLS listener configured by an earlier run")
    ap.add_argument(
        "--broker-user", help=f"account Mosquitto runs as after starting as root (default {DEFAULTS['broker_user']})"
    )
    ap.add_argument(
        "--max-message-bytes",
        type=int,
        help=f"largest payload the fedhar programs publish, their --max-message-bytes (default {DEFAULTS['max_message_bytes']})",
    )
    ap.add_argument(
        "--max-queued-messages", type=int, help=f"QoS 1 messages queued per client (default {DEFAULTS['max_queued_messages']})"
    )
    ap.add_argument("--public-host", help="host name devices use for the broker, for the printed commands (default: this host)")
    ap.add_argument("--mosquitto-passwd", help="path of mosquitto_passwd (default: searched on PATH)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    ap.add_argument("--log-level", default="WARNING")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 written, 2 bad arguments or files, 3 ``mosquitto_passwd`` missing or failed."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    given = {key: getattr(args, key, None) for key in DEFAULTS}
    if args.no_tls:
        if any(given[k] is not None for k in ("tls_cert", "tls_key", "tls_ca")):
            print("mosquitto_config: error: --no-tls contradicts --tls-cert/--tls-key/--tls-ca", file=sys.stderr)
            return 2
        given.update(tls_cert="", tls_key="", tls_ca="", require_client_cert=False)
    try:
        clients: list[str] = []
        for text in args.clients:
            clients += [c for c in parse_ids(text) if c not in clients]
        for path in args.clients_file:
            clients += [c for c in read_clients_file(path) if c not in clients]
        rotate = ["*"] if args.rotate == "*" else parse_ids(args.rotate or "")
        outcome = generate(
            args.out,
            given,
            clients,
            rotate=rotate,
            revoke=parse_ids(args.revoke or ""),
            mosquitto_passwd=args.mosquitto_passwd,
        )
    except SetupError as exc:
        print(f"mosquitto_config: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"mosquitto_config: error: {exc}", file=sys.stderr)
        return 2
    if not outcome.settings.tls:
        log.warning("no TLS: passwords cross the network in clear text; add --tls-cert/--tls-key/--tls-ca for devices on a network")
        sys.stderr.flush()
    print(json.dumps(summary(outcome), indent=2) if args.json else report(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
