"""Model transfer over MQTT: the project's path against a raw publish of the same bytes, per broker.

Baseline (measured in the same run, on the same broker): one plain paho-mqtt client publishes
the bytes of one encoded paper-size model (the envelope of :func:`har_models.wire.codec.encode`:
safetensors body, 25.8 MB for the 6,448,714 float32 parameters of the paper CNN) cut into
messages of the size the project's chunks have (``max_message_bytes``, 1,000,000 by default),
QoS 1, to a second plain paho client subscribed on the same broker; the time runs from the
first publish until the subscriber holds every byte.

Candidate: the path a personalised model takes from the coordinator to a client
(``coordinator/service.py`` ``_publish_models``, ``edge_client/agent.py`` ``_handle`` and
``_decode_and_train``): :func:`har_models.wire.codec.encode` of the state, then
:meth:`har_io.mqtt_link.MqttLink.publish_chunks` on the client's model topics, retained, QoS 1,
at most :data:`~har_io.mqtt_link.PUBLISH_WINDOW` chunks unacknowledged
(:func:`har_models.wire.chunking.iter_chunks`: a 56-byte header with the transfer's sha256 and a
CRC-32 per chunk); on the receiving side a second
:class:`~har_io.mqtt_link.MqttLink` subscribed to those topics, a
:class:`~har_models.wire.chunking.Reassembler` (CRC of every chunk, sha256 of the whole fed chunk
by chunk as they arrive) and :func:`har_models.wire.codec.decode` told, as the client tells it,
that the whole envelope was verified (safetensors parse, finiteness check; no second sha256 of
the body). The time runs from the start of the encoding until the decoded tensors are there. Each repetition
sends a model for another round (another envelope), so no transfer id repeats.
``project, not retained`` is the same path with ``retain=False``, to show what the broker's
retained store costs.

Throughput is the envelope's bytes over the time; the ratio is candidate / baseline
(issue 13 asks for at least 0.8). Brokers: the embedded amqtt broker as the project starts it
(:class:`simulation.broker.EmbeddedBroker`, MQTT 3.1.1) and Mosquitto on 127.0.0.1 (as
:class:`simulation.broker.LocalMosquitto` starts it; skipped with a note where the binary is absent). The
variants take turns within each repetition, so a slow moment of a shared machine falls on all.
Where the time of the candidate goes is printed per broker (encoded, last chunk acknowledged,
reassembled at the receiver, decoded; "transport" is encoded -> reassembled, the part that
corresponds to the baseline), and each CPU step of the path is timed on its own, without a
network (encode, chunk framing, reassembly, decode, and one sha256 of the envelope for scale).

It also prints the bytes one client sends and receives per round under each strategy,
computed from the envelopes the protocol sends (models from the coordinator, updates from
the client with the metadata a client adds, for each ``--update-encoding``).

Run: ``python benchmarks/bench_transfer.py`` (``--reps`` repetitions per variant, default 5;
``--json`` for machine-readable output). The last line is
``transfer_vs_raw=<lowest ratio over the brokers> ...`` with each broker's ratio after it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import CHUNK_HEADER_BYTES, DEFAULT_MAX_MESSAGE_BYTES, Reassembler, iter_chunks, transfer_id
from har_models.wire.messages import GUIDANCE_PREFIX, UPDATE_ENCODINGS
from har_models.wire.topics import Topics
from har_models.wire.update_encoding import encode_update
from simulation.broker import EmbeddedBroker, LocalMosquitto, find_mosquitto

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks' own helpers
from benchmarks.machine_load import LoadLog

SPEC = ArchSpec(n_classes=6)
"""The paper CNN for HAPT's 6 classes: 196 filters, 1024 units, 6,448,714 parameters."""

TOPICS = Topics("bench")
CLIENT = "bench-client"
TIMEOUT_S = 300.0
"""Longest wait for one transfer (s); a transfer that takes longer fails the benchmark."""

Arrays = dict[str, np.ndarray]


def model_state(spec: ArchSpec, seed: int = 0) -> Arrays:
    """A model of ``spec``'s shapes (Glorot-initialised, float32), as numpy arrays."""
    return {k: v.numpy() for k, v in init_state(spec, seed).items()}


def model_envelope(state: Mapping[str, Any], round_: int, spec: ArchSpec = SPEC, client_id: str = CLIENT) -> bytes:
    """A model envelope as the coordinator encodes one (``service._publish_models``)."""
    return codec.encode(state, kind="model", round=round_, arch_version=spec.version, client_id=client_id,
                        meta={"arch": spec.to_dict()})  # fmt: skip


