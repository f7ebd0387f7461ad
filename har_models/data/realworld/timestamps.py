"""The unit of a sensor CSV's time column, told from its values, and its safe conversion to int64 ns.

REALWORLD stamps rows with Unix epoch milliseconds (``System.currentTimeMillis()`` in the
recording app). Files re-exported by other tools carry whole or fractional seconds,
microseconds or nanoseconds instead; read as milliseconds they either collapse (whole
seconds: ~50 rows share each stamp, nothing is windowed) or overflow 64-bit nanoseconds
(microseconds and nanoseconds times 10^6 exceed 9.2e18). Two independent clues name the
unit:

* **spacing**: the median spacing of the sorted stamps must give a sampling rate in
  :data:`PLAUSIBLE_RATE_HZ` (5-1000 Hz; the app asks for 50 Hz). Units are 1000 apart and
  that band spans a factor of 200, so at most one unit fits;
* **magnitude**: the median stamp read as Unix epoch time must fall in
  :data:`EPOCH_RANGE_S` (2000-2100). Again at most one unit fits.

Milliseconds by spacing are accepted as they always were (also for clocks that do not
count from 1970). Another unit is converted only when the magnitude agrees with the
spacing, or says nothing; every other case is rejected with the suspected unit named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
"""Nanoseconds per unit."""

UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
"""Unit names for messages."""

EPOCH_RANGE_S = (946_684_800, 4_102_444_800)
"""Plausible Unix epoch times, s: 2000-01-01 to 2100-01-01 UTC."""

PLAUSIBLE_RATE_HZ = (5.0, 1000.0)
"""Sampling rates a phone or board sensor stream can have, Hz."""

INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class TimeUnitGuess:
    """What the time column's values say about their unit.

    Attributes
    ----------
    unit : {"s", "ms", "us", "ns"} or None
        The unit to convert from; None when the file must be rejected.
    by_spacing : str or None
        The unit in which the median spacing gives a plausible sampling rate.
    by_epoch : str or None
        The unit in which the median value is a plausible Unix epoch time.
    rate_hz : float
        Sampling rate implied by the median spacing in ``by_spacing`` (0 if none).
    reason : str
        Why the file is rejected, naming the suspected unit ("" when ``unit`` is set).
    """

    unit: str | None
    by_spacing: str | None
    by_epoch: str | None
    rate_hz: float
    reason: str


def guess_time_unit(t: np.ndarray) -> TimeUnitGuess:
    """Tell the unit of a column of timestamps (module docstring for the rules).

    Parameters
    ----------
    t : ndarray of shape (n,), float64
        Finite, positive stamps as parsed, in file order.

    Returns
    -------
    TimeUnitGuess
        ``unit`` "ms" for fewer than two distinct stamps unless their magnitude names
        another unit (one row cannot show a spacing).
    """
    t = np.asarray(t, np.float64)
    by_epoch = _by_epoch(float(np.median(t))) if t.size else None
    distinct = np.unique(t)
    if distinct.size < 2:
        return TimeUnitGuess(by_epoch or "ms", None, by_epoch, 0.0, "")
    median_spacing = float(np.median(np.diff(np.sort(t))))
    if median_spacing == 0.0:  # most rows share their stamp with a neighbour
        mean_spacing = float(distinct[-1] - distinct[0]) / (t.size - 1)
        suspect = by_epoch or _by_spacing(mean_spacing)
        return TimeUnitGuess(
            None,
            None,
            by_epoch,
            0.0,
            f"stamps repeat ({t.size / distinct.size:.0f} rows per distinct value, {np.median(np.diff(distinct)):g} apart), "
            f"coarser than the sampling: this looks like whole {UNIT_NAMES.get(suspect or '', 'units of an unknown size')}, "
            "and the sub-second timing the 50 Hz grid needs is lost",
        )
    by_spacing = _by_spacing(median_spacing)
    if by_spacing is None:
        hint = f"; the magnitude suggests Unix epoch {UNIT_NAMES[by_epoch]}" if by_epoch else ""
        return TimeUnitGuess(
            None,
            None,
            by_epoch,
            0.0,
            f"median spacing {median_spacing:g} gives no sampling rate between {PLAUSIBLE_RATE_HZ[0]:g} and "
            f"{PLAUSIBLE_RATE_HZ[1]:g} Hz in seconds, milliseconds, microseconds or nanoseconds{hint}",
        )
    rate = 1e9 / (median_spacing * UNIT_NS[by_spacing])
    if by_spacing == "ms" or by_epoch in (None, by_spacing):
        return TimeUnitGuess(by_spacing, by_spacing, by_epoch, rate, "")
    return TimeUnitGuess(
        None,
        by_spacing,
        by_epoch,
        rate,
        f"the values look like Unix epoch {UNIT_NAMES[by_epoch]} but their spacing like {UNIT_NAMES[by_spacing]} "
        f"at {rate:.0f} Hz; the unit is uncertain (suspected {UNIT_NAMES[by_spacing]})",
    )


def to_ns(t: np.ndarray, unit: str, exact: list[int] | None = None) -> np.ndarray:
    """Timestamps in ``unit`` as int64 nanoseconds, refusing anything that would overflow.

    Parameters
    ----------
    t : ndarray of shape (n,), float64
        Stamps as parsed (whole numbers except for seconds).
    unit : {"s", "ms", "us", "ns"}
    exact : list of int, optional
        The same stamps parsed as exact integers (float64 holds whole numbers exactly only
        up to 2^53 = 9.0e15, less than epoch nanoseconds); used for "us" and "ns".

    Returns
    -------
    ndarray of shape (n,), int64
        Seconds are rounded to the microsecond (float64 resolves about 0.2 us at epoch
        magnitudes), the other units are exact.

    Raises
    ------
    OverflowError
        If a stamp in ns would exceed 2^63 - 1 (the message says by how much).
    """
    factor = UNIT_NS[unit]
    if t.size == 0:
        return np.empty(0, np.int64)
    top = max(exact) if exact is not None else float(np.max(t))
    if top * factor > INT64_MAX:
        raise OverflowError(f"the largest stamp {top:g} {UNIT_NAMES[unit]} is {top * factor:.3g} ns, beyond int64 (9.22e18 ns)")
    if unit == "s":
        return np.round(t * 1e6).astype(np.int64) * 1000
    if unit == "ms":
        return t.astype(np.int64) * 1_000_000
    if exact is not None:
        return np.array(exact, dtype=np.int64) * factor
    return t.astype(np.int64) * factor


def _by_epoch(value: float) -> str | None:
    lo, hi = EPOCH_RANGE_S
    return next((u for u, f in UNIT_NS.items() if lo <= value * f / 1e9 <= hi), None)


def _by_spacing(spacing: float) -> str | None:
    lo, hi = PLAUSIBLE_RATE_HZ
    return next((u for u, f in UNIT_NS.items() if spacing > 0 and lo <= 1e9 / (spacing * f) <= hi), None)
