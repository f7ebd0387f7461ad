"""Polling a condition in tests that drive threads and processes (bounded: it always ends)."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll(cond: Callable[[], object], timeout_s: float = 60.0, every_s: float = 0.05) -> bool:
    """Whether ``cond()`` became true within ``timeout_s`` seconds, asked every ``every_s`` seconds."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(every_s)
    return False
