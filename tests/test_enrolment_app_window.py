"""The app's Enrol on the Federation screen, in a real Kivy window under Xvfb (tests/app_enrol_driver.py drives it).

Skipped when Kivy cannot be imported, unless FEDHAR_REQUIRE_APP=1 (set by .ci/run).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from support.app_script import run_driver
from support.secured_broker import Missing, make_pki
from test_app import display  # noqa: F401  (the fixture: an Xvfb display)

from har_io.enrolment import EnrolmentBundle

pytestmark = pytest.mark.app

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("window", ["480x800", "800x600", "1280x720"])
def test_enrol_on_the_federation_screen_fills_every_field_or_shows_the_refusal(tmp_path, display, window):  # noqa: F811
    if importlib.util.find_spec("kivy") is None:
        if os.environ.get("FEDHAR_REQUIRE_APP") == "1":
            pytest.fail("Kivy is not installed (FEDHAR_REQUIRE_APP=1)")
        pytest.skip("Kivy is not installed (pip install -e '.[app]')")
    try:
        ca, _, _, _ = make_pki(tmp_path / "pki")
    except Missing as exc:
        pytest.skip(str(exc))
    secret = "window-secret-77"
    bundle = EnrolmentBundle("fedhar-home", "home", "phone-anna", secret, "192.168.1.10", 8883, tls_ca_pem=ca.read_text())
    (tmp_path / "phone-anna.json").write_text(bundle.to_json())
    out, state = tmp_path / "out", tmp_path / "state"
    res, printed = run_driver("app_enrol_driver.py", out, str(state), str(tmp_path / "phone-anna.json"), window, display=display,
                     kivy_home=tmp_path / "kivy")  # fmt: skip
    # The window is the size asked, the Enrol row and the first fields are in it as it opens, and every widget of
    # every screen can be scrolled into it.
    assert res["window"] == [int(v) for v in window.split("x")]
    assert res["at_open"] == {"bundle": True, "enrol": True, "scan": True, "client_id": True, "broker": True, "federation": True}
    assert res["unreachable"] == {} and min(res["checked"].values()) >= 5, res["checked"]
    # A pasted bundle is masked while in the field and gone from it once parsed, even when refused.
    assert res["pasted"]["masked"] is True and res["pasted"]["text_after"] == "" and res["path_masked"] is False
    assert res["pasted"]["error"].startswith("enrolment bundle refused (unknown_version)")
    assert res["pasted"]["hint"] == "the pasted bundle was refused (see below); paste a new one"
    assert res["bad"]["error"].startswith("enrolment bundle refused (bad_json): not JSON")
    assert res["bad"]["fields"]["client_id"] == "localhost"  # nothing changed
    assert res["scan"].startswith("QR scanning needs the Android app and a camera")
    good = res["good"]
    assert good["error"] == "" and good["enrolled"] == "enrolled with fedhar-home: phone-anna in home" and good["bundle_text"] == ""
    assert good["fields"] == {"client_id": "phone-anna", "broker": "192.168.1.10:8883", "federation": "home", "username": "phone-anna",
                              "tls_ca": str(state / "credentials" / "home.phone-anna.ca.pem"), "password": "",
                              "password_hint": "stored (hidden)"}  # fmt: skip
    assert (state / "credentials" / "mqtt.password").read_text() == secret
    assert (out / "federation-enrolled.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("FEDHAR_KEEP_SHOTS"):
        import shutil

        shutil.copy(out / "federation-enrolled.png", os.environ["FEDHAR_KEEP_SHOTS"])
    assert secret not in printed + json.dumps(res)
