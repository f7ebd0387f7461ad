"""The app's words and colours: how durations, minutes, times and activities are shown to a person.

Nothing here imports Kivy: the screens (:mod:`edge_client.app.screens`) and the tests use the same functions.
"""

from __future__ import annotations

import datetime as dt

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
