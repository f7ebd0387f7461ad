"""Streaming resampling of two irregular sensor streams onto one exact 50 Hz grid.

Phones and boards deliver accelerometer and gyroscope events at a rate that is only a
hint (Android's requested 20 ms period often yields 10-20 ms), with jitter, duplicated
and out-of-order timestamps and gaps. The model needs one exact grid. This module keeps
both streams, and emits the grid points ``k * period`` (absolute time, so the grid does
not depend on where a stream starts or how it is chunked) that both streams cover, by
linear interpolation between the two samples that bracket each grid point.

Rules, each chosen so that streaming sample by sample, in random chunks, or all at once
gives bit-identical output:

* **Reordering.** A sample is accepted only if it is newer than ``reorder_ns`` before the
  newest sample seen so far on its stream (judged in arrival order); older ones are late
  and dropped. Accepted samples are released in time order once the stream's newest
  timestamp is ``reorder_ns`` past them.
* **Duplicates.** Of several accepted samples with the same timestamp, the first to arrive
  wins.
* **Gaps.** A grid point whose bracketing samples on either stream are more than
  ``max_gap_ns`` apart is not invented: it is skipped, which the windower sees as a break
  in the grid (timestamps jump), so no window spans a gap. Skipped points are counted, not
  generated, so a gap of any length (a phone clock jumping by days) costs nothing.
* **Clock jumps.** A sample stamped more than ``jump_ns`` (default 1 s) ahead of its
  stream's newest sample is not believed at once: one such stamp would otherwise make
  every later sample late (Android's boot clock reset, an NTP step, a wrong first stamp).
  It is held aside in a *suspect group* with the samples that follow it within
  ``jump_ns``. If the stream's own clock gets ``confirm_samples`` (default 25, 0.5 s at
  50 Hz) more samples first, the group was an outlier: its samples are dropped
  (``outliers_dropped``, one warning per resampler). If the group gets ``confirm_samples``
  samples first, the clock really stepped forward: the group is taken, in arrival order,
  as the stream's continuation (``clock_steps``), which is a gap wider than ``max_gap_ns``,
  so no window spans it, and the samples of the old clock that still arrive are late. The
  start of a stream is judged the same way: until one group of mutually close stamps has
  ``confirm_samples`` samples, the first stamp is no reference, so a wrong first stamp (far
  ahead or far behind the rest) is dropped, not taken as the clock. At :meth:`Resampler.close`
  an undecided group is kept if it has more samples than its stream received since it
  opened (a step near the end of a recording), and at the start the largest group wins.
  Decisions depend on the order of arrivals only, never on how they are chunked.
* **Non-finite values.** A sample with a NaN or infinite value is treated as missing (it
  does not count as the stream's newest sample either).
* **Anti-aliasing.** A stream sampled faster than the grid (phones often deliver 100-200 Hz;
  REALWORLD's chest gyroscope has up to 3.8 times the accelerometer's rows) is low-passed
  before it is decimated onto the grid, or its content above 25 Hz would fold into the
  band the model sees (a 40 Hz vibration sampled at 50 Hz reappears at 10 Hz at full
  amplitude). The stream's rate is measured on its first :data:`RATE_PROBE_INTERVALS`
  sample spacings (median), those alone and once, so the decision does not depend on how
  the stream is chunked (a stream that changes rate later keeps its first decision); up to
  :data:`ANTI_ALIAS_RATIO` times the grid rate it passes
  through untouched, so 50 Hz input (HAPT, REALWORLD, a phone that keeps its 20 ms
  period) gives bit for bit what it gave before the filter existed. Faster streams go
  through :class:`AntiAliasDecimator` (filter design and the reasons for it there), whose
  state is carried across pushes, so streaming still equals offline bit for bit.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

PERIOD_50HZ_NS = 20_000_000
"""Grid period for 50 Hz, nanoseconds."""

ANTI_ALIAS_RATIO = 1.25
"""A stream whose measured rate exceeds this multiple of the grid rate (62.5 Hz for a 50 Hz grid) is low-passed."""

RATE_PROBE_INTERVALS = 50
"""Sample spacings (the first ones of a stream, after reordering) whose median sets the stream's rate (1 s at 50 Hz)."""

MAX_OVERSAMPLING = 32
"""Largest factor M of the fine grid (period / M) an anti-aliased stream is interpolated onto (1.6 kHz at 50 Hz)."""

CLOCK_JUMP_NS = 1_000_000_000
"""Default ``jump_ns``: a stamp this far (1 s) ahead of its stream's newest sample is suspect until confirmed."""

CONFIRM_SAMPLES = 25
"""Default ``confirm_samples``: samples (0.5 s at 50 Hz) that decide between a clock step and an outlier."""

MAX_SUSPECT_GROUPS = 8
"""Suspect groups held at once per stream; opening one more drops the oldest as outliers."""

