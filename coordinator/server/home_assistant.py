"""Home Assistant MQTT discovery for the home server (``[server] home_assistant = true``).

Home Assistant creates entities from retained JSON config messages on
``homeassistant/<component>/<node_id>/<object_id>/config`` (its MQTT discovery; the fields
used here are those its documentation lists for ``sensor`` and ``binary_sensor``:
``name``, ``unique_id``, ``state_topic``, ``value_template``, ``device_class``,
``unit_of_measurement``, ``state_class``, ``payload_on``/``payload_off``, ``expire_after``,
``availability`` with ``availability_mode``, ``device`` and ``origin``). An empty retained
config removes the entity.

Entities::

    coordinator   sensor  state          {p}/coordinator/status, value_json.state
                  sensor  round          {p}/progress, value_json.round (last completed round)
                  sensor  last_f1        {p}/progress, personalisation macro-F1 (%)
    each device   binary_sensor online   {p}/client/<id>/status: ON unless its state is offline;
                                         expire_after = PRESENCE_PERIODS * its refresh period
                  sensor  last_contribution  (timestamp) from the server's state topic
                  sensor  sample_rate        (Hz) from the server's state topic

Availability follows presence: the coordinator's entities are available while its status says
"online"; a device's sensors while the coordinator is online and the device's own status is not
"offline" (``availability_mode: all``, each through a ``value_template`` over the status JSON).
What no retained fedhar message carries as a value (the last contribution's time, the sample
rate) the server publishes itself, retained, on :func:`device_state_topic` (under
``homeassistant/``, which the generated ACL lets the coordinator write).

Home Assistant forgets retained configs it read before a restart only if the broker lost them,
but it asks to be told again by publishing its birth message (``homeassistant/status`` =
``online``); :class:`HomeAssistantPublisher` then publishes everything again.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from har_models.wire.messages import PRESENCE_PERIODS
from har_models.wire.topics import Topics

DISCOVERY_PREFIX = "homeassistant"
BIRTH_TOPIC = "homeassistant/status"
"""Home Assistant's birth and last-will topic: ``online`` when it (re)starts."""

ORIGIN = {"name": "fedhar"}
"""The ``origin`` of every config (Home Assistant logs which software announced an entity)."""

_NODE_RE = re.compile(r"[^A-Za-z0-9_-]")


def node_id(name: str) -> str:
    """A discovery node id from a name: characters other than letters, digits, ``_`` and ``-`` become ``_``.

    Raises
    ------
    ValueError
        For an empty name.
    """
    if not name:
        raise ValueError("home assistant: the coordinator's name ([server] name) is empty; give it a name")
    return _NODE_RE.sub("_", name)


def config_topic(component: str, node: str, object_id: str) -> str:
    """``homeassistant/<component>/<node>/<object_id>/config``."""
    return f"{DISCOVERY_PREFIX}/{component}/{node}/{object_id}/config"


def device_state_topic(node: str, device: str) -> str:
    """Where the server publishes a device's figures for Home Assistant (retained JSON)."""
    return f"{DISCOVERY_PREFIX}/fedhar/{node}/{node_id(device)}/state"


def _availability_coordinator(topics: Topics) -> dict[str, Any]:
    return {"topic": topics.coordinator_status, "value_template": "{{ value_json.state }}",
            "payload_available": "online", "payload_not_available": "offline"}  # fmt: skip


def _availability_device(topics: Topics, device: str) -> dict[str, Any]:
    return {"topic": topics.client_status(device),
            "value_template": "{{ 'offline' if value_json.state == 'offline' else 'online' }}",
            "payload_available": "online", "payload_not_available": "offline"}  # fmt: skip


def _payload(d: Mapping[str, Any]) -> bytes:
    return json.dumps(d, sort_keys=True).encode()


