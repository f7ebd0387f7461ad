"""The Today screen: the day's timeline of recognised activity, minutes against a weekly goal, relabelling, CSV export."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import numpy as np
from kivy.graphics import Color, Line, Rectangle
from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.button import Button
from kivy.uix.gridlayout import GridLayout
from kivy.uix.label import Label
from kivy.uix.progressbar import ProgressBar
from kivy.uix.screenmanager import Screen
from kivy.uix.spinner import Spinner
from kivy.uix.textinput import TextInput
from kivy.uix.widget import Widget

from edge_client.app.config import MIN_TRAIN_WINDOWS
from edge_client.app.controller import AppConfig
from edge_client.app.screens.layout import ERROR_COLOUR, note, row, scrolled, show_note, wrapped
from edge_client.app.words import activity_colour, clock_words, minutes_words, pretty
from edge_client.history import edit_words
from edge_client.timeline import DEFAULT_WEEKLY_GOAL_MIN, active_classes, day_csv, minutes_per_activity


class TimelineBar(Widget):
    """The day's stretches as coloured bars over the hours that hold data; a tap selects the stretch under it."""

    def __init__(self, on_select: Callable[[Any], None], **kw: Any):
        """``on_select`` is called with the stretch tapped (None: a tap beside every stretch)."""
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
    """The day as the local model recognised it, minutes against the weekly goal, corrections and export.

    Parameters
    ----------
    app : FedHarApp
        The app (its ``controller`` holds the timeline and makes training windows of a relabel).
    cfg : AppConfig
        The app's settings (activities, and the folder exports go to).
    """

    def __init__(self, app: Any, cfg: AppConfig, **kw: Any):
        super().__init__(name="today", **kw)
        self.app = app
        self.cfg = cfg
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
        names = [pretty(n) for n in self.cfg.labels.names]
        self.relabel_to = Spinner(text=names[0], values=names)
        self.relabel_button = Button(text="Relabel", size_hint_x=None, width=dp(84), disabled=True)
        self.relabel_button.bind(on_release=lambda *_: self.relabel())
        self.delete_button = Button(text="Delete", size_hint_x=None, width=dp(76), disabled=True)
        self.delete_button.bind(on_release=lambda *_: self.delete())
        fix.add_widget(self.relabel_to)
        fix.add_widget(self.relabel_button)
        fix.add_widget(self.delete_button)
        root.add_widget(fix)
        self.fix_row = fix
        self.fix_error = note(ERROR_COLOUR)  # a relabel or delete that failed, right under its buttons
        root.add_widget(self.fix_error)
        self.taught = note()  # what the last relabel, undo or delete did to the next round's windows
        root.add_widget(self.taught)
        grid = GridLayout(cols=3, size_hint_y=None, row_default_height=dp(26), row_force_default=True)
        grid.bind(minimum_height=grid.setter("height"))
        for head in ("Activity", "Today, min", "This week, min"):
            grid.add_widget(Label(text=f"[b]{head}[/b]", markup=True, font_size="14sp"))
        self.minute_labels: dict[int, tuple[Label, Label]] = {}
        for k, n in enumerate(self.cfg.labels.names):
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
        self.export_error = note(ERROR_COLOUR)  # a file that cannot be written, right under the button
        root.add_widget(self.export_error)
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
            self._minutes[day] = minutes_per_activity(self.app.controller.timeline.stretches(start, end), len(self.cfg.labels), start, end)
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
        n = len(self.cfg.labels)
        day_min = minutes_per_activity(stretches, n, a, b)
        week_min = day_min + sum((self.day_minutes(self.day - dt.timedelta(days=d)) for d in range(1, 7)), np.zeros(n))
        for k, (lt, lw) in self.minute_labels.items():
            lt.text, lw.text = minutes_words(day_min[k]), minutes_words(week_min[k])
        goal = int(tl.get("weekly_goal_min", str(DEFAULT_WEEKLY_GOAL_MIN)))
        if not self.goal.focus:
            self.goal.text = str(goal)
        active = float(week_min[active_classes(self.cfg.labels.names)].sum())
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
        self.relabel_button.disabled = self.delete_button.disabled = stretch is None
        self.delete_button.text = "Delete"  # a second tap confirms; another selection starts over
        if stretch is None:
            self.selection.text = "Tap a stretch to correct it"
            return
        what = pretty(self.cfg.labels.names[stretch.label])
        fixed = " (corrected)" if stretch.corrected else ""
        self.selection.text = (
            f"{clock_words(stretch.start_ns)}-{clock_words(stretch.end_ns)}: {what}{fixed}, {stretch.minutes:.1f} min. "
            "Wrong? Choose what it was, or delete it:"
        )

    def forget_minutes(self) -> None:
        """Forget the past days' minutes (a relabel or a deletion changed them)."""
        self._minutes.clear()

    def _edited(self, edit: Any, handed_on: str) -> None:
        """Say what a relabel or a deletion did (None: the sensing service has not answered yet) and show the day again."""
        self.taught.text = handed_on if edit is None else edit_words(edit, MIN_TRAIN_WINDOWS)
        show_note(self.fix_error, "")
        self.forget_minutes()
        self.bar.select(None)
        self.refresh()

    def relabel(self) -> None:
        """Relabel the selected stretch as the activity chosen; its raw samples become training and test windows."""
        st = self.bar.selected
        if st is None:
            return
        name = self.cfg.labels.names[[pretty(n) for n in self.cfg.labels.names].index(self.relabel_to.text)]
        try:
            edit = self.app.controller.relabel(st.start_ns, st.end_ns, name)
        except (OSError, ValueError) as exc:  # a full or read-only folder
            show_note(self.fix_error, f"relabel failed: {exc}")
            return
        self._edited(edit, "relabelled; the sensing service is making its training windows")

    def delete(self) -> None:
        """Delete the selected stretch (a second tap confirms): its activity, raw samples and corrections with their windows."""
        st = self.bar.selected
        if st is None:
            return
        if self.delete_button.text == "Delete":
            self.delete_button.text = "Sure?"
            return
        try:
            edit = self.app.controller.delete_span(st.start_ns, st.end_ns)
        except (OSError, ValueError, LookupError) as exc:
            self.delete_button.text = "Delete"
            show_note(self.fix_error, f"delete failed: {exc}")
            return
        self._edited(edit, "deleting; the sensing service is removing it")

    def set_goal(self) -> None:
        text = self.goal.text.strip()
        if text.isdigit() and int(text) > 0:
            self.app.controller.timeline.set("weekly_goal_min", text)
            self.refresh()

    def export(self) -> None:
        a, b = self.span()
        path = self.cfg.state_dir / "exports" / f"fedhar-{self.day.isoformat()}.csv"
        offset = int(dt.datetime.fromtimestamp(a / 1e9).astimezone().utcoffset().total_seconds())  # type: ignore[union-attr]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(day_csv(self.app.controller.timeline.stretches(a, b), self.cfg.labels.names, offset))
        except OSError as exc:
            self.exported.text = ""
            show_note(self.export_error, f"cannot write {path}: {exc.strerror or exc}")
            return
        show_note(self.export_error, "")
        self.exported.text = f"saved {path.name}\nin {path.parent}"
