"""The anti-alias stage of the resampler: filter design, shipped taps, FIR filtering, decimation.

A stream faster than the 50 Hz grid (phones often deliver 100-200 Hz) is low-passed before it
is decimated, or its content above 25 Hz would fold into the band the model sees. No scipy at
run time: :func:`design_anti_alias_taps` and :func:`fir_filter` are numpy's bit-identical
equals of ``scipy.signal.firwin`` and ``lfilter``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

TABLE_PERIOD_NS = 20_000_000
"""The 50 Hz grid period (``har_models.data.resample.PERIOD_50HZ_NS``) the shipped taps are for, ns."""

ANTI_ALIAS_RATIO = 1.25
"""A stream whose measured rate exceeds this multiple of the grid rate (62.5 Hz for a 50 Hz grid) is low-passed."""

MAX_OVERSAMPLING = 32
"""Largest factor M of the fine grid (period / M) an anti-aliased stream is interpolated onto (1.6 kHz at 50 Hz)."""

FIR_STOPBAND_DB = 60.0
"""Stop-band attenuation of the anti-alias filter, dB (Kaiser window design)."""


def anti_alias_factor(median_spacing_ns: float, period_ns: int = TABLE_PERIOD_NS) -> int:
    """Oversampling factor M for a stream with the given median sample spacing (ns); 1 = no filter.

    Up to :data:`ANTI_ALIAS_RATIO` times the grid rate: 1. Faster: the smallest divisor M of
    ``period_ns`` at least the rate ratio (5 % jitter tolerance), capped at :data:`MAX_OVERSAMPLING`
    (100 Hz -> 2, 150 and 200 Hz -> 4). 1, with a warning, when ``period_ns`` has no such divisor.
    """
    if not median_spacing_ns > 0:
        return 1
    ratio = period_ns / float(median_spacing_ns)
    if ratio <= ANTI_ALIAS_RATIO:
        return 1
    divisors = [m for m in range(2, MAX_OVERSAMPLING + 1) if period_ns % m == 0]
    if not divisors:
        log.warning(
            "grid period %d ns has no divisor in 2..%d; a %.0f Hz stream is not low-passed",
            period_ns,
            MAX_OVERSAMPLING,
            1e9 / median_spacing_ns,
        )
        return 1
    return next((m for m in divisors if m >= 0.95 * ratio), divisors[-1])


def design_anti_alias_taps(period_ns: int, factor: int, i0: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Design the anti-alias low-pass filter in numpy alone (the arithmetic of ``scipy.signal.firwin``).

    The steps, in order, of ``kaiserord(60, 0.32 f / (fs / 2))`` and ``firwin(numtaps | 1, 0.44 f,
    window=("kaiser", beta), fs=fs)`` (scipy 1.11-1.17; Kaiser, ISCAS 1974; Oppenheim and Schafer,
    3rd ed., eq. 7.62-7.63). With ``i0 = scipy.special.i0`` (the default when installed) the taps
    equal scipy's bit for bit; ``np.i0`` differs in the last bit, hence the shipped table.

    Returns (numtaps,) float64: odd length, symmetric, DC gain 1. ValueError if ``factor < 2`` or ``period_ns <= 0``.
    """
    if factor < 2 or period_ns <= 0:
        raise ValueError(f"design_anti_alias_taps: need factor >= 2 and period_ns > 0, got {factor} and {period_ns}")
    if i0 is None:
        i0 = _default_i0()
    f_out = 1e9 / period_ns
    fs = factor * f_out
    width = 0.32 * f_out / (fs / 2)
    atten = abs(FIR_STOPBAND_DB)
    beta = 0.1102 * (atten - 8.7)  # Kaiser's beta for an attenuation above 50 dB
    numtaps = math.ceil((atten - 7.95) / 2.285 / (np.pi * width) + 1) | 1
    cutoff = (0.44 * f_out) / float(0.5 * fs)  # as a fraction of the Nyquist frequency
    m = np.arange(0, numtaps, dtype=np.float64) - 0.5 * (numtaps - 1)
    h = 0.0 + cutoff * np.sinc(cutoff * m)  # pass band [0, cutoff]: its right edge ...
    h = h - 0.0 * np.sinc(0.0 * m)  # ... minus its left edge (0), kept for scipy's order of operations
    n = np.arange(0, numtaps, dtype=np.float64)
    alpha = (numtaps - 1) / 2.0
    window = i0(beta * np.sqrt(1 - ((n - alpha) / alpha) ** 2.0)) / i0(np.asarray(beta, dtype=np.float64))
    h = h * window
    return h / np.sum(h * np.cos(np.pi * m * 0.0))  # gain 1 at DC


