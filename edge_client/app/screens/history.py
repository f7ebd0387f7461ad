"""The History screen: weeks and months with trends, the person's corrections and recordings (undo, delete), how well the
model knows each activity over the rounds, and what the app keeps (storage, keep periods, the window)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kivy.core.window import Window
from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.button import Button
from kivy.uix.label import Label
from kivy.uix.screenmanager import Screen
from kivy.uix.spinner import Spinner
from kivy.uix.textinput import TextInput
from kivy.uix.togglebutton import ToggleButton

from edge_client.app.config import MIN_TRAIN_WINDOWS, AppConfig
from edge_client.app.screens.chart import CurveChart
from edge_client.app.screens.layout import ERROR_COLOUR, note, row, scrolled, show_note, title, wrapped
from edge_client.app.window_size import CHOICES, choice_of, save_window
from edge_client.app.words import clock_words, pretty
from edge_client.history import compare_periods, edit_words, f1_curve, period_of, quality_lines, trend_lines
from edge_client.timeline import active_classes

RECORDINGS_LISTED = 8
"""Recordings listed with a Delete button (the newest)."""


def header(text: str) -> Label:
    """A section's heading: bold, one 34 dp row."""
    label = wrapped(f"[b]{text}[/b]", 34)
    label.markup = True
    return label


