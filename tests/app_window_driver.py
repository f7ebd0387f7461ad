"""Drives the real Kivy app, opened as ``fedhar-app`` opens it with the options given, through every screen and every error.

Usage: python tests/app_window_driver.py OUT_DIR STATE_DIR BROKER_PORT [fedhar-app options, e.g. --size 480x800]

The window is never sized here: the options go through ``fedhar-app``'s own parser, settings and
Kivy environment (:func:`edge_client.app.main.config_from_args`, :func:`~edge_client.app.main.prepare_kivy`),
so the window measured is the one the app opens. The state folder is filled first with a
person's history (forty days of recognised activity, two recordings, twelve rounds' quality);
a scripted coordinator (``tests/support/scripted_coordinator.py``) on the broker at
BROKER_PORT says what the home server is doing. The script then causes each error the screens
show (a missing bundle, Scan QR off Android, a bad broker address, an unreachable broker, an
export into a file, nothing to undo, a keep period out of range), notes where each lies against
its control and the window, checks that each clears when its cause is gone, kills the
coordinator (the phone then says "offline since"), and takes screenshots of every screen.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

from support.app_script import as_on_a_phone

ROOT = as_on_a_phone()

import numpy as np  # noqa: E402
from support.app_script import run_script  # noqa: E402

from edge_client.app.main import build_parser, config_from_args, create_app, prepare_kivy  # noqa: E402
from edge_client.app.round_notes import QUALITY_KEY  # noqa: E402
from edge_client.sensors.base import ReplaySensor  # noqa: E402
from edge_client.store import ClientStore  # noqa: E402
from edge_client.timeline_store import TimelineStore  # noqa: E402
from edge_client.window_log import WindowLog  # noqa: E402
from har_io.enrolment import EnrolmentBundle  # noqa: E402
from har_models.data.hapt import read_hapt_recordings  # noqa: E402
from har_models.data.labels import HAPT_LABELS  # noqa: E402
from har_models.data.windowing import WindowSet  # noqa: E402
from har_models.wire.topics import Topics  # noqa: E402

TIMEOUT_S = 150.0
MIN_NS = 60 * 10**9
STEP_NS = 1_280_000_000


def fill_history(state: Path) -> None:
    """Forty days of recognised activity (more walking this week), a stretch of today with raw samples, two recordings
    with the times they were made, and twelve rounds of confusion matrices on the device's own test windows."""
    tl = TimelineStore(state / "timeline.sqlite", HAPT_LABELS)
    today = dt.date.today()
    for back in range(40, 0, -1):
        day = today - dt.timedelta(days=back)
        t0 = int(dt.datetime.combine(day, dt.time(8, 0)).timestamp() * 1e9)
        walk = 12 + (8 if back <= today.weekday() else 0) + back % 3
        labels = np.repeat([0, 3, 4], [walk * 47, 25 * 47, 6 * 47])
        t = t0 + STEP_NS * np.arange(labels.size, dtype=np.int64)
        tl.add(t, labels, np.full(labels.size, 0.9), np.zeros((labels.size, 6, 1), np.float32), now_ns=t0)
    start = int(dt.datetime.combine(today, dt.time(0, 5)).timestamp() * 1e9)
    x = np.random.default_rng(2).normal(size=(56, 6, 128)).astype(np.float32)
    tl.add(start + STEP_NS * np.arange(56, dtype=np.int64), np.full(56, 4), np.full(56, 0.8), x, now_ns=start)
    log = WindowLog(state / "recorded_windows.log", HAPT_LABELS)
    rng = np.random.default_rng(1)
    for label, n, t_first, hours_ago in ((0, 30, 10**12, 26), (3, 20, 2 * 10**12, 3)):
        t = t_first + STEP_NS * np.arange(n, dtype=np.int64)
        log.append(WindowSet(rng.normal(size=(n, 6, 128)).astype(np.float32), np.full(n, label), HAPT_LABELS, t))
        tl.note_recorded(label, int(t[0]), int(t[-1]), n, time.time_ns() - hours_ago * 3600 * 10**9)
    tl.close()
    store = ClientStore(state, HAPT_LABELS)
    entries = []
    for r in range(12):
        p_start, p_personal = 0.5 + 0.025 * r, 0.68 + 0.02 * r

        def cm(p: float) -> list[list[int]]:
            m = np.zeros((6, 6), np.int64)
            for k in range(6):
                m[k, k] = round(20 * (p - (0.15 if k == 1 else 0.0)))
                m[k, (k + 1) % 6 if k != 1 else 0] = 20 - m[k, k]  # walking upstairs is taken for walking
            return m.tolist()

        entries.append({"run_id": "run-s", "round": r + 3, "t_unix": time.time() - (12 - r) * 3600, "start": cm(p_start),
                        "personal": cm(p_personal), "n_train": 160, "n_test": 40})  # fmt: skip
    store.set_meta(QUALITY_KEY, entries)
    store.close()