def _default_i0() -> Callable[[np.ndarray], np.ndarray]:
    try:  # scipy's I0 is the one scipy.signal.firwin uses; optional, never needed at 50 Hz
        from scipy.special import i0
    except ImportError:
        return np.i0
    return i0


@functools.lru_cache(maxsize=32)
def _design_taps(period_ns: int, factor: int) -> np.ndarray:
    from har_models.data.anti_alias_table import TAPS_20MS, TAPS_PERIOD_NS

    if period_ns == TAPS_PERIOD_NS and factor in TAPS_20MS:
        taps = np.array(TAPS_20MS[factor], dtype=np.float64)
    else:
        taps = design_anti_alias_taps(period_ns, factor)
    taps.setflags(write=False)
    return taps


def anti_alias_table_source() -> str:
    """Text of ``anti_alias_taps.json`` (read by :mod:`har_models.data.anti_alias_table`): scipy's taps for every factor of the 50 Hz grid.

    Raises
    ------
    ImportError
        Without scipy (its ``special.i0``, the one ``scipy.signal.firwin`` uses).
    """
    import json

    from scipy.special import i0

    rows = [
        f"    {json.dumps(str(m))}: {json.dumps(design_anti_alias_taps(TABLE_PERIOD_NS, m, i0).tolist())}"
        for m in range(2, MAX_OVERSAMPLING + 1)
        if TABLE_PERIOD_NS % m == 0
    ]
    return f'{{"period_ns": {TABLE_PERIOD_NS}, "taps": {{\n' + ",\n".join(rows) + "\n}}\n"


def write_anti_alias_table(path: str | None = None) -> None:
    """Write :func:`anti_alias_table_source` to ``har_models/data/anti_alias_taps.json`` (or ``path``)."""
    from pathlib import Path

    target = Path(path) if path else Path(__file__).with_name("anti_alias_taps.json")
    target.write_text(anti_alias_table_source())


def anti_alias_taps(period_ns: int, factor: int) -> np.ndarray:
    """Taps (numtaps,) float64, read-only, DC gain 1, of the anti-alias low-pass for a fine grid of period ``period_ns / factor``.

    Linear-phase Kaiser FIR as ``scipy.signal.firwin`` designs it, for output rate f (50 Hz):
    cut-off (-6 dB) 0.44 f = 22 Hz, transition 14-30 Hz, 60 dB stop band (:data:`FIR_STOPBAND_DB`).
    After decimation, content from 30 Hz up would land below 20 Hz, in the band of human movement,
    so it is stopped; the pass band to 14 Hz is flat within 0.1 dB. Linear phase delays every
    frequency alike and the delay is removed, so a filtered gyroscope stays aligned with an
    unfiltered accelerometer. 25 taps at 100 Hz, 47 at 200 Hz (about 0.12 s delay). The 50 Hz grid's
    taps come from :mod:`har_models.data.anti_alias_table`; other grids are designed.

    ValueError if ``factor < 2`` or ``period_ns <= 0``.
    """
    if factor < 2 or period_ns <= 0:
        raise ValueError(f"anti_alias_taps: need factor >= 2 and period_ns > 0, got {factor} and {period_ns}")
    return _design_taps(int(period_ns), int(factor))


