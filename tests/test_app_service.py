"""The two-process app of Android (sensing service + UI) over its settings and status files, without Android."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from edge_client.app.controller import AppConfig
from edge_client.app.service import STATUS_FILE, RemoteController, read_json, run_service
from edge_client.sensors.base import ReplaySensor
from edge_client.window_log import WindowLog
from har_models.data.hapt import read_hapt_recordings
from har_models.data.labels import HAPT_LABELS

ROOT = Path(__file__).resolve().parents[1]


def _wait(cond, timeout_s: float = 60.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_ui_drives_the_service_through_the_files(tmp_path):
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    reports: dict = {"counts": [], "federation": []}
    ui = RemoteController(
        cfg,
        on_counts=reports["counts"].append,
        on_federation=reports["federation"].append,
        poll_s=0.05,
    )  # writes the settings first, as the app does before starting the service
    stop = threading.Event()
    source = ReplaySensor(rec, speed=50.0, loop=True)
    kwargs = {"state_dir": tmp_path, "source": source, "stop": stop, "poll_s": 0.05, "charging": lambda: False}
    service = threading.Thread(target=run_service, kwargs=kwargs)
    service.start()
    try:
        assert _wait(lambda: (tmp_path / STATUS_FILE).exists())
        ui.start_recording("walking_upstairs")
        assert _wait(lambda: ui.counts().get("walking_upstairs", 0) >= 16)  # enough to train on (10 training windows)
        assert _wait(lambda: ui.recorder.recording and ui.recorder.session_windows >= 5)  # the service's own view
        ui.stop_recording()
        assert _wait(lambda: read_json(tmp_path / STATUS_FILE)["recording"] is None)
        ui.set_take_part(True)
        assert _wait(lambda: ui.federation.state == "waiting for charger" and ui.federation.take_part)
        ui.set_charge_only(False)
        assert _wait(lambda: ui.federation.state in ("connecting", "disconnected") and not ui.federation.charge_only)
    finally:
        stop.set()
        service.join(60)
        ui.close()
    assert not service.is_alive()
    logged = WindowLog(tmp_path / "recorded_windows.log", HAPT_LABELS).counts()
    assert logged[1] >= 5 and logged.sum() == logged[1]
    assert ui.counts()["walking_upstairs"] == int(logged[1])
    assert reports["counts"] and reports["federation"]