FIR_STOPBAND_DB = 60.0
"""Stop-band attenuation of the anti-alias filter, dB (Kaiser window design)."""

_INT64_MIN = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass
class ResampleStats:
    """Counters of what the resampler did, for logs and tests.

    Attributes
    ----------
    accepted : int
        Raw samples (both streams) used for interpolation.
    late_dropped : int
        Raw samples stamped ``reorder_ns`` or more before their stream's newest earlier arrival.
    duplicates_dropped : int
        Raw samples whose timestamp an earlier arrival of the same stream already had.
    grid_points : int
        Grid samples emitted.
    gap_points_skipped : int
        Grid points inside the common span of the streams that fell into a gap.
    nonfinite_dropped : int
        Raw samples with a NaN or infinite value.
    outliers_dropped : int
        Raw samples stamped more than ``jump_ns`` away from their stream's clock that too few
        later samples followed (a lone future stamp, a wrong first stamp).
    clock_steps : int
        Forward steps of a stream's clock that were confirmed and taken as a gap.
    """

    accepted: int = 0
    late_dropped: int = 0
    duplicates_dropped: int = 0
    grid_points: int = 0
    gap_points_skipped: int = 0
    nonfinite_dropped: int = 0
    outliers_dropped: int = 0
    clock_steps: int = 0


def anti_alias_factor(median_spacing_ns: float, period_ns: int = PERIOD_50HZ_NS) -> int:
    """Oversampling factor M for a stream with the given median sample spacing; 1 = no filter.

    A stream up to :data:`ANTI_ALIAS_RATIO` times the grid rate passes through (factor 1).
    A faster one is interpolated onto a fine grid of period ``period_ns / M`` (an exact
    integer, so the fine grid contains the output grid) with the smallest such M at least
    the input rate over the grid rate (5 % tolerance for jitter), capped at
    :data:`MAX_OVERSAMPLING`: 100 Hz -> 2, 150 Hz -> 4, 200 Hz -> 4 for a 50 Hz grid.

    Parameters
    ----------
    median_spacing_ns : float
        Median spacing of the stream's samples, ns (> 0).
    period_ns : int
        Output grid period, ns.

    Returns
    -------
    int
        M >= 1. 1 also when ``period_ns`` has no divisor in 2..:data:`MAX_OVERSAMPLING`
        (logged as a warning: the stream is then not filtered).
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

    The same steps, in the same order, as ``scipy.signal.kaiserord(60, 0.32 f / (fs / 2))``
    followed by ``scipy.signal.firwin(numtaps | 1, 0.44 f, window=("kaiser", beta), fs=fs)``
    (scipy 1.11-1.17): Kaiser's order and beta formulas (J. F. Kaiser, ISCAS 1974; Oppenheim
    and Schafer, "Discrete-Time Signal Processing", 3rd ed., eq. 7.62-7.63), the ideal
    low-pass ``c sinc(c m)`` with ``m`` the offsets from the centre tap, times the symmetric
    Kaiser window ``I0(beta sqrt(1 - ((n - a) / a)^2)) / I0(beta)``, scaled to DC gain 1.

    With ``i0 = scipy.special.i0`` the result equals scipy's design bit for bit (tested for
    every factor). numpy's own ``np.i0`` differs from scipy's in the last bit for some
    arguments, which is why the filters of the 50 Hz grid are shipped precomputed
    (:data:`har_models.data.anti_alias_table.TAPS_20MS`) rather than designed on a device.

    Parameters
    ----------
    period_ns : int
        Output grid period, ns (> 0).
    factor : int
        Oversampling factor M >= 2 of the fine grid.
    i0 : callable, optional
        Modified Bessel function of the first kind, order 0, elementwise. Default:
        ``scipy.special.i0`` when scipy is installed, else ``numpy.i0``.

    Returns
    -------
    ndarray of shape (numtaps,), float64
        Odd length, symmetric, summing to 1 up to rounding.

    Raises
    ------
    ValueError
        If ``factor < 2`` or ``period_ns <= 0``.
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
    """Text of :mod:`har_models.data.anti_alias_table`: scipy's taps for every factor of the 50 Hz grid.

    Needs scipy (its ``special.i0``, the one ``scipy.signal.firwin`` uses); run where scipy
    is installed, never on a device.

    Raises
    ------
    ImportError
        Without scipy.
    """
    from scipy.special import i0

    head = [
        '"""Anti-alias filter taps for the 50 Hz grid, designed once with scipy and shipped as data (generated file).',
        "",
        "One entry per oversampling factor M that :func:`har_models.data.resample.anti_alias_factor`",
        "can choose for a 20 ms grid (the divisors of 20,000,000 in 2..32): the taps of",
        "``scipy.signal.firwin`` with the Kaiser design of :func:`har_models.data.resample.anti_alias_taps`,",
        "written as Python floats (``repr`` round-trips a float64 exactly), so a device without",
        "scipy filters bit for bit as a machine with it. tests/test_resample.py checks every entry",
        "against scipy's design. Regenerate with::",
        "",
        '    python -c "from har_models.data.resample import write_anti_alias_table; write_anti_alias_table()"',
        '"""',
        "",
        f"TAPS_PERIOD_NS = {PERIOD_50HZ_NS:_}",
        '"""Grid period the table is for, ns (50 Hz)."""',
        "",
        "TAPS_20MS: dict[int, tuple[float, ...]] = {",
    ]
    body: list[str] = []
    for m in range(2, MAX_OVERSAMPLING + 1):
        if PERIOD_50HZ_NS % m:
            continue
        taps = design_anti_alias_taps(PERIOD_50HZ_NS, m, i0)
        body.append(f"    {m}: (")
        body += ["        " + " ".join(f"{float(v)!r}," for v in taps[k : k + 4]) for k in range(0, taps.size, 4)]
        body.append("    ),")
    tail = ["}", '"""Factor M -> taps (odd length, symmetric, DC gain 1), float64 values."""']
    return "\n".join(head + body + tail) + "\n"


