"""``fedhar-app``: the Kivy app on the device (Android, Raspberry Pi with a screen, desktop Linux).

Three screens:

* **Record** — choose an activity, start and stop; windows recorded per activity.
* **Live** — the activity the device's current model sees, with its confidence, refreshed
  at every window hop (64 samples = 1.28 s at 50 Hz).
* **Federation** — client id, broker address, federation, user name, password (stored in
  the app's private folder, shown only as "stored"), CA certificate and training backend,
  entered by hand or filled by **Enrol** from an enrolment bundle (its file, its pasted text,
  or on Android its QR code through a scanner app); connection state, current round, last local accuracy, a switch to take
  part and one to train only while charging; every failure in words (refused login,
  wrong CA, unreachable broker, too few windows, missing backend); what left the phone each
  round; and what sensing and rounds cost it in CPU and battery (:func:`edge_client.cost.cost_words`).

The screens only show what :class:`~edge_client.app.controller.DeviceController` reports
from its background threads; every report is moved onto the UI thread with
``Clock.schedule_once`` before a widget is touched.

Kivy parses ``sys.argv`` and opens a window when imported, so :func:`main` parses the
options first and imports Kivy afterwards, in the environment :func:`prepare_kivy` sets
(Kivy's documented ``KIVY_*`` variables: no argument parsing, Python's logging only, the
SDL2 clipboard instead of probing xclip, xsel, dbus and gtk3).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge_client.app.controller import (
    APP_BACKENDS,
    AppConfig,
    DeviceController,
    FederationView,
    LiveView,
    default_data_dir,
    taking_part_words,
)
from edge_client.app.scanner import start_scan
from edge_client.sensors.base import SensorSource
from edge_client.sensors.factory import make_source
from edge_client.sent_log import sent_words
from edge_client.timeline import DEFAULT_WEEKLY_GOAL_MIN, active_classes, day_csv, minutes_per_activity
from har_io import exit_codes
from har_io.cli import HelpFormatter, add_logging_arguments
from har_io.enrolment import EnrolmentRefused
from har_io.exit_codes import Exit
from har_io.install_hints import install_hint
from har_models.data.labels import LABEL_SETS

log = logging.getLogger("fedhar.app")

HOP_S = 1.28
"""Seconds between live predictions: 64 samples at 50 Hz."""


def span_words(seconds: float) -> str:
    """A duration as a person says it: "40 s", "3 min", "2 h 9 min"."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def live_words(windows: int) -> str:
    """The Live screen's line about how long the model has been watching, in words (``windows`` one per :data:`HOP_S`)."""
    if windows <= 0:
        return "Nothing seen yet: the first guess comes after about 3 seconds of movement"
    return f"Watching for {span_words(windows * HOP_S)}; the guess is updated about every second from the last 3 seconds"


def is_bundle_text(text: str) -> bool:
    """Whether the Enrol field holds a bundle's JSON text (pasted or scanned) rather than a file's path."""
    return text.lstrip().startswith("{")


ACTIVITY_COLOURS = (
    (0.95, 0.55, 0.15, 1), (0.85, 0.3, 0.3, 1), (0.75, 0.35, 0.75, 1), (0.3, 0.6, 0.95, 1),
    (0.35, 0.8, 0.45, 1), (0.6, 0.6, 0.65, 1), (0.95, 0.85, 0.3, 1), (0.3, 0.85, 0.85, 1),
)
"""Colour (RGBA) of each activity on the Today screen, by class index (wraps after eight)."""


def activity_colour(label: int) -> tuple[float, float, float, float]:
    """The Today screen's colour of class ``label``."""
    return ACTIVITY_COLOURS[label % len(ACTIVITY_COLOURS)]


def minutes_words(minutes: float) -> str:
    """Minutes for the Today table: one decimal under 10 (``"0.7"``), whole minutes above (``"42"``)."""
    return f"{minutes:.1f}" if minutes < 10 else f"{minutes:.0f}"


def clock_words(t_ns: int) -> str:
    """Local time of day of a wall-clock stamp in ns, ``HH:MM``."""
    return dt.datetime.fromtimestamp(t_ns / 1e9).strftime("%H:%M")


def pretty(activity: str) -> str:
    """``"walking_upstairs"`` -> ``"walking upstairs"``."""
    return activity.replace("_", " ")


