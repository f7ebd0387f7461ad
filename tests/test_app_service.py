"""The two-process app of Android (sensing service + UI) over its settings and status files, without Android."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.polling import poll

from edge_client.app.controller import AppConfig
from edge_client.app.service import STATUS_FILE, RemoteController, read_json, run_service
from edge_client.sensors.base import ReplaySensor
from edge_client.window_log import WindowLog
from har_models.data.hapt import read_hapt_recordings
from har_models.data.labels import HAPT_LABELS

ROOT = Path(__file__).resolve().parents[1]




@pytest.mark.slow
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
        assert poll(lambda: (tmp_path / STATUS_FILE).exists())
        ui.start_recording("walking_upstairs")
        assert poll(lambda: ui.counts().get("walking_upstairs", 0) >= 16)  # enough to train on (10 training windows)
        assert poll(lambda: ui.recorder.recording and ui.recorder.session_windows >= 5)  # the service's own view
        ui.stop_recording()
        assert poll(lambda: read_json(tmp_path / STATUS_FILE)["recording"] is None)
        ui.set_take_part(True)
        assert poll(lambda: ui.federation.state == "waiting for charger" and ui.federation.take_part)
        ui.set_charge_only(False)
        assert poll(lambda: ui.federation.state in ("connecting", "disconnected") and not ui.federation.charge_only)
    finally:
        stop.set()
        service.join(60)
        ui.close()
    assert not service.is_alive()
    logged = WindowLog(tmp_path / "recorded_windows.log", HAPT_LABELS).counts()
    assert logged[1] >= 5 and logged.sum() == logged[1]
    assert ui.counts()["walking_upstairs"] == int(logged[1])
    assert reports["counts"] and reports["federation"]


# ---------------------------------------------------------------------------------------
# Joining a secured federation: the settings, the stored password, every failure in words


def _controller(tmp_path, **cfg_kw):
    from edge_client.app.controller import DeviceController

    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    cfg = AppConfig(state_dir=tmp_path / "state", labels=HAPT_LABELS, client_id="phone-1", **cfg_kw)
    views: list = []
    source = ReplaySensor(rec, speed=None, loop=False)
    ctl = DeviceController(cfg, source, on_federation=views.append, charging=lambda: True, supervise_s=0.1)
    return ctl, views


def _record(ctl, activity: str = "walking", n: int = 20) -> None:
    ctl.start_recording(activity)
    assert poll(lambda: ctl.counts().get(activity, 0) >= n)
    ctl.stop_recording()
    assert poll(lambda: ctl.store.window_counts().n_train >= 0.8 * n - 2)


def test_password_is_stored_private_and_never_in_settings_or_logs(tmp_path, caplog):
    import json
    import logging

    from edge_client.app.controller import PASSWORD_FILE, federation_fields, store_password

    caplog.set_level(logging.DEBUG)
    secret = "s3cret-pass-word"
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    ui = RemoteController(cfg, poll_s=0.05)
    try:
        ui.set_federation(client_id="phone-7", username="phone-7", password=secret, federation="home", backend="numpy")
        pw = tmp_path / PASSWORD_FILE
        assert pw.read_text() == secret and pw.stat().st_mode & 0o777 == 0o600 and pw.parent.stat().st_mode & 0o777 == 0o700
        settings = json.loads((tmp_path / "app_settings.json").read_text())
        assert settings["password_file"] == str(pw) and secret not in json.dumps(settings)
        fields = (settings["client_id"], settings["username"], settings["federation"], settings["backend"])
        assert fields == ("phone-7", "phone-7", "home", "numpy")
        assert ui.federation.password_set and ui.federation.client_id == "phone-7"
        # a UI started again (the app reopened) keeps what was entered, not its defaults
        ui.close()
        ui = RemoteController(AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="localhost"), poll_s=0.05)
        assert ui.cfg.client_id == "phone-7" and ui.cfg.password_file == pw and ui.federation.username == "phone-7"
        # refused values name the field and change nothing
        for bad, words in (({"client_id": "has space"}, "client id"), ({"broker": "x"}, "HOST:PORT"),
                           ({"tls_ca": str(tmp_path / "none.crt")}, "no such file"), ({"backend": "gpu"}, "backend"),
                           ({"federation": "a/b"}, "federation name"), ({"password": "a\nb"}, "one line")):  # fmt: skip
            with pytest.raises(ValueError, match=words):
                ui.set_federation(**bad)
        assert ui.cfg.client_id == "phone-7"
        assert store_password(tmp_path, "") is None and not pw.exists()  # an empty password removes the file
        assert federation_fields(tmp_path, {"username": "", "tls_ca": ""}) == {"username": None, "tls_ca": None}
    finally:
        ui.close()
    assert secret not in caplog.text


def test_not_enough_data_says_how_many_windows_are_needed(tmp_path):
    ctl, views = _controller(tmp_path, broker="127.0.0.1:1")
    try:
        ctl.set_take_part(True)
        assert poll(lambda: views and views[-1].state == "not enough data")
        assert views[-1].error == (
            "nothing to train on: 0 training windows recorded, 10 needed; record about 13 more windows (0.6 min of an activity)"
        )
    finally:
        ctl.close()


def test_unreachable_broker_is_named_and_the_agent_is_not_restarted_in_a_loop(tmp_path):
    from simulation.broker import free_port

    port = free_port()  # nothing listens there
    ctl, views = _controller(tmp_path, broker=f"127.0.0.1:{port}", backend="numpy")
    try:
        _record(ctl)
        ctl.set_take_part(True)
        assert poll(lambda: views and views[-1].error.startswith("broker unreachable"), 30)
        v = views[-1]
        assert v.error == (
            f"broker unreachable: connection refused at 127.0.0.1:{port}"
        )
        assert v.state == "connecting" and v.restarts == 0  # paho retries with its own back-off; the agent is not restarted
    finally:
        ctl.close()


@pytest.mark.slow
def test_refused_login_and_wrong_ca_in_words_with_exponential_back_off(tmp_path, tls_mosquitto):
    broker = tls_mosquitto("apptest", ["phone-1"])
    ctl, views = _controller(tmp_path, backend="numpy")
    try:
        _record(ctl)
        ctl.set_federation(broker=f"127.0.0.1:{broker.tls_port}", federation="apptest", username="phone-1",
                           password="wrong", tls_ca=str(broker.ca))  # fmt: skip
        starts: list[float] = []
        real_start = ctl._start_agent

        def counted() -> None:
            starts.append(time.monotonic())
            real_start()

        ctl._start_agent = counted
        ctl.set_take_part(True)
        assert poll(lambda: views and views[-1].error.startswith("login refused"), 30)
        assert poll(lambda: len(starts) >= 4, 90)
        gaps = np.diff(starts[:4])
        # back-off 2, 4, 8 s after each failed run (a run lasts the connection attempt); once a second
        # the four starts would lie about 1 s apart
        assert np.all(gaps >= np.array([2.0, 4.0, 8.0])), gaps
        assert poll(lambda: views[-1].state == "failed" and views[-1].retry_in_s is not None and views[-1].restarts >= 3, 30)
        assert views[-1].error.startswith("login refused")
        ctl.set_federation(password=broker.password("phone-1"), tls_ca=str(broker.wrong_ca))
        assert poll(lambda: views[-1].error.startswith("wrong CA certificate"), 30)
        assert views[-1].error == (
            f"wrong CA certificate: the broker's certificate is not signed by {broker.wrong_ca}; choose the CA that signed it"
        )
        ctl.set_federation(tls_ca=str(broker.ca))
        assert poll(lambda: views[-1].state == "connected" and views[-1].error == "", 30)
        assert views[-1].restarts == 0  # new settings start the count again
    finally:
        ctl.close()


@pytest.mark.slow
def test_missing_backend_is_named(tmp_path):
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import time
        from pathlib import Path
        from test_app_service import _controller, _record, poll
        ctl, views = _controller(Path({str(tmp_path)!r}), broker="127.0.0.1:1", backend="torch")
        _record(ctl)
        ctl.set_take_part(True)
        ok = poll(lambda: views and "cannot run here" in views[-1].error, 30)
        print(views[-1].state, "|", views[-1].error)
        ctl.close()
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == (
        "failed | the torch training backend cannot run here: module 'torch' is not installed; choose the numpy backend, or install it"
    )


def test_the_controllers_copies_of_the_agents_constants_agree():
    from edge_client import agent
    from edge_client.app import controller

    assert (controller.EXIT_BROKER_REFUSED, controller.EXIT_DUPLICATE_ID) == (agent.EXIT_BROKER_REFUSED, agent.EXIT_DUPLICATE_ID)
    assert set(controller.APP_BACKENDS) == {"auto", *agent.BACKENDS}


def test_federation_settings_reach_the_service(tmp_path):
    """What the UI enters arrives in the service's own settings (the process that trains), password by file only."""
    import json

    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1")
    ui = RemoteController(cfg, poll_s=0.05)
    stop = threading.Event()
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    kwargs = {"state_dir": tmp_path, "source": ReplaySensor(rec, speed=50.0), "stop": stop, "poll_s": 0.05, "charging": lambda: True}
    service = threading.Thread(target=run_service, kwargs=kwargs)
    service.start()
    try:
        assert poll(lambda: (tmp_path / STATUS_FILE).exists())
        ui.set_federation(client_id="phone-9", federation="home", username="phone-9", password="pw-one", backend="numpy")
        want = {"client_id": "phone-9", "federation": "home", "username": "phone-9", "password_set": True, "backend": "numpy"}
        # read from the status file the service writes (the UI's own view is updated at once, so it proves nothing)
        assert poll(lambda: {k: (read_json(tmp_path / STATUS_FILE) or {}).get("federation", {}).get(k) for k in want} == want)
        stamp = json.loads((tmp_path / "app_settings.json").read_text())["password_stamp"]
        time.sleep(0.02)
        ui.set_federation(password="pw-two")  # same file, new password: the stamp changes, so the service restarts its agent
        assert json.loads((tmp_path / "app_settings.json").read_text())["password_stamp"] != stamp
        status = (tmp_path / STATUS_FILE).read_text()
        assert "pw-one" not in status and "pw-two" not in status
    finally:
        stop.set()
        service.join(60)
        ui.close()
    assert not service.is_alive()


