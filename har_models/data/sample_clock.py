"""Stamps for samples a sensor spaces by its own clock, disciplined against the host clock so they do not drift.

A sensor with a FIFO (the MPU-6050) spaces its samples by its own oscillator: sample ``k``
after a (re)start at host time ``t0`` is nominally ``t0 + (k + 1) * period``. Its real rate
differs from the nominal by a few percent (the MPU-6050's internal oscillator is specified to
±1 % over temperature and more across parts; phones under load the same), so after ten
minutes at 3 % off the nominal stamps are 18 s away from the host clock, and windows, labels
and the other sensor drift apart.

:class:`SampleClock` measures the real period from the reads themselves: each read at host time
``h`` returns every sample taken up to ``h``, so the cumulative count ``k`` against ``h`` is a line
whose slope is the real period, and the newest sample of a read was taken within one sample
period (plus the read's own duration) before it, however long the poll period is. The stamps are
disciplined from the first read: their phase is pulled toward where the reads put the newest
sample (half a period before the read on average) by slewing the spacing by at most
:data:`MAX_SLEW` within a read, so they stay monotonic; from the first :attr:`provisional_span_ns`
(1 s) of reads on they continue at the period of a least-squares fit over the reads so far
(about 1 % off at first, better with every read), clamped to ``max_deviation``; once the reads span
:attr:`fit_span_ns` (30 s, where the read jitter is below 0.1 % of the span) that fit, over the
reads of the last :attr:`window_ns`, is the measured rate (:attr:`measured_rate_hz`), which a restart
keeps. A sensor 10 % off its nominal rate is then within about 50 ms of the host clock in its
first second, and within a sample period or two once the fit has settled, for as long as it runs.
"""

from __future__ import annotations

from collections import deque

import numpy as np

MAX_SLEW = 0.05
"""Largest relative change of the sample spacing a phase correction may make within one read."""


