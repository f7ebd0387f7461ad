"""The machine's load around each side of a benchmark, and whether its ratio may count towards a goal.

A ratio measured while the 1-minute load average was above the number of cores measures the neighbours as much as
the code: each benchmark that prints a goal's ratio records the load average before and after each side it runs
(:meth:`LoadLog.around`), prints them (:meth:`LoadLog.lines`), and says when the ratio does not count
(:meth:`LoadLog.verdict`), on the line before its ``key=value`` result, which stays last.

    load = LoadLog()
    with load.around("fedhar"):
        ...
    with load.around("baseline"):
        ...
    for line in load.lines():
        print(line)
    print(f"ratio={r:.2f}")
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class LoadLog:
    """Load averages (1 minute) before and after each side: ``samples`` of ``(side, before, after)``.

    ``cores``: the CPUs this process may run on; ``read``: the 1-minute load average (``os.getloadavg``).
    """

    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    read: Callable[[], float] = field(default=lambda: os.getloadavg()[0])
    samples: list[tuple[str, float, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def around(self, side: str) -> Iterator[None]:
        """Record the load average before and after the block that runs ``side``."""
        before = self.read()
        try:
            yield
        finally:
            self.samples.append((side, before, self.read()))

    def overloaded(self) -> list[str]:
        """The sides during which the load average exceeded the core count (before or after)."""
        return [side for side, before, after in self.samples if max(before, after) > self.cores]

    def lines(self) -> list[str]:
        """One line per side: ``load average (1 min) around <side>: <before> -> <after> (<cores> cores)``, then the verdict."""
        out = [f"load average (1 min) around {side}: {before:.2f} -> {after:.2f} ({self.cores} cores)"
               for side, before, after in self.samples]  # fmt: skip
        return [*out, self.verdict()]

    def verdict(self) -> str:
        """Whether the ratio may be used for a goal, in words."""
        over = self.overloaded()
        if not over:
            return "the load average stayed at or below the core count around every side: the ratio counts for its goal"
        return (f"the load average exceeded the {self.cores} cores around {', '.join(over)}: the ratio is reported as "
                f"measured on a loaded machine and is not used for a goal")  # fmt: skip
