"""Whether a sensor source still delivers, and how well: freshness and sensing health.

With the screen off, Doze or a vendor ROM can withhold sensor events while the app stays online
(they may come back later as a burst stamped in the past): :class:`SensingFreshness` says
"paused" when the newest window ends more than ``limit_s`` before the sensor clock's now.
:class:`SensingHealthMeter` measures what a pipeline received, for the status page
(:class:`~har_models.wire.messages.SensingHealth`). Everything is on the sensor clock, the
samples' own stamps (a 10x replay still delivers 50 Hz of recording time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from har_models.data.pipeline import SensorPipeline
from har_models.data.resample import PERIOD_50HZ_NS, ResampleStats
from har_models.data.windowing import WINDOW, WindowSet
from har_models.wire.messages import SensingHealth

log = logging.getLogger(__name__)

FRESHNESS_LIMIT_S = 60.0
"""Default freshness limit, s: a live client whose newest window ends longer ago is paused."""


class SensingFreshness:
    """Track the newest window of a live source on the sensor clock.

    ``clock_ns`` is that clock's now (Android: ``elapsedRealtimeNanos``; the MPU-6050 driver:
    :func:`time.monotonic_ns`, the default); ``window_ns`` one window (2.56 s). Raises ValueError if
    ``limit_s`` is not a positive finite number.
    """

    def __init__(
        self, limit_s: float = FRESHNESS_LIMIT_S, clock_ns: Callable[[], int] = time.monotonic_ns, window_ns: int = WINDOW * PERIOD_50HZ_NS
    ) -> None:
        if not (np.isfinite(limit_s) and limit_s > 0):
            raise ValueError(f"SensingFreshness: limit_s must be > 0 seconds, got {limit_s!r}")
        self.limit_ns = round(float(limit_s) * 1e9)
        self._clock_ns = clock_ns
        self.window_ns = int(window_ns)
        self._newest_end_out: int | None = None  # end of the newest window seen, pipeline's output clock
        self._shift_ns = 0  # the pipeline's output clock minus the sensor clock, as last noted
        self._was: str = ""

    @property
    def newest_end_ns(self) -> int | None:
        """End of the newest window seen, on the sensor clock (ns); None before the first."""
        return None if self._newest_end_out is None else self._newest_end_out - self._shift_ns

    def note(self, ws: WindowSet, shift_ns: int = 0) -> None:
        """Record the windows a pipeline emitted (any order; a backlog burst of old ones is fine).

        ``shift_ns``: the pipeline's :attr:`~har_models.data.pipeline.SensorPipeline.clock_shift_ns` (windows
        re-based ahead of the sensor clock after it stepped back).
        """
        self._shift_ns = int(shift_ns)
        if len(ws) and ws.t_start_ns is not None:
            end = int(ws.t_start_ns.max()) + self.window_ns
            self._newest_end_out = end if self._newest_end_out is None else max(self._newest_end_out, end)

    def fresh(self, ws: WindowSet, shift_ns: int = 0) -> np.ndarray:
        """Boolean mask (N,): windows ending within the limit of now (``shift_ns`` as in :meth:`note`)."""
        if ws.t_start_ns is None or not len(ws):
            return np.zeros(len(ws), bool)
        return (ws.t_start_ns + self.window_ns - int(shift_ns)) >= self._clock_ns() - self.limit_ns

    def state(self) -> str:
        """ "live", "paused" (newest window older than the limit, or none yet) ; logged when it changes."""
        now = self._clock_ns()
        end = self.newest_end_ns
        live = end is not None and end >= now - self.limit_ns
        st = "live" if live else "paused"
        if st != self._was:
            if st == "paused":
                age = "no window yet" if end is None else f"newest window {(now - end) / 1e9:.0f} s old"
                log.warning("sensing paused: %s (limit %.0f s); the OS may be withholding the sensors", age, self.limit_ns / 1e9)
            elif self._was:
                log.info("sensing live again")
            self._was = st
        return st


RATE_SPAN_S = 60.0
"""The delivered sample rate is measured over this much of the sensor clock (s)."""

GAP_SPAN_S = 3600.0
"""Gaps are counted over this much of the sensor clock (s)."""


class SensingHealthMeter:
    """Measure the sensing health of one sensor pipeline (thread-safe: fed by the sensor thread, read by any).

    On the sensor clock: *now* is ``clock_ns()`` when given (a live source: a silent sensor shows
    as a falling rate, an old window and a gap going on), else the newest accepted sample. A
    stream's *rate* counts the samples the resampler accepted in ``(start, end]`` over its length,
    ``end`` being now (less the pipeline's ``reorder_ns`` with a clock) and ``start`` at most
    ``rate_span_s`` before it and not before the stream's first sample (50.0 Hz for one sample
    every 20 ms; None before two samples). *Window age*: now minus the newest window's end (s,
    >= 0). *Gaps*: silences longer than ``window_ns`` between accepted samples of either stream or
    up to now, overlapping ones counted once, ending within ``gap_span_s`` (or going on). *Late*:
    ``ResampleStats.late_dropped``. Raises ValueError if a span is not positive or ``window_ns`` <= 0.
    """

    def __init__(
        self,
        clock_ns: Callable[[], int] | None = None,
        window_ns: int = WINDOW * PERIOD_50HZ_NS,
        rate_span_s: float = RATE_SPAN_S,
        gap_span_s: float = GAP_SPAN_S,
    ) -> None:
        for name, v in (("rate_span_s", rate_span_s), ("gap_span_s", gap_span_s)):
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"SensingHealthMeter: {name} must be > 0 seconds, got {v!r}")
        if window_ns <= 0:
            raise ValueError(f"SensingHealthMeter: window_ns must be > 0, got {window_ns!r}")
        self._clock_ns = clock_ns
        self.window_ns = int(window_ns)
        self.rate_span_ns = round(float(rate_span_s) * 1e9)
        self.gap_span_ns = round(float(gap_span_s) * 1e9)
        self._lock = threading.Lock()
        self._stats: ResampleStats | None = None
        self._reorder_ns = 0
        self._reset()

    def _reset(self) -> None:
        self._recent: dict[str, list[np.ndarray]] = {"acc": [], "gyro": []}  # accepted stamps of the last spans, in order
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._gaps: dict[str, list[tuple[int, int]]] = {"acc": [], "gyro": []}  # (last sample before, first after), ns
        self._newest_end_ns: int | None = None

    def watch(self, pipeline: SensorPipeline) -> None:
        """Measure ``pipeline`` from now on: a new sensing session, the figures of an earlier one are dropped."""
        with self._lock:
            self._reset()
            self._stats = pipeline.stats
            self._reorder_ns = pipeline.reorder_ns
        pipeline.watch_accepted(self._on_accepted)

    def _on_accepted(self, sensor: str, t: np.ndarray) -> None:
        if sensor not in self._recent or t.size == 0:
            return
        t = np.asarray(t, np.int64)
        with self._lock:
            prev = self._last.get(sensor)
            if prev is None:
                self._first[sensor] = int(t[0])
                seq = t
            else:
                seq = np.concatenate([np.array([prev], np.int64), t])
            big = np.flatnonzero(np.diff(seq) > self.window_ns)
            self._gaps[sensor].extend(zip(seq[big].tolist(), seq[big + 1].tolist(), strict=True))
            self._last[sensor] = newest = int(t[-1])
            chunks = self._recent[sensor]
            chunks.append(t.copy())
            keep_after = newest - 2 * self.rate_span_ns  # a margin: the clock's end may lag the newest stamp
            while chunks and int(chunks[0][-1]) < keep_after:
                chunks.pop(0)
            gaps = self._gaps[sensor]
            while gaps and gaps[0][1] < newest - 2 * self.gap_span_ns:
                gaps.pop(0)

    def note(self, ws: WindowSet) -> None:
        """Record the windows the pipeline emitted (any order)."""
        if len(ws) and ws.t_start_ns is not None:
            end = int(ws.t_start_ns.max()) + self.window_ns
            with self._lock:
                self._newest_end_ns = end if self._newest_end_ns is None else max(self._newest_end_ns, end)

    def snapshot(self) -> SensingHealth | None:
        """The figures now (see the class docstring); None when no pipeline is watched."""
        with self._lock:
            if self._stats is None:
                return None
            late = int(self._stats.late_dropped)
            if not self._last:
                return SensingHealth(late=late)
            if self._clock_ns is not None:
                now = int(self._clock_ns())
                end = now - self._reorder_ns
            else:
                now = end = max(self._last.values())
            rates = {s: self._rate(s, end) for s in ("acc", "gyro")}
            age = None
            if self._newest_end_ns is not None:
                age = round(max(0.0, (now - self._newest_end_ns) / 1e9), 3)
            return SensingHealth(acc_hz=rates["acc"], gyro_hz=rates["gyro"], window_age_s=age, gaps_1h=self._gap_count(now), late=late)

    def _rate(self, sensor: str, end: int) -> float | None:
        if sensor not in self._first:
            return None
        start = max(end - self.rate_span_ns, self._first[sensor])
        if end <= start:
            return None
        n = 0
        for c in self._recent[sensor]:
            n += int(np.searchsorted(c, end, side="right") - np.searchsorted(c, start, side="right"))
        return round(n / ((end - start) / 1e9), 3)

    def _gap_count(self, now: int) -> int:
        spans = [g for s in ("acc", "gyro") for g in self._gaps[s]]
        spans += [(last, now) for last in self._last.values() if now - last > self.window_ns]  # a silence going on
        spans.sort()
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return sum(1 for _, b in merged if b > now - self.gap_span_ns)