class SampleClock:
    """Disciplined stamps of one sensor's sample clock (see the module docstring).

    Parameters
    ----------
    nominal_period_ns : int
        The period asked of the sensor (20,000,000 ns at 50 Hz).
    fit_span_ns : int
        Host time the reads must span before their fit is the measured period (default 30 s).
    window_ns : int
        Host time of reads the fit keeps (default 300 s): long enough to average the read
        jitter away, short enough to follow a rate that changes with temperature.
    max_deviation : float
        The largest relative deviation of the real period from the nominal that is believed
        (default 0.1); beyond it the period is clamped there (a wrong configuration, not a slow clock).
    provisional_span_ns : int
        Host time the reads must span before the stamps follow their fit rather than the nominal
        (or last measured) period (default 1 s; at most ``fit_span_ns``).

    Raises
    ------
    ValueError
        For a non-positive period or span, a provisional span over the fit's, or a window shorter than the span.
    """

    def __init__(
        self,
        nominal_period_ns: int,
        fit_span_ns: int = 30_000_000_000,
        window_ns: int = 300_000_000_000,
        max_deviation: float = 0.1,
        provisional_span_ns: int = 1_000_000_000,
    ):
        if (nominal_period_ns <= 0 or not 0 < provisional_span_ns <= fit_span_ns or window_ns < fit_span_ns
                or not 0 < max_deviation < 1):  # fmt: skip
            raise ValueError(
                f"SampleClock: nominal_period_ns ({nominal_period_ns}) > 0, 0 < provisional_span_ns ({provisional_span_ns}) <= "
                f"fit_span_ns ({fit_span_ns}) <= window_ns ({window_ns}) and 0 < max_deviation ({max_deviation}) < 1 are needed"
            )
        self.nominal_period_ns = int(nominal_period_ns)
        self.fit_span_ns = int(fit_span_ns)
        self.provisional_span_ns = int(provisional_span_ns)
        self.window_ns = int(window_ns)
        self.max_deviation = float(max_deviation)
        self.period_ns = float(nominal_period_ns)  # the period the stamps continue at
        self.measured_period_ns: float | None = None
        self._reads: deque[tuple[int, int]] = deque()  # (samples since restart, host time of the read)
        self._t0 = 0
        self._k = 0
        self._last_t: int | None = None
        self._anchor_t: float | None = None  # the stamp of sample index _anchor_k; None before the first restart
        self._anchor_k = 0

    @property
    def measured_rate_hz(self) -> float | None:
        """The sensor's real sample rate by the host clock (Hz), once measured; None before."""
        return None if self.measured_period_ns is None else 1e9 / self.measured_period_ns

    def restart(self, host_ns: int) -> None:
        """Samples start again at host time ``host_ns`` (a FIFO reset after lost data): stamps restart from it.

        The measured period is kept (the same oscillator), the fit's reads are not (the count restarts).
        Stamps never go back: a restart before the last stamp given out restarts from that stamp.
        """
        self._t0 = int(host_ns) if self._last_t is None else max(int(host_ns), self._last_t)
        self._k = 0
        self._reads.clear()
        self._anchor_t, self._anchor_k = float(self._t0), 0

    def stamps(self, n: int, read_ns: int, whole: bool = True) -> np.ndarray:
        """Stamps (ns, host clock) of the next ``n`` samples, which a read at host time ``read_ns`` returned.

        ``whole`` False: the read returned only part of the samples taken up to ``read_ns`` (a
        transfer failed midway), so it says nothing of where they lie: they continue the stamps
        before them at the current period, and the read is not kept for the fit.

        Returns
        -------
        (n,) int64
            Increasing, continuing the previous stamps.

        Raises
        ------
        ValueError
            For a negative ``n``.
        """
        if n < 0:
            raise ValueError(f"SampleClock.stamps: n must be >= 0, got {n}")
        if self._anchor_t is None:
            self.restart(read_ns)
        assert self._anchor_t is not None
        if n == 0:
            return np.empty(0, np.int64)
        self._k += n
        j = np.arange(self._k - n + 1, self._k + 1, dtype=np.float64)  # sample indices, 1-based since the restart
        if not whole:
            return self._give(self._anchor_t + (j - self._anchor_k) * self.period_ns)
        self._reads.append((self._k, int(read_ns)))
        while self._reads and read_ns - self._reads[0][1] > self.window_ns:
            self._reads.popleft()
        fit = self._fit(self.fit_span_ns)
        if fit is not None:
            self.measured_period_ns = fit[1]
        elif self.measured_period_ns is None:  # nothing better known yet: the reads so far, once they say enough
            fit = self._fit(self.provisional_span_ns)
        if fit is not None:
            a, p = fit
            self.period_ns = p
            target = a + p * j[-1] - p / 2  # where the line puts the newest sample: half a period before its read on average
        else:
            # The read bounds the newest sample: taken within a period (and the read's own time, another) before it.
            # Stamps inside that band agree with the read and are left alone; a stamp outside is pulled to its edge.
            p = self.period_ns
            target = float(np.clip(self._anchor_t + (j[-1] - self._anchor_k) * p, read_ns - 2 * p, read_ns))
        # How far the stamps continued at this period would be from the target: that phase error is slewed away,
        # a bounded part per read, so the spacing never changes by more than MAX_SLEW and the stamps never go back.
        continued = self._anchor_t + (j - self._anchor_k) * p
        error = continued[-1] - target
        limit = MAX_SLEW * p * n
        correction = float(np.clip(error, -limit, limit))
        return self._give(continued - correction * (np.arange(1, n + 1) / n))

    def _give(self, t: np.ndarray) -> np.ndarray:
        """``t`` rounded to whole ns, never at or before the last stamp given out; the anchor moves to its end."""
        out = np.round(t).astype(np.int64)
        if self._last_t is not None and out[0] <= self._last_t:  # never back, never twice
            out += self._last_t + 1 - out[0]
        self._anchor_t, self._anchor_k = float(out[-1]), self._k
        self._last_t = int(out[-1])
        return out

    def _fit(self, span_ns: int) -> tuple[float, float] | None:
        """``(a, p)`` of ``read = a + p * k`` over the kept reads, once they span ``span_ns``; None before."""
        if len(self._reads) < 3 or self._reads[-1][1] - self._reads[0][1] < span_ns:
            return None
        k = np.array([r[0] for r in self._reads], dtype=np.float64)
        h = np.array([r[1] for r in self._reads], dtype=np.float64)
        h0 = h[0]
        p, a = np.polyfit(k, h - h0, 1)
        lo, hi = self.nominal_period_ns * (1 - self.max_deviation), self.nominal_period_ns * (1 + self.max_deviation)
        p = float(np.clip(p, lo, hi))
        a = float(np.mean(h - h0 - p * k)) + h0  # the intercept for the clamped slope
        return a, p