def write_anti_alias_table(path: str | None = None) -> None:
    """Write :func:`anti_alias_table_source` to ``har_models/data/anti_alias_table.py`` (or ``path``)."""
    from pathlib import Path

    target = Path(path) if path else Path(__file__).with_name("anti_alias_table.py")
    target.write_text(anti_alias_table_source())


def anti_alias_taps(period_ns: int, factor: int) -> np.ndarray:
    """Taps of the anti-alias low-pass filter for a fine grid of period ``period_ns / factor``.

    Linear-phase FIR designed as ``scipy.signal.firwin`` designs it (Kaiser window sized by
    ``scipy.signal.kaiserord``; J. F. Kaiser, "Nonrecursive digital filter design using
    the I0-sinh window function", ISCAS 1974), for an output rate f = 1e9 / period_ns
    (50 Hz):

    * cut-off (-6 dB) 0.44 f = 22 Hz, transition band 0.28 f .. 0.60 f = 14 .. 30 Hz,
      stop-band attenuation :data:`FIR_STOPBAND_DB` = 60 dB; odd length, so the delay is
      a whole number (numtaps - 1) / 2 of fine samples and is compensated exactly;
    * why: after decimation to f, a component at frequency g lands at |g - k f|. Everything
      from 0.6 f (30 Hz) up would land below 0.4 f (20 Hz), inside the band that carries
      human movement, so it is stopped by 60 dB (a 40 Hz test tone keeps 1e-3 of its
      amplitude); 25-30 Hz can only land at 20-25 Hz, above that band, so the transition
      may lie there. The pass band up to 14 Hz is flat within 0.1 dB (-2.8 dB at 20 Hz),
      which keeps the gait and posture content HAR relies on (mostly below 15 Hz);
    * linear phase (a symmetric FIR rather than, say, a Butterworth IIR): every frequency
      is delayed alike, and the delay is removed, so a filtered gyroscope stays aligned
      with an unfiltered accelerometer and steps keep their shape.

    No scipy at run time: for the 50 Hz grid (every factor :func:`anti_alias_factor` can
    choose) the taps are read from :mod:`har_models.data.anti_alias_table`, which holds
    scipy's design to the bit; other grid periods are designed by
    :func:`design_anti_alias_taps` (bit-identical to scipy where scipy is installed).

    Length: 25 taps at 100 Hz, 47 at 200 Hz (about 0.12 s of delay at any rate).

    Parameters
    ----------
    period_ns : int
        Output grid period, ns (20 ms).
    factor : int
        Oversampling factor M >= 2 of the fine grid.

    Returns
    -------
    ndarray of shape (numtaps,), float64, read-only
        DC gain 1 (a constant passes unchanged).

    Raises
    ------
    ValueError
        If ``factor < 2`` or ``period_ns <= 0``.
    """
    if factor < 2 or period_ns <= 0:
        raise ValueError(f"anti_alias_taps: need factor >= 2 and period_ns > 0, got {factor} and {period_ns}")
    return _design_taps(int(period_ns), int(factor))


def fir_steady_state(taps: np.ndarray) -> np.ndarray:
    """State of :func:`fir_filter` after a constant input of 1 held forever (``scipy.signal.lfilter_zi`` for ``a = [1, 0, ...]``).

    For a transposed direct-form FIR the steady state is ``z[i] = b[i+1] + ... + b[L-1]``,
    summed from the last tap towards the first, which is the order in which
    ``lfilter_zi``'s triangular solve adds them (bit-identical).

    Parameters
    ----------
    taps : ndarray of shape (L,), L >= 2

    Returns
    -------
    ndarray of shape (L - 1,), float64
    """
    b = np.asarray(taps, np.float64)
    return np.cumsum(b[:0:-1])[::-1].copy()


