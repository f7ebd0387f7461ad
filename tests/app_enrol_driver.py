"""Drives the real Kivy app's Enrol (Federation screen) in its own process: the script of tests/test_enrolment_app_window.py.

Usage: python tests/app_enrol_driver.py OUT_DIR STATE_DIR BUNDLE_JSON [WIDTHxHEIGHT]

Opens the window at WIDTHxHEIGHT (default 480x800) and notes where the Enrol row and the
client id, broker and federation fields lie; pastes a malformed bundle, presses Scan QR (not
Android: the reason is shown), pastes a whole bundle of a version this app does not read
(its password is masked while pasted, and the field is emptied once parsed), then enrols
from the bundle's file path; then scrolls every screen to each of its widgets and notes any
that stays outside the window. The texts the widgets showed go to ``OUT_DIR/results.json``,
with a screenshot of the Federation screen after the enrolment. Driven through Kivy's own
event API, as tests/app_driver.py does.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from support.app_script import as_on_a_phone

ROOT = as_on_a_phone()


from edge_client.app.controller import AppConfig  # noqa: E402
from edge_client.app.main import create_app  # noqa: E402
from edge_client.sensors.base import ReplaySensor  # noqa: E402
from har_models.data.hapt import read_hapt_recordings  # noqa: E402
from har_models.data.labels import HAPT_LABELS  # noqa: E402

TIMEOUT_S = 60.0


def main() -> int:
    out, state, bundle = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    width, height = (int(v) for v in (sys.argv[4] if len(sys.argv) > 4 else "480x800").split("x"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"error": None}
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1")
    source = ReplaySensor(read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0], speed=5.0, loop=True)
    app = create_app(cfg, source, charging=lambda: False, supervise_s=0.3)

    from kivy.clock import Clock
    from kivy.core.window import Window
    from kivy.uix.scrollview import ScrollView

    Window.size = (width, height)
    deadline = time.monotonic() + TIMEOUT_S

    def fields(fed) -> dict:
        return {"client_id": fed.client_id.text, "broker": fed.broker.text, "federation": fed.federation_name.text,
                "username": fed.username.text, "tls_ca": fed.tls_ca.text, "password": fed.password.text,
                "password_hint": fed.password.hint_text}  # fmt: skip

    def rect(w) -> tuple[float, float, float, float]:
        x, y = w.to_window(*w.pos)
        return x, y, x + w.width, y + w.height

    def shown(w, view) -> bool:
        """Whether ``w`` lies wholly inside the window and inside its screen's scrolled viewport (so not under the tabs)."""
        x0, y0, x1, y1 = rect(w)
        vx0, vy0, vx1, vy1 = rect(view)
        tol = 1.0
        inside_window = x0 >= -tol and y0 >= -tol and x1 <= Window.width + tol and y1 <= Window.height + tol
        return inside_window and x0 >= vx0 - tol and y0 >= vy0 - tol and x1 <= vx1 + tol and y1 <= vy1 + tol

    def view_of(screen):
        """The screen's ScrollView, or the screen itself where it has none (then nothing can scroll)."""
        return next((w for w in screen.walk() if isinstance(w, ScrollView)), screen)

    def script():
        fed = app.federation
        yield
        app.tabs["federation"].dispatch("on_release")
        yield
        yield
        view = view_of(fed)
        named = {"bundle": fed.bundle, "enrol": fed.enrol_button, "scan": fed.scan_button, "client_id": fed.client_id,
                 "broker": fed.broker, "federation": fed.federation_name}  # fmt: skip
        results["window"] = [Window.width, Window.height]
        results["at_open"] = {name: shown(w, view) for name, w in named.items()}
        fed.bundle.text = '{"format": "fedhar-enrolment", "version": 1, "client_id": '
        fed.enrol_button.dispatch("on_release")
        results["bad"] = {"error": fed.enrol_error.text, "fields": fields(fed)}
        yield
        fed.scan_button.dispatch("on_release")
        results["scan"] = fed.enrol_error.text
        yield
        newer = json.loads(bundle.read_text()) | {"version": 99}
        fed.bundle.text = json.dumps(newer)
        masked = fed.bundle.password
        fed.enrol_button.dispatch("on_release")
        results["pasted"] = {"masked": masked, "text_after": fed.bundle.text, "hint": fed.bundle.hint_text, "error": fed.enrol_error.text}
        yield
        fed.bundle.text = str(bundle)
        results["path_masked"] = fed.bundle.password
        fed.enrol_button.dispatch("on_release")
        results["good"] = {"error": fed.enrol_error.text, "enrolled": fed.bundle.hint_text, "bundle_text": fed.bundle.text,
                           "fields": fields(fed), "current": app.sm.current}  # fmt: skip
        yield
        yield
        path = Window.screenshot(name=str(out / "federation-enrolled.png"))
        if path and Path(path).exists():
            Path(path).rename(out / "federation-enrolled.png")
        yield
        # Every widget of every screen can be scrolled into the window.
        unreachable: dict[str, list[str]] = {}
        for name in ("today", "record", "live", "federation"):
            app.tabs[name].dispatch("on_release")
            yield
            screen = app.sm.get_screen(name)
            view = view_of(screen)
            targets = [w for w in view.children[0].walk(restrict=True) if w is not view.children[0] and not w.children]
            for w in targets:
                if isinstance(view, ScrollView):
                    view.scroll_to(w, padding=0, animate=False)
                yield
                if not shown(w, view):
                    unreachable.setdefault(name, []).append(f"{type(w).__name__} {getattr(w, 'text', '')!r:.40} at {rect(w)}")
            results.setdefault("checked", {})[name] = len(targets)
        results["unreachable"] = unreachable

    steps = script()

    def tick(_dt):
        try:
            next(steps)
        except StopIteration:
            Clock.unschedule(tick)
            app.stop()
            return
        except Exception:
            results["error"] = traceback.format_exc()
            Clock.unschedule(tick)
            app.stop()
            return
        if time.monotonic() > deadline:
            results["error"] = f"not done in {TIMEOUT_S} s"
            Clock.unschedule(tick)
            app.stop()

    Clock.schedule_interval(tick, 0.1)
    app.run()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if results["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
