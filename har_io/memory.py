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
import threading

log = logging.getLogger("fedhar.memory")

_libc = None
try:
    _name = ctypes.util.find_library("c")
    _libc = ctypes.CDLL(_name) if _name else None
    if _libc is not None and not hasattr(_libc, "malloc_trim"):
        _libc = None
except OSError:  # no loadable C library: nothing to trim
    _libc = None


#: How many calls of :func:`release_free_memory` freeze what survives their collection.
FREEZING_CALLS = 3
_freezes_left = FREEZING_CALLS
_freeze_lock = threading.Lock()


def release_free_memory() -> bool:
    """Collect garbage and return free heap pages to the OS; True if ``malloc_trim`` ran.

    A full ``gc.collect()`` walks every tracked object. After ``import torch`` and a first
    training there are about 290,000 that live as long as the process (half of them created
    lazily by the first training), and walking them took 0.06-0.14 s of CPU per call here,
    holding the interpreter lock; a virtual-client worker calls this once per client per
    round. So the first :data:`FREEZING_CALLS` calls (the end of start-up and of the first
    rounds) move what survives their collection into the permanent generation
    (``gc.freeze``), and later collections walk only what rounds create. Frozen objects are
    still freed by reference counting; only a reference cycle among them is never collected.
    """
    global _freezes_left
    gc.collect()
    with _freeze_lock:
        if _freezes_left > 0:
            _freezes_left -= 1
            gc.freeze()
    if _libc is None:
        return False
    try:
        _libc.malloc_trim(0)
    except OSError as exc:  # pragma: no cover - depends on the C library
        log.debug("malloc_trim failed: %s", exc)
        return False
    return True
