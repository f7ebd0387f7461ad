"""The Kivy app in a real window under Xvfb, driven through Kivy's event API, in a real, secured federation.

The app runs as on a phone (torch and scipy cannot be imported in its process, the sensors
deliver 100 Hz): it records labelled windows from a replayed HAPT session, is given its
client id, federation, user name, password and CA certificate on the Federation screen,
shows a wrong password's refusal and a wrong CA in words, then takes part in a federation
of one (a real coordinator over a Mosquitto with TLS, an ACL and per-device accounts,
written by firmware_scripts/mosquitto_config.py) with the numpy backend, and shows live
predictions of the model that federation trained. tests/app_driver.py runs the app in its
own process (Kivy opens one window per process) and reports what the widgets showed;
here those texts are checked against independent sources (the window log, the
coordinator's report, the model file run through PyTorch), and the screenshots are
copied to docs/screenshots/ when FEDHAR_UPDATE_SCREENSHOTS=1 (so an ordinary run leaves the
checkout clean).

Skipped when Kivy cannot be imported, unless FEDHAR_REQUIRE_APP=1 (set by .ci/run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulation.broker import stop_process

pytestmark = [pytest.mark.slow, pytest.mark.app]  # the Kivy app records and federates under Xvfb

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots"


def _require(what: str) -> None:
    if os.environ.get("FEDHAR_REQUIRE_APP") == "1":
        pytest.fail(f"{what} (FEDHAR_REQUIRE_APP=1)")
    pytest.skip(what)


@pytest.fixture
def display(tmp_path):
    """An X display: the existing one, or an Xvfb started here on a free display number."""
    if os.environ.get("DISPLAY"):
        yield os.environ["DISPLAY"]
        return
    from support.app_script import xvfb

    with xvfb(tmp_path, "1280x800") as d:  # room for every window size the app tests open (480x800 to 1280x720)
        if d is None:
            _require("Xvfb is not installed (apt-get install xvfb)")
        yield d


@pytest.fixture
def secured(tmp_path):
    """A Mosquitto with TLS, an ACL and per-device accounts (firmware_scripts/mosquitto_config.py)."""
    from support.secured_broker import Missing, secured_mosquitto

    try:
        with secured_mosquitto(tmp_path / "mqtt", "apptest", ["phone-1"]) as b:
            yield b
    except Missing as exc:
        _require(str(exc))


@pytest.mark.parametrize("window", ["480x800", "800x600", "1280x720"])
def test_app_joins_a_secured_federation_without_torch_or_scipy(tmp_path, secured, display, window):
    if importlib.util.find_spec("kivy") is None:  # not imported here: Kivy takes over logging when imported
        _require("Kivy is not installed (pip install -e '.[app]')")
    out, state, run_dir = tmp_path / "out", tmp_path / "state", tmp_path / "run"
    cmd = [sys.executable, "-m", "coordinator.cli", "--broker", f"127.0.0.1:{secured.port}", "--federation", "apptest"]
    cmd += ["--username", "coordinator", "--password-file", str(secured.password_file("coordinator"))]
    cmd += ["--run-dir", str(run_dir), "--run-id", "apptest", "--rounds", "2", "--min-clients", "1", "--expected-clients", "1"]
    cmd += ["--conv-filters", "8", "--dense-units", "32", "--no-progress", "--round-timeout", "120", "--start-timeout", "300"]
    password = secured.password("phone-1")
    settings = {"tls_port": secured.tls_port, "ca": str(secured.ca), "wrong_ca": str(secured.wrong_ca)}
    settings |= {"client_id": "phone-1", "password": password, "federation": "apptest"}
    (tmp_path / "broker.json").write_text(json.dumps(settings))
    with open(tmp_path / "coordinator.log", "wb") as coord_log:
        coordinator = subprocess.Popen(cmd, cwd=ROOT, stdout=coord_log, stderr=subprocess.STDOUT)
        try:
            env = dict(os.environ, DISPLAY=display, KIVY_HOME=str(tmp_path / "kivy"), PYTHONPATH=str(ROOT))
            r = subprocess.run(
                [sys.executable, str(ROOT / "tests" / "app_driver.py"), str(out), str(state), str(tmp_path / "broker.json"), window],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=480,
            )
            coordinator.wait(60)
        finally:
            stop_process(coordinator)
    assert (out / "results.json").exists(), r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["error"] is None, res["error"] + (tmp_path / "coordinator.log").read_text()[-2000:]
    assert r.returncode == 0
    assert res["window"] == [int(v) for v in window.split("x")]
    # The app ran as on a phone: torch and scipy could not be imported, first to last.
    assert res["blocked"] == res["still_blocked"] == {"torch": True, "scipy": True}
    # 100 Hz sensors: both streams were low-passed on a 2x fine grid (scipy-free) and resampled to 50 Hz.
    assert res["factors"]["recorder"] == {"acc": 2, "gyro": 2} and res["factors"]["live"] == {"acc": 2, "gyro": 2}

    # Federation: a bad address is named; the typed settings are taken; the password is not shown after entry.
    assert "is not HOST:PORT" in res["broker_error"]
    assert res["after_apply"] == {"error": "", "password_text": "", "hint": "stored (hidden)"}
    assert res["broker_after"] == f"127.0.0.1:{secured.tls_port}"
    assert res["state_on_battery"] == "waiting for charger"
    # A wrong password: the refusal in words on the screen, and the agent restarted with back-off.
    assert res["refused"]["error"] == (
        "login refused: the broker does not accept user 'phone-1' with this password; check the user name and password"
    )
    assert res["refused"]["state"].startswith("failed, retry in")
    # back-off 2, 4, 8 s: within the 8 s watched after the first refusal, at most 2 restarts (once a second: 8)
    assert 1 <= res["refused"]["restarts_in_8s"] <= 2
    assert res["wrong_ca"].startswith(f"wrong CA certificate: the broker's certificate is not signed by {secured.wrong_ca}")
    assert res["fields"] == {
        "client_id": "phone-1",
        "username": "phone-1",
        "password": "",
        "backend": "numpy",
        "footer": "phone-1 - sensor: replay hapt-01/exp0",
    }
    assert res["federation"]["error"] == ""

    # The password: in the app's private folder, owner-only; never in the settings, status or any log.
    pw_file = state / "credentials" / "mqtt.password"
    assert pw_file.read_text() == password
    assert pw_file.stat().st_mode & 0o777 == 0o600 and pw_file.parent.stat().st_mode & 0o777 == 0o700
    for text in (r.stdout, r.stderr, (tmp_path / "coordinator.log").read_text(), json.dumps(res)):
        assert password not in text
    for f in state.rglob("*"):
        if f.is_file() and f != pw_file:
            assert password.encode() not in f.read_bytes(), f

    # Record screen: the counts shown are the window log's, per activity.
    from edge_client.window_log import WindowLog
    from har_models.data.labels import HAPT_LABELS

    log_counts = WindowLog(state / "recorded_windows.log", HAPT_LABELS).counts()
    assert res["counts_widget"] == {n: str(int(c)) for n, c in zip(HAPT_LABELS.names, log_counts, strict=True)}
    assert log_counts[0] >= 12 and log_counts[3] >= 8 and log_counts.sum() == log_counts[0] + log_counts[3]
    assert res["steps"][0] == {"status_while_recording": "Recording: walking", "button": "Stop recording"}
    assert res["status_after_stop"] == "Not recording"

    # Live before any model; screens switched.
    assert res["live_before"] == {"activity": "-", "note": "no model yet: take part in a federation round first", "current": "live"}
    assert res["federation_current"] == "federation"

    # The rounds are the coordinator's, with this device's update counted.
    report = json.loads((run_dir / "report.json").read_text())
    assert [rd["round"] for rd in report["rounds"]] == [0, 1]
    assert [rd["updates"] for rd in report["rounds"]] == [1, 1]
    assert res["federation"]["round"] == "1" and res["federation"]["state"] == "connected"
    pers = report["rounds"][-1]["personalisation"]["accuracy"]
    assert res["federation"]["accuracy"] == f"{pers * 100:.1f} %"  # this device is the federation's only member

    # Live: the label and confidence are the stored model's own output on the window the app saw.
    import torch
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from har_models.nn.model import ArchSpec, build_model

    path = state / "local_model.safetensors"
    with safe_open(str(path), framework="numpy") as f:
        spec = ArchSpec.from_json(f.metadata()["arch"])
    model = build_model(spec, {k: torch.from_numpy(v) for k, v in load_file(str(path)).items()}).eval()
    x = np.load(out / "live_x.npy")
    assert x.shape == (1, 6, 128)
    with torch.no_grad():
        p = torch.softmax(model(torch.from_numpy(x)), dim=1).numpy()[0]
    k = int(np.argmax(p))
    assert res["live"]["activity"] == HAPT_LABELS.names[k].replace("_", " ")
    assert res["live"]["confidence"] == f"confidence {p[k] * 100:.0f} %"
    np.testing.assert_allclose(np.load(out / "live_p.npy")[0], p, rtol=1e-5)
    assert res["live"]["windows"].startswith("Watching for ") and "; the guess is updated about every second" in res["live"]["windows"]

    # What left the phone: each round's update with the size of its envelope; round 1's counted by the coordinator.
    from edge_client.sent_log import size_words
    from edge_client.store import ClientStore

    store = ClientStore(state, HAPT_LABELS)
    meta, envelope = store.load_last_update()
    ledger = store.get_meta("sent_log", [])
    store.close()
    (last,) = [e for e in ledger if (e["run_id"], e["round"], e["stage"]) == (meta["run_id"], meta["round"], meta["stage"])]
    assert last["bytes"] == len(envelope)
    (r1,) = [e for e in ledger if e["round"] == 1]
    assert r1["counted"] and "round 1, " in res["privacy"]["sent"]
    # A coordinator that does not say its model versions: the update is named by its architecture's version.
    assert f"a model update of {size_words(r1['bytes'])} (architecture v{r1['arch_version']}), counted" in res["privacy"]["sent"]
    assert res["privacy"]["why"].startswith(("Taking part: connected", "Training round"))

    # What it costs: the round's CPU as the agent measured and kept it, sensing's, and a battery this machine may not have.
    from edge_client.cost import ROUND_COST_KEY
    from edge_client.power import battery_percent_linux

    store = ClientStore(state, HAPT_LABELS)
    kept = {c["round"]: c for c in store.get_meta(ROUND_COST_KEY, [])}
    store.close()
    cost = res["privacy"]["cost"].splitlines()
    assert cost[0] == "Sensing: measuring its CPU use (after a minute of sensing)" or re.fullmatch(
        r"Sensing: \d+ s of CPU per hour \(\d+\.\d % of one core\)", cost[0]
    )
    m = re.match(r"A round \(numpy\): (\d+\.\d) s of CPU in (\d+\.\d) s, round (\d+)", cost[1])
    assert m is not None, cost
    c = kept[int(m.group(3))]
    assert (c["backend"], f"{c['cpu_s']:.1f}", f"{c['wall_s']:.1f}") == ("numpy", m.group(1), m.group(2))
    no_battery = battery_percent_linux() is None
    assert (cost[-1] == "Battery: unknown (this device reports no battery level)") == no_battery

    for name in ("record", "live", "federation", "federation-refused", "privacy"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        if os.environ.get("FEDHAR_UPDATE_SCREENSHOTS") == "1" and window == "480x800":  # the phone's shape
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, SHOTS / f"{name}.png")
        if os.environ.get("FEDHAR_UPDATE_SCREENSHOTS") == "1" and window == "800x600" and name == "privacy":  # the desktop's
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, SHOTS / "privacy-800x600.png")
