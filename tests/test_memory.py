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


_MAPPED_AFTER_A_LARGE_FREE = """
    import ctypes, ctypes.util, sys
    from har_io import memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallinfo2"):
        print("no mallinfo2")
        sys.exit(0)
    libc.mallinfo2.restype = MallInfo2
    if BOUND:
        assert memory.bound_mmap_threshold()
    big = bytearray(26 << 20)   # a model-sized block: mapped, and freeing it raises glibc's own threshold
    del big
    block = bytearray(8 << 20)  # then a block of 8 MiB: mapped again only with the threshold bound
    print(libc.mallinfo2().hblkhd >= len(block))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_with_the_threshold_bound_a_block_after_a_large_free_gets_its_own_mapping() -> None:
    bound = _run("BOUND = True\n" + textwrap.dedent(_MAPPED_AFTER_A_LARGE_FREE))
    if bound == "no mallinfo2":
        pytest.skip("glibc without mallinfo2 (< 2.33)")
    # glibc's default: the free of the 26 MiB block raised the threshold, and 8 MiB came from the heap.
    assert _run("BOUND = False\n" + textwrap.dedent(_MAPPED_AFTER_A_LARGE_FREE)) == "False"
    assert bound == "True"


def test_a_threshold_that_is_not_positive_is_refused() -> None:
    from har_io.memory import bound_mmap_threshold

    with pytest.raises(ValueError, match="threshold must be > 0"):
        bound_mmap_threshold(0)


@pytest.mark.slow
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


@pytest.mark.slow
def test_monitor_of_another_process_sees_its_grandchild_s_memory() -> None:
    """A child that starts a grandchild holding 300 MB of touched pages: the tree's peak PSS includes them."""
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; b = bytearray(300 * 2**20); time.sleep(2.5)'])")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code])
    mon = MemoryMonitor(interval_s=0.2, pid=proc.pid)
    mon.start()
    proc.wait(30)
    time.sleep(0.3)
    mon.stop()
    assert mon.peak_procs == 2
    assert mon.peak_pss >= 300 * 2**20
    assert mon.peak_rss >= mon.peak_pss


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
