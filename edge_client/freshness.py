"""Whether a live sensor source still delivers: the newest window against a freshness limit.

With the screen off, Doze or a vendor ROM can withhold sensor events while the app keeps its
MQTT session ("online", collecting nothing); the events may come back later as a burst from
the hardware FIFO, stamped in the past. :class:`SensingFreshness` watches the windows a live
pipeline emits and says "paused" when the newest one ends more than ``limit_s`` before the
sensor clock's now, so the client's status says so and its windows are not counted as fresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from har_models.data.resample import PERIOD_50HZ_NS
from har_models.data.windowing import WINDOW, WindowSet

log = logging.getLogger(__name__)

FRESHNESS_LIMIT_S = 60.0
"""Default freshness limit, s: a live client whose newest window ends longer ago is paused."""


class SensingFreshness:
    """Track the newest window of a live source on the sensor clock.

    Parameters
    ----------
    limit_s : float
        Freshness limit, seconds (> 0).
    clock_ns : callable returning int
        The sensor clock's now, ns, on the clock the events are stamped with (Android:
        ``SystemClock.elapsedRealtimeNanos``; the MPU-6050 driver: :func:`time.monotonic_ns`,
        the default).
    window_ns : int
        Length of one window, ns (128 samples at 50 Hz = 2.56 s).

    Raises
    ------
    ValueError
        If ``limit_s`` is not a positive finite number.
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

        ``shift_ns`` is the pipeline's :attr:`~har_models.data.pipeline.SensorPipeline.clock_shift_ns`:
        after a backward step of the sensor clock the windows are stamped that far ahead of
        it (re-based), so the newest end is compared with now as ``end - shift_ns``.
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