def coordinator_configs(topics: Topics, name: str, sw_version: str = "") -> list[tuple[str, bytes]]:
    """Discovery configs of the coordinator's entities: state, last completed round, last macro-F1.

    Parameters
    ----------
    topics : Topics
        The federation's topics (the states come from its retained messages).
    name : str
        The coordinator's name (``[server] name``); its node id is :func:`node_id` of it.
    sw_version : str
        fedhar's version, shown on the device page.

    Returns
    -------
    list of (topic, payload)
        To be published retained.
    """
    node = node_id(name)
    device = {"identifiers": [f"fedhar_{node}"], "name": name, "manufacturer": "fedhar", "model": "federation coordinator"}
    if sw_version:
        device["sw_version"] = sw_version
    common = {"device": device, "origin": ORIGIN, "availability": [_availability_coordinator(topics)]}
    f1 = ("{{ (value_json.record.personalisation.macro_f1 * 100) | round(1) "
          "if value_json.record.personalisation is defined and value_json.record.personalisation else none }}")  # fmt: skip
    entities = [
        ("sensor", "state", {"name": "State", "state_topic": topics.coordinator_status, "value_template": "{{ value_json.state }}",
                             "icon": "mdi:server-network"}),
        ("sensor", "round", {"name": "Round", "state_topic": topics.progress, "value_template": "{{ value_json.round }}",
                             "state_class": "measurement", "icon": "mdi:counter"}),
        ("sensor", "last_f1", {"name": "Last macro-F1", "state_topic": topics.progress, "value_template": f1,
                               "unit_of_measurement": "%", "state_class": "measurement", "icon": "mdi:chart-line"}),
    ]  # fmt: skip
    out = []
    for component, obj, extra in entities:
        cfg = {**extra, **common, "unique_id": f"fedhar_{node}_{obj}"}
        out.append((config_topic(component, node, obj), _payload(cfg)))
    return out


def device_configs(topics: Topics, name: str, device: str, refresh_s: float | None = None) -> list[tuple[str, bytes]]:
    """Discovery configs of one device's entities: online, last contribution, sample rate.

    Parameters
    ----------
    topics : Topics
    name : str
        The coordinator's name (the entities' node, and their ``via_device``).
    device : str
        The device's client id.
    refresh_s : float, optional
        The device's status refresh period (s); the online sensor then expires after
        ``PRESENCE_PERIODS * refresh_s`` seconds without a status, the same rule as presence.

    Returns
    -------
    list of (topic, payload)
    """
    node = node_id(name)
    dev = node_id(device)
    device_info = {"identifiers": [f"fedhar_{node}_{dev}"], "name": device, "manufacturer": "fedhar",
                   "model": "federated HAR device", "via_device": f"fedhar_{node}"}  # fmt: skip
    base = {"device": device_info, "origin": ORIGIN}
    state = device_state_topic(node, device)
    online: dict[str, Any] = {
        "name": "Online", "device_class": "connectivity", "state_topic": topics.client_status(device),
        "value_template": "{{ 'OFF' if value_json.state == 'offline' else 'ON' }}", "payload_on": "ON", "payload_off": "OFF",
    }  # fmt: skip
    if refresh_s and refresh_s > 0:
        online["expire_after"] = math.ceil(PRESENCE_PERIODS * refresh_s)
    guarded = {"availability": [_availability_coordinator(topics), _availability_device(topics, device)], "availability_mode": "all"}
    entities = [
        ("binary_sensor", "online", online),
        ("sensor", "last_contribution", {"name": "Last contribution", "device_class": "timestamp", "state_topic": state,
                                         "value_template": "{{ value_json.last_contribution }}", **guarded}),
        ("sensor", "sample_rate", {"name": "Sample rate", "unit_of_measurement": "Hz", "device_class": "frequency",
                                   "state_class": "measurement", "state_topic": state,
                                   "value_template": "{{ value_json.sample_rate_hz }}", **guarded}),
    ]  # fmt: skip
    out = []
    for component, obj, extra in entities:
        uid = f"fedhar_{node}_{dev}_{obj}"
        out.append((config_topic(component, node, f"{dev}_{obj}"), _payload({**extra, **base, "unique_id": uid})))
    return out


def device_removal(name: str, device: str) -> list[tuple[str, bytes]]:
    """Empty retained configs (and state) that remove a revoked or forgotten device's entities."""
    node, dev = node_id(name), node_id(device)
    topics = [config_topic("binary_sensor", node, f"{dev}_online"), config_topic("sensor", node, f"{dev}_last_contribution"),
              config_topic("sensor", node, f"{dev}_sample_rate"), device_state_topic(node, device)]  # fmt: skip
    return [(t, b"") for t in topics]


