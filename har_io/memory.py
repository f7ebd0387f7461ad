"""Give freed heap memory back to the operating system between rounds.

A round allocates several copies of a 26 MB model; glibc keeps freed blocks in its
arenas, so a long-running client or coordinator would hold its peak forever (the
problem NVFlare hit on edge devices). ``malloc_trim(0)`` returns them. A no-op where
glibc is not the C library (macOS, musl, Android's bionic).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("fedhar.memory")

_libc = None
try:
    _name = ctypes.util.find_library("c")
    _libc = ctypes.CDLL(_name) if _name else None
    if _libc is not None and not hasattr(_libc, "malloc_trim"):
        _libc = None
except OSError:  # no loadable C library: nothing to trim
    _libc = None


def release_free_memory() -> bool:
    """Collect garbage and return free heap pages to the OS; True if ``malloc_trim`` ran."""
    gc.collect()
    if _libc is None:
        return False
    try:
        _libc.malloc_trim(0)
    except OSError as exc:  # pragma: no cover - depends on the C library
        log.debug("malloc_trim failed: %s", exc)
        return False
    return True
