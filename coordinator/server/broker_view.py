"""Which devices are online, and whether a ``serve`` answers: read from the running server's page, else the broker.

For ``fedhar-coordinator devices``: the running server's status page JSON API is asked first (its
own monitor session holds the monitor account); without a page, the broker's retained statuses
are read with the read-only monitor account, never the coordinator's. Whether a server *runs* is
not decided here: that is the data folder's lock (:mod:`coordinator.server.data_lock`).
"""

from __future__ import annotations

import json
import os
import queue
import time
from typing import Any

from coordinator.server.device_commands import DeviceCommandError, admin_of
from coordinator.server.settings import ServeFile
from har_io.broker_config import BrokerConfig


def from_status_page(file: ServeFile, timeout_s: float = 3.0) -> tuple[dict[str, str], bool] | None:
    """Device states and whether the coordinator is online, from a running server's status page JSON API.

    Returns ``({device: state}, serving)`` as :func:`retained_states` does (an offline device's state is
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


def retained_states(file: ServeFile, wait_s: float = 2.0) -> tuple[dict[str, str], bool] | None:
    """Device states and whether a ``serve`` runs: from its status page, else the broker's retained statuses.

    Returns ``({device: state}, serving)`` where ``serving`` is True when the coordinator's status
    says online and is fresh (a ``serve`` runs); None if neither can be read. A running server's
    status page (:func:`from_status_page`) is asked first: its own monitor session holds the
    monitor account, and the generated broker takes user names as client ids, so a second login
    with it would disconnect the page's session (seen on a fresh install: each ``revoke`` and
    ``devices`` knocked the page's monitor off for a second or two). Without a page, the broker is
    read with the read-only monitor account (never the coordinator's, which would disconnect a
    running coordinator), and the retained statuses go through the coordinator's client table
    (:class:`coordinator.client_table.ClientTable`): a device whose status has expired (it vanished
    without its last will) is "offline" there, as on the page.
    """
    page = from_status_page(file)
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
        admin = admin_of(file)
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


def online_states(file: ServeFile, wait_s: float = 2.0) -> dict[str, str] | None:
    """Each device's state from a running server's status page, else its retained status on the broker (read-only
    monitor account); None if neither can be read."""
    seen = retained_states(file, wait_s)
    return None if seen is None else seen[0]
