"""The fuzzer's mutations as MQTT messages: through a real Mosquitto into a running coordinator and clients.

tests/test_reliability_memory_and_fuzz.py feeds mutated envelopes, chunks and JSON messages to
the validators directly; here the same four mutation kinds (flip bytes, cut, splice, random
bytes) of the same baselines are published on every topic the coordinator or the clients
subscribe to (client updates, statuses and program requests; the coordinator's status, the
round announcement, global and per-client models, receipts and delivered programs; chunked
transfers on the model and update topics), a bounded number per topic,
while a two-client federation of two rounds runs. Then: both rounds closed with both
updates, every process exited 0, the coordinator logged its refusals with a reason, and
the logs stayed bounded.

The hostile sender publishes under ids of its own on the topics clients publish to (a
broker's ACLs, firmware_scripts/mosquitto_config.py, keep it off the real clients' topics) and
on the coordinator's topics as it finds them, never retained (so the coordinator's retained
messages stay what it published).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import split_payload
from har_models.wire.topics import Topics

ROOT = Path(__file__).resolve().parents[1]
FED, RUN = "fuzzed", "fuzzed"
CLIENTS = ("hapt-01", "hapt-02")
INTRUDERS = ("intruder-1", "hapt-99")
PER_TOPIC = 30  # mutated messages per topic
FUZZ_SECONDS = 90.0  # and never longer than this

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]


def mutate(blob: bytes, rng: random.Random) -> bytes:
    """One of the fuzzer's four mutations of ``blob``: flip 1-8 bytes, cut, splice up to 64 bytes in, or random bytes."""
    out = bytearray(blob)
    how = rng.choice(("flip", "cut", "splice", "random"))
    if how == "flip":
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= rng.randint(1, 255)
    elif how == "cut":
        out = out[: rng.randrange(len(out))]
    elif how == "splice":
        i = rng.randint(0, min(200, len(out)))
        out[i:i] = rng.randbytes(rng.randint(0, 64))
    else:
        out = bytearray(rng.randbytes(rng.randint(0, 512)))
    return bytes(out)


def _envelope(kind: str, client_id: str) -> bytes:
    spec = ArchSpec(n_classes=3, conv_filters=2, dense_units=4)  # not the federation's model: never acceptable as-is
    state = {k: v.numpy() for k, v in init_state(spec, 1).items()}
    meta = {"run_id": RUN, "stage": 0, "n_train": 4, "n_test": 2}
    return codec.encode(state, kind=kind, round=0, arch_version=spec.version, client_id=client_id, meta=meta)


def _json(d: dict) -> bytes:
    return json.dumps(d).encode()


def _targets(t: Topics) -> dict[str, list[bytes]]:
    """topic -> baselines to mutate (several: whole messages and the chunks of a chunked transfer)."""
    upd = _envelope("update", INTRUDERS[0])
    model = _envelope("model", "")
    chunks = lambda b: split_payload(b, 400)  # noqa: E731
    out: dict[str, list[bytes]] = {}
    for cid in INTRUDERS:  # the topics the coordinator subscribes to, under ids that are not the clients'
        out[t.client_status(cid)] = [_json({"protocol": 1, "client_id": cid, "state": "online", "n_train": 5})]
        out[t.client_update(cid, 0)] = [upd, *chunks(upd)]
        out[t.client_program_request(cid)] = [_json({"protocol": 1, "client_id": cid, "run_id": RUN, "backend": "executorch"})]
    # The topics the clients subscribe to, as the coordinator publishes them (not retained).
    out[t.coordinator_status] = [_json({"protocol": 1, "state": "online", "run_id": RUN, "attempt": "x"})]
    out[t.round] = [_json({"protocol": 1, "run_id": RUN, "round": 0, "state": "training", "arch": {}, "label_set": "hapt6"})]
    out[t.global_model(0)] = [model, *chunks(model)]
    for cid in CLIENTS:
        out[t.client_model(cid, 0)] = [model, *chunks(model)]
        receipt = {"protocol": 1, "run_id": RUN, "round": 0, "stage": 0, "transfer": "0" * 64, "state": "accepted"}
        out[t.client_receipt(cid)] = [_json(receipt)]
        out[t.client_programs(cid, 0)] = [model[:300], *chunks(model)[:2]]
    return out


