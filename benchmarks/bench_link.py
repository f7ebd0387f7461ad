"""How fast the MQTT link lets a publish leave: a lone QoS 1 message and a multi-MB payload, per broker.

What it guards: a publish from the program's thread must wake paho's network loop at once
instead of waiting up to the loop's 1 s select() timeout (docs/benchmarks-server.md: before
the wake-up fix a lone publish with its acknowledgement took 1.0 s and a 26 MB model about
0.96 s on either broker). The link runs paho's own ``loop_start`` thread, which has that
wake-up built in.

Two measurements on each broker (the embedded amqtt broker, MQTT 3.1.1, and Mosquitto on
127.0.0.1, MQTT 5, both as :mod:`simulation.broker` starts them):

* ``lone ms``: one :meth:`~har_io.mqtt_link.MqttLink.publish` at QoS 1, from the call until
  the broker's acknowledgement (median of ``--lone`` messages, each after 20 ms of quiet, so
  no other traffic can wake the loop instead);
* ``payload s``: ``--payload-mb`` of random bytes through
  :meth:`~har_io.mqtt_link.MqttLink.publish_chunks` (chunks of ``max_message_bytes``, not
  retained) to a second link subscribed to the topics, from the call until the receiver's
  :class:`~har_models.wire.chunking.Reassembler` holds the whole payload (median of ``--reps``).

``--baseline-link FILE`` measures a second link module in the same run, taking turns with the
current one in every repetition, e.g. the link before this change::

    git show 4e4b297:har_io/mqtt_link.py > /tmp/mqtt_link_before.py
    python benchmarks/bench_link.py --baseline-link /tmp/mqtt_link_before.py

The last line is ``link_lone_ms=<worst median over the brokers> link_payload_s=<worst median>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import har_io.mqtt_link as current_link
from har_io.broker_config import BrokerConfig
from har_models.wire.chunking import DEFAULT_MAX_MESSAGE_BYTES, Reassembler
from simulation.broker import EmbeddedBroker, LocalMosquitto, find_mosquitto

TIMEOUT_S = 120.0
"""Longest wait for one publish or payload (s); longer fails the benchmark."""


def load_link(path: Path) -> ModuleType:
    """Import a link module from ``path`` under its own name (``bench_baseline_link``).

    Raises
    ------
    ImportError
        If the file cannot be imported.
    """
    spec = importlib.util.spec_from_file_location("bench_baseline_link", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextmanager
def broker(name: str) -> Iterator[int | None]:
    """Port of a started broker ``name`` ("amqtt" or "mosquitto"); None where Mosquitto is not installed."""
    if name == "amqtt":
        with EmbeddedBroker() as b:
            yield b.port
        return
    if find_mosquitto() is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-link-") as tmp, LocalMosquitto(log_file=Path(tmp) / "mosquitto.log") as b:
        yield b.port


class Pair:
    """A sending and a receiving link of module ``mod`` on one broker."""

    def __init__(self, mod: ModuleType, tag: str, port: int, max_message_bytes: int):
        config = getattr(mod, "BrokerConfig", BrokerConfig)  # the link before the split defined its own
        cfg = config(host="127.0.0.1", port=port, max_message_bytes=max_message_bytes)
        self.prefix = f"bench/link/{tag}"
        self.sender = mod.MqttLink(cfg, f"bench-{tag}-send")
        self.receiver = mod.MqttLink(cfg, f"bench-{tag}-recv", subscriptions=[(f"{self.prefix}/+/+", 1)])
        for link in (self.sender, self.receiver):
            if not link.start(wait_s=30.0):
                raise RuntimeError(f"{link.client_name} could not connect to 127.0.0.1:{port}")

    def lone(self) -> float:
        """Seconds from one QoS 1 publish until its acknowledgement."""
        time.sleep(0.02)
        t0 = time.perf_counter()
        self.sender.publish(f"bench/lone/{self.prefix}", b"x", timeout=TIMEOUT_S)
        return time.perf_counter() - t0

    def payload(self, data: bytes, rep: int) -> float:
        """Seconds from handing ``data`` to ``publish_chunks`` until the receiver reassembled it.

        Raises
        ------
        TimeoutError, RuntimeError
            If it does not arrive whole within :data:`TIMEOUT_S`, or arrives different.
        """
        r = Reassembler(max_payload_bytes=len(data) + 1)
        t0 = time.perf_counter()
        self.sender.publish_chunks(lambda i: f"{self.prefix}/{rep}/{i}", data, timeout=TIMEOUT_S)
        end = time.monotonic() + TIMEOUT_S
        while time.monotonic() < end:
            try:
                _, msg, _ = self.receiver.inbox.get(timeout=1.0)
            except queue.Empty:
                continue
            done = r.add("bench", msg)
            if done is not None:
                elapsed = time.perf_counter() - t0
                if done[1] != data:
                    raise RuntimeError("the payload arrived different")
                return elapsed
        raise TimeoutError(f"payload {rep} did not arrive whole within {TIMEOUT_S} s")

    def close(self) -> None:
        """Stop both links."""
        self.sender.stop()
        self.receiver.stop()


def measure(name: str, port: int, variants: dict[str, ModuleType], lone_n: int, reps: int, payload_bytes: int,
            max_message_bytes: int) -> dict[str, Any]:  # fmt: skip
    """Each variant's lone-publish and payload medians on one broker, taking turns (the first of a turn alternates);
    one untimed warm-up each."""
    pairs = {v: Pair(mod, v.replace(" ", "-"), port, max_message_bytes) for v, mod in variants.items()}
    lone: dict[str, list[float]] = {v: [] for v in variants}
    pay: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for p in pairs.values():
            p.lone()
            p.payload(os.urandom(payload_bytes), -1)
            protocol = p.sender.protocol
        order = list(pairs)
        for _ in range(lone_n):
            for v in order:
                lone[v].append(pairs[v].lone())
            order.reverse()  # neither variant always goes first
        for rep in range(reps):
            data = os.urandom(payload_bytes)
            for v in order:
                pay[v].append(pairs[v].payload(data, rep))
            order.reverse()
            print(f"  [{name}] turn {rep + 1}: " + ", ".join(f"{v} {pay[v][-1]:.3f} s" for v in variants), file=sys.stderr, flush=True)
    finally:
        for p in pairs.values():
            p.close()
    return {
        "broker": name,
        "protocol": protocol,
        "lone_ms": {v: statistics.median(x) * 1e3 for v, x in lone.items()},
        "lone_ms_max": {v: max(x) * 1e3 for v, x in lone.items()},
        "payload_s": {v: statistics.median(x) for v, x in pay.items()},
        "payload_all_s": pay,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brokers", default="amqtt,mosquitto", help="which brokers (amqtt,mosquitto)")
    ap.add_argument("--payload-mb", type=float, default=16.0, help="payload size, MB = 10^6 bytes (16)")
    ap.add_argument("--reps", type=int, default=5, help="timed payloads per variant and broker (5)")
    ap.add_argument("--lone", type=int, default=50, help="timed lone publishes per variant and broker (50)")
    ap.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, help="chunk message size (bytes)")
    ap.add_argument("--baseline-link", type=Path, default=None, help="another link module to measure in the same run")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.lone < 1:
        ap.error("--reps and --lone must be >= 1")
    variants: dict[str, ModuleType] = {"current": current_link}
    if args.baseline_link is not None:
        variants["baseline"] = load_link(args.baseline_link)
    results = []
    for name in [b.strip() for b in args.brokers.split(",") if b.strip()]:
        with broker(name) as port:
            if port is None:
                print(f"note: {name} not installed; skipped", file=sys.stderr)
                continue
            results.append(measure(name, port, variants, args.lone, args.reps, int(args.payload_mb * 1e6), args.max_message_bytes))
    if not results:
        print("link_lone_ms=nan link_payload_s=nan")
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"MQTT link: lone QoS 1 publish until PUBACK (median of {args.lone}; max) and a {args.payload_mb:g} MB payload "
              f"until reassembled (median of {args.reps}), chunks of {args.max_message_bytes:,} bytes")  # fmt: skip
        print(f"{'broker':<10} {'MQTT':>5} {'variant':<9} {'lone ms':>8} {'max ms':>8} {'payload s':>10} {'MB/s':>7}")
        for r in results:
            for v in variants:
                s = r["payload_s"][v]
                print(f"{r['broker']:<10} {r['protocol']:>5} {v:<9} {r['lone_ms'][v]:>8.2f} {r['lone_ms_max'][v]:>8.2f} "
                      f"{s:>10.3f} {args.payload_mb / s:>7.1f}")  # fmt: skip
    worst_lone = max(r["lone_ms"]["current"] for r in results)
    worst_pay = max(r["payload_s"]["current"] for r in results)
    print(f"link_lone_ms={worst_lone:.2f} link_payload_s={worst_pay:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
