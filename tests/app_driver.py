"""Drives the real Kivy app in its own process (one window per process): the script of tests/test_app.py.

Usage: python tests/app_driver.py OUT_DIR STATE_DIR SETTINGS_JSON [WIDTHxHEIGHT]  (the window, default 480x800)

SETTINGS_JSON names the secured broker: ``tls_port``, ``ca``, ``wrong_ca``, ``client_id``,
``password``, ``federation``. The process runs as a phone does: ``torch`` and ``scipy``
cannot be imported (``sys.modules[name] = None`` before anything else), the sensors
deliver 100 Hz (a HAPT session interpolated onto a 10 ms grid, which the pipeline low-passes
and resamples to 50 Hz), and the credentials are typed into the Federation screen.

Everything is done through Kivy's own event API (``dispatch("on_release")``, setting a
``Spinner``'s text, a ``Switch``'s ``active``, a ``TextInput``'s text); the texts the widgets
show are written to ``OUT_DIR/results.json`` with screenshots of each screen. The pytest
side asserts them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from support.app_script import PHONE_LACKS as BLOCKED
from support.app_script import as_on_a_phone

ROOT = as_on_a_phone()

import numpy as np  # noqa: E402
from support.app_script import run_script  # noqa: E402

from edge_client.app.controller import AppConfig, _trained_accuracy  # noqa: E402
from edge_client.app.main import create_app  # noqa: E402
from edge_client.app.predictor import load_predictor  # noqa: E402
from edge_client.sensors.base import ReplaySensor  # noqa: E402
from har_models.data.hapt import read_hapt_recordings  # noqa: E402
from har_models.data.labels import HAPT_LABELS  # noqa: E402
from har_models.data.recording import Recording, SensorStream  # noqa: E402

TIMEOUT_S = 240.0
RATE_HZ = 100.0


def at_100hz(rec: Recording) -> Recording:
    """The session as a 100 Hz sensor would deliver it: both streams linearly interpolated onto a 10 ms grid."""

    def up(s: SensorStream) -> SensorStream:
        t = np.arange(int(s.t_ns[0]), int(s.t_ns[-1]) + 1, int(1e9 / RATE_HZ), dtype=np.int64)
        xyz = np.stack([np.interp(t, s.t_ns, s.xyz[:, k]) for k in range(3)], axis=1)
        return SensorStream(t, xyz)

    return Recording(rec.subject, rec.session, up(rec.acc), up(rec.gyro), rec.labels)


def main() -> int:
    out, state, broker = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
    port = int(broker["tls_port"])
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"steps": [], "error": None, "blocked": {n: sys.modules.get(n, "absent") is None for n in BLOCKED}}
    seen: dict = {}

    def loader(store):
        pred = load_predictor(store)
        if pred is None:
            return None

        class Spy:
            def predict(self, x):
                p = pred.predict(x)
                seen["x"], seen["p"] = x[-1:].copy(), p[-1:].copy()  # the newest window: the one the Live screen shows
                return p

        return Spy()

    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1")  # what a phone starts with
    rec = at_100hz(read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0])
    source = ReplaySensor(rec, speed=25.0, loop=True)
    app = create_app(cfg, source, predictor_loader=loader, charging=lambda: False, supervise_s=0.3)

    from kivy.core.window import Window

    Window.size = tuple(int(v) for v in (sys.argv[4] if len(sys.argv) > 4 else "480x800").split("x"))
    results["window"] = list(Window.size)

    def shot(name: str) -> None:
        path = Window.screenshot(name=str(out / f"{name}.png"))
        if path and Path(path).exists():
            Path(path).rename(out / f"{name}.png")

    def script():
        """A generator: each yield is a condition to wait for (polled every 50 ms) or a number of seconds."""
        rec, live, fed = app.record, app.live, app.federation
        yield 1.0
        app.tabs["record"].dispatch("on_release")  # the app opens on Today
        # Record: walking, then sitting.
        rec.activity.text = "walking"
        rec.button.dispatch("on_release")
        results["steps"].append({"status_while_recording": rec.status.text, "button": rec.button.text})
        yield lambda: int(rec.count_labels["walking"].text) >= 12
        rec.button.dispatch("on_release")
        rec.activity.text = "sitting"
        rec.button.dispatch("on_release")
        yield lambda: int(rec.count_labels["sitting"].text) >= 8
        rec.button.dispatch("on_release")
        yield 1.0
        # A window that ended before the stop may still come out of the pipeline: the screen catches up with the log.
        yield lambda: {n: rec.count_labels[n].text for n in HAPT_LABELS.names} == {
            n: str(c) for n, c in app.controller.counts().items()}  # fmt: skip
        counts = app.controller.counts()
        results["counts_widget"] = {n: rec.count_labels[n].text for n in HAPT_LABELS.names}
        results["counts_log"] = counts
        results["status_after_stop"] = rec.status.text
        shot("record")
        # Live, before any model exists.
        app.tabs["live"].dispatch("on_release")
        yield lambda: live.note.text.startswith("no model")
        results["live_before"] = {"activity": live.activity.text, "note": live.note.text, "current": app.sm.current}
        # Federation: a bad address is refused, then the settings are typed in, first with a wrong password.
        app.tabs["federation"].dispatch("on_release")
        results["federation_current"] = app.sm.current
        fed.broker.text = "not a broker"
        fed.apply_button.dispatch("on_release")
        results["broker_error"] = fed.apply_error.text
        fed.client_id.text = broker["client_id"]
        fed.broker.text = f"127.0.0.1:{port}"
        fed.federation_name.text = broker["federation"]
        fed.username.text = broker["client_id"]
        fed.password.text = "not-the-password"
        fed.tls_ca.text = broker["ca"]
        fed.backend.text = "numpy"
        fed.apply_button.dispatch("on_release")
        results["after_apply"] = {"error": fed.apply_error.text, "password_text": fed.password.text, "hint": fed.password.hint_text}
        results["broker_after"] = app.controller.cfg.broker
        fed.take_part.active = True
        yield lambda: fed.state.text == "waiting for charger"
        results["state_on_battery"] = fed.state.text
        fed.charge_only.active = False
        t_refused = time.monotonic()
        yield lambda: fed.error.text.startswith("login refused")
        results["refused"] = {"error": fed.error.text, "after_s": time.monotonic() - t_refused}
        yield lambda: fed.state.text.startswith("failed, retry in")
        results["refused"]["state"] = fed.state.text
        shot("federation-refused")
        yield 8.0
        results["refused"]["restarts_in_8s"] = app.controller.federation.restarts
        results["refused"]["state_later"] = fed.state.text
        # The wrong CA: the right password, a CA that did not sign the broker's certificate.
        fed.password.text = broker["password"]
        fed.tls_ca.text = broker["wrong_ca"]
        fed.apply_button.dispatch("on_release")
        results["stored_hint"] = fed.password.hint_text
        yield lambda: fed.error.text.startswith("wrong CA certificate")
        results["wrong_ca"] = fed.error.text
        # The right CA: joins and trains.
        fed.tls_ca.text = broker["ca"]
        fed.apply_button.dispatch("on_release")
        yield lambda: fed.state.text in ("connected", "training") or fed.round.text not in ("-",)
        results["state_connected"] = fed.state.text
        store = app.controller.store
        yield lambda: fed.round.text == "1" and fed.state.text == "connected" and store.get_meta("last_update", {}).get("round") == 1

        def shows_round_1_accuracy() -> bool:
            # The screen refreshes from the controller on its own tick: wait until it shows round 1's update, not round 0's.
            last = store.load_last_update()
            if last is None or last[0].get("round") != 1:
                return False
            acc = _trained_accuracy(last[1])
            return acc is not None and fed.accuracy.text == f"{acc * 100:.1f} %"

        yield shows_round_1_accuracy
        results["federation"] = {"state": fed.state.text, "round": fed.round.text, "accuracy": fed.accuracy.text, "error": fed.error.text}
        yield lambda: "counted" in fed.sent.text  # the coordinator's receipt for round 1
        yield lambda: "A round (numpy): " in fed.cost.text  # round 1's cost, measured by the agent, on the screen
        results["privacy"] = {"why": fed.why.text, "sent": fed.sent.text, "cost": fed.cost.text}
        results["fields"] = {
            "client_id": fed.client_id.text,
            "username": fed.username.text,
            "password": fed.password.text,
            "backend": fed.backend.text,
            "footer": app.footer.text,
        }
        ctl = app.controller
        results["factors"] = {"recorder": ctl.recorder._pipeline._resampler.factors, "live": ctl._live_pipe._resampler.factors}
        shot("federation")
        fed.children[0].scroll_to(fed.cost, animate=False)  # the privacy view and the cost, at the end of the screen
        yield 0.5
        shot("privacy")
        fed.children[0].scroll_y = 1
        # Live: the model from the federation now predicts.
        app.tabs["live"].dispatch("on_release")
        n0 = app.controller.live.windows
        yield lambda: "x" in seen and app.controller.live.windows >= n0 + 2 and live.activity.text != "-"
        yield 0.0
        # Freeze what the screen shows and what the model saw for it, together.
        app.controller.stop_sensing()
        yield 0.5
        results["live"] = {
            "activity": live.activity.text,
            "confidence": live.confidence.text,
            "windows": live.windows.text,
            "controller_activity": app.controller.live.activity,
        }
        np.save(out / "live_x.npy", seen["x"])
        np.save(out / "live_p.npy", seen["p"])
        shot("live")
        results["last_update_round"] = app.controller.store.get_meta("last_update", {}).get("round")
        results["still_blocked"] = {n: sys.modules.get(n, "absent") is None for n in BLOCKED}

    return run_script(app, script(), results, out, TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main())
