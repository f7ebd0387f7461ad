"""The objects this device refused because their bytes did not match their SHA-256, for its status.

A model or a program set reaches a device by its hash: the blob store serves ``objects/{sha256}``
and a chunked transfer names the hash of the whole. A device that receives bytes of another hash
drops them (it never trains on them) and, so that the coordinator learns that the store or the
broker serves bad bytes for that object (and can write it again or drop it), lists the hash in
its status (:attr:`~har_models.wire.messages.ClientStatus.bad_objects`). The list is bounded: the
:data:`KEPT` newest, each for :data:`KEEP_S` after it was last refused; an object fetched whole
and right later leaves it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from har_models.wire.messages import MAX_BAD_OBJECTS

KEPT = MAX_BAD_OBJECTS
"""Objects listed at most (the newest)."""

KEEP_S = 3600.0
"""An object refused longer ago than this (s) is no longer listed."""


class BadObjects:
    """Hashes of objects refused for their bytes, newest last (thread-safe; see the module docstring).

    Parameters
    ----------
    on_change : callable, optional
        Called (outside the lock) when an object is added, so the status goes out at once.
    clock : callable returning float
        Monotonic seconds (tests give their own).
    """

    def __init__(self, on_change: Callable[[], object] | None = None, clock: Callable[[], float] = time.monotonic):
        self._seen: OrderedDict[str, float] = OrderedDict()  # sha256 hex -> when last refused
        self._lock = threading.Lock()
        self.on_change = on_change or (lambda: None)
        self._clock = clock

    def refused(self, sha256: str) -> None:
        """Note that an object announced as ``sha256`` (hex) came with other bytes."""
        sha = str(sha256).lower()[:64]
        with self._lock:
            new = sha not in self._seen
            self._seen[sha] = self._clock()
            self._seen.move_to_end(sha)
            while len(self._seen) > KEPT:
                self._seen.popitem(last=False)
        if new:
            self.on_change()

    def fine(self, sha256: str) -> None:
        """An object listed here arrived whole and right: it is no longer listed."""
        with self._lock:
            self._seen.pop(str(sha256).lower(), None)

    def listed(self) -> tuple[str, ...]:
        """The hashes to report now, oldest first (at most :data:`KEPT`, none older than :data:`KEEP_S`)."""
        now = self._clock()
        with self._lock:
            for sha in [s for s, t in self._seen.items() if now - t > KEEP_S]:
                del self._seen[sha]
            return tuple(self._seen)