def fir_filter(taps: np.ndarray, x: np.ndarray, zi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FIR filtering along axis 0 with carried state: numpy's equal of ``scipy.signal.lfilter(b, a, x, axis=0, zi=zi)``.

    The arithmetic is that of scipy's general recurrence (transposed direct form II, which
    scipy runs when ``a`` is as long as ``b``) with ``a = [1, 0, ..., 0]``: output
    ``y[n] = z[0] + b[0] x[n]`` and state ``z[i] <- z[i+1] + b[i+1] x[n]``. Unrolled, each
    output is its chain of products added from the oldest tap to the newest, which is done
    here tap by tap over all samples at once; the sums are formed in scipy's order, so the
    result is bit-identical to scipy's (up to the sign of an exact zero) and does not depend
    on how the input is split into calls.

    Parameters
    ----------
    taps : ndarray of shape (L,), L >= 2
    x : ndarray of shape (N, C), float64
    zi : ndarray of shape (L - 1, C)
        State before ``x`` (from the previous call, or ``fir_steady_state(taps)[:, None] * x0``).

    Returns
    -------
    y : ndarray of shape (N, C)
    zf : ndarray of shape (L - 1, C)
        State after ``x``.

    Raises
    ------
    ValueError
        If the shapes do not fit.
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

    Three steps, each a pure function of the samples seen so far, so the output does not
    depend on how the input is chunked (bit for bit):

    1. linear interpolation of the samples onto the fine grid ``k * period_ns / M`` (M =
       ``factor``), within runs of samples no more than ``max_gap_ns`` apart;
    2. the FIR low-pass of :func:`anti_alias_taps` along each run, through
       :func:`fir_filter` (numpy; bit-identical to ``scipy.signal.lfilter``) with its state
       carried from push to push. A run
       starts from the filter's steady state for its first value and ends by feeding its
       last value (numtaps - 1) / 2 more times, i.e. each run is extended by holding its
       end values, and nothing leaks across a gap;
    3. the output sample for fine point k is the filter output (numtaps - 1) / 2 fine
       samples later (the delay of a linear-phase FIR); only fine points on the output
       grid (k divisible by M) are returned.

    The output covers exactly the output-grid times inside the runs of the input, so the
    :class:`Resampler` sees the same gaps as without the filter.

    Parameters
    ----------
    period_ns : int
        Output grid period, ns; must be divisible by ``factor``.
    factor : int
        Oversampling factor M >= 2 (:func:`anti_alias_factor`).
    max_gap_ns : int
        Longest spacing interpolated across, ns; a longer one ends a run.

    Raises
    ------
    ValueError
        If ``period_ns`` is not divisible by ``factor`` or a setting is not positive.
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
        """Add samples (increasing times, after all earlier ones); return the output that became final.

        Parameters
        ----------
        t_ns : ndarray of shape (n,), int64, strictly increasing
        xyz : ndarray of shape (n, 3), float64

        Returns
        -------
        t_ns : ndarray of shape (m,), int64, multiples of ``period_ns``
        xyz : ndarray of shape (m, 3), float64

        Raises
        ------
        ValueError
            If the times do not increase.
        """
        t = np.asarray(t_ns, np.int64).reshape(-1)
        v = np.asarray(xyz, np.float64).reshape(-1, 3)
        outs: list[tuple[np.ndarray, np.ndarray]] = []
        if t.size == 0:
            return _join(outs)
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
                x, _ = _interpolate(seg_t, seg_v, fine, self.max_gap_ns)
                self._filter(x, outs)
                self._k_next = k_hi + 1
        self._last_t, self._last_v = int(T[-1]), V[-1].copy()
        return _join(outs)

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """End of the stream: flush the open run and return its last output samples."""
        outs: list[tuple[np.ndarray, np.ndarray]] = []
        self._end_run(outs)
        return _join(outs)

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


def _join(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.empty(0, np.int64), np.empty((0, 3))
    return np.concatenate([p[0] for p in parts]), np.vstack([p[1] for p in parts])


@dataclass
class _SuspectGroup:
    """Samples held because their stamps are far from the stream's clock (internal).

    ``t``/``v`` in arrival order, ``top`` their newest stamp, ``seen`` the samples the
    stream's own clock received since the group opened.
    """

    top: int
    t: list[int] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)
    seen: int = 0


