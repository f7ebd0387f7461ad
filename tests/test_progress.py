"""The retained progress message: its format, and an observer that follows a real federation by subscribing."""

from __future__ import annotations

import json
import queue

import paho.mqtt.client as mqtt
import pytest

from coordinator.record import RoundRecord
from har_models.wire.messages import MAX_PROGRESS_BYTES, PROGRESS_VERSION, MessageError, RoundProgress
from har_models.wire.topics import Topics
from simulation import simulate
from simulation.broker import EmbeddedBroker

RECORD = {"round": 3, "selected": 2, "updates": 2, "rejected": 0, "missing": [], "arch_version": 0, "conv_filters": 8,
          "dense_units": 32, "bytes_up": 10, "bytes_down": 20, "received_union": None, "seconds": 0.5}  # fmt: skip


def test_the_progress_topic_sits_under_the_federation() -> None:
    assert Topics("home").progress == "fedhar/v1/home/progress"
    assert Topics("home").parse_client_topic(Topics("home").progress) is None  # not a client's topic


def test_progress_round_trips() -> None:
    msg = RoundProgress("run-1", 3, 10, RECORD)
    back = RoundProgress.from_bytes(msg.to_bytes())
    assert back == msg and back.version == PROGRESS_VERSION
    assert json.loads(msg.to_bytes())["protocol"] == 1


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"version": 2}, "version 2, this build reads 1"),
        ({"protocol": 9}, "protocol 9"),
        ({"round": -1}, "round must be an integer"),
        ({"rounds": "ten"}, "rounds must be an integer"),
        ({"record": [1]}, "'record' an object"),
        ({"record": {**RECORD, "round": 4}}, "the record is of round 4, the message of 3"),
        ({"extra": 1}, "unexpected keyword argument 'extra'"),
    ],
)
def test_malformed_progress_is_refused(change: dict, match: str) -> None:
    d = {**json.loads(RoundProgress("run-1", 3, 10, RECORD).to_bytes()), **change}
    with pytest.raises(MessageError, match=match):
        RoundProgress.from_bytes(json.dumps(d).encode())


def test_progress_is_bounded() -> None:
    big = {**RECORD, "missing": ["c" * 60] * (MAX_PROGRESS_BYTES // 60)}
    with pytest.raises(ValueError, match="above 1048576"):
        RoundProgress("run-1", 3, 10, big).to_bytes()
    with pytest.raises(MessageError, match="above 1048576"):
        RoundProgress.from_bytes(b" " * (MAX_PROGRESS_BYTES + 1))


def _observer(port: int, topic: str, got: queue.Queue, name: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv311)
    c.on_message = lambda client, userdata, msg: got.put((msg.payload, bool(msg.retain)))
    c.on_connect = lambda client, userdata, flags, rc, props: client.subscribe(topic, qos=1)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


@pytest.mark.slow
def test_an_observer_follows_a_federation_over_the_embedded_broker(tmp_path) -> None:
    federation, run_dir = "observed", tmp_path / "run"
    topic = Topics(federation).progress
    with EmbeddedBroker(log_file=tmp_path / "broker.log") as broker:
        live: queue.Queue = queue.Queue()
        watcher = _observer(broker.port, topic, live, "watcher")  # subscribed before the run: sees every round
        try:
            argv = ["--clients", "3", "--rounds", "2", "--conv-filters", "8", "--dense-units", "32", "--no-progress",
                    "--round-timeout", "120", "--start-timeout", "120", "--workers", "1", "--aggregation", "feddwa",
                    "--broker", f"127.0.0.1:{broker.port}", "--federation", federation, "--run-dir", str(run_dir),
                    "--run-id", "observed-run"]  # fmt: skip
            assert simulate.main(argv) == 0
        finally:
            watcher.loop_stop()
            watcher.disconnect()
        late: queue.Queue = queue.Queue()
        after = _observer(broker.port, topic, late, "late-observer")  # subscribed after the run: gets the retained one
        try:
            payload, retained = late.get(timeout=30)
        finally:
            after.loop_stop()
            after.disconnect()
    doc = json.loads((run_dir / "report.json").read_text())
    assert retained
    last = RoundProgress.from_bytes(payload)
    assert (last.run_id, last.round, last.rounds) == ("observed-run", 1, 2)
    assert last.record == doc["rounds"][-1]  # the same values as the report's last round, key for key
    rec = RoundRecord.from_json(last.record)
    assert rec == RoundRecord.from_json(doc["rounds"][-1])
    assert rec.feddwa_weights is not None and rec.feddwa_weights.clients == ("hapt-01", "hapt-02", "hapt-03")
    assert sorted(rec.evaluation.personalisation_clients) == ["hapt-01", "hapt-02", "hapt-03"]
    seen = []
    while not live.empty():
        p, _ = live.get()
        if p:  # the run's start clears any earlier run's progress with an empty retained message
            seen.append(RoundProgress.from_bytes(p))
    assert [m.round for m in seen] == [0, 1]
    assert [m.record for m in seen] == doc["rounds"]