# --------------------------------------------------------------------------------------- brokers
@contextmanager
def mosquitto() -> Iterator[int | None]:
    """Mosquitto on 127.0.0.1:<free port>, started as ``fedhar-simulate --local-broker mosquitto`` starts it; None if not installed."""
    if find_mosquitto() is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp, LocalMosquitto(log_file=Path(tmp) / "mosquitto.log") as broker:
        yield broker.port


@contextmanager
def amqtt() -> Iterator[int | None]:
    """The embedded amqtt broker, started as the simulation starts it."""
    with EmbeddedBroker() as broker:
        yield broker.port


# --------------------------------------------------------------------------------------- baseline
class RawPair:
    """Two plain paho clients on one broker: a publisher and a subscriber that counts the bytes it receives.

    Parameters
    ----------
    port : int
        Broker port on 127.0.0.1.
    protocol : {"5", "3.1.1"}
        MQTT version both clients speak (the one the project's link negotiated with this broker).
    """

    def __init__(self, port: int, protocol: str):
        version = mqtt.MQTTv5 if protocol == "5" else mqtt.MQTTv311
        self._got = 0
        self._want = 0
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.sub = self._client("bench-raw-sub", version)
        self.sub.on_message = self._on_message
        self.sub.on_subscribe = lambda *a: self._subscribed.set()
        self.pub = self._client("bench-raw-pub", version)
        for c in (self.sub, self.pub):
            c.connect("127.0.0.1", port, keepalive=60)
            c.loop_start()
        end = time.monotonic() + 30
        while not (self.sub.is_connected() and self.pub.is_connected()):
            if time.monotonic() > end:
                raise RuntimeError(f"plain paho clients could not connect to 127.0.0.1:{port}")
            time.sleep(0.02)
        self.sub.subscribe("bench/raw/#", qos=1)
        if not self._subscribed.wait(30):
            raise RuntimeError("the broker did not acknowledge the raw subscription")

    @staticmethod
    def _client(name: str, version: mqtt.MQTTProtocolVersion) -> mqtt.Client:
        return mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=version)

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self._got += len(msg.payload)
            if self._want and self._got >= self._want:
                self._done.set()

    def transfer(self, payload: bytes, message_bytes: int, rep: int) -> float:
        """Publish ``payload`` in ``message_bytes`` pieces at QoS 1; seconds until the subscriber has every byte.

        Raises
        ------
        TimeoutError
            If the bytes have not all arrived within :data:`TIMEOUT_S`.
        """
        with self._lock:
            self._got, self._want = 0, len(payload)
            self._done.clear()
        view = memoryview(payload)
        t0 = time.perf_counter()
        for i, lo in enumerate(range(0, len(payload), message_bytes)):
            self.pub.publish(f"bench/raw/{rep}/{i}", bytes(view[lo : lo + message_bytes]), qos=1)
        if not self._done.wait(TIMEOUT_S):
            raise TimeoutError(f"raw transfer {rep}: {self._got} of {len(payload)} bytes after {TIMEOUT_S} s")
        return time.perf_counter() - t0

    def close(self) -> None:
        """Disconnect both clients."""
        for c in (self.pub, self.sub):
            c.disconnect()
            c.loop_stop()


