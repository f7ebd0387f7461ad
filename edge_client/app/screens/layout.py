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


ERROR_COLOUR = (1, 0.45, 0.45, 1)
"""Text colour (RGBA) of an error shown under the control that caused it."""


def note(colour: tuple[float, float, float, float] | None = None) -> Label:
    """A wrapped, left-aligned label as high as its text (0 when empty): an error or a result under its control.

    Its text wraps at its width, and its height follows the text, so an empty one takes no
    room and a long one pushes what follows down instead of overlapping it.
    """
    label = Label(text="", size_hint_y=None, height=0, halign="left", valign="top", font_size="14sp", padding=(dp(4), dp(2)))
    if colour is not None:
        label.color = colour
    label.bind(width=lambda w, width: setattr(w, "text_size", (width, None)))
    label.bind(texture_size=lambda w, size: setattr(w, "height", size[1] if w.text else 0))
    return label


def show_note(label: Label, text: str) -> None:
    """Put ``text`` in a :func:`note` and scroll its screen so the person sees it (no scrolling for an empty one)."""
    label.text = text
    if not text:
        label.height = 0
        return
    view = label.parent
    while view is not None and not isinstance(view, ScrollView):
        view = view.parent
    if view is not None:  # once the label has its height (the next frame), bring it into view
        Clock.schedule_once(lambda _dt: view.scroll_to(label, padding=dp(8), animate=False), 0)