class _StreamBuffer:
    """Per-sensor reorder buffer, rate probe, optional anti-alias stage and released history (internal)."""

    def __init__(
        self,
        reorder_ns: int,
        period_ns: int,
        max_gap_ns: int,
        jump_ns: int = CLOCK_JUMP_NS,
        confirm: int = CONFIRM_SAMPLES,
        name: str = "stream",
        warned: set[str] | None = None,
    ) -> None:
        self.reorder_ns = reorder_ns
        self.period_ns, self.max_gap_ns = period_ns, max_gap_ns
        self.jump_ns, self.confirm, self.name = jump_ns, confirm, name
        self._warned = warned if warned is not None else set()
        self.clock_known = False  # False until one group of close stamps has `confirm` samples
        self.groups: list[_SuspectGroup] = []  # held samples far from the stream's clock, oldest first
        self.newest = _INT64_MIN  # newest timestamp seen on the stream's clock (accepted or not)
        self.last_raw = _INT64_MIN  # newest raw sample released so far
        self.pending_t = np.empty(0, np.int64)  # accepted, not yet released (arrival order)
        self.pending_v = np.empty((0, 3), np.float64)
        self.factor: int | None = None  # oversampling factor once the rate is known (1: passed through)
        self._probe_t = np.empty(0, np.int64)  # released raw samples held until the rate is known
        self._probe_v = np.empty((0, 3), np.float64)
        self._decimator: AntiAliasDecimator | None = None
        self.released_t = np.empty(0, np.int64)  # what the grid interpolates from: time-sorted, unique
        self.released_v = np.empty((0, 3), np.float64)
        self.on_accepted: Callable[[str, np.ndarray], None] | None = None  # observer of accepted stamps (Resampler.watch_accepted)

    def push(self, t: np.ndarray, v: np.ndarray, stats: ResampleStats) -> None:
        """Route samples (arrival order) to the stream's clock or to suspect groups (module rule "Clock jumps")."""
        i, n = 0, t.size
        while i < n:
            if self.clock_known and not self.groups:
                # Fast path: everything up to the first stamp far ahead of the running maximum.
                prev = np.maximum.accumulate(np.concatenate([np.array([self.newest], np.int64), t[i : n - 1]]))
                ahead = t[i:] - prev > self.jump_ns  # prev is a real stamp here: no overflow
                far = np.flatnonzero(ahead)
                j = n if far.size == 0 else i + int(far[0])
                self._accept(t[i:j], v[i:j], stats)
                i = j
                if i < n:
                    self._suspect(int(t[i]), v[i], stats)
                    i += 1
            else:
                x = int(t[i])
                if self.clock_known and x <= self.newest + self.jump_ns:
                    self._accept(t[i : i + 1], v[i : i + 1], stats)
                    for g in self.groups:
                        g.seen += 1
                    stale = [g for g in self.groups if g.seen >= self.confirm]
                    for g in stale:
                        self._drop(g, stats)
                else:
                    self._suspect(x, v[i], stats)
                i += 1

    def _suspect(self, x: int, v: np.ndarray, stats: ResampleStats) -> None:
        """Hold a sample far from the stream's clock in the first group it fits, or a new one."""
        g = next((g for g in self.groups if abs(x - g.top) <= self.jump_ns), None)
        if g is None:
            if len(self.groups) >= MAX_SUSPECT_GROUPS:
                self._drop(self.groups[0], stats)
            g = _SuspectGroup(x)
            self.groups.append(g)
        g.t.append(x)
        g.v.append(np.array(v, np.float64))
        g.top = max(g.top, x)
        if len(g.t) >= self.confirm:
            self._take(g, stats)

    def _take(self, g: _SuspectGroup, stats: ResampleStats) -> None:
        """Group ``g`` is the stream's clock from now on; every other held group was an outlier."""
        for other in [o for o in self.groups if o is not g]:
            self._drop(other, stats)
        self.groups = []
        if self.clock_known:
            stats.clock_steps += 1
            self._warn_once(
                "step",
                "%s clock stepped forward by %.3f s; taken as a gap (no window spans it)",
                self.name,
                (g.t[0] - self.newest) / 1e9,
            )
        self.clock_known = True
        self._accept(np.array(g.t, np.int64), np.array(g.v, np.float64).reshape(-1, 3), stats)

    def _drop(self, g: _SuspectGroup, stats: ResampleStats) -> None:
        self.groups = [o for o in self.groups if o is not g]
        stats.outliers_dropped += len(g.t)
        where = "far from the stream's first settled stamps"
        if self.clock_known:
            where = f"{(g.t[0] - self.newest) / 1e9:+.3f} s from the stream's clock"
        self._warn_once(
            "outlier",
            "%s: dropped %d sample(s) stamped %s (a clock outlier); later ones are only counted in outliers_dropped",
            self.name,
            len(g.t),
            where,
        )

    def _warn_once(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(msg, *args)

    def settle(self, stats: ResampleStats) -> None:
        """End of the recording: decide the groups still held (module rule "Clock jumps")."""
        if not self.groups:
            return
        if not self.clock_known:  # the start never settled: the largest group (first among equals) is the clock
            self._take(max(self.groups, key=lambda g: len(g.t)), stats)
            return
        for g in list(self.groups):
            if g in self.groups:
                if len(g.t) > g.seen:
                    self._take(g, stats)
                else:
                    self._drop(g, stats)

    def _accept(self, t: np.ndarray, v: np.ndarray, stats: ResampleStats) -> None:
        if t.size == 0:
            return
        # A sample is late when it is not newer than (running max of earlier arrivals - reorder).
        prev_max = np.maximum.accumulate(np.concatenate([np.array([self.newest], np.int64), t[:-1]]))
        late = t + self.reorder_ns <= prev_max  # written this way round: no int64 underflow
        # Also late if it is not newer than what was already released.
        if self.last_raw != _INT64_MIN:
            late |= t <= self.last_raw
        stats.late_dropped += int(late.sum())
        self.newest = max(self.newest, int(t.max()))
        keep = ~late
        self.pending_t = np.concatenate([self.pending_t, t[keep]])
        self.pending_v = np.vstack([self.pending_v, v[keep]])

    def release(self, final: bool, stats: ResampleStats) -> None:
        if final:
            self.settle(stats)
        t, v = np.empty(0, np.int64), np.empty((0, 3), np.float64)
        if self.pending_t.size:
            cutoff = _INT64_MAX if final else self.newest - self.reorder_ns
            ready = self.pending_t <= cutoff
            if ready.any():
                t, v = self.pending_t[ready], self.pending_v[ready]
                self.pending_t, self.pending_v = self.pending_t[~ready], self.pending_v[~ready]
                order = np.argsort(t, kind="stable")  # stable: first arrival first among equal stamps
                t, v = t[order], v[order]
                first = np.concatenate([[True], t[1:] != t[:-1]])
                first &= t != self.last_raw
                stats.duplicates_dropped += int((~first).sum())
                stats.accepted += int(first.sum())
                t, v = t[first], v[first]
                if t.size:
                    self.last_raw = int(t[-1])
                    if self.on_accepted is not None:
                        self.on_accepted(self.name, t)
        self._condition(t, v, final)

    def _condition(self, t: np.ndarray, v: np.ndarray, final: bool) -> None:
        """Pass released raw samples on to the grid, through the anti-alias stage if the stream is fast."""
        if self.factor is None:
            self._probe_t = np.concatenate([self._probe_t, t])
            self._probe_v = np.vstack([self._probe_v, v])
            if self._probe_t.size <= RATE_PROBE_INTERVALS and not final:
                return
            # Exactly the first RATE_PROBE_INTERVALS spacings, never "all held so far": how many
            # samples one release brings depends on the chunking (one push of a whole recording
            # releases it all at once), and so would the decision.
            first = self._probe_t[: RATE_PROBE_INTERVALS + 1]
            spacing = float(np.median(np.diff(first))) if first.size > 1 else 0.0
            self.factor = anti_alias_factor(spacing, self.period_ns)
            if self.factor > 1:
                self._decimator = AntiAliasDecimator(self.period_ns, self.factor, self.max_gap_ns)
            t, v = self._probe_t, self._probe_v
            self._probe_t, self._probe_v = np.empty(0, np.int64), np.empty((0, 3), np.float64)
        if self._decimator is not None:
            parts = [self._decimator.push(t, v)]
            if final:
                parts.append(self._decimator.close())
            t, v = _join(parts)
        if t.size:
            self.released_t = np.concatenate([self.released_t, t])
            self.released_v = np.vstack([self.released_v, v])

    def trim_before(self, t_keep: int) -> None:
        """Forget released samples that can no longer bracket a grid point >= t_keep."""
        if self.released_t.size < 2:
            return
        j = int(np.searchsorted(self.released_t, t_keep, side="right")) - 1
        if j > 0:
            self.released_t = self.released_t[j:]
            self.released_v = self.released_v[j:]


class Resampler:
    """Two sensor streams in, one exact-grid 6-channel stream out.

    Parameters
    ----------
    period_ns : int
        Grid period in nanoseconds (default 20 ms = 50 Hz).
    max_gap_ns : int
        Longest spacing between two samples of one stream that may be interpolated across
        (default 100 ms = 5 grid periods). Longer gaps split the output.
    reorder_ns : int
        How far back in time a late sample may still be accepted (default 200 ms); this is
        also the output latency, plus the rate probe's :data:`RATE_PROBE_INTERVALS` samples
        at the start of each stream and the anti-alias filter's delay (about 0.12 s) for a
        fast stream.
    jump_ns : int, optional
        A stamp more than this far ahead of its stream's newest sample is suspect (module
        rule "Clock jumps"); default ``max(CLOCK_JUMP_NS, max_gap_ns, reorder_ns)`` (1 s).
    confirm_samples : int
        Samples that decide between a clock step and an outlier (default 25); this is also
        the extra latency after a real gap longer than ``jump_ns``.

    A stream faster than :data:`ANTI_ALIAS_RATIO` times the grid rate is low-passed before
    decimation (:class:`AntiAliasDecimator`); :attr:`factors` tells which.

    Output of :meth:`push` and :meth:`close`: ``(t_ns (m,), values (m, 6))`` with values
    ordered acc x, y, z (m/s^2) then gyro x, y, z (rad/s), float64; grid times increase and
    are multiples of ``period_ns``; a jump larger than one period marks a gap.

    Raises
    ------
    ValueError
        On non-positive settings, an unknown sensor name, or mis-shaped input.
    """

    SENSORS = ("acc", "gyro")

    def __init__(
        self,
        period_ns: int = PERIOD_50HZ_NS,
        max_gap_ns: int = 100_000_000,
        reorder_ns: int = 200_000_000,
        jump_ns: int | None = None,
        confirm_samples: int = CONFIRM_SAMPLES,
    ):
        if period_ns <= 0 or max_gap_ns <= 0 or reorder_ns < 0:
            raise ValueError(
                f"Resampler: period_ns ({period_ns}) and max_gap_ns ({max_gap_ns}) must be > 0, reorder_ns ({reorder_ns}) >= 0"
            )
        if jump_ns is None:
            jump_ns = max(CLOCK_JUMP_NS, int(max_gap_ns), int(reorder_ns))
        if jump_ns < reorder_ns or jump_ns <= 0 or confirm_samples < 1:
            raise ValueError(
                f"Resampler: jump_ns ({jump_ns}) must be > 0 and >= reorder_ns ({reorder_ns}), "
                f"confirm_samples ({confirm_samples}) >= 1; the defaults (1 s, 25) suit 50 Hz sensors"
            )
        self.period_ns = int(period_ns)
        self.max_gap_ns = int(max_gap_ns)
        self.jump_ns, self.confirm_samples = int(jump_ns), int(confirm_samples)
        self.stats = ResampleStats()
        warned: set[str] = set()  # clock warnings are logged once per resampler
        self._streams = {
            s: _StreamBuffer(int(reorder_ns), self.period_ns, self.max_gap_ns, self.jump_ns, self.confirm_samples, s, warned)
            for s in self.SENSORS
        }
        self._next_grid: int | None = None  # next grid time to consider
        self._closed = False

    def watch_accepted(self, observer: Callable[[str, np.ndarray], None] | None) -> None:
        """Call ``observer(sensor, t_ns)`` with the stamps of every sample counted in ``stats.accepted``.

        ``t_ns`` (k,) int64 increases within and across calls for one sensor (samples are
        accepted in time order once their stream is ``reorder_ns`` past them). Observation
        only: the output does not change. None removes the observer.
        """
        for buf in self._streams.values():
            buf.on_accepted = observer

    @property
    def factors(self) -> dict[str, int | None]:
        """Oversampling factor per sensor: 1 = passed through, M >= 2 = low-passed on a period/M grid, None = rate not yet known."""
        return {s: buf.factor for s, buf in self._streams.items()}

    def push(self, sensor: str, t_ns: np.ndarray, xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add samples of one sensor; return the grid samples that became final.

        Parameters
        ----------
        sensor : {"acc", "gyro"}
        t_ns : array of shape (n,), int64 nanoseconds, in arrival order
            Any order and repeats are allowed (see the module rules). Float arrays are
            accepted only if every value is a whole number.
        xyz : array of shape (n, 3): m/s^2 (acc) or rad/s (gyro)

        Returns
        -------
        t_ns : ndarray of shape (m,), int64
            Grid times, multiples of ``period_ns``, increasing across calls.
        values : ndarray of shape (m, 6), float64
            acc x, y, z (m/s^2) then gyro x, y, z (rad/s).

        Raises
        ------
        ValueError
            After :meth:`close`, for an unknown sensor, mis-shaped samples, or timestamps
            that are not integer nanoseconds.
        """
        if self._closed:
            raise ValueError("Resampler: push() after close(); create a new Resampler for a new recording")
        if sensor not in self._streams:
            raise ValueError(f"Resampler: unknown sensor {sensor!r}; expected one of {self.SENSORS}")
        t = _as_ns(t_ns, sensor)
        v = np.asarray(xyz, dtype=np.float64)
        if v.shape != (t.shape[0], 3):
            raise ValueError(f"Resampler: {sensor} samples must have shape ({t.shape[0]}, 3), got {v.shape}")
        finite = np.isfinite(v).all(axis=1)
        if not finite.all():  # a non-finite sample is treated as missing, i.e. a possible gap
            self.stats.nonfinite_dropped += int((~finite).sum())
            t, v = t[finite], v[finite]
        buf = self._streams[sensor]
        buf.push(t, v, self.stats)
        buf.release(False, self.stats)
        return self._emit()

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """End of the recording: release everything still held and return the last grid samples."""
        if self._closed:
            return np.empty(0, np.int64), np.empty((0, 6))
        for buf in self._streams.values():
            buf.release(True, self.stats)
        out = self._emit()
        self._closed = True
        return out

    def _emit(self) -> tuple[np.ndarray, np.ndarray]:
        acc, gyr = self._streams["acc"], self._streams["gyro"]
        if acc.released_t.size == 0 or gyr.released_t.size == 0:
            return np.empty(0, np.int64), np.empty((0, 6))
        p = self.period_ns
        if self._next_grid is None:
            start = max(int(acc.released_t[0]), int(gyr.released_t[0]))
            self._next_grid = -(-start // p) * p  # first multiple of p at or after start
        end = min(int(acc.released_t[-1]), int(gyr.released_t[-1]))
        if end < self._next_grid:
            return np.empty(0, np.int64), np.empty((0, 6))
        # Only grid points outside every gap are generated: materialising the whole range
        # would cost memory and time proportional to a gap's length (a phone clock jump of
        # days would mean billions of points).
        n_range = (end - self._next_grid) // p + 1
        grid = _grid_outside_gaps(self._next_grid, end, p, [acc.released_t, gyr.released_t], self.max_gap_ns)
        if grid.size == 0:
            self._next_grid += n_range * p
            acc.trim_before(self._next_grid)
            gyr.trim_before(self._next_grid)
            self.stats.gap_points_skipped += int(n_range)
            return np.empty(0, np.int64), np.empty((0, 6))
        va, ok_a = _interpolate(acc.released_t, acc.released_v, grid, self.max_gap_ns)
        vg, ok_g = _interpolate(gyr.released_t, gyr.released_v, grid, self.max_gap_ns)
        ok = ok_a & ok_g  # all True by construction of the grid; kept as a guard
        self._next_grid += n_range * p
        acc.trim_before(self._next_grid)
        gyr.trim_before(self._next_grid)
        self.stats.grid_points += int(ok.sum())
        self.stats.gap_points_skipped += int(n_range - ok.sum())
        return grid[ok], np.hstack([va[ok], vg[ok]])


def _grid_outside_gaps(lo: int, hi: int, p: int, streams: list[np.ndarray], max_gap_ns: int) -> np.ndarray:
    """Multiples of ``p`` in ``[lo, hi]`` not strictly inside a gap of any stream.

    A gap is a pair of consecutive samples ``(a, b)`` of one (sorted, unique) stream with
    ``b - a > max_gap_ns``; the grid points ``a < g < b`` cannot be interpolated. ``lo``
    is a multiple of ``p``. Cost is proportional to the number of points returned plus the
    number of gaps, not to the length of the range.
    """
    starts, stops = [], []  # excluded ranges of grid indices, inclusive
    for t in streams:
        big = np.flatnonzero(np.diff(t) > max_gap_ns)
        a, b = t[big], t[big + 1]
        starts.append(a // p + 1)  # first multiple strictly after a
        stops.append(-(-b // p) - 1)  # last multiple strictly before b
    k_lo, k_hi = lo // p, hi // p
    if not any(s.size for s in starts):
        return np.arange(k_lo, k_hi + 1, dtype=np.int64) * p
    ex_start, ex_stop = np.concatenate(starts), np.concatenate(stops)
    order = np.argsort(ex_start, kind="stable")
    segments, k = [], k_lo
    for s, e in zip(ex_start[order].tolist(), ex_stop[order].tolist(), strict=True):
        if e < k or s > e:
            continue
        if s > k_hi:
            break
        if s > k:
            segments.append(np.arange(k, s, dtype=np.int64))
        k = max(k, e + 1)
    if k <= k_hi:
        segments.append(np.arange(k, k_hi + 1, dtype=np.int64))
    if not segments:
        return np.empty(0, np.int64)
    return np.concatenate(segments) * p


def _as_ns(t_ns: np.ndarray, sensor: str) -> np.ndarray:
    """Timestamps as a flat int64 array; floats are accepted only when they are whole numbers."""
    raw = np.asarray(t_ns)
    if raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw)):
            raise ValueError(
                f"Resampler: {sensor} timestamps must be integer nanoseconds; got non-integer floats "
                "(seconds or milliseconds?); convert with (t_s * 1e9).astype(np.int64)"
            )
    elif raw.dtype.kind not in "iu" and raw.size:
        raise ValueError(f"Resampler: {sensor} timestamps must be integer nanoseconds, got dtype {raw.dtype}")
    return raw.astype(np.int64).reshape(-1)


def _interpolate(t: np.ndarray, v: np.ndarray, grid: np.ndarray, max_gap_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation at ``grid`` from sorted unique samples ``(t, v)``.

    Returns ``(values (m, 3), ok (m,))``; ``ok`` is False where the bracketing samples are
    more than ``max_gap_ns`` apart. A grid point that coincides with a sample gets that
    sample's value exactly.
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
