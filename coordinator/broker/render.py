"""The text of the broker's two rule files, ``acl`` and ``mosquitto.conf``: pure functions of the settings.

Nothing here touches a file; :mod:`coordinator.broker.accounts` writes what these return.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.broker.device_ca import paths as device_ca_paths
from coordinator.broker.settings import ENROL_DESK_USER, ENROL_USER, PACKET_MARGIN_BYTES, PID_FILE_NAME, BrokerSettings
from har_models.wire.topics import Topics

BRIDGE_QOS = 1
"""QoS of every bridged topic: fedhar publishes everything at QoS 1 (docs/protocol.md)."""


def bridge_topics(topics: Topics) -> list[tuple[str, str]]:
    """The topic filters a regional broker's bridge forwards, as (filter, "in"/"out") seen from the regional broker.

    ``in`` carries what the coordinator publishes for devices (status, round, progress, models, receipts,
    grants, programs); ``out`` what devices publish (status, update chunks, program requests): the topics
    of docs/protocol.md in their documented direction, none both ways. ``+`` stands for any client id,
    since the regional ACL already ties each device to its own.
    """
    t = topics
    return [
        (t.coordinator_status, "in"),
        (t.coordinator_outlook, "in"),
        (t.round, "in"),
        (t.progress, "in"),
        (t.global_model("+"), "in"),
        (t.client_model("+", "+"), "in"),
        (t.client_receipt("+"), "in"),
        (t.client_grant("+"), "in"),
        (t.client_programs("+", "+"), "in"),
        (t.client_status("+"), "out"),
        (t.client_update("+", "+"), "out"),
        (t.client_program_request("+"), "out"),
    ]


def acl_text(settings: BrokerSettings, clients: list[str]) -> str:
    """The Mosquitto ACL file for ``settings.federation`` and the devices ``clients``.

    The coordinator reads and writes the whole prefix; the monitor only reads it; each device reads the
    round, the coordinator's status and outlook, the global model and its own model, receipts, grant and
    programs, reads and writes its own status, and writes only its own updates and program requests.
    Whatever is not granted is denied. Every rule is a ``topic`` line under its ``user``: a ``pattern``
    line (``%u``) would apply to every account, letting the monitor write a device's status.
    """
    t = Topics(settings.federation)
    lines = [
        f"# Mosquitto ACL of the fedhar federation {settings.federation!r} (topics {t.prefix}/...).",
        "# Written by fedhar-coordinator broker (firmware_scripts/mosquitto_config.py); re-run it rather than editing this file.",
        "# Whatever is not granted here is denied.",
        "",
        "# The coordinator runs the federation: it reads statuses and updates, writes rounds, models and its status.",
        f"user {settings.coordinator_user}",
        f"topic readwrite {t.prefix}/#",
    ]
    lines += [
        "",
        "# The monitor (a status page) reads the whole federation and writes nothing.",
        f"user {settings.monitor_user}",
        f"topic read {t.prefix}/#",
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
            f"topic read {t.coordinator_outlook}",
            f"topic read {t.global_model('+')}",
            f"topic read {t.client_model(cid, '+')}",
            f"topic read {t.client_receipt(cid)}",
            f"topic read {t.client_grant(cid)}",
            f"topic readwrite {t.client_status(cid)}",
            f"topic write {t.client_update(cid, '+')}",
            f"topic write {t.client_program_request(cid)}",
            f"topic read {t.client_programs(cid, '+')}",
            "",
        ]
    if settings.device_cert_port is not None:
        lines += [
            "# Enrolment by certificate: the shared enrolment account only leaves a request under an enrolment code and",
            "# reads the replies (certificates are public) and the CA; the desk (fedhar-coordinator pending/approve) reads the",
            "# requests and writes the replies. A device enrolled so logs in by certificate: its CN is its user name above.",
            f"user {ENROL_USER}",
            f"topic write {t.enrol_request('+')}",
            f"topic read {t.enrol_reply('+')}",
            f"topic read {t.ca}",
            "",
            f"user {ENROL_DESK_USER}",
            f"topic readwrite {t.enrol_request('+')}",
            f"topic readwrite {t.enrol_reply('+')}",
            f"topic readwrite {t.ca}",
            "",
        ]
    if settings.bridge_users:
        lines += [
            "# Each regional broker's bridge (fedhar-coordinator broker bridge init) reads what the coordinator publishes",
            "# for devices and writes what devices publish for the coordinator, exactly the bridged topics; nothing else.",
        ]
    for user in settings.bridge_users:
        lines.append(f"user {user}")
        lines += [f"topic {'read' if way == 'in' else 'write'} {pattern}" for pattern, way in bridge_topics(t)]
        lines.append("")
    return "\n".join(lines)


def bridge_text(settings: BrokerSettings, password: str) -> str:
    """The ``connection`` section of a regional broker's ``mosquitto.conf``: its bridge to the coordinator's broker.

    Logs in as ``settings.upstream_user`` with ``password`` (clear text: the file is written private),
    over TLS with ``upstream_ca`` when set; MQTT 3.1.1 with ``try_private`` (retain flags kept) and a
    persistent session (QoS 1 kept while the link is down). Raises ValueError without an upstream, or
    for an empty or multi-line password.
    """
    address = settings.upstream_address
    if address is None or settings.upstream_user is None:
        raise ValueError("bridge_text: settings.upstream and settings.upstream_user are required for a bridge")
    if not password or any(c in password for c in "\r\n"):
        raise ValueError("bridge_text: the bridge password must be one non-empty line")
    host, port = address
    user = settings.upstream_user
    lines = [
        "",
        f"# Bridge to the coordinator's broker at {host}:{port}: this regional broker serves devices and forwards only the",
        "# federation's topics the coordinator needs (fedhar-coordinator broker bridge init; docs/scale.md, Regional brokers).",
        f"connection fedhar-{user}",
        f"address {host}:{port}",
        "bridge_protocol_version mqttv311",
        "try_private true",
        "cleansession false",
        f"remote_clientid {user}",
        f"remote_username {user}",
        f"remote_password {password}",
        "notifications false",
        "keepalive_interval 30",
        "restart_timeout 1 30",
    ]
    if settings.upstream_ca:
        lines += [f"bridge_cafile {settings.upstream_ca}", "bridge_insecure false", "bridge_tls_version tlsv1.2"]
    lines += [f"topic {pattern} {way} {BRIDGE_QOS}" for pattern, way in bridge_topics(Topics(settings.federation))]
    return "\n".join(lines) + "\n"


def config_text(settings: BrokerSettings, out: Path, upstream_password: str | None = None) -> str:
    """The ``mosquitto.conf`` for ``settings``, naming files inside the absolute folder ``out``.

    A regional broker (``settings.upstream``) needs ``upstream_password`` and ends with :func:`bridge_text`;
    ValueError when only one of the two is given.
    """
    s = settings
    lines = [
        f"# Mosquitto configuration of the fedhar federation {s.federation!r}.",
        "# Written by fedhar-coordinator broker (firmware_scripts/mosquitto_config.py); re-run it rather than editing this file.",
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
            *_tls_listener(s, s.tls_port),
        ]
        if s.tls_ca:
            lines.append(f"cafile {s.tls_ca}")
        lines += [
            f"require_certificate {'true' if s.require_client_cert else 'false'}",
            "tls_version tlsv1.2",
        ]
    if s.tls and s.device_cert_port is not None:
        ca = device_ca_paths(out)
        lines += [
            "",
            "# MQTT over TLS for devices enrolled by certificate (fedhar-coordinator approve): only a certificate signed",
            "# by the device CA and not on its revocation list is let in, and its CN is the user name the ACL knows.",
            *_tls_listener(s, s.device_cert_port),
            f"cafile {ca['crt']}",
            f"crlfile {ca['crl']}",
            "require_certificate true",
            "use_identity_as_username true",
            "tls_version tlsv1.2",
        ]
    if (settings.upstream is None) != (upstream_password is None):
        raise ValueError("config_text: a regional broker (settings.upstream) needs its bridge password, and only it has one")
    text = "\n".join(lines) + "\n"
    return text if upstream_password is None else text + bridge_text(settings, upstream_password)


def _tls_listener(s: BrokerSettings, port: int) -> list[str]:
    """The first lines of a TLS listener on ``port``: the user name as session id, the server's certificate and key."""
    return [f"listener {port} {s.tls_bind}".rstrip(), "protocol mqtt", "use_username_as_clientid true", f"certfile {s.tls_cert}",
            f"keyfile {s.tls_key}"]  # fmt: skip
