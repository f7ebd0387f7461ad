"""The device's status carries the windows it holds now: windows added while the agent runs (a relabelled stretch of the
Today timeline, a recording stopped) are in the next status on the broker, exactly, with no restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.mqtt_watcher import Watcher
from support.polling import poll
from support.replay_day import hapt_day

from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.app.controller import AppConfig, DeviceController
from edge_client.backends.numpy_ref import init_weights
from edge_client.recorder import RECORDED_LOG, sync_to_store
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore
from edge_client.timeline import STEP_NS
from edge_client.window_log import WindowLog
from har_io.broker_config import BrokerConfig
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import ChannelStats, WindowSet
from har_models.nn.arch import ArchSpec
from har_models.wire.messages import ClientStatus
from har_models.wire.topics import Topics

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=0)
WALKING, SITTING = HAPT_LABELS.index("walking"), HAPT_LABELS.index("sitting")




@pytest.mark.slow
def test_a_relabel_while_the_agent_runs_is_in_the_next_status_with_the_exact_counts(tmp_path: Path, mosquitto: int) -> None:
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.save_local_model(SPEC.to_json(), init_weights(SPEC, 3))  # any model: the timeline holds what it says
    store.close()
    x = np.random.default_rng(0).normal(size=(20, 6, 128)).astype(np.float32)
    WindowLog(tmp_path / RECORDED_LOG, HAPT_LABELS).append(WindowSet(x, np.full(20, WALKING), HAPT_LABELS, np.arange(20) * STEP_NS))
    source = ReplaySensor(hapt_day(35.0), speed=None, loop=False)
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker=f"127.0.0.1:{mosquitto}")
    watcher = Watcher(mosquitto, Topics(cfg.federation).client_status("phone-1"))
    ctl = DeviceController(cfg, source, charging=lambda: True, battery=lambda: None, supervise_s=0.1)
    try:
        ctl.start_sensing()
        assert poll(lambda: not source.running, 60), "the 35 s replay did not end within a minute"
        ctl.set_take_part(True)

        def status(pred):
            _, payload, _ = watcher.wait_for(lambda t, p, r: p and pred(ClientStatus.from_bytes(p)), timeout=20)
            return ClientStatus.from_bytes(payload)

        # At start: the 20 recorded walking windows, round(0.2 * 20) = 4 of them test windows.
        first = status(lambda s: s.state != "offline")
        assert (first.n_train, first.n_test) == (16, 4)
        assert first.class_counts == tuple(16 if c == WALKING else 0 for c in range(6))

        # Relabel 15 windows' worth of the sensed day as sitting: 15 new windows, round(0.2 * 15) = 3 of them test windows.
        t0 = min(s.start_ns for s in ctl.timeline.stretches(0, time.time_ns() + 86_400 * 10**9))
        before = time.time()
        assert ctl.relabel(t0, t0 + 15 * STEP_NS, "sitting").windows == 15
        after = status(lambda s: s.sent_unix >= before and s.n_train != 16)
        assert time.time() - before < 10  # at once, not at the next refresh (30 s)
        assert (after.n_train, after.n_test) == (16 + 12, 4 + 3)
        assert after.class_counts == tuple({WALKING: 16, SITTING: 12}.get(c, 0) for c in range(6))
        assert after.train_stats == ChannelStats.of(ctl.store.windows("train").x).to_json()
        assert after.train_stats != first.train_stats and after.state != "offline"
        # ...and every later status says the same (the periodic refresh included).
        assert ClientStatus.from_bytes(ctl._agent._status_bytes()).n_train == 28
    finally:
        ctl.close()
        watcher.close()


def test_windows_synced_from_the_recording_log_while_the_agent_runs_are_in_its_next_status(tmp_path: Path, mosquitto: int) -> None:
    """The path of a stopped recording (and of fedhar-client's recorded source): the log synced into the store."""
    rng = np.random.default_rng(2)

    def windows(label: int, n: int, t0: int) -> WindowSet:
        return WindowSet(rng.normal(size=(n, 6, 128)).astype(np.float32), np.full(n, label), HAPT_LABELS, t0 + np.arange(n) * STEP_NS)

    log = WindowLog(tmp_path / RECORDED_LOG, HAPT_LABELS)
    log.append(windows(WALKING, 20, 0))
    store = ClientStore(tmp_path / "state", HAPT_LABELS)
    assert sync_to_store(log, store) == (16, 4)
    agent = EdgeAgent(ClientConfig("board-1", BrokerConfig(port=mosquitto), backend="numpy"), store)
    watcher = Watcher(mosquitto, Topics("default").client_status("board-1"))
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    try:

        def status(pred):
            _, payload, _ = watcher.wait_for(lambda t, p, r: p and pred(ClientStatus.from_bytes(p)), timeout=20)
            return ClientStatus.from_bytes(payload)

        assert status(lambda s: s.state != "offline").n_train == 16
        log.append(windows(SITTING, 10, 10**12))  # a recording of sitting stopped: round(0.2 * 10) = 2 test windows
        assert sync_to_store(log, store) == (16 + 8, 4 + 2)
        after = status(lambda s: s.n_train != 16)
        assert (after.n_train, after.n_test) == (24, 6)
        assert after.class_counts == tuple({WALKING: 16, SITTING: 8}.get(c, 0) for c in range(6))
        assert after.train_stats == ChannelStats.of(store.windows("train").x).to_json()
    finally:
        stop.set()
        t.join(30)
        watcher.close()
        store.close()
    assert not t.is_alive() and store.window_listeners == [] and store.fault_listeners == []  # the store outlives the agent
