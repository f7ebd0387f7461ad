"""The app's window: tabs over its screens (:mod:`edge_client.app.screens`), a footer, and the controller wired to them.

The screens only show what the controller reports from its background threads; every report
is moved onto the UI thread (:func:`~edge_client.app.screens.layout.on_ui`) before a widget is
touched. Imports Kivy: import after the app's options are parsed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kivy.app import App
from kivy.clock import Clock
from kivy.core.window import Window
from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.label import Label
from kivy.uix.screenmanager import NoTransition, ScreenManager
from kivy.uix.togglebutton import ToggleButton

from edge_client.app.controller import AppConfig, DeviceController
from edge_client.app.screens import FederationScreen, HistoryScreen, LiveScreen, RecordScreen, TodayScreen
from edge_client.app.screens.layout import on_ui
from edge_client.app.window_size import display_size, fit
from edge_client.sensors.base import SensorSource


class FedHarApp(App):
    """The app: tabs over the Today, Record, Live, Federation and History screens, a footer naming the device and its sensor.

    Parameters
    ----------
    cfg : AppConfig
        The app's settings.
    source : SensorSource or None
        Where samples come from; None on Android, where the foreground service senses.
    controller_factory : callable
        :class:`~edge_client.app.controller.DeviceController` (sensing in this process) or
        :class:`~edge_client.app.service.RemoteController` (Android: the service senses, the UI
        shows its reports); called in :meth:`build` with ``cfg``, ``source``, the screens' report
        callbacks and ``controller_kwargs``.
    controller_kwargs : dict, optional
        More keyword arguments of ``controller_factory``.
    """

    title = "fedhar"

    def __init__(self, cfg: AppConfig, source: SensorSource | None, controller_factory: Callable[..., Any] = DeviceController,
                 controller_kwargs: dict[str, Any] | None = None, **kw: Any):  # fmt: skip
        super().__init__(**kw)
        self.cfg = cfg
        self.source = source
        self.controller_factory = controller_factory
        self.controller_kwargs = dict(controller_kwargs or {})
        self.controller: Any = None

    def build(self) -> Any:
        """Lay out the window, create the controller with the screens' report callbacks, and start sensing.

        The window opened at the size the options or settings chose (:mod:`edge_client.app.window_size`);
        with none chosen, one that does not fit the display is made the display's size here.
        """
        cfg, source = self.cfg, self.source
        if cfg.window_size is None and not cfg.fullscreen:
            fitted = fit((int(Window.width), int(Window.height)), display_size())
            if fitted != (Window.width, Window.height):
                Window.size = fitted
        self.sm = ScreenManager(transition=NoTransition())
        self.record = RecordScreen(self, cfg)
        self.live = LiveScreen()
        self.federation = FederationScreen(self, cfg)
        self.today = TodayScreen(self, cfg)
        self.history = HistoryScreen(self, cfg)
        for s in (self.today, self.record, self.live, self.federation, self.history):
            self.sm.add_widget(s)
        nav = BoxLayout(size_hint_y=None, height=dp(52))
        self.tabs: dict[str, ToggleButton] = {}
        tabs = (("today", "Today"), ("record", "Record"), ("live", "Live"), ("federation", "Federation"), ("history", "History"))
        for name, text in tabs:
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
        self.controller = self.controller_factory(
            cfg,
            source,
            on_live=on_ui(self.live.show),
            on_counts=on_ui(self.record.show_counts),
            on_federation=on_ui(self.federation.show),
            **self.controller_kwargs,
        )
        self.record.show_counts(self.controller.counts())
        self.federation.load(self.controller.federation)
        self.controller.start_sensing()
        self.today.refresh()
        Clock.schedule_interval(lambda _dt: self.today.refresh() if self.sm.current == "today" else None, 2.0)
        return root

    def show(self, name: str) -> None:
        """Switch to screen ``name`` ("today", "record", "live", "federation", "history")."""
        self.sm.current = name
        if name == "today":
            self.today.refresh()
        if name == "history":
            self.history.refresh()
        for n, b in self.tabs.items():
            b.state = "down" if n == name else "normal"

    def on_stop(self) -> None:
        """Stop the controller's threads and close its stores when the window closes."""
        if self.controller is not None:
            self.controller.close()
