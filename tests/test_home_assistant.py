"""Home Assistant MQTT discovery: config topics and JSON against the documented discovery fields, availability
tied to presence, removal, and republishing on Home Assistant's birth message."""

from __future__ import annotations

import json
from typing import Any

from coordinator.server import home_assistant as ha
from har_models.wire.topics import Topics

T = Topics("home")

# Options Home Assistant documents for MQTT sensor and binary_sensor discovery (the ones these configs may use).
DOCUMENTED = {
    "sensor": {"name", "unique_id", "state_topic", "value_template", "device_class", "unit_of_measurement", "state_class",
               "icon", "availability", "availability_mode", "device", "origin", "expire_after", "json_attributes_topic"},
    "binary_sensor": {"name", "unique_id", "state_topic", "value_template", "device_class", "payload_on", "payload_off",
                      "icon", "availability", "availability_mode", "device", "origin", "expire_after"},
}  # fmt: skip
DEVICE_KEYS = {"identifiers", "name", "manufacturer", "model", "sw_version", "via_device"}
AVAILABILITY_KEYS = {"topic", "value_template", "payload_available", "payload_not_available"}


def _check(topic: str, payload: bytes) -> tuple[str, dict]:
    parts = topic.split("/")
    assert parts[0] == "homeassistant" and parts[-1] == "config" and len(parts) == 5, topic
    component = parts[1]
    cfg = json.loads(payload)
    assert set(cfg) <= DOCUMENTED[component], set(cfg) - DOCUMENTED[component]
    assert {"name", "unique_id", "state_topic", "device"} <= set(cfg)
    assert set(cfg["device"]) <= DEVICE_KEYS and cfg["device"]["identifiers"]
    for a in cfg.get("availability", []):
        assert set(a) <= AVAILABILITY_KEYS and a["topic"].startswith("fedhar/v1/home/")
    assert cfg.get("availability_mode", "all") in ("all", "any", "latest")
    return component, cfg


def test_coordinator_entities_follow_its_status_and_progress() -> None:
    pairs = ha.coordinator_configs(T, "fedhar home", sw_version="1.2")
    topics = [t for t, _ in pairs]
    assert topics == ["homeassistant/sensor/fedhar_home/state/config", "homeassistant/sensor/fedhar_home/round/config",
                      "homeassistant/sensor/fedhar_home/last_f1/config"]  # fmt: skip
    cfgs = {t.split("/")[3]: _check(t, p)[1] for t, p in pairs}
    assert cfgs["state"]["state_topic"] == "fedhar/v1/home/coordinator/status"
    assert cfgs["state"]["value_template"] == "{{ value_json.state }}"
    assert cfgs["round"]["state_topic"] == "fedhar/v1/home/progress" and cfgs["round"]["value_template"] == "{{ value_json.round }}"
    assert cfgs["last_f1"]["unit_of_measurement"] == "%" and "personalisation.macro_f1 * 100" in cfgs["last_f1"]["value_template"]
    for c in cfgs.values():
        assert c["availability"] == [{"topic": "fedhar/v1/home/coordinator/status", "value_template": "{{ value_json.state }}",
                                      "payload_available": "online", "payload_not_available": "offline"}]  # fmt: skip
        assert c["device"] == {"identifiers": ["fedhar_fedhar_home"], "name": "fedhar home", "manufacturer": "fedhar",
                               "model": "federation coordinator", "sw_version": "1.2"}  # fmt: skip
    assert len({c["unique_id"] for c in cfgs.values()}) == 3