# -------------------------------------------------------------------------------------- candidate
class ProjectPair:
    """The coordinator's sending link and a client's receiving link, with the client's reassembly and decoding.

    Parameters
    ----------
    port : int
        Broker port on 127.0.0.1.
    max_message_bytes : int
        The links' ``max_message_bytes`` (chunk message size).
    """

    def __init__(self, port: int, max_message_bytes: int):
        cfg = BrokerConfig(host="127.0.0.1", port=port, max_message_bytes=max_message_bytes)
        self.sender = MqttLink(cfg, "bench-coordinator")
        self.receiver = MqttLink(cfg, f"fedhar-client-{CLIENT}", subscriptions=[(TOPICS.client_model(CLIENT, "+"), 1)])
        for link in (self.sender, self.receiver):
            if not link.start(wait_s=30.0):
                raise RuntimeError(f"{link.client_name} could not connect to 127.0.0.1:{port}")
        self.reassembler = Reassembler()
        self.topic_of: Callable[[int], str] = functools.partial(TOPICS.client_model, CLIENT)
        self.chunks = 0

    @property
    def protocol(self) -> str:
        """MQTT version the links speak with this broker."""
        return self.sender.protocol

    def transfer(self, state: Mapping[str, Any], round_: int, retain: bool) -> dict[str, float]:
        """Encode, publish in chunks, receive, reassemble and decode one model; the phases' end times (s from start).

        Raises
        ------
        TimeoutError, RuntimeError
            If the transfer does not complete within :data:`TIMEOUT_S` or decodes to another model.
        """
        marks: dict[str, float] = {}
        failed: list[BaseException] = []
        t0 = time.perf_counter()
        env = model_envelope(state, round_)
        marks["encoded"] = time.perf_counter() - t0

        def send() -> None:
            try:
                self.chunks = self.sender.publish_chunks(self.topic_of, env, retain=retain, timeout=TIMEOUT_S)
                marks["acknowledged"] = time.perf_counter() - t0
            except BaseException as exc:  # reported to the caller below
                failed.append(exc)

        sender = threading.Thread(target=send, name="bench-send")
        sender.start()
        end = time.monotonic() + TIMEOUT_S
        envelope, transfer = None, ""
        while envelope is None:
            left = end - time.monotonic()
            if left <= 0 or failed:
                break
            try:
                _, payload, _ = self.receiver.inbox.get(timeout=min(0.5, left))
            except queue.Empty:
                continue
            if not payload:  # a cleared retained chunk of an earlier repetition
                continue
            done = self.reassembler.add("personal", payload)
            if done is not None:
                transfer, envelope = done
        if envelope is None:
            sender.join(TIMEOUT_S)
            raise failed[0] if failed else TimeoutError(f"model transfer {round_} did not complete within {TIMEOUT_S} s")
        marks["reassembled"] = time.perf_counter() - t0
        decoded = codec.decode(envelope, verified=transfer)  # as the client does: the reassembler checked the whole
        marks["decoded"] = time.perf_counter() - t0
        sender.join(TIMEOUT_S)
        if failed:
            raise failed[0]
        if decoded.round != round_ or set(decoded.tensors) != set(state):
            raise RuntimeError(f"transfer {round_} delivered round {decoded.round} with tensors {sorted(decoded.tensors)}")
        if retain:  # as the coordinator does when a run ends: the broker does not keep 26 MB per repetition
            self.sender.clear_retained([self.topic_of(i) for i in range(self.chunks)])
        return marks

    def close(self) -> None:
        """Disconnect both links."""
        self.receiver.stop()
        self.sender.stop()