def main() -> int:
    out, state, port, options = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"error": None, "errors": {}, "cleared": {}, "shots": []}
    fill_history(state)
    (state / "exports").write_text("a file where the exports folder belongs")  # the export's error
    args = build_parser().parse_args([*options, "--state-dir", str(state), "--client-id", "phone-1", "--broker", f"127.0.0.1:{port}",
                                      "--federation", "home", "--backend", "numpy"])  # fmt: skip
    cfg = config_from_args(args, state.parent)
    prepare_kivy(size=cfg.window_size, fullscreen=cfg.fullscreen)
    coordinator = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "scripted_coordinator.py"), str(port),
                                    Topics("home").coordinator_status], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
    bundle = EnrolmentBundle("fedhar-home", "home", "phone-1", "any-password", "127.0.0.1", port)
    (out / "phone-1.json").write_text(bundle.to_json())
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    app = create_app(cfg, ReplaySensor(rec, speed=1.0, loop=True), charging=lambda: True, supervise_s=0.3)

    from kivy.core.window import Window
    from kivy.uix.scrollview import ScrollView

    def shot(name: str) -> None:
        size = "x".join(str(int(v)) for v in Window.size)  # as the window is now (an "auto" one is fitted when the app builds)
        path = Window.screenshot(name=str(out / f"{name}-{size}.png"))
        if path and Path(path).exists():
            Path(path).rename(out / f"{name}-{size}.png")
        results["shots"].append(f"{name}-{size}.png")

    def rect(w) -> list[float]:
        x, y = w.to_window(*w.pos)
        return [x, y, x + w.width, y + w.height]

    def view_of(w):
        while w is not None and not isinstance(w, ScrollView):
            w = w.parent
        return w

    def placed(err, control) -> dict:
        """Where an error lies: inside the window and its screen's viewport, and how far under its control."""
        e, c, v = rect(err), rect(control), rect(view_of(err))
        inside = e[0] >= -1 and e[1] >= -1 and e[2] <= Window.width + 1 and e[3] <= Window.height + 1
        in_view = e[1] >= v[1] - 1 and e[3] <= v[3] + 1
        return {"text": getattr(err, "text", ""), "shown": inside and in_view and err.height > 0, "gap": round(c[1] - e[3], 1),
                "overlap": min(e[2], c[2]) - max(e[0], c[0]) > 0}  # fmt: skip

    def cause(name: str, button, error, control):
        """Press ``button``, let a frame pass, and note where ``error`` lies against ``control``."""
        button.dispatch("on_release")
        yield 0.3
        results["errors"][name] = placed(error, control)

    def script():
        fed, today, hist = app.federation, app.today, app.history
        results["window"] = [int(Window.width), int(Window.height)]
        results["tabs"] = {n: rect(b)[2] <= Window.width + 1 and b.texture_size[0] <= b.width for n, b in app.tabs.items()}
        yield 1.0
        # Federation: the switch near the top, the server's state in words.
        app.tabs["federation"].dispatch("on_release")
        yield 0.3
        results["take_part_at_open"] = placed(fed.take_part, fed.take_part)["shown"]
        fed.take_part.active = True
        fv = app.controller  # the view the screen shows: its words are in the sentence of why or on their own line
        yield lambda: fv.federation.server.startswith("home server online") and fv.federation.server in fed.why.text + fed.server.text
        results["server_online"] = fv.federation.server
        shot("federation")
        # Errors of the Enrol row: a bundle file that is not there, then Scan QR off Android.
        fed.bundle.text = str(state / "no-such-bundle.json")
        yield from cause("enrol", fed.enrol_button, fed.enrol_error, fed.enrol_row)
        yield from cause("scan", fed.scan_button, fed.enrol_error, fed.enrol_row)
        # A broker address that is not one: right under Apply; taken once fixed.
        fed.broker.text = "not a broker"
        yield from cause("apply", fed.apply_button, fed.apply_error, fed.apply_button)
        # An unreachable broker: the agent's error under the connection state.
        fed.broker.text = "127.0.0.1:1"
        fed.apply_button.dispatch("on_release")
        results["cleared"]["apply"] = fed.apply_error.text == "" and fed.apply_error.height == 0
        yield lambda: fed.error.text.startswith("broker unreachable")
        fed.view.scroll_y = 1
        yield 0.3
        results["errors"]["connection"] = placed(fed.error, fed.state.parent)
        # A good enrolment: the Scan QR error and the connection error are gone with their causes.
        fed.bundle.text = str(out / "phone-1.json")
        fed.enrol_button.dispatch("on_release")
        yield lambda: fed.error.text == "" and fv.federation.server.startswith("home server online")
        results["cleared"]["scan"] = fed.enrol_error.text == "" and fed.enrol_error.height == 0
        results["cleared"]["connection"] = fed.error.height == 0
        # The home server dies: its will, and the phone says since when.
        coordinator.kill()
        yield lambda: fv.federation.server.startswith("home server offline since") and fv.federation.server in fed.why.text
        results["server_offline"] = {"server": fv.federation.server, "why": fed.why.text}
        fed.view.scroll_y = 1
        yield 0.3
        shot("federation-offline")
        # Today: relabel a stretch (training and test windows in words), and an export into a file.
        app.tabs["today"].dispatch("on_release")
        yield 0.5
        st = today.stretches[0]
        today.bar.select(st)
        today.relabel_to.text = "sitting"
        today.relabel_button.dispatch("on_release")
        results["taught"] = today.taught.text
        yield from cause("export", today.export_button, today.export_error, today.export_button)
        view_of(today.export_button).scroll_y = 1
        yield 0.3
        shot("today")
        # History: undo the correction, then once more (nothing to undo), a keep period out of range, a recording deleted.
        app.tabs["history"].dispatch("on_release")
        hist.month.state, hist.week.state = "down", "normal"
        hist.month.dispatch("on_release")
        yield 0.5
        results["trend"] = hist.trend.text
        shot("history")
        hist.undo_button.dispatch("on_release")
        results["undone"] = hist.undone.text
        yield from cause("undo", hist.undo_button, hist.undo_error, hist.undo_button)
        hist.keep_raw.text = "100"
        yield from cause("keep", hist.keep_button, hist.keep_error, hist.keep_button)
        hist.keep_raw.text = "3"
        hist.keep_button.dispatch("on_release")
        yield 0.3
        results["cleared"]["keep"] = hist.keep_error.text == "" and app.controller.timeline.raw_days == 3.0
        results["recordings"] = [b.parent.children[-1].text for _, b, _ in hist.recording_rows]
        _, button, _ = hist.recording_rows[-1]
        button.dispatch("on_release")
        button.dispatch("on_release")
        results["deleted"] = hist.deleted.text
        results["quality"] = hist.quality.text
        view = view_of(hist.chart)
        view.scroll_to(hist.legend, padding=0, animate=False)
        yield 0.3
        shot("history-quality")
        view.scroll_to(hist.window_note, padding=0, animate=False)
        yield 0.3
        results["storage"] = hist.storage.text
        shot("history-settings")
        # Every widget of the History screen can be scrolled into the window.
        unreachable = []
        targets = [w for w in view.children[0].walk(restrict=True) if w is not view.children[0] and not w.children and w.height > 0]
        for w in targets:
            view.scroll_to(w, padding=0, animate=False)
            yield 0.06  # a frame: the scroll is laid out
            e, v = rect(w), rect(view)
            if not (e[1] >= v[1] - 1 and e[3] <= v[3] + 1 and e[0] >= -1 and e[2] <= Window.width + 1):
                unreachable.append(f"{type(w).__name__} {getattr(w, 'text', '')!r:.40}")
        results["history_unreachable"], results["history_checked"] = unreachable, len(targets)
        # Today again: a stretch deleted (a second tap confirms), its minutes gone from the day.
        app.tabs["today"].dispatch("on_release")
        yield 0.3
        today.bar.select(today.stretches[0])
        today.delete_button.dispatch("on_release")
        results["delete_asks"] = today.delete_button.text
        today.delete_button.dispatch("on_release")
        results["stretch_deleted"] = today.taught.text
        for name in ("record", "live"):
            app.tabs[name].dispatch("on_release")
            yield 0.3
            shot(name)

    try:
        return run_script(app, script(), results, out, TIMEOUT_S)
    finally:
        coordinator.kill()


if __name__ == "__main__":
    sys.exit(main())