class HistoryScreen(Screen):
    """Weeks and months, corrections and recordings to undo or delete, quality over rounds, storage and settings.

    Parameters
    ----------
    app : FedHarApp
        The app (its ``controller`` edits the history; its ``today`` screen caches each day's minutes).
    cfg : AppConfig
        The app's settings (activities, the folder, the window).
    """

    def __init__(self, app: Any, cfg: AppConfig, **kw: Any):
        super().__init__(name="history", **kw)
        self.app, self.cfg = app, cfg
        self.kind, self.anchor = "week", dt.date.today()
        root = BoxLayout(orientation="vertical", padding=dp(10), spacing=dp(4))
        root.add_widget(title("History"))
        nav = BoxLayout(size_hint_y=None, height=dp(44), spacing=dp(4))
        self.week = ToggleButton(text="Week", group="period", state="down", allow_no_selection=False, size_hint_x=None, width=dp(70))
        self.month = ToggleButton(text="Month", group="period", allow_no_selection=False, size_hint_x=None, width=dp(70))
        self.week.bind(on_release=lambda *_: self.show_kind("week"))
        self.month.bind(on_release=lambda *_: self.show_kind("month"))
        self.prev = Button(text="<", size_hint_x=None, width=dp(40))
        self.prev.bind(on_release=lambda *_: self.go(-1))
        self.next = Button(text=">", size_hint_x=None, width=dp(40))
        self.next.bind(on_release=lambda *_: self.go(1))
        self.period = Label(text="", font_size="15sp")
        for w in (self.week, self.month, self.prev, self.period, self.next):
            nav.add_widget(w)
        root.add_widget(nav)
        self.trend = note()
        root.add_widget(self.trend)

        root.add_widget(header("Your corrections"))
        self.corrections = note()
        root.add_widget(self.corrections)
        self.undo_button = Button(text="Undo the last correction", size_hint_y=None, height=dp(40))
        self.undo_button.bind(on_release=lambda *_: self.undo())
        root.add_widget(self.undo_button)
        self.undo_error = note(ERROR_COLOUR)  # nothing to undo, right under the button
        root.add_widget(self.undo_error)
        self.undone = note()
        root.add_widget(self.undone)

        root.add_widget(header("Your recordings"))
        self.recordings = BoxLayout(orientation="vertical", size_hint_y=None, spacing=dp(2))
        self.recordings.bind(minimum_height=self.recordings.setter("height"))
        root.add_widget(self.recordings)
        self.recording_rows: list[tuple[dict[str, int], Button, Label]] = []
        self.deleted = note()
        root.add_widget(self.deleted)

        root.add_widget(header("How well the model knows you"))
        self.quality = note()
        root.add_widget(self.quality)
        self.chart = CurveChart()
        root.add_widget(self.chart)
        self.legend = note()
        root.add_widget(self.legend)

        root.add_widget(header("Storage and settings"))
        self.storage = note()
        root.add_widget(self.storage)
        root.add_widget(wrapped("Raw samples let a correction teach the model (about 100 MB a day of sensing); "
                                "recognised activity makes the timeline and these totals.", 44))  # fmt: skip
        self.keep_raw = TextInput(multiline=False, input_filter="float", font_size="15sp")
        root.add_widget(row("Keep raw samples (days)", self.keep_raw, 40))
        self.keep_days = TextInput(multiline=False, input_filter="float", font_size="15sp")
        root.add_widget(row("Keep recognised activity (days)", self.keep_days, 40))
        self.keep_button = Button(text="Keep for these periods", size_hint_y=None, height=dp(40))
        self.keep_button.bind(on_release=lambda *_: self.set_keep())
        root.add_widget(self.keep_button)
        self.keep_error = note(ERROR_COLOUR)  # a period out of range, right under the button
        root.add_widget(self.keep_error)
        self.window_choice = Spinner(text=choice_of(cfg.window_size, cfg.fullscreen), values=CHOICES, size_hint_y=None, height=dp(36))
        self.window_choice.bind(text=lambda _w, text: self.choose_window(text))
        root.add_widget(row("Window", self.window_choice, 36))
        self.window_note = note()
        root.add_widget(self.window_note)
        self.view = scrolled(root)
        self.add_widget(self.view)

    # -- periods -----------------------------------------------------------------------------
    def show_kind(self, kind: str) -> None:
        """Show weeks or months."""
        self.kind = kind
        self.refresh()

    def go(self, n: int) -> None:
        """Show the period ``n`` periods later (never after the one holding today)."""
        p = period_of(self.kind, self.anchor).step(n)
        self.anchor = min(dt.date.today(), p.first)
        self.refresh()

    def _periods(self) -> None:
        today = dt.date.today()
        p = period_of(self.kind, self.anchor)
        self.period.text = p.label
        self.next.disabled = p.last >= today
        now, before, partial = compare_periods(p, today, self.app.today.day_minutes)
        names = self.cfg.labels.names
        self.trend.text = "\n".join(trend_lines(names, now, before, active_classes(names), p, partial))

    # -- refresh -----------------------------------------------------------------------------
    def refresh(self, *_: Any) -> None:
        """Show the history as the controller holds it now."""
        self._periods()
        names = self.cfg.labels.names
        fixes = self.app.controller.timeline.correction_list(5)
        self.corrections.text = "\n".join(
            f"{dt.datetime.fromtimestamp(c.start_ns / 1e9):%a %d %b} {clock_words(c.start_ns)}-{clock_words(c.end_ns)}: "
            f"{pretty(names[c.label])}, {c.windows} windows" for c in fixes) or "none kept"  # fmt: skip
        view = self.app.controller.history()
        self._recordings(view.recordings)
        lines = quality_lines(view.quality, names)
        self.quality.text = "\n".join(lines) if lines else "no round taken part in yet: the quality shows after the first"
        curve = f1_curve(view.quality)
        self.chart.set(curve)
        self.legend.text = (f"macro-F1 on this phone's own test windows, rounds {curve[0][0]} to {curve[-1][0]} (lines at 25 % steps): "
                            "blue the shared model as this phone starts from it, green after training here") if curve else ""  # fmt: skip
        self.storage.text = "\n".join(view.storage)
        if not self.keep_raw.focus:
            self.keep_raw.text = f"{view.keep_raw_days:g}"
        if not self.keep_days.focus:
            self.keep_days.text = f"{view.keep_days:g}"

    def _recordings(self, rows: list[dict[str, int]]) -> None:
        self.recordings.clear_widgets()
        self.recording_rows = []
        names = self.cfg.labels.names
        for r in rows[:RECORDINGS_LISTED]:
            when = (f"{dt.datetime.fromtimestamp(r['wall_first_ns'] / 1e9):%a %d %b} {clock_words(r['wall_first_ns'])}"
                    if r["wall_first_ns"] else "recorded earlier")  # fmt: skip
            line = BoxLayout(size_hint_y=None, height=dp(40), spacing=dp(6))
            line.add_widget(wrapped(f"{pretty(names[r['label']])}: {r['windows']} windows, {when}", 40))
            button = Button(text="Delete", size_hint_x=None, width=dp(76))
            error = note(ERROR_COLOUR)  # why this recording could not be deleted, right under its row
            button.bind(on_release=lambda _b, r=r, b=button, e=error: self.delete_recording(r, b, e))
            line.add_widget(button)
            self.recordings.add_widget(line)
            self.recordings.add_widget(error)
            self.recording_rows.append((r, button, error))
        if not rows:
            self.recordings.add_widget(wrapped("none kept: record on the Record screen", 30))

    # -- edits -------------------------------------------------------------------------------
    def _edited(self) -> None:
        self.app.today.forget_minutes()
        self.refresh()

    def undo(self) -> None:
        """Undo the newest correction; "nothing to undo" right under the button when there is none."""
        try:
            edit = self.app.controller.undo_relabel()
        except LookupError as exc:
            show_note(self.undo_error, str(exc.args[0] if exc.args else exc))
            return
        show_note(self.undo_error, "")
        self.undone.text = "handed to the sensing service" if edit is None else edit_words(edit, MIN_TRAIN_WINDOWS)
        self._edited()

    def delete_recording(self, r: dict[str, int], button: Button, error: Label) -> None:
        """Delete a recording and its windows (a second tap confirms); a failure right under its row."""
        if button.text == "Delete":
            button.text = "Sure?"
            return
        try:
            edit = self.app.controller.delete_recording(r["t_first_ns"], r["t_last_ns"], r["label"])
        except (LookupError, OSError) as exc:
            button.text = "Delete"
            show_note(error, str(exc.args[0] if exc.args else exc))
            return
        self.deleted.text = "handed to the sensing service" if edit is None else edit_words(edit, MIN_TRAIN_WINDOWS)
        self._edited()

    def set_keep(self) -> None:
        """Keep raw samples and recognised activity for the periods typed; a period out of range right under the button."""
        try:
            self.app.controller.set_keep(float(self.keep_days.text or "nan"), float(self.keep_raw.text or "nan"))
        except ValueError as exc:
            show_note(self.keep_error, str(exc))
            return
        show_note(self.keep_error, "")
        self.refresh()

    def choose_window(self, choice: str) -> None:
        """Resize the window now and keep the choice for the next start (a command-line ``--size`` still wins then)."""
        size, full = save_window(self.cfg.state_dir, choice)
        Window.fullscreen = "auto" if full else False
        if size is not None:
            Window.size = size
        self.window_note.text = f"window: {choice}; kept for the next start"
