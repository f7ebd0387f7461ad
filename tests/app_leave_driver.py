"""Drives leaving the federation in the real Kivy app, in its own process: the script of tests/test_app_leave.py.

Usage: python tests/app_leave_driver.py OUT_DIR STATE_DIR BUNDLE_FILE [WIDTHxHEIGHT]  (default 480x800)

As on a phone, ``torch`` and ``scipy`` cannot be imported. Before the window opens the store
holds a local model (a numpy HarCNN at its initial weights: what a round leaves there). The
script enrols from the bundle's file, switches on taking part, presses "Leave the federation",
cancels once, presses it again, switches on "Also ask the server to forget this phone" and
leaves; then writes what the widgets showed and which files remain to ``OUT_DIR/results.json``,
with screenshots of the confirmation (``leave-confirm.png``) and of the screen after it
(``left.png``). Driven through Kivy's own event API, as tests/app_driver.py does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from support.app_script import as_on_a_phone

ROOT = as_on_a_phone()


from support.app_script import run_script  # noqa: E402

from edge_client.app.controller import AppConfig  # noqa: E402
from edge_client.app.main import create_app  # noqa: E402
from edge_client.backends.numpy_ref import init_weights  # noqa: E402
from edge_client.sensors.base import ReplaySensor  # noqa: E402
from edge_client.store import ClientStore  # noqa: E402
from har_models.data.hapt import read_hapt_recordings  # noqa: E402
from har_models.data.labels import HAPT_LABELS  # noqa: E402
from har_models.nn.arch import ArchSpec  # noqa: E402

TIMEOUT_S = 60.0
KEPT = ("credentials/mqtt.password", "credentials/enrolled", "local_model.safetensors", "timeline.sqlite")
"""Files whose presence is reported before and after leaving (relative to STATE_DIR)."""


def main() -> int:
    out, state, bundle = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"error": None}
    spec = ArchSpec(n_classes=6, conv_filters=8, dense_units=16)
    store = ClientStore(state, HAPT_LABELS)
    store.save_local_model(spec.to_json(), init_weights(spec, 3))
    store.close()
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1")
    source = ReplaySensor(read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0], speed=5.0, loop=True)
    app = create_app(cfg, source, charging=lambda: False, supervise_s=0.3)

    from kivy.core.window import Window

    Window.size = tuple(int(v) for v in (sys.argv[4] if len(sys.argv) > 4 else "480x800").split("x"))
    results["window"] = list(Window.size)

    def shot(name: str) -> None:
        path = Window.screenshot(name=str(out / f"{name}.png"))
        if path and Path(path).exists():
            Path(path).rename(out / f"{name}.png")

    def files() -> dict[str, bool]:
        return {name: (state / name).exists() for name in KEPT}

    def in_window(w) -> bool:
        x, y = w.to_window(*w.pos)
        return x >= -1 and y >= -1 and x + w.width <= Window.width + 1 and y + w.height <= Window.height - 52 + 1  # under the tabs

    def script():
        fed = app.federation
        yield 0.5
        app.tabs["federation"].dispatch("on_release")
        fed.bundle.text = str(bundle)
        fed.enrol_button.dispatch("on_release")
        fed.charge_only.active = False
        fed.take_part.active = True
        yield lambda: fed.state.text == "not enough data"
        results["before"] = {"files": files(), "client_id": fed.client_id.text, "broker": fed.broker.text,
                             "error": fed.error.text, "take_part": app.controller.federation.take_part}  # fmt: skip
        fed.view.scroll_to(fed.leave_button, animate=False)
        yield 0.3
        # Asked first; Cancel changes nothing.
        fed.leave_button.dispatch("on_release")
        yield 0.3
        results["cancelled"] = {"popup": fed.leave_popup.title}
        fed.leave_cancel.dispatch("on_release")
        yield 0.5
        results["cancelled"] |= {"files": files(), "take_part": app.controller.federation.take_part, "left": fed.left.text,
                                 "open": fed.leave_popup.get_parent_window() is not None}  # fmt: skip
        fed.leave_button.dispatch("on_release")
        yield 0.3
        fed.forget_switch.active = True
        results["confirm"] = {"title": fed.leave_popup.title, "forget": fed.forget_switch.active,
                              "question": fed.leave_popup.content.children[-1].text}  # fmt: skip
        yield 0.5
        shot("leave-confirm")
        fed.leave_confirm.dispatch("on_release")
        results["while_leaving"] = {"button": fed.leave_confirm.text, "disabled": fed.leave_confirm.disabled}
        yield lambda: fed.left.text != ""
        yield 0.8
        results["after"] = {
            "left": fed.left.text,
            "files": files(),
            "current": app.sm.current,
            "scroll_y": fed.view.scroll_y,
            "enrol_row_in_window": in_window(fed.bundle) and in_window(fed.enrol_button),
            "hint": fed.bundle.hint_text,
            "popup_closed": fed.leave_popup is None,
            "take_part_switch": fed.take_part.active,
            "state": fed.state.text,
            "fields": {"client_id": fed.client_id.text, "broker": fed.broker.text, "federation": fed.federation_name.text,
                       "username": fed.username.text, "tls_ca": fed.tls_ca.text, "password_hint": fed.password.hint_text},
            "controller": {"take_part": app.controller.federation.take_part, "password_file": str(app.controller.cfg.password_file)},
        }  # fmt: skip
        shot("left")
        app.controller.stop_sensing()

    return run_script(app, script(), results, out, TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main())
