"""The app window's size: a command-line option (``--size 480x800``, ``--fullscreen``), a saved setting, or the display's.

Kivy sizes its window when ``kivy.core.window`` is first imported, so the size goes through its
configuration environment (``KCFG_GRAPHICS_*``, :func:`kivy_environment`) before Kivy is imported.
"auto" opens Kivy's 800x600 where it fits the display, else the display's usable size (:func:`fit`,
measured through SDL2: :func:`display_size`). The History screen's choice is kept in
:data:`WINDOW_FILE`. No Kivy imported here.
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
from pathlib import Path

log = logging.getLogger("fedhar.app")

KIVY_DEFAULT = (800, 600)
"""The window Kivy opens when told nothing (pixels)."""

CHOICES = ("auto", "480x800", "800x600", "1280x720", "full screen")
"""Window sizes offered on the History screen's settings."""

WINDOW_FILE = "window.json"
"""The saved window choice, in the app's folder: ``{"size": "480x800" | "auto", "fullscreen": bool}``."""

_SDL2 = re.compile(r"/libSDL2-2[.-][^/]*$")


def parse_size(text: str) -> tuple[int, int] | None:
    """``"480x800"`` -> (480, 800); ``"auto"`` or "" -> None; ValueError unless WIDTHxHEIGHT, each 200 to 10000 pixels."""
    text = text.strip().lower()
    if text in ("", "auto"):
        return None
    m = re.fullmatch(r"(\d+)\s*x\s*(\d+)", text)
    if m is None or not all(200 <= int(v) <= 10_000 for v in m.groups()):
        raise ValueError(f"window size {text!r} is not WIDTHxHEIGHT in pixels (200 to 10000 each), e.g. 480x800, or auto")
    return int(m.group(1)), int(m.group(2))


def kivy_environment(size: tuple[int, int] | None, fullscreen: bool) -> dict[str, str]:
    """Kivy's configuration variables for a window of ``size`` pixels (None: Kivy's own) or full screen."""
    env = {}
    if size is not None:
        env["KCFG_GRAPHICS_WIDTH"], env["KCFG_GRAPHICS_HEIGHT"] = str(size[0]), str(size[1])
    if fullscreen:
        env["KCFG_GRAPHICS_FULLSCREEN"] = "auto"  # the desktop's resolution, without changing the display's mode
    return env


def fit(window: tuple[int, int], display: tuple[int, int] | None) -> tuple[int, int]:
    """The window an "auto" size opens: ``window`` where it fits ``display``, else the display's usable size."""
    if display is None or (window[0] <= display[0] and window[1] <= display[1]):
        return window
    return display


class _Rect(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


def display_size() -> tuple[int, int] | None:
    """The usable size (pixels) of the first display, asked of the SDL2 library Kivy's window loaded
    (``SDL_GetDisplayUsableBounds``, found in ``/proc/self/maps``); None elsewhere or before the window exists."""
    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if _SDL2.search(line.strip())), None)
        if path is None:
            return None
        rect = _Rect()
        if ctypes.CDLL(path).SDL_GetDisplayUsableBounds(0, ctypes.byref(rect)) != 0 or rect.w <= 0 or rect.h <= 0:
            return None
        return rect.w, rect.h
    except (OSError, AttributeError) as exc:
        log.debug("display size unknown: %s", exc)
        return None


def saved_window(folder: Path) -> tuple[tuple[int, int] | None, bool]:
    """The window choice saved in ``folder`` (:data:`WINDOW_FILE`): (size or None for auto, full screen); auto when none."""
    try:
        d = json.loads((Path(folder) / WINDOW_FILE).read_text())
        return parse_size(str(d.get("size", "auto"))), bool(d.get("fullscreen", False))
    except (OSError, ValueError, AttributeError):
        return None, False


def save_window(folder: Path, choice: str) -> tuple[tuple[int, int] | None, bool]:
    """Keep ``choice`` (one of :data:`CHOICES`, or WIDTHxHEIGHT; ValueError otherwise) for the next start; return it parsed."""
    full = choice == "full screen"
    size = None if full else parse_size(choice)
    Path(folder).mkdir(parents=True, exist_ok=True)
    text = "auto" if size is None else f"{size[0]}x{size[1]}"
    (Path(folder) / WINDOW_FILE).write_text(json.dumps({"size": text, "fullscreen": full}))
    return size, full


def choice_of(size: tuple[int, int] | None, fullscreen: bool) -> str:
    """The settings' words for a window: "full screen", "480x800", "auto"."""
    return "full screen" if fullscreen else ("auto" if size is None else f"{size[0]}x{size[1]}")