def device_state(last_contribution_unix: float | None, sample_rate_hz: float | None) -> bytes:
    """The JSON the server publishes on :func:`device_state_topic`.

    ``last_contribution`` is ISO 8601 with the UTC offset (what a ``timestamp`` sensor needs)
    or null; ``sample_rate_hz`` a number or null (the device does not report it).
    """
    stamp = None
    if last_contribution_unix is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(last_contribution_unix))
    return _payload({"last_contribution": stamp, "sample_rate_hz": sample_rate_hz})


class HomeAssistantPublisher:
    """Publishes the discovery configs and device states, again whenever Home Assistant says it is online.

    Parameters
    ----------
    publish : callable (topic, payload, retain) -> None
        E.g. ``lambda t, p, r: link.publish(t, p, retain=r)`` on the coordinator's MQTT link,
        which must be subscribed to :data:`BIRTH_TOPIC`.
    topics : Topics
    name : str
        The coordinator's name.
    sw_version : str

    Notes
    -----
    Pure bookkeeping over ``publish``: it remembers the devices it announced so that
    :meth:`republish` repeats them and :meth:`remove` clears them.
    """

    def __init__(self, publish: Callable[[str, bytes, bool], None], topics: Topics, name: str, sw_version: str = ""):
        self._publish = publish
        self.topics = topics
        self.name = name
        self.sw_version = sw_version
        self._devices: dict[str, float | None] = {}
        self._states: dict[str, bytes] = {}
        self._announced = False

    def _send(self, pairs: Iterable[tuple[str, bytes]]) -> None:
        for topic, payload in pairs:
            self._publish(topic, payload, True)

    def announce(self, devices: Mapping[str, float | None]) -> None:
        """Publish the coordinator's configs and those of ``devices`` (client id -> refresh period s, or None)."""
        self._devices.update(devices)
        self._announced = True
        self._send(coordinator_configs(self.topics, self.name, self.sw_version))
        for dev, refresh in sorted(devices.items()):
            self._send(device_configs(self.topics, self.name, dev, refresh))

    def update_state(self, device: str, last_contribution_unix: float | None, sample_rate_hz: float | None = None) -> None:
        """Publish ``device``'s figures when they changed."""
        payload = device_state(last_contribution_unix, sample_rate_hz)
        if self._states.get(device) != payload:
            self._states[device] = payload
            self._send([(device_state_topic(node_id(self.name), device), payload)])

    def remove(self, devices: Sequence[str]) -> None:
        """Remove the entities of ``devices`` (revoked or forgotten)."""
        for dev in devices:
            self._devices.pop(dev, None)
            self._states.pop(dev, None)
            self._send(device_removal(self.name, dev))

    def sync(self, devices: Sequence[Mapping[str, Any]]) -> None:
        """Bring Home Assistant in line with ``devices`` (:meth:`coordinator.server.web.ServerView.devices`' objects).

        Enrolled devices not announced yet (or whose refresh period changed) are announced, with
        the coordinator's configs the first time; announced devices now revoked or forgotten are
        removed; each enrolled device's state (``last_contribution_unix``, ``sensing.rate_hz``: the
        lower of its accelerometer and gyroscope rates, :func:`coordinator.server.web.sensing_json`)
        is published when it changed. Calling it again with the same devices publishes nothing.
        """
        enrolled = {str(d["name"]): d for d in devices if d.get("state") == "enrolled"}
        gone = [str(d["name"]) for d in devices if d.get("state") in ("revoked", "forgotten") and d["name"] in self._devices]
        if gone:
            self.remove(gone)
        new = {n: d.get("refresh_s") for n, d in enrolled.items() if n not in self._devices or self._devices[n] != d.get("refresh_s")}
        if new or not self._announced:
            self.announce(new)
        for n, d in sorted(enrolled.items()):
            self.update_state(n, d.get("last_contribution_unix"), (d.get("sensing") or {}).get("rate_hz"))

    def republish(self) -> None:
        """Everything announced so far, again (configs, then the last states)."""
        self.announce(dict(self._devices))
        node = node_id(self.name)
        self._send([(device_state_topic(node, dev), p) for dev, p in sorted(self._states.items())])

    def handle(self, topic: str, payload: bytes) -> bool:
        """Republish on Home Assistant's birth message; True if ``topic``/``payload`` was it."""
        if topic == BIRTH_TOPIC and bytes(payload).strip() == b"online":
            self.republish()
            return True
        return False
