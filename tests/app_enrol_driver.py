"""Drives the real Kivy app's Enrol (Federation screen) in its own process: the script of tests/test_enrolment_app_window.py.

Usage: python tests/app_enrol_driver.py OUT_DIR STATE_DIR BUNDLE_JSON

Pastes a malformed bundle, presses Scan QR (not Android: the reason is shown), then enrols
from the bundle's file path; the texts the widgets showed go to ``OUT_DIR/results.json``,
with a screenshot of the Federation screen after the enrolment. Driven through Kivy's own
event API, as tests/app_driver.py does.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("KIVY_NO_ARGS", "1")
os.environ.setdefault("KIVY_NO_CONSOLELOG", "1")
for _name in ("torch", "scipy"):  # as on a phone
    sys.modules[_name] = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_client.app.controller import AppConfig  # noqa: E402
from edge_client.app.main import create_app  # noqa: E402
from edge_client.sensors.base import ReplaySensor  # noqa: E402
from har_models.data.hapt import read_hapt_recordings  # noqa: E402
from har_models.data.labels import HAPT_LABELS  # noqa: E402

TIMEOUT_S = 60.0


def main() -> int:
    out, state, bundle = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"error": None}
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1")
    source = ReplaySensor(read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0], speed=5.0, loop=True)
    app = create_app(cfg, source, charging=lambda: False, supervise_s=0.3)

    from kivy.clock import Clock
    from kivy.core.window import Window

    Window.size = (480, 800)
    deadline = time.monotonic() + TIMEOUT_S
    steps = iter(range(5))

    def fields(fed) -> dict:
        return {"client_id": fed.client_id.text, "broker": fed.broker.text, "federation": fed.federation_name.text,
                "username": fed.username.text, "tls_ca": fed.tls_ca.text, "password": fed.password.text,
                "password_hint": fed.password.hint_text}  # fmt: skip

    def tick(_dt):
        try:
            fed = app.federation
            step = next(steps)
            if step == 0:
                app.tabs["federation"].dispatch("on_release")
                fed.bundle.text = '{"format": "fedhar-enrolment", "version": 1, "client_id": '
                fed.enrol_button.dispatch("on_release")
                results["bad"] = {"error": fed.error.text, "fields": fields(fed)}
            elif step == 1:
                fed.scan_button.dispatch("on_release")
                results["scan"] = fed.error.text
            elif step == 2:
                fed.bundle.text = str(bundle)
                fed.enrol_button.dispatch("on_release")
                results["good"] = {"error": fed.error.text, "enrolled": fed.bundle.hint_text, "bundle_text": fed.bundle.text,
                                   "fields": fields(fed), "current": app.sm.current}  # fmt: skip
            elif step == 3:
                path = Window.screenshot(name=str(out / "federation-enrolled.png"))
                if path and Path(path).exists():
                    Path(path).rename(out / "federation-enrolled.png")
            else:
                raise StopIteration
        except StopIteration:
            Clock.unschedule(tick)
            app.stop()
        except Exception:
            results["error"] = traceback.format_exc()
            Clock.unschedule(tick)
            app.stop()
        if time.monotonic() > deadline:
            results["error"] = f"not done in {TIMEOUT_S} s"
            app.stop()

    Clock.schedule_interval(tick, 0.5)
    app.run()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if results["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
