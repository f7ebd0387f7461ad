"""The Record screen: choose an activity, start and stop; windows recorded per activity."""

from __future__ import annotations

from typing import Any

from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.button import Button
from kivy.uix.gridlayout import GridLayout
from kivy.uix.label import Label
from kivy.uix.screenmanager import Screen
from kivy.uix.spinner import Spinner

from edge_client.app.controller import AppConfig
from edge_client.app.screens.layout import row, scrolled, title
from edge_client.app.words import pretty


class RecordScreen(Screen):
    """Choose an activity, start and stop recording it; the windows recorded per activity.

    Parameters
    ----------
    app : FedHarApp
        The app (its ``controller`` records).
    cfg : AppConfig
        The app's settings (the activities offered: ``cfg.labels``).
    """

    def __init__(self, app: Any, cfg: AppConfig, **kw: Any):
        super().__init__(name="record", **kw)
        self.app = app
        self.cfg = cfg
        names = [pretty(n) for n in self.cfg.labels.names]
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
        for n in self.cfg.labels.names:
            grid.add_widget(Label(text=pretty(n)))
            self.count_labels[n] = Label(text="0")
            grid.add_widget(self.count_labels[n])
        root.add_widget(grid)
        self.add_widget(scrolled(root))

    def activity_name(self) -> str:
        """The activity chosen, as its label-set name (``"walking_upstairs"``)."""
        return self.cfg.labels.names[[pretty(n) for n in self.cfg.labels.names].index(self.activity.text)]

    def toggle(self) -> None:
        """Start recording the chosen activity, or stop the recording running."""
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
        """Show the windows recorded per activity (``counts``: activity name -> windows)."""
        for n, c in counts.items():
            self.count_labels[n].text = str(c)
        rec = self.app.controller.recorder
        if rec.recording:
            self.status.text = f"Recording: {pretty(rec.activity)} ({rec.session_windows} windows this session)"
