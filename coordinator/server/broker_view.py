"""Which devices are online, and whether a ``serve`` answers: read from the running server's page, else the broker.

For ``fedhar-coordinator devices``; the broker is read with the read-only monitor account, never the
coordinator's. Whether a server *runs* is the data folder's lock's to say.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from coordinator.server.device_commands import DeviceCommandError, admin_of
from coordinator.server.settings import ServeFile
from har_io.broker_config import BrokerConfig


def from_status_page(file: ServeFile, timeout_s: float = 3.0) -> tuple[dict[str, str], bool] | None:
    """``({device: state}, serving)`` from a running server's status page JSON API, or None (port 0, no answer).

    A page on a wildcard address is asked on loopback, with ``[server] token`` when set.
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
    """``({device: state}, serving)``: from the status page, else the broker's retained statuses; None if neither reads.

    The page goes first: its monitor session holds the monitor account, and a second login with it
    (user names are client ids) would knock the page's session off. The broker's statuses go through a
    :class:`coordinator.client_table.ClientTable`, so an expired status is "offline" as on the page.
    """
    page = from_status_page(file)
    if page is not None:
        return page
    if not file.server.broker_dir:
        return None
    from coordinator.client_table import ClientTable
    from coordinator.server.broker_admin import BrokerAdminError
    from coordinator.server.broker_session import messages_for
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
        for topic, payload, retained in messages_for(link, wait_s, 0.2):
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
