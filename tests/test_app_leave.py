"""Leaving the federation from the app, in a real Kivy window under Xvfb, against a Mosquitto with TLS, an ACL and per-device accounts.

tests/app_leave_driver.py enrols the app from a bundle, then leaves with "Also ask the server to
forget this phone" after a confirmation (cancelled once). Here the driver's report is checked
against the device's folder and against what the broker retains for the server: the device's
own account published its leaving status, which asks to be forgotten. Screenshots go to
docs/screenshots/ when FEDHAR_UPDATE_SCREENSHOTS=1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import time
from pathlib import Path

import pytest
from support.app_script import run_driver
from test_app import _require, display, secured  # noqa: F401  (the fixtures: an Xvfb display, a secured Mosquitto)

from edge_client.leave import leaving_status
from har_io.broker_config import BrokerConfig
from har_io.enrolment import EnrolmentBundle
from har_io.mqtt_link import MqttLink
from har_models.wire.messages import ClientStatus

pytestmark = [pytest.mark.slow, pytest.mark.app]

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots"
STATUS = "fedhar/v1/apptest/client/phone-1/status"


def retained_status(secured, topic: str) -> bytes | None:  # noqa: F811
    """The payload the broker retains on ``topic``, read with the coordinator's account (None: nothing retained)."""
    cfg = BrokerConfig(host="127.0.0.1", port=secured.tls_port, username="coordinator", password=secured.password("coordinator"),
                       tls_ca=str(secured.ca))  # fmt: skip
    link = MqttLink(cfg, "test-leave-reader", subscriptions=[(topic, 1)])
    try:
        assert link.start(wait_s=15.0), link.connect_error
        end = time.monotonic() + 10.0  # returns as soon as the retained message arrives
        while time.monotonic() < end:
            try:
                t, payload, retained = link.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if t == topic and retained:
                return payload
        return None
    finally:
        link.stop()


@pytest.mark.parametrize("window", ["480x800", "800x600"])
def test_leaving_deletes_the_credentials_and_model_and_asks_the_server_to_forget(tmp_path, secured, display, window):  # noqa: F811
    if importlib.util.find_spec("kivy") is None:  # not imported here: Kivy takes over logging when imported
        _require("Kivy is not installed (pip install -e '.[app]')")
    password = secured.password("phone-1")
    ca_pem = secured.ca.read_text()
    bundle = EnrolmentBundle("fedhar-home", "apptest", "phone-1", password, "127.0.0.1", secured.tls_port, tls_ca_pem=ca_pem)
    (tmp_path / "phone-1.json").write_text(bundle.to_json())
    out, state = tmp_path / "out", tmp_path / "state"
    res, printed = run_driver("app_leave_driver.py", out, str(state), str(tmp_path / "phone-1.json"), window, display=display,
                     kivy_home=tmp_path / "kivy")  # fmt: skip
    assert res["window"] == [int(v) for v in window.split("x")]

    # Enrolled and taking part: the bundle's password and mark, the model a round left.
    every = {"credentials/mqtt.password": True, "credentials/enrolled": True, "local_model.safetensors": True, "timeline.sqlite": True}
    assert res["before"] == {"files": every, "client_id": "phone-1", "broker": f"127.0.0.1:{secured.tls_port}", "take_part": True,
                             "error": res["before"]["error"]}  # fmt: skip
    # Cancel: nothing changes.
    assert res["cancelled"] == {"popup": "Leave the federation?", "files": every, "take_part": True, "left": "", "open": False}
    assert res["confirm"]["title"] == "Leave the federation?" and res["confirm"]["forget"] is True
    assert "your recorded activities and the Today timeline stay" in res["confirm"]["question"]
    assert res["while_leaving"] == {"button": "Leaving...", "disabled": True}

    # After: the bundle's secrets and the model are gone, the timeline stays; the settings are a device that never joined.
    after = res["after"]
    assert after["files"] == {"credentials/mqtt.password": False, "credentials/enrolled": False, "local_model.safetensors": False,
                              "timeline.sqlite": True}  # fmt: skip
    assert not (state / "credentials").exists() and not (state / "last_update.bin").exists()
    assert after["left"] == (
        "You left the federation. Deleted from this phone: the broker password and certificate of the enrolment and the local "
        "model and its training state. The server was asked to forget phone-1; its operator deletes what it holds of this "
        "phone. To join again, enrol with a new bundle."
    )
    assert after["fields"] == {"client_id": "phone-1", "broker": "127.0.0.1:1883", "federation": "default", "username": "",
                               "tls_ca": "", "password_hint": "not set"}  # fmt: skip
    assert after["controller"] == {"take_part": False, "password_file": "None"}
    assert after["take_part_switch"] is False and after["state"] == "off" and after["popup_closed"] is True
    # The app shows where to enrol again: the Federation screen at its top, the Enrol row in the window.
    assert after["current"] == "federation" and after["scroll_y"] == 1 and after["enrol_row_in_window"] is True
    assert after["hint"] == "left: enrol with a new bundle file, or paste its text"

    # The server's side: the broker retains the device's leaving status, published by its own account, asking to be forgotten.
    payload = retained_status(secured, STATUS)
    assert payload is not None
    st = ClientStatus.from_bytes(payload)
    assert (st.client_id, st.state, st.left, st.selectable) == ("phone-1", "offline", "forget", False)
    assert abs(st.sent_unix - time.time()) < 120
    assert json.loads(payload) == json.loads(leaving_status("phone-1", True, st.sent_unix))
    assert password not in printed

    for name in ("leave-confirm", "left"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        if os.environ.get("FEDHAR_UPDATE_SCREENSHOTS") == "1":
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, SHOTS / f"{name}-{window}.png")
