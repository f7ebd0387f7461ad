"""A sensor the platform refuses, or a listener that stops delivering, is a fault in words: on the screen and in the status.

The Android source runs against a stand-in of pyjnius's ``autoclass`` whose ``SensorManager``
refuses one registration (``registerListener`` answers false, as Android does); the other
cases use a source whose chunks the test hands over, on a host clock the test sets.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from support import android_standin

from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.app.controller import AppConfig, DeviceController
from edge_client.sensors.android import AndroidSensorSource
from edge_client.sensors.base import STALL_S, SensorSource
from edge_client.sensors.replay import SensorChunk
from edge_client.store import ClientStore
from har_io.broker_config import BrokerConfig
from har_models.data.labels import HAPT_LABELS
from har_models.wire.messages import ClientStatus


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class HandedSource(SensorSource):
    """Delivers the chunks put in :attr:`inbox` (None ends it)."""

    name = "handed"

    def __init__(self) -> None:
        super().__init__()
        self.inbox: queue.Queue[SensorChunk | None] = queue.Queue()
        self.delivered = threading.Event()

    def chunks(self, stop_event: threading.Event) -> Iterator[SensorChunk]:
        while not stop_event.is_set():
            try:
                chunk = self.inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if chunk is None:
                return
            yield chunk
            self.delivered.set()

    def hand(self, sensor: str, n: int = 10) -> None:
        self.delivered.clear()
        self.inbox.put((sensor, np.arange(n, dtype=np.int64) * 20_000_000, np.zeros((n, 3))))
        assert self.delivered.wait(5)


def _source() -> tuple[HandedSource, Clock]:
    src, clock = HandedSource(), Clock()
    src.host_clock = clock
    src.start(lambda chunk: None)
    return src, clock


def test_a_listener_that_stops_while_the_other_goes_on_is_a_fault_until_it_delivers_again():
    src, clock = _source()
    try:
        src.hand("acc")
        src.hand("gyro")
        assert src.fault() == ""
        clock.t += STALL_S - 1
        src.hand("acc")  # the gyroscope has been quiet for 9 s: not yet
        assert src.fault() == ""
        clock.t += 2
        src.hand("acc")
        assert src.fault() == (
            "sensor handed: the gyroscope has sent nothing for 11 s while the accelerometer goes on; its listener stopped: restart sensing"
        )
        src.hand("gyro")
        assert src.fault() == ""
    finally:
        src.stop()


def test_a_source_that_never_delivers_is_a_fault_and_all_silent_after_delivering_is_a_pause_not_a_fault():
    src, clock = _source()
    try:
        clock.t += STALL_S - 0.5
        assert src.fault() == ""
        clock.t += 1
        assert src.fault().startswith("sensor handed has delivered no sample in the 10 s since it started")
        src.hand("acc")
        src.hand("gyro")
        clock.t += 300  # Doze: both withheld; SensingFreshness reports the pause
        assert src.fault() == ""
        src.inbox.put(None)  # the source ended on its own
        time.sleep(0.3)
        assert not src.running and src.fault() == ""
    finally:
        src.stop()


@pytest.fixture
def android(monkeypatch):
    """pyjnius as the Android source reaches the platform (tests/support/android_standin.py), refusing the sensor type given."""
    return lambda refuse: android_standin.install(monkeypatch, refuse=refuse)


@pytest.mark.parametrize(("refuse", "words"), [(4, "gyroscope"), (1, "accelerometer")])
def test_a_registration_android_refuses_is_an_error_not_a_silent_stream(android, refuse, words):
    manager = android(refuse)
    src = AndroidSensorSource()
    ended = threading.Event()
    src.start(lambda chunk: None, on_end=ended.set)
    assert ended.wait(5)
    assert src.fault() == (
        f"sensor android failed: Android refused to register the {words} listener at 20000 µs (registerListener returned false); "
        "check the app's sensor permissions, then restart sensing"
    )
    assert manager.unregistered == 1  # what was registered is given back


def test_the_fault_is_in_the_status_and_on_the_screens(tmp_path, android):
    android(4)
    store = ClientStore(tmp_path / "agent", HAPT_LABELS, owner="phone-1")
    try:
        agent = EdgeAgent(ClientConfig(client_id="phone-1", broker=BrokerConfig(port=1), federation="home", backend="numpy"), store)
        agent.fault = lambda: "sensor android failed: Android refused to register the gyroscope listener"
        st = ClientStatus.from_bytes(agent._status_bytes())
        assert st.fault == "sensor android failed: Android refused to register the gyroscope listener" and not st.selectable
    finally:
        store.close()
    lives: list = []
    feds: list = []
    cfg = AppConfig(state_dir=tmp_path / "app", labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    ctl = DeviceController(cfg, AndroidSensorSource(), on_live=lives.append, on_federation=feds.append, charging=lambda: True,
                           supervise_s=0.1)  # fmt: skip
    try:
        ctl.start_sensing()
        end = time.monotonic() + 10
        while time.monotonic() < end and not (lives and lives[-1].note.startswith("sensor android failed")):
            time.sleep(0.05)
        assert lives[-1].note.startswith("sensor android failed: Android refused to register the gyroscope listener")
        assert lives[-1].activity is None
        assert feds[-1].error == lives[-1].note
    finally:
        ctl.close()


