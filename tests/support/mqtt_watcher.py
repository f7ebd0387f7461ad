"""A plain paho subscriber for tests: records what arrives on some topics of a broker on 127.0.0.1."""

from __future__ import annotations

import os
import queue
import time

import paho.mqtt.client as mqtt


class Watcher:
    """A plain paho session (MQTT 3.1.1) that records what arrives on some topics."""

    def __init__(self, port: int, *topics: str):
        self.q: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"watch-{os.getpid()}-{time.monotonic_ns()}",
                             protocol=mqtt.MQTTv311)  # fmt: skip
        self.c.on_message = lambda _c, _u, m: self.q.put((m.topic, bytes(m.payload), bool(m.retain)))
        self.c.connect("127.0.0.1", port)
        for t in topics:
            self.c.subscribe(t, 1)
        self.c.loop_start()

    def wait_for(self, pred, timeout: float) -> tuple[str, bytes, bool]:
        end = time.monotonic() + timeout
        while True:
            try:
                m = self.q.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the expected message never arrived") from None
            if pred(*m):
                return m

    def drain(self, quiet_s: float = 1.0) -> list[tuple[str, bytes, bool]]:
        out = []
        while True:
            try:
                out.append(self.q.get(timeout=quiet_s))
            except queue.Empty:
                return out

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()
