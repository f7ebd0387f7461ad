"""What taking part costs the device: CPU seconds of sensing and of each round, and the battery's drain.

Shown on the screen and in the status (:class:`har_models.wire.messages.DeviceCost`): **sensing**,
the process's CPU time while it senses, rounds left out, per hour of samples on the sensor's clock
(a replay at any speed gives the real-time figure); **rounds**, the process's CPU time from the
received model to the encoded update less the sensing thread's, with wall time and backend;
**battery**, percent per day lost off the charger (the whole device's drain; None where the
platform reports no level, never guessed). :class:`CostMeter` is shared by the sensing, agent and
supervisor threads; :func:`cost_words` turns its figures into lines.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from har_models.wire.messages import DeviceCost

SENSING_MIN_S = 60.0
"""Sensed span (s of the sensor clock) before a per-hour sensing figure is given: less is mostly start-up."""

ROUNDS_KEPT = 20
"""Rounds whose cost is kept (the newest)."""

ROUND_COST_KEY = "round_cost"
"""Store meta key of the kept round costs (:meth:`CostMeter.rounds_json`), so they outlive a restart."""

BATTERY_MIN_DISCHARGE_S = 1800.0
"""Time off the charger (s) before a per-day battery figure: levels come in whole percent, a phone at rest loses 1-2 an hour."""

BATTERY_SAMPLE_S = 300.0
"""Seconds between two battery samples kept while the level and the charging state stay the same."""

BATTERY_KEPT = 2000
"""Battery samples kept (the newest): a week at one each :data:`BATTERY_SAMPLE_S`."""


@dataclass(frozen=True)
class RoundCost:
    """The cost of one round on this device: CPU seconds less the sensing thread's (>= 0), wall seconds, end (unix s)."""

    round: int
    backend: str
    cpu_s: float
    wall_s: float
    unix: float


