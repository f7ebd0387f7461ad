"""Memory helpers: the heap release between rounds and the simulation's memory monitor.

``release_free_memory`` freezes what survives its first collections, so later full
collections walk only objects created since; cyclic garbage made after that is still
collected. Each case runs in a fresh interpreter: the freezing is once per process.

``MemoryMonitor`` reads PSS only when the summed RSS could set a new peak; a child that
holds 200 MiB of touched pages must show in both peaks.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from simulation.simulate import MemoryMonitor

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_first_calls_freeze_survivors_and_later_garbage_is_still_collected() -> None:
    out = _run(
        """
        import gc, weakref
        from har_io import memory
        counts = []
        for _ in range(memory.FREEZING_CALLS + 2):
            memory.release_free_memory()
            counts.append(gc.get_freeze_count())

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a   # a reference cycle: only the collector frees it
        probe = weakref.ref(a)
        del a, b
        memory.release_free_memory()
        print(counts[memory.FREEZING_CALLS - 1] > 0, counts[-1] == counts[memory.FREEZING_CALLS - 1], probe() is None)
        """
    )
    assert out == "True True True"


def test_before_the_freezing_calls_nothing_is_frozen() -> None:
    assert _run("import gc; from har_io import memory; print(gc.get_freeze_count())") == "0"


def test_monitor_sees_a_child_that_holds_200_mib() -> None:
    idle = MemoryMonitor(interval_s=0.05)
    idle.start()
    time.sleep(0.5)
    idle.stop()
    mon = MemoryMonitor(interval_s=0.05)
    mon.start()
    try:
        subprocess.run(
            [sys.executable, "-c", "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)"],
            check=True,
            timeout=60,
        )
    finally:
        mon.stop()
    assert mon.samples > 5
    assert mon.peak_pss - idle.peak_pss >= 190 * 2**20
    assert mon.peak_rss >= mon.peak_pss > 0


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