class Fuzzer(threading.Thread):
    """Publishes :data:`PER_TOPIC` mutated messages on each target topic, round robin, once the coordinator and both
    clients are on the broker; then an intruder's update into each round it sees open.

    Each step waits for what the federation published (the retained statuses, the round announcements), never for a
    time, so a loaded machine changes when the messages go out, not whether they land while someone listens.
    """

    def __init__(self, port: int, topics: Topics, targets: dict[str, list[bytes]]) -> None:
        super().__init__(daemon=True)
        self.port, self.t, self.targets, self.sent = port, topics, targets, 0
        self.stop = threading.Event()
        self.seen: dict[str, bytes] = {}  # topic -> newest payload of the watched topics
        self.rounds_hit: set[int] = set()

    def _on_message(self, _c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        self.seen[msg.topic] = bytes(msg.payload)

    def _wait(self, ready: Callable[[], bool]) -> bool:
        end = time.monotonic() + FUZZ_SECONDS * 4  # a bound only for a federation that never comes up
        while not self.stop.is_set() and time.monotonic() < end:
            if ready():
                return True
            time.sleep(0.05)
        return False

    def _online(self) -> bool:
        st = [self.seen.get(self.t.coordinator_status, b""), *(self.seen.get(self.t.client_status(c), b"") for c in CLIENTS)]
        return all(b'"online"' in p or b'"idle"' in p for p in st)

    def run(self) -> None:
        rng = random.Random(20261201)
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="fuzzer", protocol=mqtt.MQTTv5)
        c.on_message = self._on_message
        c.connect("127.0.0.1", self.port)
        c.loop_start()
        try:
            own = SubscribeOptions(qos=1, noLocal=True)  # what the federation published, not this fuzzer's mutations
            c.subscribe([(self.t.coordinator_status, own), (self.t.round, own), *((self.t.client_status(x), own) for x in CLIENTS)])
            if not self._wait(self._online):
                return
            for _ in range(PER_TOPIC):
                for topic, bases in self.targets.items():
                    if self.stop.is_set():
                        return
                    c.publish(topic, mutate(rng.choice(bases), rng), qos=1, retain=False).wait_for_publish(5)
                    self.sent += 1
                time.sleep(0.2)  # spread over the rounds
            plain = _envelope("update", INTRUDERS[0])
            while not self.stop.is_set() and len(self.rounds_hit) < 2:  # an intruder's whole update into each open round
                if not self._wait(lambda: self._open_round() not in (None, *self.rounds_hit)):
                    return
                r = self._open_round()
                c.publish(self.t.client_update(INTRUDERS[0], 0), plain, qos=1).wait_for_publish(5)
                self.sent += 1
                if r is not None:
                    self.rounds_hit.add(r)
        finally:
            c.loop_stop()
            c.disconnect()

    def _open_round(self) -> int | None:
        try:
            ann = json.loads(self.seen.get(self.t.round, b"") or b"{}")
        except ValueError:
            return None
        return ann.get("round") if ann.get("state") == "training" and ann.get("run_id") == RUN else None


def test_mutated_messages_on_every_topic_leave_the_federation_whole(tmp_path: Path, mosquitto: int) -> None:
    t = Topics(FED)
    targets = _targets(t)
    broker = ["--broker", f"127.0.0.1:{mosquitto}", "--federation", FED]
    coord_cmd = [sys.executable, "-m", "coordinator.cli", *broker, "--run-id", RUN, "--run-dir", str(tmp_path / "run"),
                 "--expected-clients", "2", "--min-clients", "2", "--rounds", "2", "--conv-filters", "8", "--dense-units", "32",
                 "--local-epochs", "1", "--start-timeout", "200", "--round-timeout", "200", "--generalisation-every", "0",
                 "--no-progress"]  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("coordinator", *CLIENTS)}
    fuzzer = Fuzzer(mosquitto, t, targets)
    try:
        with open(logs["coordinator"], "wb") as fh:
            procs["coordinator"] = subprocess.Popen(coord_cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        fuzzer.start()  # from when the clients are on the broker until the second round
        for k, cid in enumerate(CLIENTS, start=1):
            cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, *broker, "--backend", "numpy",
                   "--source", f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}", "--state-dir", str(tmp_path / cid),
                   "--max-seconds", "400", "--exit-after-run", RUN]  # fmt: skip
            with open(logs[cid], "wb") as fh:
                procs[cid] = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        end = time.monotonic() + 420
        while time.monotonic() < end and any(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
    finally:
        fuzzer.stop.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(30)
        fuzzer.join(10)
    text = {name: path.read_text(errors="replace") for name, path in logs.items()}
    tails = {name: s[-3000:] for name, s in text.items()}
    assert {name: p.returncode for name, p in procs.items()} == dict.fromkeys(procs, 0), tails
    print(f"{fuzzer.sent} mutated messages on {len(targets)} topics")
    assert fuzzer.sent >= len(targets) * 5, fuzzer.sent  # the mutations went out while the federation ran
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [r["updates"] for r in doc["rounds"]] == [2, 2], tails
    # Refusals are recorded with their reason: in the round record, and in the logs of each side.
    rejections = [tuple(r) for rd in doc["rounds"] for r in rd.get("rejections", [])]
    assert sum(rd["rejected"] for rd in doc["rounds"]) == sum(n for _, _, n in rejections) > 0, rejections
    assert {cid for cid, _, _ in rejections} <= set(INTRUDERS) and all(reason for _, reason, _ in rejections), rejections
    assert "rejected update from" in text["coordinator"] and "ignoring malformed status of client" in text["coordinator"]
    for cid in CLIENTS:
        assert "ignoring malformed round announcement" in text[cid] and "dropped a global model chunk (" in text[cid], tails[cid]
    # Bounded: at most one line per hostile message beyond an ordinary run's, and no traceback anywhere.
    for name, s in text.items():
        assert "Traceback" not in s, (name, tails[name])
        assert len(s.splitlines()) <= 60 + fuzzer.sent, (name, len(s.splitlines()), fuzzer.sent)
