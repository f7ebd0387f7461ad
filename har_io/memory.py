"""Give freed heap memory back to the operating system between rounds, and keep large blocks out of the heap.

A round allocates several copies of a 26 MB model; glibc keeps freed blocks in its
arenas, so a long-running client or coordinator would hold its peak forever (the
problem NVFlare hit on edge devices). ``malloc_trim(0)`` returns them
(:func:`release_free_memory`), and :func:`bound_mmap_threshold` keeps blocks of 4 MiB and
more in their own mappings, returned the moment they are freed. Both are no-ops where
glibc is not the C library (macOS, musl, Android's bionic).
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
    """Serve every heap block of ``threshold`` bytes or more from a mapping of its own; True if glibc took the setting.

    glibc starts with a 128 KiB threshold and raises it, each time a mapped block is freed,
    to that block's size (up to 32 MiB): after the first model-sized array is freed, every
    later block up to 32 MiB (1 MB transfer chunks, tensors of a model, the update's
    arrays) comes from the arenas, which it fragments, and ``malloc_trim`` cannot give back
    a page that still holds one live small block. Fixing the threshold (``mallopt``, which
    also stops the raising) sends those blocks to their own mappings again, unmapped when
    freed. The price is fresh pages (page faults) for every such block: for the paper CNN
    a local epoch (234 windows, batch 32, one thread) took 0.44-0.46 CPU-s with 4 or 16 MiB
    against 0.30 with glibc's default (its weight gradients, up to 24 MB, are allocated at
    every step), and an evaluation of 2,012 windows 1.00-1.07 against 0.91-1.02. So only
    the simulation's coordinator process, which receives, spills and aggregates models but
    does not train, uses it (docs/benchmarks-server.md section 3).
    The process's existing blocks stay where they are. A process started with
    :data:`MMAP_THRESHOLD_ENV` in its environment keeps that value (False is returned).

    Raises
    ------
    ValueError
        If ``threshold`` is not positive.
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
