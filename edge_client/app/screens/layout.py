"""Layout shared by the app's screens: titles, rows, wrapped labels, and the scrolled page every screen is laid out in.

Imports Kivy: import after the app's options are parsed (:func:`edge_client.app.main.prepare_kivy`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kivy.clock import Clock
from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.label import Label
from kivy.uix.scrollview import ScrollView


def on_ui(fn: Callable[..., None]) -> Callable[..., None]:
    """Run ``fn`` on the UI thread at the next frame (reports come from background threads)."""
    return lambda *a: Clock.schedule_once(lambda _dt: fn(*a), 0)


def title(text: str) -> Label:
    """A screen's title: bold, 22 sp, one 48 dp row."""
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
    """A left-aligned 14 sp label ``height`` dp high whose text wraps at its width."""
    label = Label(text=text, size_hint_y=None, height=dp(height), halign="left", valign="middle", font_size="14sp")
    label.bind(size=lambda w, size: setattr(w, "text_size", size))
    return label


def row(label: str, widget: Any, height: float = 44) -> BoxLayout:
    """One settings row ``height`` dp high: ``label`` on the left half (wrapped), ``widget`` on the right."""
    box = BoxLayout(size_hint_y=None, height=dp(height), spacing=dp(8))
    name = Label(text=label, halign="left", valign="middle", size_hint_x=0.5, padding=(dp(6), 0))
    name.bind(size=lambda w, size: setattr(w, "text_size", size))  # wrap and align inside the cell
    box.add_widget(name)
    box.add_widget(widget)
    return box