def fir_steady_state(taps: np.ndarray) -> np.ndarray:
    """State (L - 1,) of :func:`fir_filter` after a constant 1 held forever (``scipy.signal.lfilter_zi``, bit-identical).

    ``z[i] = b[i+1] + ... + b[L-1]``, summed from the last tap, in ``lfilter_zi``'s order.
    """
    b = np.asarray(taps, np.float64)
    return np.cumsum(b[:0:-1])[::-1].copy()


def fir_filter(taps: np.ndarray, x: np.ndarray, zi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FIR filtering along axis 0 with carried state: numpy's equal of ``scipy.signal.lfilter(b, a, x, axis=0, zi=zi)``.

    scipy's transposed direct form II with ``a = [1, 0, ...]``: ``y[n] = z[0] + b[0] x[n]``,
    ``z[i] <- z[i+1] + b[i+1] x[n]``, unrolled tap by tap over all samples, the sums in scipy's
    order: bit-identical (up to the sign of an exact zero) and independent of chunking.
    ``taps`` (L,), ``x`` (N, C), ``zi`` (L - 1, C) -> ``(y (N, C), zf (L - 1, C))``; ValueError if the shapes do not fit.
    """
    b = np.asarray(taps, np.float64)
    L, N = b.size, x.shape[0]
    if L < 2 or zi.shape != (L - 1, *x.shape[1:]):
        raise ValueError(f"fir_filter: need >= 2 taps and a state of shape {(L - 1, *x.shape[1:])}, got {L} taps, state {zi.shape}")
    acc = np.zeros((N + L - 1, *x.shape[1:]))  # outputs 0..N-1, then the state as outputs not yet complete
    for j in range(L - 1, -1, -1):
        if j <= L - 2:
            acc[j] = zi[j]  # the chain of output j starts from the carried state
        acc[j : j + N] = acc[j : j + N] + b[j] * x
    return acc[:N], acc[N:]


class AntiAliasDecimator:
    """One fast, irregular sensor stream in; the same stream low-passed, on the output grid, out.

    Each step is a pure function of the samples so far, so output does not depend on chunking:

    1. linear interpolation onto the fine grid ``k * period_ns / M`` within runs of samples at most
       ``max_gap_ns`` apart;
    2. :func:`fir_filter` along each run, state carried across pushes; a run starts from the steady
       state of its first value and ends by holding its last value for the filter's delay, so
       nothing leaks across a gap;
    3. output for fine point k is the filter output (numtaps - 1) / 2 samples later, for k divisible by M.

    ValueError if ``period_ns`` is not divisible by ``factor`` (M >= 2) or a setting is not positive.
    """

    def __init__(self, period_ns: int, factor: int, max_gap_ns: int) -> None:
        if factor < 2 or period_ns <= 0 or period_ns % factor or max_gap_ns <= 0:
            raise ValueError(
                f"AntiAliasDecimator: need factor >= 2 dividing period_ns > 0 and max_gap_ns > 0, "
                f"got factor {factor}, period_ns {period_ns}, max_gap_ns {max_gap_ns}"
            )
        self.period_ns, self.factor, self.max_gap_ns = int(period_ns), int(factor), int(max_gap_ns)
        self.fine_ns = self.period_ns // self.factor
        self.taps = anti_alias_taps(self.period_ns, self.factor)
        self.delay = (self.taps.size - 1) // 2
        # fir_filter repeats scipy's general recurrence (lfilter with ``a`` as long as ``b``),
        # whose arithmetic per sample does not depend on where a chunk ends.
        self._zi_unit = fir_steady_state(self.taps)
        self._last_t: int | None = None  # last input sample (brackets the next fine points)
        self._last_v = np.zeros(3)
        self._k_next: int | None = None  # next fine index of the open run; None: no run open
        self._run_k0 = 0
        self._n_fed = 0
        self._zi: np.ndarray | None = None
        self._x_last = np.zeros(3)

    def push(self, t_ns: np.ndarray, xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add samples (``t_ns`` (n,) int64 strictly increasing, after earlier ones; ``xyz`` (n, 3)); return the output that became final.

        Returns ``(t_ns (m,), xyz (m, 3))``, times multiples of ``period_ns``. ValueError if the times do not increase.
        """
        t = np.asarray(t_ns, np.int64).reshape(-1)
        v = np.asarray(xyz, np.float64).reshape(-1, 3)
        outs: list[tuple[np.ndarray, np.ndarray]] = []
        if t.size == 0:
            return join_parts(outs)
        if self._last_t is None:
            T, V = t, v
        else:
            T, V = np.r_[self._last_t, t], np.vstack([self._last_v[None, :], v])
        if np.any(np.diff(T) <= 0):
            raise ValueError("AntiAliasDecimator.push: sample times must increase strictly across pushes")
        q = self.fine_ns
        bounds = [0, *(np.flatnonzero(np.diff(T) > self.max_gap_ns) + 1).tolist(), T.size]
        for i in range(len(bounds) - 1):
            if i > 0:
                self._end_run(outs)
            seg_t, seg_v = T[bounds[i] : bounds[i + 1]], V[bounds[i] : bounds[i + 1]]
            if self._k_next is None:
                self._k_next = -(-int(seg_t[0]) // q)
                self._run_k0, self._n_fed, self._zi = self._k_next, 0, None
            k_hi = int(seg_t[-1]) // q
            if k_hi >= self._k_next:
                fine = np.arange(self._k_next, k_hi + 1, dtype=np.int64) * q
                x, _ = interpolate(seg_t, seg_v, fine, self.max_gap_ns)
                self._filter(x, outs)
                self._k_next = k_hi + 1
        self._last_t, self._last_v = int(T[-1]), V[-1].copy()
        return join_parts(outs)

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """End of the stream: flush the open run and return its last output samples."""
        outs: list[tuple[np.ndarray, np.ndarray]] = []
        self._end_run(outs)
        return join_parts(outs)

    def _filter(self, x: np.ndarray, outs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        if self._zi is None:  # steady state for the run's first value: as if it had been held forever
            self._zi = self._zi_unit[:, None] * x[0][None, :]
        y, self._zi = fir_filter(self.taps, x, self._zi)
        j = self._n_fed + np.arange(x.shape[0], dtype=np.int64)
        k = self._run_k0 + j - self.delay  # fine point each output stands for
        keep = (j >= self.delay) & (k % self.factor == 0)
        outs.append((k[keep] * self.fine_ns, y[keep]))
        self._n_fed += x.shape[0]
        self._x_last = x[-1].copy()

    def _end_run(self, outs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        if self._k_next is not None and self._n_fed > 0:
            self._filter(np.repeat(self._x_last[None, :], self.delay, axis=0), outs)
        self._k_next, self._zi, self._n_fed = None, None, 0


def join_parts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``(t (n,), v (n, 3))`` pieces, skipping empty ones; ``(empty, empty (0, 3))`` when none."""
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.empty(0, np.int64), np.empty((0, 3))
    return np.concatenate([p[0] for p in parts]), np.vstack([p[1] for p in parts])


def interpolate(t: np.ndarray, v: np.ndarray, grid: np.ndarray, max_gap_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation at ``grid`` (m,) int64 ns from sorted unique samples ``t`` (n,) int64 ns, ``v`` (n, 3).

    Returns ``(values (m, 3), ok (m,))``; ``ok`` is False where the bracketing samples are more
    than ``max_gap_ns`` apart; a grid point on a sample gets its value exactly.
    """
    j = np.searchsorted(t, grid, side="right") - 1  # t[j] <= g
    j = np.clip(j, 0, t.size - 1)
    exact = t[j] == grid
    k = np.minimum(j + 1, t.size - 1)
    t0, t1 = t[j], t[k]
    span = (t1 - t0).astype(np.float64)
    frac = np.divide((grid - t0).astype(np.float64), span, out=np.zeros_like(span), where=span > 0)
    vals = v[j] + (v[k] - v[j]) * frac[:, None]
    vals[exact] = v[j[exact]]
    ok = exact | ((t1 > grid) & (t0 <= grid) & (t1 - t0 <= max_gap_ns))
    return vals, ok
