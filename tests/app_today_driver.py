"""Drives the real Kivy app's Today screen in its own process: the script of tests/test_app_today.py.

Usage: python tests/app_today_driver.py OUT_DIR STATE_DIR [WIDTHxHEIGHT]  (default 480x800)

As on a phone, ``torch`` and ``scipy`` cannot be imported. Before the window opens, the
device's local model is a small HarCNN trained here with the numpy backend on HAPT subject 2
(a stand-in for what a federation round leaves in the store). The sensor replays HAPT subject
1's first session at 40x real time; the app classifies every window in the background and the
Today screen draws the stretches. The script waits for a few minutes of timeline, taps the
longest stretch on the bar (a touch at its middle), relabels it as another activity, sets
the weekly goal, exports the day as CSV, and writes what the widgets showed to
``OUT_DIR/results.json`` with screenshots (``today.png`` before the relabel,
``today-relabelled.png`` after).
"""

from __future__ import annotations

import sys
from pathlib import Path

from support.app_script import as_on_a_phone

ROOT = as_on_a_phone()

import numpy as np  # noqa: E402
from support.app_script import run_script  # noqa: E402

from edge_client.app.controller import AppConfig  # noqa: E402
from edge_client.app.main import create_app  # noqa: E402
from edge_client.backends.factory import make_backend  # noqa: E402
from edge_client.backends.numpy_ref import init_weights  # noqa: E402
from edge_client.sensors.base import ReplaySensor  # noqa: E402
from edge_client.store import ClientStore  # noqa: E402
from har_models.data.hapt import read_hapt_recordings  # noqa: E402
from har_models.data.labels import HAPT_LABELS  # noqa: E402
from har_models.data.pipeline import windows_from_recording  # noqa: E402
from har_models.nn.arch import ArchSpec  # noqa: E402

TIMEOUT_S = 200.0


def train_local_model(state: Path) -> None:
    """A small HarCNN trained for 3 epochs on HAPT subject 2, saved as the store's local model."""
    wss = [windows_from_recording(r, HAPT_LABELS) for r in read_hapt_recordings(ROOT / "datasets" / "hapt" / "user02.npz")]
    x = np.concatenate([w.x for w in wss])
    y = np.concatenate([w.y for w in wss])
    mean = tuple(float(v) for v in x.mean(axis=(0, 2)))
    std = tuple(float(v) for v in x.std(axis=(0, 2)) + 1e-3)
    spec = ArchSpec(n_classes=6, conv_filters=8, dense_units=16, input_mean=mean, input_std=std)
    backend = make_backend("numpy", spec, init_weights(spec, 3))
    rng = np.random.default_rng(0)
    for _ in range(3):
        backend.train_epoch(x, y, rng.permutation(len(y)), lr=0.05, batch_size=32)
    store = ClientStore(state, HAPT_LABELS)
    store.save_local_model(spec.to_json(), backend.get_weights())
    store.close()


def main() -> int:
    out, state = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"error": None}
    train_local_model(state)
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    source = ReplaySensor(rec, speed=40.0, loop=False)
    app = create_app(cfg, source, charging=lambda: False, supervise_s=0.5)

    from kivy.core.window import Window
    from kivy.input.motionevent import MotionEvent

    Window.size = tuple(int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "480x800").split("x"))
    results["window"] = list(Window.size)

    def shot(name: str) -> None:
        path = Window.screenshot(name=str(out / f"{name}.png"))
        if path and Path(path).exists():
            Path(path).rename(out / f"{name}.png")

    class Tap(MotionEvent):
        def depack(self, args: tuple[float, float]) -> None:
            self.is_touch = True
            self.sx, self.sy = args
            super().depack(args)

    def script():
        today = app.today
        ctl = app.controller
        yield lambda: len(today.bar.stretches) >= 3 and today.bar.span[1] > today.bar.span[0]
        yield 2.0
        today.refresh()
        results["before"] = {
            "stretches": [(s.start_ns, s.end_ns, s.label) for s in today.bar.stretches],
            "minutes": {HAPT_LABELS.names[k]: (a.text, b.text) for k, (a, b) in today.minute_labels.items()},
            "goal": today.goal_words.text,
            "guidance": today.guidance.text,
            "date": today.date.text,
            "counts": ctl.counts(),
        }
        shot("today")
        # Tap the middle of the longest stretch on the bar, in window coordinates.
        st = max(today.bar.stretches, key=lambda s: s.end_ns - s.start_ns)
        x = today.bar._x((st.start_ns + st.end_ns) // 2)
        wx, wy = today.bar.to_window(x, today.bar.center_y)
        touch = Tap("tap", 1, (wx / Window.width, wy / Window.height))
        touch.pos = (x, today.bar.center_y)  # in the bar's parent's coordinates, as the ScrollView hands touches on
        touch.x, touch.y = touch.pos
        today.bar.on_touch_down(touch)
        results["selected"] = {"text": today.selection.text, "stretch": [st.start_ns, st.end_ns, st.label],
                               "bar": None if today.bar.selected is None else [today.bar.selected.start_ns, today.bar.selected.end_ns]}
        other = "laying" if HAPT_LABELS.names[st.label] != "laying" else "standing"
        today.relabel_to.text = other
        results["relabel_to"] = other
        today.relabel_button.dispatch("on_release")
        results["after"] = {
            "taught": today.taught.text,
            "counts": ctl.counts(),
            "n_train": len(ctl.store.windows("train")),
            "n_test": len(ctl.store.windows("test")),
            "corrected": [(s.start_ns, s.end_ns, s.label, s.corrected) for s in today.bar.stretches if s.corrected],
            "guidance": today.guidance.text,
        }
        today.goal.text = "90"
        today.set_goal()
        results["goal_after"] = today.goal_words.text
        today.export_button.dispatch("on_release")
        results["exported"] = today.exported.text
        today.bar.select(None)
        yield 0.5
        shot("today-relabelled")
        today.prev.dispatch("on_release")  # yesterday: browsable, nothing recognised then
        results["yesterday"] = {"date": today.date.text, "stretches": len(today.bar.stretches), "text": today.selection.text,
                                "next_disabled": today.next.disabled, "walking": today.minute_labels[0][0].text}
        today.next.dispatch("on_release")
        results["back"] = {"date": today.date.text, "next_disabled": today.next.disabled, "stretches": len(today.bar.stretches)}
        ctl.stop_sensing()

    return run_script(app, script(), results, out, TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main())
