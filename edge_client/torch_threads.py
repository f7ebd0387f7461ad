"""Who sets PyTorch's intra-op thread count: the round's training keeps its own, background classification runs on one.

PyTorch has one intra-op thread count per process (``torch.set_num_threads``; with its
OpenMP build each thread also keeps the count it last applied, but the process's count is what
``torch.get_num_threads`` reports and what a thread adopts at its first parallel operation).
There is no per-call or per-thread setting to ask for, so a thread that wants another count
must change the process's and put it back, and nothing else may train meanwhile.

The sensing thread classifies every window for the Today timeline (a few windows every
1.28 s). At PyTorch's default count each tiny forward pass wakes the intra-op pool, whose
threads then spin waiting for more work: on a 2-core machine ``benchmarks/bench_device_cost.py
--small`` measured 8.9-35.9 CPU s per hour of sensing with the torch predictor at PyTorch's count
(the busier the machine, the more) and 4.6-6.0 on one thread; the paper's CNN, whose passes keep
both threads busy, 11.0-14.6 and 10.0-12.4 (``docs/benchmarks-client.md``, section 3). The
probabilities are the same. So a prediction runs on :data:`INFERENCE_THREADS` inside
:func:`inference_threads`, which changes the process's count and restores it, and a round runs
inside :func:`training_threads`:

* while any training holds the setting, a prediction changes nothing and runs at the training's
  count (it costs more then, but the round's threads and its numbers are untouched: how a
  kernel splits its work, and so the rounding of its sums, may depend on the count);
* a training waits for a prediction under way to put the count back (milliseconds), then
  applies the process's count to its own thread, so a thread whose first PyTorch operation
  fell inside a prediction's change does not keep one thread for its rounds;
* predictions are serialised with each other, so two never restore each other's change.

The lock and the count of trainings are module state on purpose: they guard a setting that is
itself one per process. Nothing here imports PyTorch: a device without it (the numpy backend)
only counts trainings.
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
    """Hold PyTorch's intra-op thread count as the process has it, for the duration of a training (a round).

    Waits for a prediction under way to restore the count; then applies the process's count
    to the calling thread (where PyTorch is imported); predictions until the block ends leave
    the count alone. Trainings may overlap (clients hosted in one process).
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
    """Run the block's PyTorch operations on ``n`` intra-op threads, unless a training holds the count.

    Parameters
    ----------
    n : int
        Intra-op threads for the block (>= 1).

    Yields
    ------
    int
        The count the block runs at: ``n``, or the training's when one holds the count.

    Raises
    ------
    ValueError
        If ``n`` < 1.
    """
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
