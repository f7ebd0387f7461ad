"""Who sets PyTorch's intra-op thread count: the round's training keeps its own, background classification runs on one.

PyTorch has one count per process (``torch.set_num_threads``), no per-call setting, so a thread
wanting another count changes the process's and restores it. Classifying each window at
PyTorch's count wakes the intra-op pool, whose spinning cost 8.9-35.9 CPU s per hour of sensing
against 4.6-6.0 on one thread, same probabilities (docs/benchmarks-client.md, section 3). So a
prediction runs inside :func:`inference_threads` and a round inside :func:`training_threads`:
while a training holds the count a prediction changes nothing (a kernel's split, and so its
rounding, may depend on the count); a training waits for a prediction to restore the count, then
applies it to its own thread; predictions are serialised. The lock and the count are module state
because the setting is one per process; nothing here imports PyTorch.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

INFERENCE_THREADS = 1
"""Intra-op threads of a background prediction: the pool's spinning costs more than the split saves for a few windows."""

_setting = threading.Lock()  # held while the count is changed and restored, and while a training registers
_trainings = 0  # trainings holding the count now (guarded by _setting)


def trainings() -> int:
    """How many trainings hold PyTorch's thread count now (0: a prediction may change it)."""
    with _setting:
        return _trainings


@contextmanager
def training_threads() -> Iterator[None]:
    """Hold PyTorch's intra-op thread count as the process has it for a training (a round); trainings may overlap.

    Waits for a prediction under way to restore the count, then applies it to the calling thread.
    """
    global _trainings
    with _setting:
        _trainings += 1
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(torch.get_num_threads())  # this thread's own copy of the count, as the process's
    try:
        yield
    finally:
        with _setting:
            _trainings -= 1


@contextmanager
def inference_threads(n: int = INFERENCE_THREADS) -> Iterator[int]:
    """Run the block's PyTorch operations on ``n`` (>= 1, else ValueError) intra-op threads, unless a training holds the
    count; yields the count the block runs at."""
    if n < 1:
        raise ValueError(f"inference_threads: n must be at least 1, got {n}")
    import torch

    with _setting:  # other holders are a prediction or a training registering: a short wait
        prev = torch.get_num_threads()
        if _trainings or prev == n:
            yield prev
            return
        torch.set_num_threads(n)
        try:
            yield n
        finally:
            torch.set_num_threads(prev)
