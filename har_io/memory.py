"""Give freed heap memory back to the operating system between rounds, and keep large blocks out of the heap.

glibc keeps freed blocks of a round's model copies in its arenas (the problem NVFlare hit on edge
devices): ``malloc_trim(0)`` returns them (:func:`release_free_memory`), and
:func:`bound_mmap_threshold` gives blocks of 4 MiB and more their own mappings. No-ops where glibc
is not the C library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
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


#: glibc's ``mallopt`` parameter number of ``M_MMAP_THRESHOLD`` (``<malloc.h>``).
M_MMAP_THRESHOLD = -3
#: Blocks of at least this many bytes get a mapping of their own (see :func:`bound_mmap_threshold`).
MMAP_THRESHOLD_BYTES = 4 << 20
#: The environment variable glibc reads for the same setting when a process starts (its children inherit it).
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"


def bound_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve every heap block of ``threshold`` (> 0, else ValueError) bytes or more from its own mapping; True if glibc took it.

    glibc raises its threshold to each freed mapped block's size (up to 32 MiB), after which
    model-sized blocks fragment the arenas where ``malloc_trim`` cannot return them; fixing it
    costs page faults (a paper-CNN epoch 0.44-0.46 CPU-s against 0.30), so only the simulation's
    coordinator, which does not train, uses it (docs/benchmarks-server.md section 3). A process
    started with :data:`MMAP_THRESHOLD_ENV` keeps that value (False).
    """
    if threshold <= 0:
        raise ValueError(f"bound_mmap_threshold: threshold must be > 0 bytes, got {threshold}")
    if os.environ.get(MMAP_THRESHOLD_ENV):  # glibc applied the environment's value at start: it stays
        return False
    if _libc is None or not hasattr(_libc, "mallopt"):
        return False
    try:
        return bool(_libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except OSError as exc:  # pragma: no cover - depends on the C library
        log.debug("mallopt failed: %s", exc)
        return False


#: How many calls of :func:`release_free_memory` freeze what survives their collection.
FREEZING_CALLS = 3
_freezes_left = FREEZING_CALLS
_freeze_lock = threading.Lock()


def release_free_memory() -> bool:
    """Collect garbage and return free heap pages to the OS; True if ``malloc_trim`` ran.

    After ``import torch`` and a first training about 290,000 objects live as long as the process,
    and walking them cost 0.06-0.14 CPU-s per call; so the first :data:`FREEZING_CALLS` calls
    ``gc.freeze`` what survives, and later collections walk only what rounds create (a cycle among
    frozen objects is never collected).
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