class CostMeter:
    """CPU seconds of sensing and of rounds, and the battery's drain, on one device (thread-safe).

    ``thread_cpu``, ``process_cpu`` and ``wall`` are the clocks; ``rounds``: costs kept before
    (:meth:`rounds_json`), bad entries skipped.
    """

    def __init__(
        self,
        thread_cpu: Callable[[], float] = time.thread_time,
        process_cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.monotonic,
        rounds: list[dict[str, Any]] | None = None,
    ):
        self._thread_cpu = thread_cpu
        self._process_cpu = process_cpu
        self._wall = wall
        self._lock = threading.Lock()
        # Sensing: finished sensor threads' totals, and the running thread's.
        self._cpu_done = 0.0
        self._span_done_s = 0.0
        self._thread: threading.Thread | None = None
        self._cpu_run = 0.0
        self._th_last = 0.0  # the sensor thread's CPU clock at its previous chunk's end
        self._p_last: float | None = None  # the process's CPU clock then (None: no chunk of this thread ended yet)
        self._rounds_running = 0
        self._round_since_chunk = False  # a round ran since the previous chunk ended
        self._t_lo: int | None = None
        self._t_hi: int | None = None
        self._rounds: deque[RoundCost] = deque(maxlen=ROUNDS_KEPT)
        for d in rounds or []:
            try:
                rc = RoundCost(int(d["round"]), str(d["backend"]), float(d["cpu_s"]), float(d["wall_s"]), float(d["unix"]))
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(rc.cpu_s) and rc.cpu_s >= 0 and math.isfinite(rc.wall_s) and rc.wall_s >= 0:
                self._rounds.append(rc)
        self._battery: deque[tuple[float, float, bool]] = deque(maxlen=BATTERY_KEPT)  # (unix s, percent, charging)

    # -- sensing -------------------------------------------------------------------------------
    @contextmanager
    def sensing(self, t_ns: np.ndarray) -> Iterator[None]:
        """Count the CPU time of sensing up to the end of handling one chunk stamped ``t_ns`` (sensor clock, ns).

        Wrap every chunk's handling on the sensor thread. A thread's first chunk counts its own CPU
        time; later chunks the process's since the previous chunk ended (the sensor read, library
        threads, the app's other threads), or only the sensor thread's own where a round ran
        meanwhile. A new sensor thread starts again as with the first chunk.
        """
        me = threading.current_thread()
        with self._lock:
            if me is not self._thread:
                self._close_run()
                self._thread, self._th_last, self._p_last = me, self._thread_cpu(), None
        try:
            yield
        finally:
            th, proc = self._thread_cpu(), self._process_cpu()
            t = np.asarray(t_ns)
            with self._lock:
                if me is self._thread:
                    if self._p_last is None or self._rounds_running or self._round_since_chunk:
                        self._cpu_run += max(0.0, th - self._th_last)
                    else:
                        self._cpu_run += max(0.0, proc - self._p_last)
                    self._th_last, self._p_last = th, proc
                    self._round_since_chunk = self._rounds_running > 0
                    if t.size:
                        lo, hi = int(t.min()), int(t.max())
                        self._t_lo = lo if self._t_lo is None else min(self._t_lo, lo)
                        self._t_hi = hi if self._t_hi is None else max(self._t_hi, hi)

    def _close_run(self) -> None:
        self._cpu_done += self._cpu_run
        self._span_done_s += self._run_span_s()
        self._cpu_run, self._t_lo, self._t_hi = 0.0, None, None

    def _run_span_s(self) -> float:
        return 0.0 if self._t_lo is None or self._t_hi is None else (self._t_hi - self._t_lo) / 1e9

    def sensing_cpu_s(self) -> float:
        """CPU seconds of sensing so far (see :meth:`sensing`), every run of the sensor thread in this process."""
        with self._lock:
            return self._cpu_done + self._cpu_run

    def sensed_s(self) -> float:
        """Seconds of samples sensed so far, on the sensor clock."""
        with self._lock:
            return self._span_done_s + self._run_span_s()

    def sensing_cpu_s_per_h(self) -> float | None:
        """CPU seconds of sensing per hour of sensed samples (s/h); None before :data:`SENSING_MIN_S` of samples."""
        with self._lock:
            span = self._span_done_s + self._run_span_s()
            cpu = self._cpu_done + self._cpu_run
        return cpu / span * 3600.0 if span >= SENSING_MIN_S else None

    # -- rounds --------------------------------------------------------------------------------
    @contextmanager
    def round(self, round_: int, backend: Callable[[], str]) -> Iterator[None]:
        """Measure the round run inside the block (kept only without an exception): process CPU less what sensing counted.

        ``backend`` is asked once the round ended (a refused program falls back to numpy).
        """
        with self._lock:
            self._rounds_running += 1
            self._round_since_chunk = True
        p0, s0, w0 = self._process_cpu(), self.sensing_cpu_s(), self._wall()
        try:
            yield
        finally:
            with self._lock:
                self._rounds_running -= 1
        cpu = (self._process_cpu() - p0) - (self.sensing_cpu_s() - s0)
        rc = RoundCost(int(round_), backend(), max(0.0, cpu), max(0.0, self._wall() - w0), time.time())
        with self._lock:
            self._rounds.append(rc)

    def rounds(self) -> list[RoundCost]:
        """The kept round costs, oldest first."""
        with self._lock:
            return list(self._rounds)

    def rounds_json(self) -> list[dict[str, Any]]:
        """The kept round costs as JSON (the ``rounds`` argument takes it back)."""
        return [asdict(r) for r in self.rounds()]

    # -- battery -------------------------------------------------------------------------------
    def note_battery(self, percent: float | None, charging: bool | None, unix: float | None = None) -> None:
        """Keep one battery sample (``percent`` 0..100; None: the platform reports none, nothing kept); an unchanged sample
        only after :data:`BATTERY_SAMPLE_S`, so the kept ones span days."""
        if percent is None or not math.isfinite(percent) or not 0 <= percent <= 100:
            return
        t = time.time() if unix is None else float(unix)
        on = bool(charging)
        with self._lock:
            if self._battery:
                t1, p1, c1 = self._battery[-1]
                if t < t1:  # the wall clock stepped back: the old samples' spans mean nothing now
                    self._battery.clear()
                elif p1 == percent and c1 == on and t - t1 < BATTERY_SAMPLE_S:
                    return
            self._battery.append((t, float(percent), on))

    def battery_seen(self) -> bool:
        """Whether the platform has reported a battery level at all."""
        with self._lock:
            return bool(self._battery)

    def battery_pct_per_day(self) -> float | None:
        """Battery percent lost per day off the charger; None without :data:`BATTERY_MIN_DISCHARGE_S` of discharge.

        Drops between consecutive samples both off the charger count over their time apart (a rise was charged).
        """
        with self._lock:
            samples = list(self._battery)
        lost = spent = 0.0
        for (t0, p0, c0), (t1, p1, c1) in itertools.pairwise(samples):
            if c0 or c1 or p1 > p0:
                continue
            lost += p0 - p1
            spent += t1 - t0
        return lost / spent * 86_400.0 if spent >= BATTERY_MIN_DISCHARGE_S else None

    # -- the status ----------------------------------------------------------------------------
    def snapshot(self) -> DeviceCost:
        """The figures now, as the status carries them (the latest round's)."""
        last = self.rounds()[-1:]
        return DeviceCost(
            sensing_cpu_s_per_h=_rounded(self.sensing_cpu_s_per_h()),
            round_cpu_s=_rounded(last[0].cpu_s) if last else None,
            round_wall_s=_rounded(last[0].wall_s) if last else None,
            round_backend=last[0].backend if last else "",
            battery_pct_per_day=_rounded(self.battery_pct_per_day()),
        )


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(float(v), 3)