@pytest.mark.slow
def test_leaving_through_the_service_is_done_once_even_across_a_restart(tmp_path, mosquitto):
    """Android's two processes: the UI asks, the service leaves (tells the broker, deletes), and a restarted service,
    which reads the same settings file, does not leave again after the device has joined anew."""
    from edge_client.store import ClientStore
    from har_models.nn.arch import ArchSpec

    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.save_local_model(spec.to_json(), {"w": np.zeros(3, np.float32)})
    store.close()
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1")
    ui = RemoteController(cfg, poll_s=0.05)
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]

    def start() -> tuple[threading.Event, threading.Thread]:
        stop = threading.Event()
        kwargs = {"state_dir": tmp_path, "source": ReplaySensor(rec, speed=50.0), "stop": stop, "poll_s": 0.05, "charging": lambda: True}
        service = threading.Thread(target=run_service, kwargs=kwargs)
        service.start()
        return stop, service

    stop, service = start()
    try:
        ui.set_federation(client_id="phone-9", broker=f"127.0.0.1:{mosquitto}", federation="home", username="phone-9", password="pw-1")
        assert poll(lambda: (read_json(tmp_path / STATUS_FILE) or {}).get("federation", {}).get("client_id") == "phone-9")
        out = ui.leave(forget=True, wait_s=30.0)
        assert out.told and out.forget and out.not_told == ""
        assert out.deleted == ("the broker password and certificate of the enrolment", "the local model and its training state")
        assert not (tmp_path / "credentials").exists() and not (tmp_path / "local_model.safetensors").exists()
        settings = read_json(tmp_path / "app_settings.json") or {}
        assert (settings["client_id"], settings["broker"], settings["password_file"], settings["take_part"]) == (
            "phone-9", "127.0.0.1:1883", None, False)  # fmt: skip
        assert "leave" not in settings
        assert (ui.federation.client_id, ui.federation.federation, ui.federation.password_set) == ("phone-9", "default", False)
        # Joined anew, then the service restarts: the old request is answered already, the new password stays.
        ui.set_federation(broker=f"127.0.0.1:{mosquitto}", federation="home", username="phone-9", password="pw-2")
    finally:
        stop.set()
        service.join(60)
    restarted = time.time()
    stop, service = start()
    try:
        assert poll(lambda: (read_json(tmp_path / STATUS_FILE) or {}).get("time", 0) > restarted + 0.3)  # the new service runs
        assert (read_json(tmp_path / STATUS_FILE) or {})["federation"]["password_set"] is True
        time.sleep(0.5)  # several polls of the settings file
        assert (tmp_path / "credentials" / "mqtt.password").read_text() == "pw-2"
    finally:
        stop.set()
        service.join(60)
        ui.close()
    assert not service.is_alive()
