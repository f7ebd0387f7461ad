"""Screens that fit: the window ``fedhar-app`` opens with ``--size`` (or with none, on a phone-shaped display), every error next
to the control that caused it and inside that window, and cleared when its cause is gone (tests/app_window_driver.py drives it).

Each case runs the app as its own command line would open it: the driver never sets the window's size.
The screenshots of every new or changed screen at 480x800, 800x600 and 1280x720 are copied to
docs/screenshots/app/ when FEDHAR_UPDATE_SCREENSHOTS=1. Skipped when Kivy cannot be imported,
unless FEDHAR_REQUIRE_APP=1 (set by .ci/run).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from support.app_script import run_driver, xvfb

pytestmark = [pytest.mark.slow, pytest.mark.app]

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots" / "app"
MAX_GAP_PX = 8.0
"""Most pixels between a control's bottom edge and the top of its error (the layout's spacing is 3-4 dp)."""


@pytest.mark.parametrize(("options", "screen", "window"), [
    pytest.param(["--size", "480x800"], "1280x800", [480, 800], id="size-480x800"),
    pytest.param(["--size", "800x600"], "1280x800", [800, 600], id="size-800x600"),
    pytest.param(["--size", "1280x720"], "1280x800", [1280, 720], id="size-1280x720"),
    # no option on a 480x800 display: the display's size, not Kivy's 800x600 cut off
    pytest.param([], "480x800", [480, 800], id="auto-on-480x800"),
])  # fmt: skip
def test_every_error_lies_under_its_control_inside_the_window_the_app_opens(tmp_path, mosquitto, options, screen, window):
    if importlib.util.find_spec("kivy") is None:
        if os.environ.get("FEDHAR_REQUIRE_APP") == "1":
            pytest.fail("Kivy is not installed (FEDHAR_REQUIRE_APP=1)")
        pytest.skip("Kivy is not installed (pip install -e '.[app]')")
    out, state = tmp_path / "out", tmp_path / "state"
    with xvfb(tmp_path, screen) as display:
        if display is None:
            pytest.skip("Xvfb is not installed (apt-get install xvfb)")
        res, _ = run_driver("app_window_driver.py", out, str(state), str(mosquitto), *options, display=display,
                            kivy_home=tmp_path / "kivy", timeout_s=240)  # fmt: skip
    assert res["window"] == window
    assert all(res["tabs"].values()), res["tabs"]  # Today to History: every tab inside the window, its name not cut
    assert res["take_part_at_open"] is True
    # Each error: shown inside the window and its screen's view, right under the control that caused it.
    assert set(res["errors"]) == {"enrol", "scan", "apply", "connection", "export", "undo", "keep"}
    for name, where in res["errors"].items():
        assert where["shown"] and where["overlap"] and 0 <= where["gap"] <= MAX_GAP_PX, (name, where)
    assert res["errors"]["enrol"]["text"].startswith("enrol: cannot read the bundle")
    assert res["errors"]["scan"]["text"].startswith("QR scanning needs the Android app")
    assert "is not HOST:PORT" in res["errors"]["apply"]["text"]
    assert res["errors"]["connection"]["text"].startswith("broker unreachable")
    assert res["errors"]["export"]["text"].startswith("cannot write")
    assert res["errors"]["undo"]["text"] == "nothing to undo: no correction is kept"
    assert res["errors"]["keep"]["text"] == "keep raw samples for 0.25 to 30 days, not 100.0"
    # ... and each cleared once its cause is gone (a good Apply, a good enrolment, the broker back, valid periods).
    assert res["cleared"] == {"apply": True, "scan": True, "connection": True, "keep": True}
    # The home server in words, online and then killed.
    assert res["server_online"].startswith("home server online: waiting for 2 more devices; next round at about ")
    assert res["server_offline"]["server"].startswith("home server offline since ")
    assert res["server_offline"]["why"] == "Taking part, but no rounds now: " + res["server_offline"]["server"]
    # History: training and test windows named, the undo, the trend, the quality, storage; every widget reachable.
    assert res["taught"].startswith("45 training and 11 test windows from this stretch")
    assert res["undone"].startswith("undid the correction sitting 00:05-00:06: 45 training and 11 test windows fewer")
    assert res["trend"].splitlines()[-1].startswith("Active: ")
    assert "walking upstairs: 71 % recognised, often taken for walking (100 test windows)" in res["quality"]
    assert res["recordings"][0].startswith("sitting: 20 windows, ") and res["deleted"].startswith("deleted the recording walking")
    assert res["storage"].splitlines()[-1].startswith("In all: ")
    assert res["delete_asks"] == "Sure?" and res["stretch_deleted"].startswith("deleted 00:05-00:06 from the timeline")
    assert res["history_unreachable"] == [] and res["history_checked"] >= 20
    for name in res["shots"]:
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("FEDHAR_UPDATE_SCREENSHOTS") == "1" and options:
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, SHOTS / name)