def cost_words(cost: DeviceCost, rounds: list[RoundCost] | None = None, battery_seen: bool = False) -> list[str]:
    """The cost lines the app shows: sensing, the latest round per backend of ``rounds`` (with the mean of that
    backend's kept rounds) or none yet, and the battery (unknown without ``battery_seen``, else measuring until a figure)."""
    lines = []
    if cost.sensing_cpu_s_per_h is None:
        lines.append("Sensing: measuring its CPU use (after a minute of sensing)")
    else:
        share = cost.sensing_cpu_s_per_h / 3600.0 * 100.0
        lines.append(f"Sensing: {cost.sensing_cpu_s_per_h:.0f} s of CPU per hour ({share:.1f} % of one core)")
    by_backend: dict[str, list[RoundCost]] = {}
    for r in rounds or []:
        by_backend.setdefault(r.backend, []).append(r)
    if by_backend:
        for backend, rs in by_backend.items():
            mean = sum(r.cpu_s for r in rs) / len(rs)
            lines.append(f"A round ({backend}): {rs[-1].cpu_s:.1f} s of CPU in {rs[-1].wall_s:.1f} s, round {rs[-1].round}"
                         + (f"; {mean:.1f} s on average over {len(rs)} rounds" if len(rs) > 1 else ""))  # fmt: skip
    elif cost.round_cpu_s is not None:
        lines.append(f"A round ({cost.round_backend or 'backend not known'}): {cost.round_cpu_s:.1f} s of CPU")
    else:
        lines.append("A round: no round trained on this device yet")
    if cost.battery_pct_per_day is None and not battery_seen:
        lines.append("Battery: unknown (this device reports no battery level)")
    elif cost.battery_pct_per_day is None:
        lines.append(f"Battery: measuring (a figure after {BATTERY_MIN_DISCHARGE_S / 60:.0f} min off the charger)")
    else:
        lines.append(f"Battery: {cost.battery_pct_per_day:.0f} % a day off the charger (the whole phone, not fedhar alone)")
    return lines