def measure_broker(name: str, port: int, state: Arrays, reps: int, max_message_bytes: int) -> dict[str, Any]:
    """Baseline and candidate on one broker, ``reps`` turns each after one untimed warm-up turn."""
    size = len(model_envelope(state, 0))
    project = ProjectPair(port, max_message_bytes)
    chunk = project.sender.chunk_size(project.topic_of)
    raw = RawPair(port, project.protocol)
    times: dict[str, list[float]] = {"raw": [], "project": [], "project, not retained": []}
    phases: list[dict[str, float]] = []
    try:
        for rep in range(reps + 1):
            t_raw = raw.transfer(model_envelope(state, 10_000 + rep), chunk, rep)
            marks = project.transfer(state, 1 + 2 * rep, retain=True)
            plain = project.transfer(state, 2 + 2 * rep, retain=False)
            if rep == 0:
                continue  # warm-up: connections, allocator, page cache
            times["raw"].append(t_raw)
            times["project"].append(marks["decoded"])
            times["project, not retained"].append(plain["decoded"])
            phases.append(marks)
            print(f"  [{name}] turn {rep}: raw {t_raw:.2f} s, project {marks['decoded']:.2f} s, "
                  f"not retained {plain['decoded']:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        raw.close()
        project.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    mid = sorted(phases, key=lambda m: m["decoded"])[(len(phases) - 1) // 2]
    return {
        "broker": name,
        "protocol": project.protocol,
        "envelope_bytes": size,
        "message_bytes": chunk,
        "messages": project.chunks,
        "seconds": med,
        "all_seconds": times,
        "mb_per_s": {k: size / v / 1e6 for k, v in med.items()},
        "ratio": med["raw"] / med["project"],
        "ratio_not_retained": med["raw"] / med["project, not retained"],
        "phases": mid,
    }


def components(state: Arrays, reps: int, message_bytes: int) -> dict[str, float]:
    """Seconds of each CPU step of the project's path on its own (median of ``reps``), no network.

    Keys: ``encode`` (:func:`codec.encode`: sha256 of the safetensors body, one copy into the
    envelope), ``chunk`` (:func:`iter_chunks`: the envelope's sha256, a CRC-32 and a header
    per chunk), ``reassemble`` (:class:`Reassembler`: CRC-32 and sha256 update per chunk, join),
    ``decode`` (:func:`codec.decode` with ``verified``, as the client calls it: safetensors parse,
    finiteness) and, for scale, ``sha256`` (one sha256 of the envelope's bytes). Each ``chunk``
    turn cuts a fresh copy of the envelope, so it never finds the digest of an earlier turn.
    """
    env = model_envelope(state, 1)
    chunks = list(iter_chunks(env, message_bytes))
    tid = transfer_id(env)
    fresh = iter([bytes(bytearray(env)) for _ in range(reps)])  # equal bytes, new objects: none has a remembered digest

    def reassemble() -> None:
        r = Reassembler()
        for c in chunks:
            r.add("personal", c)

    steps: dict[str, Callable[[], object]] = {
        "encode": lambda: model_envelope(state, 1),
        "chunk": lambda: list(iter_chunks(next(fresh), message_bytes)),
        "reassemble": reassemble,
        "decode": lambda: codec.decode(env, verified=tid),
        "sha256": lambda: hashlib.sha256(env).digest(),
    }
    out = {}
    for name, fn in steps.items():
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


# ----------------------------------------------------------------------------------- bytes per round
def update_envelope(spec: ArchSpec, guidance: bool, encoding: str, received: Arrays) -> bytes:
    """An update envelope as a client builds one (``edge_client/trainer.py``): model (+ guidance), metadata, encoding."""
    trained = model_state(spec, 1)
    tensors: dict[str, Any] = dict(trained)
    if guidance:
        tensors.update({GUIDANCE_PREFIX + k: v for k, v in model_state(spec, 2).items()})
    cm = [[12 if r == c else 1 for c in range(spec.n_classes)] for r in range(spec.n_classes)]
    meta: dict[str, Any] = {
        "run_id": "bench", "stage": 0, "n_train": 300, "n_test": 75, "label_set": "hapt6", "train_loss": [0.8123],
        "train_seconds": 12.5, "steps": 10, "init_mode": "overwrite", "ala": None,
        "confusion": {"received": cm, "initial": cm, "trained": cm},
    }  # fmt: skip
    arrays, enc_meta, _ = encode_update(tensors, received, encoding)
    meta.update(enc_meta)
    return codec.encode(arrays, kind="update", round=1, arch_version=spec.version, client_id=CLIENT, meta=meta)


def exchange_bytes(spec: ArchSpec, guidance: bool) -> dict[str, int]:
    """Bytes of one exchange for one client at ``spec``: the model down, the update up in each encoding."""
    received = model_state(spec, 0)
    out = {"down": len(model_envelope(received, 1, spec))}
    for enc in UPDATE_ENCODINGS:
        out[enc] = len(update_envelope(spec, guidance, enc, received))
    return out


def bytes_per_round() -> list[dict[str, Any]]:
    """Per-client bytes of one round for each strategy (sum over the round's exchanges)."""
    conv_grown = replace(SPEC, conv_filters=245, version=1)
    both_grown = replace(SPEC, conv_filters=245, dense_units=1280, version=2)
    one = exchange_bytes(SPEC, guidance=False)
    dwa = exchange_bytes(SPEC, guidance=True)
    after = exchange_bytes(both_grown, guidance=False)
    growth = [one, exchange_bytes(conv_grown, guidance=False), after]
    grow_sum = {k: sum(e[k] for e in growth) for k in one}
    ten = {k: (grow_sum[k] + 9 * after[k]) / 10 for k in one}
    rows: list[tuple[str, float, Mapping[str, float]]] = [
        ("fedavg", 1, one),
        ("fedavg+ala", 1, one),
        ("fedper", 1, one),
        ("feddwa", 1, dwa),
        ("feddist, growth round (196->245 F, 1024->1280 H)", 3, grow_sum),
        ("feddist, round at 245 F, 1280 H", 1, after),
        ("feddist, 10 rounds: 1 growth + 9 grown (mean)", 1.2, ten),
    ]
    return [{"strategy": s, "exchanges": x, **b} for s, x, b in rows]


# ------------------------------------------------------------------------------------------ main
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="timed transfers per variant and broker; the median is reported (5)")
    ap.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                    help=f"the links' max_message_bytes, i.e. the chunk message size (default {DEFAULT_MAX_MESSAGE_BYTES})")  # fmt: skip
    ap.add_argument("--brokers", default="amqtt,mosquitto", help="which brokers (amqtt,mosquitto)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")

    state = model_state(SPEC)
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    starters = {"amqtt": amqtt, "mosquitto": mosquitto}
    load = LoadLog()
    for name in [b.strip() for b in args.brokers.split(",") if b.strip()]:
        if name not in starters:
            ap.error(f"unknown broker {name!r}; choose amqtt and/or mosquitto")
        with starters[name]() as port:
            if port is None:
                notes.append(f"{name}: not installed (apt-get install mosquitto); skipped")
                continue
            print(f"{name} on 127.0.0.1:{port}", file=sys.stderr, flush=True)
            with load.around(f"{name} (raw and project transfers alternated)"):
                results.append(measure_broker(name, port, state, args.reps, args.max_message_bytes))
    traffic = bytes_per_round()
    steps = components(state, args.reps, results[0]["message_bytes"] if results else args.max_message_bytes)

    if args.json:
        print(json.dumps({"transfer": results, "notes": notes, "components": steps, "bytes_per_round": traffic}, indent=2))
    else:
        if results:
            r0 = results[0]
            print(f"model transfer: project path vs raw paho publish, one {r0['envelope_bytes']:,}-byte model envelope "
                  f"({SPEC.n_parameters():,} float32 parameters) in {r0['messages']} messages of {r0['message_bytes']:,} bytes, "
                  f"QoS 1, median of {args.reps}")  # fmt: skip
            print(f"{'broker':<10} {'MQTT':>5} {'raw s':>7} {'raw MB/s':>9} {'project s':>10} {'project MB/s':>13} {'ratio':>6} "
                  f"{'not retained s':>15} {'ratio':>6}")  # fmt: skip
            for r in results:
                s, mb = r["seconds"], r["mb_per_s"]
                print(f"{r['broker']:<10} {r['protocol']:>5} {s['raw']:>7.2f} {mb['raw']:>9.1f} {s['project']:>10.2f} "
                      f"{mb['project']:>13.1f} {r['ratio']:>6.2f} {s['project, not retained']:>15.2f} "
                      f"{r['ratio_not_retained']:>6.2f}")  # fmt: skip
            print()
            print("where the project path's time goes (median turn; seconds from the start of encoding; transport = "
                  "encoded -> reassembled, its ratio = raw s / transport s)")  # fmt: skip
            print(f"{'broker':<10} {'encoded':>8} {'last ack':>9} {'reassembled':>12} {'decoded':>8} {'transport s':>12} "
                  f"{'transport ratio':>16}")  # fmt: skip
            for r in results:
                p = r["phases"]
                transport = p["reassembled"] - p["encoded"]
                print(f"{r['broker']:<10} {p['encoded']:>8.2f} {p.get('acknowledged', float('nan')):>9.2f} {p['reassembled']:>12.2f} "
                      f"{p['decoded']:>8.2f} {transport:>12.2f} {r['seconds']['raw'] / transport:>16.2f}")  # fmt: skip
            print()
            print(f"the project path's CPU steps alone, no network (median of {args.reps}; ms): "
                  + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items()))  # fmt: skip
        for note in notes:
            print(f"note: {note}")
        print()
        print(f"bytes per client per round (envelopes; chunking adds {CHUNK_HEADER_BYTES} bytes per message of "
              f"{args.max_message_bytes:,}), MB = 10^6 bytes")  # fmt: skip
        print(f"{'strategy':<50} {'exch.':>5} {'down MB':>8} {'up f32':>8} {'up f16':>8} {'up int8':>8} {'30 clients down/up f32 MB':>26}")
        for t in traffic:
            pair = f"{30 * t['down'] / 1e6:.0f} / {30 * t['float32'] / 1e6:.0f}"
            print(f"{t['strategy']:<50} {t['exchanges']:>5} {t['down'] / 1e6:>8.2f} {t['float32'] / 1e6:>8.2f} "
                  f"{t['float16'] / 1e6:>8.2f} {t['int8_delta'] / 1e6:>8.2f} {pair:>26}")  # fmt: skip
    if not results:
        print("transfer_vs_raw=nan")
        return 1
    per = " ".join(f"transfer_vs_raw_{r['broker']}={r['ratio']:.2f}" for r in results)
    for line in load.lines():
        print(line)
    print(f"transfer_vs_raw={min(r['ratio'] for r in results):.2f} {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