def test_device_entities_online_last_contribution_and_sample_rate() -> None:
    pairs = ha.device_configs(T, "home", "phone-anna", refresh_s=30)
    got = {t: _check(t, p) for t, p in pairs}
    online = got["homeassistant/binary_sensor/home/phone-anna_online/config"][1]
    assert online["state_topic"] == "fedhar/v1/home/client/phone-anna/status"
    assert online["device_class"] == "connectivity" and online["expire_after"] == 90  # 3 periods of 30 s, as presence
    assert (online["payload_on"], online["payload_off"]) == ("ON", "OFF")
    last = got["homeassistant/sensor/home/phone-anna_last_contribution/config"][1]
    rate = got["homeassistant/sensor/home/phone-anna_sample_rate/config"][1]
    assert last["device_class"] == "timestamp" and rate["unit_of_measurement"] == "Hz" and rate["device_class"] == "frequency"
    state_topic = ha.device_state_topic("home", "phone-anna")
    assert last["state_topic"] == rate["state_topic"] == state_topic == "homeassistant/fedhar/home/phone-anna/state"
    for c in (last, rate):
        assert c["availability_mode"] == "all"
        assert [a["topic"] for a in c["availability"]] == ["fedhar/v1/home/coordinator/status", "fedhar/v1/home/client/phone-anna/status"]
        assert "value_json.state == 'offline'" in c["availability"][1]["value_template"]
    assert online["device"]["via_device"] == "fedhar_home" and online["device"]["name"] == "phone-anna"
    assert "expire_after" not in json.loads(ha.device_configs(T, "home", "pi", refresh_s=None)[0][1])


def test_device_state_and_removal() -> None:
    assert json.loads(ha.device_state(86400.0, 49.8)) == {"last_contribution": "1970-01-02T00:00:00+00:00", "sample_rate_hz": 49.8}
    assert json.loads(ha.device_state(None, None)) == {"last_contribution": None, "sample_rate_hz": None}
    gone = ha.device_removal("home", "phone-anna")
    assert all(p == b"" for _, p in gone) and len(gone) == 4
    configs = {t for t, _ in ha.device_configs(T, "home", "phone-anna")}
    assert {t for t, _ in gone} == configs | {ha.device_state_topic("home", "phone-anna")}


def test_the_publisher_republishes_everything_on_the_birth_message() -> None:
    sent: list[tuple[str, bytes, bool]] = []
    pub = ha.HomeAssistantPublisher(lambda t, p, r: sent.append((t, p, r)), T, "home")
    pub.announce({"a": 30.0, "b": None})
    pub.update_state("a", 100.0, None)
    pub.update_state("a", 100.0, None)  # unchanged: not sent again
    first = list(sent)
    assert len(first) == 3 + 2 * 3 + 1 and all(r for _, _, r in first)
    sent.clear()
    assert not pub.handle("homeassistant/status", b"offline") and sent == []
    assert pub.handle("homeassistant/status", b"online")
    assert sorted(sent) == sorted(first)  # the same configs and the last state, again
    sent.clear()
    pub.remove(["b"])
    assert [p for _, p, _ in sent] == [b""] * 4
    sent.clear()
    pub.handle("homeassistant/status", b"online")
    assert not any("/b_" in t for t, _, _ in sent) and len(sent) == 3 + 3 + 1


def test_sync_follows_the_status_pages_devices() -> None:
    sent: list[tuple[str, bytes, bool]] = []
    pub = ha.HomeAssistantPublisher(lambda t, p, r: sent.append((t, p, r)), T, "home")
    devices: list[dict[str, Any]] = [
        {"name": "a", "state": "enrolled", "refresh_s": 30.0, "last_contribution_unix": 86400.0, "sensing": {"rate_hz": None}},
        {"name": "b", "state": "enrolled", "refresh_s": None, "last_contribution_unix": None, "sensing": {}},
        {"name": "c", "state": "revoked", "refresh_s": None},
    ]
    pub.sync(devices)
    topics = [t for t, _, _ in sent]
    assert len(topics) == 3 + 3 + 3 + 2 and not any("/c_" in t or "/c/" in t for t in topics)  # the revoked device is not announced
    state_a = dict((t, p) for t, p, _ in sent)["homeassistant/fedhar/home/a/state"]
    assert json.loads(state_a) == {"last_contribution": "1970-01-02T00:00:00+00:00", "sample_rate_hz": None}
    sent.clear()
    pub.sync(devices)
    assert sent == []  # nothing changed, nothing published
    devices[0] = {**devices[0], "last_contribution_unix": 90000.0}
    devices[1] = {**devices[1], "state": "forgotten"}
    pub.sync(devices)
    assert [t for t, p, _ in sent if p == b""] == [t for t, _ in ha.device_removal("home", "b")]
    assert [t for t, p, _ in sent if p != b""] == ["homeassistant/fedhar/home/a/state"]