def build_parser() -> argparse.ArgumentParser:
    """Options of ``fedhar-app``."""
    on_android = "ANDROID_ARGUMENT" in os.environ or "ANDROID_PRIVATE" in os.environ
    ap = argparse.ArgumentParser(
        prog="fedhar-app",
        description="fedhar on a device: record activities, see live predictions, federate",
        epilog=exit_codes.epilog(exit_codes.APP),
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--state-dir", type=Path, default=None, help="device store (default: the app's data folder)")
    ap.add_argument("--client-id", default=None, help="device id in the federation (default: this host's name)")
    ap.add_argument("--broker", default="127.0.0.1:1883", help="MQTT broker HOST:PORT (default %(default)s)")
    ap.add_argument("--federation", default="default", help="federation name (default %(default)s)")
    ap.add_argument("--username", default=None, help="MQTT user name (a device's is its client id)")
    ap.add_argument("--password-file", type=Path, default=None, help="file holding the MQTT password")
    ap.add_argument("--tls-ca", type=Path, default=None, help="CA certificate: connect with TLS")
    ap.add_argument(
        "--backend", default="auto", choices=APP_BACKENDS, help="training backend (default %(default)s: the client's own choice)"
    )
    ap.add_argument("--labels", default="hapt6", choices=sorted(LABEL_SETS), help="activities to record (default %(default)s)")
    ap.add_argument(
        "--sensor",
        default="android" if on_android else "replay:hapt:datasets/hapt/user01.npz",
        help="android | mpu6050[:BUS[:ADDRESS]] | replay:SOURCE (default %(default)s)",
    )
    ap.add_argument("--replay-speed", type=float, default=1.0, help="replay speed, 1 = real time (default %(default)s)")
    ap.add_argument("--max-windows", type=int, default=20_000, help="bound of the recorded-window log (default %(default)s)")
    add_logging_arguments(ap, progress=False)
    return ap


def config_from_args(args: argparse.Namespace, data_dir: Path) -> AppConfig:
    """The app's settings from parsed options (``data_dir``: the platform's folder for app data)."""
    cid = args.client_id or "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())[:64] or "device"
    return AppConfig(
        state_dir=args.state_dir or data_dir / "fedhar",
        labels=LABEL_SETS[args.labels],
        client_id=cid,
        broker=args.broker,
        federation=args.federation,
        max_windows=args.max_windows,
        username=args.username,
        password_file=args.password_file,
        tls_ca=args.tls_ca,
        backend=args.backend,
    )


RUNTIME_PERMISSIONS = ("android.permission.POST_NOTIFICATIONS",)
"""Permissions the app asks for when it starts: the service's notification (a runtime permission from Android 13).

The sensors need none at run time: 50 Hz is below the 200 Hz limit, and
``HIGH_SAMPLING_RATE_SENSORS`` (the health service type's prerequisite) is granted at install.
"""


def request_android_permissions(then: Callable[[], None]) -> None:
    """Ask for :data:`RUNTIME_PERMISSIONS` not yet granted, then call ``then`` (granted or not).

    The service starts either way: without the notification permission Android still runs
    the foreground service, it only hides its notification. Elsewhere than on Android
    (no python-for-android ``android`` module) ``then`` is called at once.
    """
    try:
        from android.permissions import check_permission, request_permissions  # python-for-android only
    except ImportError:
        then()
        return
    missing = [p for p in RUNTIME_PERMISSIONS if not check_permission(p)]
    if not missing:
        then()
        return

    def answered(permissions: list[str], grants: list[bool]) -> None:
        for name, ok in zip(permissions, grants, strict=False):
            if not ok:
                log.warning("%s was refused: the sensing service runs without a visible notification", name)
        then()

    request_permissions(missing, answered)


def start_android_service(on_error: Callable[[BaseException], None] | None = None) -> None:
    """Ask for the runtime permissions, then start the foreground service "Sensing" declared in buildozer.spec.

    python-for-android names the service's class ``Service<Name>`` in the app's package.
    The start may run later, from the permission dialog's answer; an exception it raises
    there (Android 12+: ``ForegroundServiceStartNotAllowedException`` when the app is in the
    background) goes to ``on_error`` instead of crashing the app (re-raised without one).
    """

    def start() -> None:
        try:
            from jnius import autoclass

            activity = autoclass("org.kivy.android.PythonActivity").mActivity
            autoclass(f"{activity.getPackageName()}.ServiceSensing").start(activity, "")
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)

    request_android_permissions(start)


def create_app(
    cfg: AppConfig, source: SensorSource | None, controller_factory: Callable[..., Any] = DeviceController, **controller_kwargs: Any
) -> Any:
    """Build the Kivy app object (imports Kivy: call after the options are parsed).

    ``controller_factory`` is :class:`~edge_client.app.controller.DeviceController` (sensing in
    this process) or :class:`~edge_client.app.service.RemoteController` (Android: the
    foreground service senses, the UI shows its reports).

    Returns
    -------
    FedHarApp
        ``app.run()`` opens the window; ``app.controller`` is created in ``build()``.
    """
    from kivy.app import App
    from kivy.clock import Clock
    from kivy.graphics import Color, Line, Rectangle
    from kivy.metrics import dp
    from kivy.uix.boxlayout import BoxLayout
    from kivy.uix.button import Button
    from kivy.uix.gridlayout import GridLayout
    from kivy.uix.label import Label
    from kivy.uix.progressbar import ProgressBar
    from kivy.uix.screenmanager import NoTransition, Screen, ScreenManager
    from kivy.uix.scrollview import ScrollView
    from kivy.uix.spinner import Spinner
    from kivy.uix.switch import Switch
    from kivy.uix.textinput import TextInput
    from kivy.uix.togglebutton import ToggleButton
    from kivy.uix.widget import Widget

    def on_ui(fn: Callable[..., None]) -> Callable[..., None]:
        """Run ``fn`` on the UI thread at the next frame (reports come from background threads)."""
        return lambda *a: Clock.schedule_once(lambda _dt: fn(*a), 0)

    def title(text: str) -> Label:
        return Label(text=f"[b]{text}[/b]", markup=True, font_size="22sp", size_hint_y=None, height=dp(48))

    def scrolled(root: BoxLayout) -> ScrollView:
        """``root`` (a vertical box of fixed-height rows) at its own height in a vertical ScrollView, top first.

        Every screen is laid out this way so that any window, 480x800 to 1280x720 and smaller,
        shows the top of the screen and scrolls to the rest, instead of pushing rows above the
        window's top edge.
        """
        root.size_hint_y = None
        root.bind(minimum_height=root.setter("height"))
        view = ScrollView(do_scroll_x=False, bar_width=dp(6), scroll_type=["bars", "content"])
        view.add_widget(root)
        return view

    def wrapped(text: str, height: float) -> Label:
        label = Label(text=text, size_hint_y=None, height=dp(height), halign="left", valign="middle", font_size="14sp")
        label.bind(size=lambda w, size: setattr(w, "text_size", size))
        return label

    def row(label: str, widget: Any, height: float = 44) -> BoxLayout:
        box = BoxLayout(size_hint_y=None, height=dp(height), spacing=dp(8))
        name = Label(text=label, halign="left", valign="middle", size_hint_x=0.5, padding=(dp(6), 0))
        name.bind(size=lambda w, size: setattr(w, "text_size", size))  # wrap and align inside the cell
        box.add_widget(name)
        box.add_widget(widget)
        return box

    class RecordScreen(Screen):
        def __init__(self, app: Any, **kw: Any):
            super().__init__(name="record", **kw)
            self.app = app
            names = [pretty(n) for n in cfg.labels.names]
            root = BoxLayout(orientation="vertical", padding=dp(12), spacing=dp(8))
            root.add_widget(title("Record an activity"))
            self.activity = Spinner(text=names[0], values=names, size_hint_y=None, height=dp(48))
            root.add_widget(row("Activity", self.activity, 48))
            self.button = Button(text="Start recording", size_hint_y=None, height=dp(56), background_color=(0.2, 0.7, 0.3, 1))
            self.button.bind(on_release=lambda *_: self.toggle())
            root.add_widget(self.button)
            self.status = Label(text="Not recording", size_hint_y=None, height=dp(32))
            root.add_widget(self.status)
            root.add_widget(Label(text="Windows recorded per activity (2.56 s each)", size_hint_y=None, height=dp(28)))
            grid = GridLayout(cols=2, size_hint_y=None, row_default_height=dp(30), row_force_default=True)
            grid.bind(minimum_height=grid.setter("height"))
            self.count_labels: dict[str, Label] = {}
            for n in cfg.labels.names:
                grid.add_widget(Label(text=pretty(n)))
                self.count_labels[n] = Label(text="0")
                grid.add_widget(self.count_labels[n])
            root.add_widget(grid)
            self.add_widget(scrolled(root))

        def activity_name(self) -> str:
            return cfg.labels.names[[pretty(n) for n in cfg.labels.names].index(self.activity.text)]

        def toggle(self) -> None:
            ctl = self.app.controller
            if ctl.recorder.recording:
                ctl.stop_recording()
                self.button.text, self.button.background_color = "Start recording", (0.2, 0.7, 0.3, 1)
                self.status.text = "Not recording"
                self.activity.disabled = False
            else:
                ctl.start_recording(self.activity_name())
                self.button.text, self.button.background_color = "Stop recording", (0.8, 0.25, 0.2, 1)
                self.status.text = f"Recording: {self.activity.text}"
                self.activity.disabled = True

        def show_counts(self, counts: dict[str, int]) -> None:
            for n, c in counts.items():
                self.count_labels[n].text = str(c)
            rec = self.app.controller.recorder
            if rec.recording:
                self.status.text = f"Recording: {pretty(rec.activity)} ({rec.session_windows} windows this session)"

    class LiveScreen(Screen):
        def __init__(self, **kw: Any):
            super().__init__(name="live", **kw)
            root = BoxLayout(orientation="vertical", padding=dp(12), spacing=dp(8))
            root.add_widget(title("What the model sees"))
            self.activity = Label(text="-", font_size="40sp", bold=True, size_hint_y=None, height=dp(120))
            root.add_widget(self.activity)
            self.confidence = Label(text="", font_size="18sp", size_hint_y=None, height=dp(32))
            root.add_widget(self.confidence)
            self.bar = ProgressBar(max=100, value=0, size_hint_y=None, height=dp(24))
            root.add_widget(self.bar)
            self.windows = Label(text=live_words(0), size_hint_y=None, height=dp(48), halign="center", valign="middle")
            self.windows.bind(size=lambda w, size: setattr(w, "text_size", size))  # wrap on a narrow window
            root.add_widget(self.windows)
            self.note = Label(text=LiveView().note, size_hint_y=None, height=dp(48), color=(0.8, 0.8, 0.8, 1),
                              halign="center", valign="middle")
            self.note.bind(size=lambda w, size: setattr(w, "text_size", size))
            root.add_widget(self.note)
            self.add_widget(scrolled(root))

        def show(self, v: LiveView) -> None:
            self.activity.text = pretty(v.activity) if v.activity else "-"
            self.confidence.text = f"confidence {v.confidence * 100:.0f} %" if v.activity else ""
            self.bar.value = v.confidence * 100
            self.windows.text = live_words(v.windows)
            self.note.text = v.note

    class FederationScreen(Screen):
        """Settings of the federation (entered by hand), the connection state and every failure in words."""

        def __init__(self, app: Any, **kw: Any):
            super().__init__(name="federation", **kw)
            self.app = app
            root = BoxLayout(orientation="vertical", padding=dp(10), spacing=dp(3))
            root.add_widget(title("Federation"))
            self.why = wrapped("", 44)
            root.add_widget(self.why)
            enrol_row = BoxLayout(size_hint_y=None, height=dp(36), spacing=dp(4))
            self.bundle = TextInput(multiline=False, write_tab=False, font_size="13sp", hint_text="bundle file, or paste its text")
            # A pasted bundle holds the device's password: masked as soon as it is bundle text, never readable.
            self.bundle.bind(text=lambda w, text: setattr(w, "password", is_bundle_text(text)))
            enrol_row.add_widget(self.bundle)
            self.enrol_button = Button(text="Enrol", size_hint_x=None, width=dp(64))
            self.enrol_button.bind(on_release=lambda *_: self.enrol())
            enrol_row.add_widget(self.enrol_button)
            self.scan_button = Button(text="Scan QR", size_hint_x=None, width=dp(76))
            self.scan_button.bind(on_release=lambda *_: self.scan())
            enrol_row.add_widget(self.scan_button)
            root.add_widget(enrol_row)

            def field(label: str, **opts: Any) -> TextInput:
                box = TextInput(multiline=False, write_tab=False, font_size="15sp", **opts)
                root.add_widget(row(label, box, 36))
                return box

            self.client_id = field("Client id", text=cfg.client_id)
            self.broker = field("Broker", text=cfg.broker, hint_text="host:port")
            self.federation_name = field("Federation", text=cfg.federation)
            self.username = field("User name", text=cfg.username or "", hint_text="none: anonymous")
            self.password = field("Password", text="", password=True, hint_text="not set")
            self.tls_ca = field("CA certificate", text=str(cfg.tls_ca or ""), hint_text="path of ca.crt (empty: no TLS)")
            self.backend = Spinner(text=cfg.backend, values=APP_BACKENDS, size_hint_y=None, height=dp(36))
            root.add_widget(row("Training backend", self.backend, 36))
            self.apply_button = apply = Button(text="Apply", size_hint_y=None, height=dp(40))
            apply.bind(on_release=lambda *_: self.apply())
            root.add_widget(apply)
            self.state = Label(text="off")
            root.add_widget(row("Connection", self.state, 34))
            self.round = Label(text="-")
            root.add_widget(row("Current round", self.round, 34))
            self.accuracy = Label(text="-")
            root.add_widget(row("Last local accuracy", self.accuracy, 34))
            self.take_part = Switch(active=False)
            self.take_part.bind(active=lambda _w, on: app.controller.set_take_part(on))
            root.add_widget(row("Take part in training", self.take_part, 36))
            self.charge_only = Switch(active=True)
            self.charge_only.bind(active=lambda _w, on: app.controller.set_charge_only(on))
            root.add_widget(row("Train only while charging", self.charge_only, 36))
            self.charging = Label(text="")
            root.add_widget(row("Charging", self.charging, 30))
            self.error = Label(text="", color=(1, 0.45, 0.45, 1), size_hint_y=None, height=dp(84), halign="left", valign="top")
            self.error.bind(size=lambda w, size: setattr(w, "text_size", size))  # wrap the whole sentence
            root.add_widget(self.error)
            privacy = wrapped("[b]What left this phone[/b]: raw sensor data never does; only one model update a round", 44)
            privacy.markup = True
            root.add_widget(privacy)
            self.sent = wrapped("nothing yet: no round taken part in", 30)
            root.add_widget(self.sent)
            cost_title = wrapped("[b]What it costs this phone[/b]", 30)
            cost_title.markup = True
            root.add_widget(cost_title)
            self.cost = wrapped("", 30)
            root.add_widget(self.cost)
            self.add_widget(scrolled(root))
            self._input_error = ""

        def load(self, v: FederationView) -> None:
            """Fill the fields from the settings in force (the password is never shown: only whether one is stored)."""
            self.client_id.text = v.client_id
            self.broker.text = v.broker
            self.federation_name.text = v.federation
            self.username.text = v.username or ""
            self.tls_ca.text = v.tls_ca or ""
            self.backend.text = v.backend
            self.password.text = ""
            self.password.hint_text = "stored (hidden)" if v.password_set else "not set"

        def apply(self) -> None:
            """Hand the typed settings to the controller; a field it refuses is named on the screen."""
            fields: dict[str, Any] = {
                "client_id": self.client_id.text,
                "broker": self.broker.text,
                "federation": self.federation_name.text,
                "username": self.username.text,
                "tls_ca": self.tls_ca.text,
                "backend": self.backend.text,
            }
            if self.password.text:
                fields["password"] = self.password.text
            try:
                self.app.controller.set_federation(**fields)
            except ValueError as exc:
                self._input_error = str(exc)
                self.error.text = self._input_error
                return
            self._input_error = ""
            self.error.text = ""
            self.load(self.app.controller.federation)

        def enrol(self, text: str | None = None) -> None:
            """Take the bundle typed, pasted or scanned: every field filled from it, or its refusal shown."""
            source = (self.bundle.text if text is None else text).strip()
            if not source:
                self._input_error = "enrol: give the bundle's file (fedhar-coordinator enrol NAME wrote it), or paste its text"
                self.error.text = self._input_error
                return
            pasted = is_bundle_text(source)
            if pasted:  # parsed now, whatever the outcome: the text (password included) leaves the field
                self.bundle.text = ""
            try:
                b = self.app.controller.enrol(source, ca_file=self.tls_ca.text.strip() or None)
            except EnrolmentRefused as exc:
                self._input_error = str(exc)
                if pasted:
                    self.bundle.hint_text = "the pasted bundle was refused (see below); paste a new one"
            except OSError as exc:
                self._input_error = f"enrol: cannot read the bundle {source}: {exc.strerror or exc}"
            else:
                self._input_error = ""
                self.bundle.text = ""  # it holds the password
                self.bundle.hint_text = f"enrolled with {b.coordinator}: {b.client_id} in {b.federation}"
                self.load(self.app.controller.federation)
            self.error.text = self._input_error

        def scan(self) -> None:
            """Scan the bundle's QR code with the phone's scanner app; off Android, say why not and keep file and paste."""
            why = start_scan(on_ui(self._scanned))
            if why is not None:
                self._input_error = why
                self.error.text = why

        def _scanned(self, text: str | None) -> None:
            if text is None:
                self._input_error = "QR scan cancelled"
                self.error.text = self._input_error
                return
            self.enrol(text)

        def show(self, v: FederationView) -> None:
            state = v.state
            if v.retry_in_s is not None:
                state = f"{state}, retry in {v.retry_in_s:.0f} s"
            self.state.text = state
            self.round.text = "-" if v.round is None else str(v.round)
            self.accuracy.text = "-" if v.last_accuracy is None else f"{v.last_accuracy * 100:.1f} %"
            self.charging.text = "yes" if v.charging else "no"
            self.password.hint_text = "stored (hidden)" if v.password_set else "not set"
            self.error.text = self._input_error or v.error
            self.why.text = taking_part_words(v)
            lines = sent_words(v.sent, v.round)
            self.sent.text = "\n".join(lines) if lines else "nothing yet: no round taken part in"
            self.sent.height = dp(38) * max(1, len(lines))
            self.cost.text = "\n".join(v.cost)
            self.cost.height = dp(38) * max(1, len(v.cost))
            self.app.footer.text = f"{v.client_id} - sensor: {self.app.sensor_name}"

    class TimelineBar(Widget):
        """The day's stretches as coloured bars over the hours that hold data; a tap selects the stretch under it."""

        def __init__(self, on_select: Callable[[Any], None], **kw: Any):
            super().__init__(size_hint_y=None, height=dp(64), **kw)
            self.stretches: list[Any] = []
            self.span = (0, 1)
            self.selected: Any = None
            self.on_select = on_select
            self.bind(pos=lambda *_: self.draw(), size=lambda *_: self.draw())

        def set(self, stretches: list[Any], span: tuple[int, int]) -> None:
            self.stretches, self.span = stretches, span
            if self.selected not in stretches:
                self.selected = None
            self.draw()

        def _x(self, t: int) -> float:
            a, b = self.span
            return float(self.x + self.width * (t - a) / max(1, b - a))

        def draw(self) -> None:
            self.canvas.clear()
            with self.canvas:
                Color(0.18, 0.18, 0.2, 1)
                Rectangle(pos=self.pos, size=self.size)
                for st in self.stretches:
                    Color(*activity_colour(st.label))
                    x0 = self._x(st.start_ns)
                    Rectangle(pos=(x0, self.y + dp(6)), size=(max(dp(2), self._x(st.end_ns) - x0), self.height - dp(12)))
                if self.selected is not None:
                    Color(1, 1, 1, 1)
                    x0 = self._x(self.selected.start_ns)
                    Line(rectangle=(x0, self.y + dp(2), max(dp(2), self._x(self.selected.end_ns) - x0), self.height - dp(4)), width=dp(1.5))

        def on_touch_down(self, touch: Any) -> bool:
            if not self.collide_point(*touch.pos):
                return False
            a, b = self.span
            t = a + (touch.x - self.x) / max(1.0, self.width) * (b - a)
            hit = [st for st in self.stretches if st.start_ns <= t < st.end_ns]
            self.select(hit[0] if hit else None)
            return True

        def select(self, stretch: Any) -> None:
            self.selected = stretch
            self.draw()
            self.on_select(stretch)

    class TodayScreen(Screen):
        """The day as the local model recognised it, minutes against the weekly goal, corrections and export."""

        def __init__(self, app: Any, **kw: Any):
            super().__init__(name="today", **kw)
            self.app = app
            self.day = dt.date.today()
            self._minutes: dict[dt.date, Any] = {}  # past days' minutes per activity; they change only by a relabel
            root = BoxLayout(orientation="vertical", padding=dp(10), spacing=dp(6))
            nav = BoxLayout(size_hint_y=None, height=dp(44), spacing=dp(6))
            self.prev = Button(text="<", size_hint_x=None, width=dp(48))
            self.prev.bind(on_release=lambda *_: self.go(-1))
            self.next = Button(text=">", size_hint_x=None, width=dp(48))
            self.next.bind(on_release=lambda *_: self.go(1))
            self.date = Label(text="", markup=True, font_size="20sp")
            nav.add_widget(self.prev)
            nav.add_widget(self.date)
            nav.add_widget(self.next)
            root.add_widget(nav)
            self.bar = TimelineBar(self.selected)
            root.add_widget(self.bar)
            ticks = BoxLayout(size_hint_y=None, height=dp(20))
            self.tick_start = Label(text="", font_size="12sp", halign="left")
            self.tick_start.bind(size=lambda w, size: setattr(w, "text_size", size))
            self.tick_end = Label(text="", font_size="12sp", halign="right")
            self.tick_end.bind(size=lambda w, size: setattr(w, "text_size", size))
            ticks.add_widget(self.tick_start)
            ticks.add_widget(self.tick_end)
            root.add_widget(ticks)
            self.selection = wrapped("Tap a stretch to correct it", 40)
            root.add_widget(self.selection)
            fix = BoxLayout(size_hint_y=None, height=dp(44), spacing=dp(6))
            names = [pretty(n) for n in cfg.labels.names]
            self.relabel_to = Spinner(text=names[0], values=names)
            self.relabel_button = Button(text="Relabel", size_hint_x=None, width=dp(96), disabled=True)
            self.relabel_button.bind(on_release=lambda *_: self.relabel())
            fix.add_widget(self.relabel_to)
            fix.add_widget(self.relabel_button)
            root.add_widget(fix)
            self.taught = wrapped("", 40)
            root.add_widget(self.taught)
            grid = GridLayout(cols=3, size_hint_y=None, row_default_height=dp(26), row_force_default=True)
            grid.bind(minimum_height=grid.setter("height"))
            for head in ("Activity", "Today, min", "This week, min"):
                grid.add_widget(Label(text=f"[b]{head}[/b]", markup=True, font_size="14sp"))
            self.minute_labels: dict[int, tuple[Label, Label]] = {}
            for k, n in enumerate(cfg.labels.names):
                grid.add_widget(Label(text=pretty(n), color=activity_colour(k), font_size="14sp"))
                today, week = Label(text="0", font_size="14sp"), Label(text="0", font_size="14sp")
                grid.add_widget(today)
                grid.add_widget(week)
                self.minute_labels[k] = (today, week)
            root.add_widget(grid)
            self.goal = TextInput(text="", multiline=False, input_filter="int", font_size="15sp")
            self.goal.bind(on_text_validate=lambda *_: self.set_goal(), focus=lambda _w, on: None if on else self.set_goal())
            root.add_widget(row("Weekly goal, active minutes", self.goal, 36))
            self.goal_bar = ProgressBar(max=100, value=0, size_hint_y=None, height=dp(18))
            root.add_widget(self.goal_bar)
            self.goal_words = wrapped("", 28)
            root.add_widget(self.goal_words)
            self.export_button = Button(text="Export this day as CSV", size_hint_y=None, height=dp(40))
            self.export_button.bind(on_release=lambda *_: self.export())
            root.add_widget(self.export_button)
            self.exported = wrapped("", 64)
            root.add_widget(self.exported)
            self.guidance = wrapped("", 110)
            root.add_widget(self.guidance)
            self.add_widget(scrolled(root))

        def span(self) -> tuple[int, int]:
            """The day, local midnight to midnight, in wall-clock ns."""
            start = dt.datetime.combine(self.day, dt.time()).astimezone()
            end = dt.datetime.combine(self.day + dt.timedelta(days=1), dt.time()).astimezone()
            return int(start.timestamp() * 1e9), int(end.timestamp() * 1e9)

        def day_minutes(self, day: dt.date) -> Any:
            """Minutes per activity (C,) of a past day, computed once (a relabel clears them)."""
            if day not in self._minutes:
                start = int(dt.datetime.combine(day, dt.time()).astimezone().timestamp() * 1e9)
                end = int(dt.datetime.combine(day + dt.timedelta(days=1), dt.time()).astimezone().timestamp() * 1e9)
                self._minutes[day] = minutes_per_activity(self.app.controller.timeline.stretches(start, end), len(cfg.labels), start, end)
            return self._minutes[day]

        def go(self, days: int) -> None:
            """Show another day (never after today)."""
            self.day = min(dt.date.today(), self.day + dt.timedelta(days=days))
            self.bar.select(None)
            self.refresh()

        def refresh(self, *_: Any) -> None:
            tl = self.app.controller.timeline
            a, b = self.span()
            stretches = tl.stretches(a, b)
            self.stretches = stretches
            if stretches:  # the part of the day that holds data: whole hours, or 5 minutes when under an hour
                first, last = stretches[0].start_ns - a, stretches[-1].end_ns - a
                unit = 3600 * 10**9 if last - first > 3600 * 10**9 else 300 * 10**9
                lo, hi = a + first // unit * unit, a + -(-last // unit) * unit
            else:
                lo, hi = a, b
            self.bar.set(stretches, (lo, hi))
            self.tick_start.text = clock_words(lo)
            self.tick_end.text = clock_words(hi)
            today = self.day == dt.date.today()
            self.date.text = f"[b]{'Today' if today else self.day.strftime('%a %d %b %Y')}[/b]"
            self.next.disabled = today
            n = len(cfg.labels)
            day_min = minutes_per_activity(stretches, n, a, b)
            week_min = day_min + sum((self.day_minutes(self.day - dt.timedelta(days=d)) for d in range(1, 7)), np.zeros(n))
            for k, (lt, lw) in self.minute_labels.items():
                lt.text, lw.text = minutes_words(day_min[k]), minutes_words(week_min[k])
            goal = int(tl.get("weekly_goal_min", str(DEFAULT_WEEKLY_GOAL_MIN)))
            if not self.goal.focus:
                self.goal.text = str(goal)
            active = float(week_min[active_classes(cfg.labels.names)].sum())
            self.goal_bar.value = min(100.0, 100.0 * active / max(1, goal))
            self.goal_words.text = f"{active:.0f} of {goal} active minutes (walking, stairs) in the 7 days to this one"
            if not stretches:
                self.selection.text = "Nothing recognised on this day yet: the model classifies while the phone senses"
            elif self.bar.selected is None:
                self.selection.text = "Tap a stretch to correct it"
            needs = self.app.controller.guidance()
            self.guidance.text = (
                "The model needs more examples of:\n" + "\n".join(needs) if needs else "Every activity has enough examples to train on"
            )
            self.guidance.height = dp(21) * (len(needs) + 1) + dp(8)

        def selected(self, stretch: Any) -> None:
            self.relabel_button.disabled = stretch is None
            if stretch is None:
                self.selection.text = "Tap a stretch to correct it"
                return
            what = pretty(cfg.labels.names[stretch.label])
            fixed = " (corrected)" if stretch.corrected else ""
            self.selection.text = (
                f"{clock_words(stretch.start_ns)}-{clock_words(stretch.end_ns)}: {what}{fixed}, {stretch.minutes:.1f} min. "
                "Wrong? Choose what it was:"
            )

        def relabel(self) -> None:
            st = self.bar.selected
            if st is None:
                return
            name = cfg.labels.names[[pretty(n) for n in cfg.labels.names].index(self.relabel_to.text)]
            made = self.app.controller.relabel(st.start_ns, st.end_ns, name)
            self._minutes.clear()
            total = sum(self.app.controller.counts().values())
            if made is None:  # the sensing service has not answered yet (Android's two processes)
                self.taught.text = "relabelled; the sensing service is making its training windows"
            elif made:
                self.taught.text = f"{made} training windows from this stretch ({total} in all); the next round trains on them"
            else:
                self.taught.text = "relabelled; its raw samples are no longer kept, so it gives no training windows"
            self.bar.select(None)
            self.refresh()

        def set_goal(self) -> None:
            text = self.goal.text.strip()
            if text.isdigit() and int(text) > 0:
                self.app.controller.timeline.set("weekly_goal_min", text)
                self.refresh()

        def export(self) -> None:
            a, b = self.span()
            path = cfg.state_dir / "exports" / f"fedhar-{self.day.isoformat()}.csv"
            offset = int(dt.datetime.fromtimestamp(a / 1e9).astimezone().utcoffset().total_seconds())  # type: ignore[union-attr]
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(day_csv(self.app.controller.timeline.stretches(a, b), cfg.labels.names, offset))
            except OSError as exc:
                self.exported.text = f"cannot write {path}: {exc.strerror or exc}"
                return
            self.exported.text = f"saved {path.name}\nin {path.parent}"

    class FedHarApp(App):
        title = "fedhar"

        def build(self) -> Any:
            self.controller: DeviceController | None = None
            self.sm = ScreenManager(transition=NoTransition())
            self.record = RecordScreen(self)
            self.live = LiveScreen()
            self.federation = FederationScreen(self)
            self.today = TodayScreen(self)
            for s in (self.today, self.record, self.live, self.federation):
                self.sm.add_widget(s)
            nav = BoxLayout(size_hint_y=None, height=dp(52))
            self.tabs: dict[str, ToggleButton] = {}
            for name, text in (("today", "Today"), ("record", "Record"), ("live", "Live"), ("federation", "Federation")):
                b = ToggleButton(text=text, group="screens", state="down" if name == "today" else "normal", allow_no_selection=False)
                b.bind(on_release=lambda _b, n=name: self.show(n))
                nav.add_widget(b)
                self.tabs[name] = b
            root = BoxLayout(orientation="vertical")
            root.add_widget(nav)
            root.add_widget(self.sm)
            self.sensor_name = sensor = source.name if source is not None else "android (service)"
            self.footer = Label(text=f"{cfg.client_id} - sensor: {sensor}", size_hint_y=None, height=dp(26), font_size="12sp")
            root.add_widget(self.footer)
            self.controller = controller_factory(
                cfg,
                source,
                on_live=on_ui(self.live.show),
                on_counts=on_ui(self.record.show_counts),
                on_federation=on_ui(self.federation.show),
                **controller_kwargs,
            )
            self.record.show_counts(self.controller.counts())
            self.federation.load(self.controller.federation)
            self.controller.start_sensing()
            self.today.refresh()
            Clock.schedule_interval(lambda _dt: self.today.refresh() if self.sm.current == "today" else None, 2.0)
            return root

        def show(self, name: str) -> None:
            """Switch to screen ``name`` ("today", "record", "live", "federation")."""
            self.sm.current = name
            if name == "today":
                self.today.refresh()
            for n, b in self.tabs.items():
                b.state = "down" if n == name else "normal"

        def on_stop(self) -> None:
            if self.controller is not None:
                self.controller.close()

    return FedHarApp()


KIVY_ENVIRONMENT = {"KIVY_NO_ARGS": "1", "KIVY_LOG_MODE": "PYTHON"}
"""Kivy's environment for the app (``kivy.logger``, "Kivy's logging modes"): our options are not Kivy's, and
Kivy logs through Python's root logger alone, so every line is printed once and in one format."""

KIVY_CLIPBOARD = "sdl2,dummy"
"""Clipboard providers off Android (``KIVY_CLIPBOARD``): the SDL2 window's own, else none, instead of probing
xclip, xsel, dbus and gtk3 at start."""


class _CutBufferNote(logging.Filter):
    """Kivy's CRITICAL "Unable to find any valuable Cutbuffer provider" and its tracebacks, made one INFO line.

    The cut buffer is X11's middle-click paste, optional for the app; Kivy probes it on Linux whatever the
    clipboard setting (``kivy.core.clipboard``) and has no option to turn the probe off.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("Cutbuffer: Unable to find"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "Cutbuffer: no middle-click paste (install xclip or xsel to have it)", ()
        return True


def prepare_kivy(environ: dict[str, str] | os._Environ[str] | None = None, on_android: bool = False) -> None:
    """Set Kivy's environment (:data:`KIVY_ENVIRONMENT`, :data:`KIVY_CLIPBOARD`) before Kivy is imported.

    Values already set win (a user's ``KIVY_LOG_MODE=MIXED`` stays). The cut-buffer probe's alarm is
    turned into a note (:class:`_CutBufferNote`).
    """
    env = os.environ if environ is None else environ
    for key, value in KIVY_ENVIRONMENT.items():
        env.setdefault(key, value)
    if not on_android:
        env.setdefault("KIVY_CLIPBOARD", KIVY_CLIPBOARD)
    logging.getLogger("kivy").addFilter(_CutBufferNote())


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-app``; returns the exit status (:mod:`har_io.exit_codes`): 0 ok, 2 bad options,
    7 Kivy is not installed (the message names the extra to install)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prepare_kivy(on_android=args.sensor == "android")
    try:
        import kivy  # noqa: F401  (Kivy's logger starts here, in the environment just set)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "kivy":
            raise
        print(
            f"fedhar-app: Kivy is not installed in {sys.prefix}; the app needs its extra: {install_hint('app')}",
            file=sys.stderr,
        )
        return Exit.MISSING_MODULE
    try:
        cfg = config_from_args(args, default_data_dir())
        if args.sensor == "android":  # sensing lives in the foreground service, which outlives the UI
            from edge_client.app.service import RemoteController

            create_app(cfg, None, RemoteController, start_service=start_android_service).run()
            return Exit.OK
        source = make_source(args.sensor, cfg.labels, args.replay_speed)
    except (ValueError, OSError) as exc:
        print(f"fedhar-app: {exc}", file=sys.stderr)
        return Exit.USAGE
    create_app(cfg, source).run()
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
