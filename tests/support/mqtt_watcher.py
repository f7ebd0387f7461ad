"""A plain paho subscriber for tests: records what arrives on some topics of a broker on 127.0.0.1."""

from __future__ import annotations

import os
import queue
import threading
import time

import paho.mqtt.client as mqtt


class Watcher:
    """A plain paho session (MQTT 3.1.1) that records what arrives on some topics."""

    def __init__(self, port: int, *topics: str, timeout: float = 10.0):
        """Connect to 127.0.0.1:``port`` and subscribe to ``topics`` (QoS 1); return once the broker acknowledged them.

        Waiting for the SUBACKs means a message published after this returns reaches the watcher
        however loaded the machine is. Raises AssertionError if they do not come within ``timeout`` s.
        """
        self.q: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"watch-{os.getpid()}-{time.monotonic_ns()}",
                             protocol=mqtt.MQTTv311)  # fmt: skip
        self.c.on_message = lambda _c, _u, m: self.q.put((m.topic, bytes(m.payload), bool(m.retain)))
        acked: set[int] = set()
        all_acked = threading.Event()
        mids: list[int] = []

        def on_subscribe(_c: object, _u: object, mid: int, *_rest: object) -> None:
            acked.add(mid)
            if len(mids) == len(topics) and acked >= set(mids):
                all_acked.set()

        self.c.on_subscribe = on_subscribe
        self.c.connect("127.0.0.1", port)
        for t in topics:
            rc, mid = self.c.subscribe(t, 1)  # queued until the loop runs: no acknowledgement can come before
            assert rc == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None, f"subscribing to {t} failed: {rc}"
            mids.append(mid)
        self.c.loop_start()
        if topics and not all_acked.wait(timeout):
            self.close()
            raise AssertionError(f"the broker did not acknowledge the subscriptions to {topics} within {timeout} s")

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
