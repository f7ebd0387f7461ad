"""A serving loop over in-memory devices, for the tests of ``serve`` (no broker): a grid whose wait takes a moment,
and a bounded wait for what the loop does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from support.inmemory_grid import InMemoryGrid


class LoopGrid(InMemoryGrid):
    """In-memory devices whose wait takes a moment (the serving loop polls it)."""

    def wait(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.02))


def until(what: Callable[[], Any], timeout: float, label: str) -> Any:
    """``what()``'s first true value, asked every 20 ms; AssertionError naming ``label`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{label} did not happen within {timeout} s")
