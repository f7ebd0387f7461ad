"""The text of the broker's two rule files, ``acl`` and ``mosquitto.conf``: pure functions of the settings.

Nothing here touches a file; :mod:`coordinator.broker.accounts` writes what these return.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.broker.settings import PACKET_MARGIN_BYTES, PID_FILE_NAME, BrokerSettings
from har_models.wire.topics import Topics


def acl_text(settings: BrokerSettings, clients: list[str]) -> str:
    """The Mosquitto ACL file for ``settings.federation`` and the devices ``clients``.

    * The coordinator reads and writes everything under the federation prefix.
    * The monitor reads everything under the federation prefix and writes nothing.
    * Each device (user name = fedhar client id) reads the round announcement, the coordinator's
      status, the global model, its own personalised model, the receipts for its updates and
      the ExecuTorch programs sent to it; it reads and writes its own status and writes only its
      own update chunks and program requests. It cannot read other devices' statuses (they
      carry label counts and data statistics), updates or models, nor write anything else.

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
