"""Whole federations over real brokers: the embedded amqtt one and a real Mosquitto.

Small CNN widths keep each run to seconds; everything else (processes, MQTT, chunking,
validation, aggregation, evaluation, reports) is the real main job.
"""

from __future__ import annotations

import math
import sqlite3
import threading

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from har_models.wire import codec
from har_models.wire.chunking import split_payload
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.topics import Topics

pytestmark = pytest.mark.slow  # whole federations over three brokers


def _run(small_simulation, *extra: str) -> dict:
    """Two rounds of the small federation (3 clients) in ``tmp_path / "run"``."""
    return small_simulation("--rounds", "2", *extra, run_id="itest")


def _check_report(doc: dict) -> None:
    assert [r["round"] for r in doc["rounds"]] == [0, 1]
    for r in doc["rounds"]:
        assert r["updates"] == 3 and r["selected"] == 3 and r["missing"] == []
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0
        for measure in ("global", "personalisation", "generalisation"):
            for key in ("accuracy", "macro_f1"):
                v = r[measure][key]
                assert math.isfinite(v) and 0.0 <= v <= 1.0, (measure, key, v)
    assert doc["final"]["global"]["round"] == 1


def test_two_rounds_of_three_clients_over_the_embedded_broker(tmp_path, small_simulation):
    doc = _run(small_simulation)
    _check_report(doc)
    assert "embedded amqtt" in doc["broker"]
    assert (tmp_path / "run" / "metrics.png").stat().st_size > 1000
    assert "| 1 | 3/3 |" in (tmp_path / "run" / "report.md").read_text()


def test_two_rounds_of_three_clients_over_mosquitto(small_simulation, mosquitto):
    doc = _run(small_simulation, "--broker", f"127.0.0.1:{mosquitto}")
    _check_report(doc)
    assert doc["broker"] == f"external 127.0.0.1:{mosquitto}"


def test_two_rounds_of_three_clients_over_a_mosquitto_the_simulation_starts(tmp_path, small_simulation, mosquitto):
    doc = _run(small_simulation, "--local-broker", "mosquitto")  # the fixture only makes sure Mosquitto is installed
    _check_report(doc)
    assert doc["broker"] == "embedded mosquitto (MQTT 3.1.1, loopback)"
    assert "listener" in (tmp_path / "run" / "logs" / "mosquitto.conf").read_text()
    assert b"mosquitto" in (tmp_path / "run" / "logs" / "broker.log").read_bytes()


def _saboteur(port: int, federation: str, stop: threading.Event) -> None:
    """Publishes every kind of bad input once the first round opens."""
    topics = Topics(federation)
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="saboteur")
    done = threading.Event()

    def on_message(client, userdata, msg):
        if done.is_set() or not msg.payload:
            return
        ann = RoundAnnouncement.from_bytes(msg.payload)
        if ann.state != "training":
            return
        done.set()
        client.publish(topics.client_status("evil"), b"{not json", qos=1)
        client.publish(topics.client_update("hapt-01", 0), b"\x00garbage", qos=1)
        stale = codec.encode(
            {"w": np.zeros(2, np.float32)},
            kind="update",
            round=ann.round + 7,
            arch_version=0,
            client_id="hapt-02",
            meta={"run_id": ann.run_id, "stage": 0, "n_train": 1, "n_test": 0},
        )
        for i, ch in enumerate(split_payload(stale, 200)):
            client.publish(topics.client_update("hapt-02", i), ch, qos=1)
        corrupt = bytearray(
            codec.encode(
                {"w": np.ones(4, np.float32)}, kind="update", round=ann.round, arch_version=0, client_id="hapt-03", meta={}
            )
        )
        corrupt[-1] ^= 0xFF
        for i, ch in enumerate(split_payload(bytes(corrupt), 200)):
            client.publish(topics.client_update("hapt-03", i), ch, qos=1)

    c.on_message = on_message
    c.connect("127.0.0.1", port)
    c.subscribe(topics.round, qos=1)
    c.loop_start()
    stop.wait(180)
    c.loop_stop()
    c.disconnect()


def test_bad_input_on_the_wire_is_rejected_and_the_run_completes(tmp_path, small_simulation, mosquitto):
    stop = threading.Event()
    t = threading.Thread(target=_saboteur, args=(mosquitto, "itest-fed", stop), daemon=True)
    t.start()
    try:
        doc = _run(small_simulation, "--broker", f"127.0.0.1:{mosquitto}", "--federation", "itest-fed")
    finally:
        stop.set()
        t.join(10)
    _check_report(doc)  # all three real updates were still accepted in both rounds
    with sqlite3.connect(tmp_path / "run" / "state.sqlite") as db:
        rows = db.execute("SELECT client, detail FROM events WHERE kind = 'rejected'").fetchall()
    reasons = {(c, d.split(":")[0]) for c, d in rows}
    assert ("hapt-01", "bad_chunk") in reasons
    assert ("hapt-02", "future_round") in reasons
    assert ("hapt-03", "sha256_mismatch") in reasons
    # the round records name the same rejections, with their counts
    recorded = {(c, why) for r in doc["rounds"] for c, why, n in r.get("rejections", []) if n >= 1}
    assert {("hapt-01", "bad_chunk"), ("hapt-02", "future_round"), ("hapt-03", "sha256_mismatch")} <= recorded
    assert sum(r["rejected"] for r in doc["rounds"]) == sum(n for r in doc["rounds"] for _, _, n in r.get("rejections", []))
