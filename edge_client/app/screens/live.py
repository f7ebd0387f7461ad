"""The Live screen: the activity the device's current model sees, with its confidence."""

from __future__ import annotations

from typing import Any

from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.label import Label
from kivy.uix.progressbar import ProgressBar
from kivy.uix.screenmanager import Screen

from edge_client.app.controller import LiveView
from edge_client.app.screens.layout import scrolled, title
from edge_client.app.words import live_words, pretty


class LiveScreen(Screen):
    """The activity the device's current model sees, with its confidence, refreshed at every window hop."""

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
        """Show the controller's newest :class:`~edge_client.app.controller.LiveView`."""
        self.activity.text = pretty(v.activity) if v.activity else "-"
        self.confidence.text = f"confidence {v.confidence * 100:.0f} %" if v.activity else ""
        self.bar.value = v.confidence * 100
        self.windows.text = live_words(v.windows)
        self.note.text = v.note
