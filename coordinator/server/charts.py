"""Server-side SVG charts of the status page: line charts with axes and labels, and a heat map.

Geometry (ticks, coordinates, buckets) is computed here and written by the autoescaped templates
``chart.svg`` and ``heatmap.svg``, so the page needs no JavaScript or image library. Points carry their
data values (``data-x``, ``data-y``) beside their pixels, so tests can check both. The plot area of a
``width`` x ``height`` chart spans x in [:data:`MARGIN_LEFT`, width - :data:`MARGIN_RIGHT`] and y in
[:data:`MARGIN_TOP`, height - :data:`MARGIN_BOTTOM`], y growing downwards (:func:`scale`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.server.templating import render

MARGIN_LEFT = 56
MARGIN_RIGHT = 16
MARGIN_TOP = 34
MARGIN_BOTTOM = 42

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
"""Colours of a chart's series, in order (a colour-blind-tolerant set of eight)."""

HEAT_LOW = (247, 251, 255)
HEAT_HIGH = (8, 48, 107)
"""RGB colours of the heat map's 0 and 1 (white to dark blue), mixed linearly."""


@dataclass(frozen=True)
class Series:
    """One line of a chart: a legend name and (x, y) points in x order; a NaN or None ``y`` is a gap."""

    name: str
    points: Sequence[tuple[float, float | None]]


MAX_POINTS = 120
"""Points a line chart draws per series at most; a longer series is drawn in buckets (:func:`downsample`)."""


@dataclass(frozen=True)
class Bucket:
    """Consecutive points drawn as one: mean ``y`` at midpoint ``x``, band [``lo``, ``hi``] (None: a gap), ``n`` points."""

    x: float
    y: float | None
    lo: float | None
    hi: float | None
    n: int


def downsample(points: Sequence[tuple[float, float | None]], max_points: int = MAX_POINTS) -> list[Bucket]:
    """``points`` cut into at most ``max_points`` buckets of ``ceil(len / max_points)`` consecutive points.

    Keeps a year of 10-minute rounds (52,560 points) a small chart whose band still shows every extreme;
    one bucket per point when there are few. Raises ValueError if ``max_points`` < 1.
    """
    if max_points < 1:
        raise ValueError(f"downsample: max_points must be at least 1, got {max_points}")
    size = max(1, math.ceil(len(points) / max_points))
    out = []
    for i in range(0, len(points), size):
        chunk = points[i : i + size]
        ys = [float(y) for _, y in chunk if y is not None and math.isfinite(y)]
        x = (float(chunk[0][0]) + float(chunk[-1][0])) / 2
        if ys:
            out.append(Bucket(x, math.fsum(ys) / len(ys), min(ys), max(ys), len(chunk)))
        else:
            out.append(Bucket(x, None, None, None, len(chunk)))
    return out


class Sketch:
    """A series folded point by point into at most ``max_buckets`` (>= 2, else ValueError) equal buckets.

    ``size`` starts at 1 and doubles (neighbours merged pairwise) when one more bucket would not fit:
    O(1) amortised per point, O(``max_buckets``) memory, so a year-long chart stays current.
    """

    def __init__(self, max_buckets: int = MAX_POINTS):
        if max_buckets < 2:
            raise ValueError(f"Sketch: max_buckets must be at least 2, got {max_buckets}")
        self.max_buckets = max_buckets
        self.size = 1
        self._b: list[list[float]] = []  # x first, x last, sum of finite y, finite count, lo, hi, points

    def add(self, x: float, y: float | None) -> None:
        """Append the point (x, y); a None or NaN y is a gap. Points must come in x order."""
        fin = y is not None and math.isfinite(y)
        v = float(y) if fin and y is not None else 0.0
        if self._b and self._b[-1][6] < self.size:
            b = self._b[-1]
            b[1] = float(x)
            b[6] += 1
            if fin:
                b[2] += v
                b[3] += 1
                b[4], b[5] = min(b[4], v), max(b[5], v)
            return
        self._b.append([float(x), float(x), v, 1.0 if fin else 0.0, v if fin else math.inf, v if fin else -math.inf, 1.0])
        if len(self._b) > self.max_buckets:
            merged = []
            for i in range(0, len(self._b), 2):
                a = self._b[i]
                if i + 1 < len(self._b):
                    c = self._b[i + 1]
                    a = [a[0], c[1], a[2] + c[2], a[3] + c[3], min(a[4], c[4]), max(a[5], c[5]), a[6] + c[6]]
                merged.append(a)
            self._b = merged
            self.size *= 2

    def buckets(self) -> list[Bucket]:
        """The buckets so far."""
        return [Bucket((b[0] + b[1]) / 2, b[2] / b[3], b[4], b[5], int(b[6])) if b[3] else
                Bucket((b[0] + b[1]) / 2, None, None, None, int(b[6])) for b in self._b]  # fmt: skip


@dataclass(frozen=True)
class BucketSeries:
    """One line of a chart given as buckets (:func:`downsample`, :class:`Sketch`) instead of points."""

    name: str
    buckets: Sequence[Bucket]


def scale(v: float, lo: float, hi: float, a: float, b: float) -> float:
    """Map ``v`` in [lo, hi] linearly onto [a, b]; the middle of [a, b] when lo == hi."""
    if hi == lo:
        return (a + b) / 2
    return a + (v - lo) / (hi - lo) * (b - a)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].

    Raises ValueError if ``lo`` or ``hi`` is not finite, ``hi < lo`` or ``n < 2``.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo or n < 2:
        raise ValueError(f"nice_ticks: need finite lo <= hi and n >= 2, got lo={lo!r}, hi={hi!r}, n={n!r}")
    if hi == lo:
        return [lo]
    raw = (hi - lo) / (n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    t = first
    while t <= hi + step * 1e-9:
        out.append(round(t, 12))
        t += step
    return out


def _num(v: float) -> str:
    """A coordinate with at most two decimals (no trailing zeros)."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def _label(v: float) -> str:
    """A tick label: an integer without decimals, else up to three significant decimals."""
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.3g}"


def line_chart(
    series: Sequence[Series | BucketSeries],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 460,
    height: int = 240,
    y_range: tuple[float, float] | None = None,
    y_format: str = "",
    max_points: int = MAX_POINTS,
) -> str:
    """An SVG line chart (``<svg>`` text) of up to eight series with axes, round ticks, labels and a legend.

    A series over ``max_points`` is drawn in buckets: a line through the means and a band from minimum
    to maximum (circles carry ``data-lo``, ``data-hi``, ``data-n``). ``y_range`` fixes the y axis
    (default the data's, 0 included for non-negative data); ``y_format="%"`` labels 0.5 as "50%". A chart
    without a finite point says "no data yet". Raises ValueError for a size below 160 x 120, more than
    eight series, or a y_range with hi <= lo.
    """
    if width < 160 or height < 120:
        raise ValueError(f"line_chart: size {width}x{height} is too small; use at least 160x120 pixels")
    if len(series) > len(PALETTE):
        raise ValueError(f"line_chart: {len(series)} series, at most {len(PALETTE)} fit one chart")
    if y_range is not None and not y_range[1] > y_range[0]:
        raise ValueError(f"line_chart: y_range {y_range!r} must have hi > lo")
    x0, x1 = MARGIN_LEFT, width - MARGIN_RIGHT
    y0, y1 = MARGIN_TOP, height - MARGIN_BOTTOM
    plain: list[Sequence[tuple[float, float | None]] | None] = []
    bucketed: list[Sequence[Bucket] | None] = []
    for s in series:
        if isinstance(s, BucketSeries) and all(k.n == 1 for k in s.buckets):
            plain.append([(k.x, k.y) for k in s.buckets])
            bucketed.append(None)
        elif isinstance(s, BucketSeries):
            plain.append(None)
            bucketed.append(s.buckets)
        elif len(s.points) > max_points:
            plain.append(None)
            bucketed.append(downsample(s.points, max_points))
        else:
            plain.append(s.points)
            bucketed.append(None)
    pts = []
    for ps, b in zip(plain, bucketed, strict=True):
        if ps is not None:
            pts += [(float(x), float(y)) for x, y in ps if y is not None and math.isfinite(y) and math.isfinite(x)]
        elif b is not None:
            pts += [(k.x, v) for k in b if k.lo is not None and k.hi is not None and math.isfinite(k.x) for v in (k.lo, k.hi)]
    chart: dict[str, Any] = {"width": width, "height": height, "title": title, "x0": x0, "x1": x1, "y0": y0, "y1": y1,
                             "mid_x": _num((x0 + x1) / 2), "mid_y": _num((y0 + y1) / 2), "empty": not pts}  # fmt: skip
    if not pts:
        return render("chart.svg", chart=chart)
    xlo, xhi = min(p[0] for p in pts), max(p[0] for p in pts)
    if y_range is not None:
        ylo, yhi = y_range
    else:
        ylo, yhi = min(p[1] for p in pts), max(p[1] for p in pts)
        if ylo >= 0:
            ylo = 0.0
        if yhi == ylo:
            yhi = ylo + 1.0
    xticks = [t for t in nice_ticks(xlo, xhi, 6) if float(t).is_integer()] if xhi > xlo else [xlo]
    yticks = nice_ticks(ylo, yhi, 6)
    if y_range is None and yticks[-1] < yhi:  # let the axis end on a tick above the data
        step = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
        yticks.append(round(yticks[-1] + step, 12))
        yhi = yticks[-1]
    sx = lambda v: scale(v, xlo, xhi, x0, x1)  # noqa: E731
    sy = lambda v: scale(v, ylo, yhi, y1, y0)  # noqa: E731
    chart["yticks"] = [(_num(sy(t)), f"{100 * t:.0f}%" if y_format == "%" else _label(t)) for t in yticks]
    chart["xticks"] = [(_num(sx(t)), _label(t)) for t in xticks]
    chart["x_label"], chart["y_label"] = x_label, y_label
    drawn = [i for i, (ps, b) in enumerate(zip(plain, bucketed, strict=True))
             if (ps is not None and any(math.isfinite(x) and y is not None and math.isfinite(y) for x, y in ps))
             or (b is not None and any(k.y is not None for k in b))]  # fmt: skip
    chart["series"] = []
    for i, s in enumerate(series):
        ps, b = plain[i], bucketed[i]
        marks = _point_marks(ps, sx, sy) if ps is not None else _bucket_marks(b or (), sx, sy)
        legend = {"x": x1 - 130, "y": 14 + 12 * drawn.index(i)} if len(drawn) > 1 and i in drawn else None
        chart["series"].append({"name": s.name, "colour": PALETTE[i], "legend": legend, **marks})
    sizes = [k.n for b in bucketed if b is not None for k in b]
    chart["note"] = f"each point: mean of up to {max(sizes)} rounds; band: their lowest to highest" if sizes else None
    return render("chart.svg", chart=chart)


def _point_marks(points: Sequence[tuple[float, float | None]], sx: Callable[[float], float],
                 sy: Callable[[float], float]) -> dict[str, list[Any]]:  # fmt: skip
    """One circle per finite point and a polyline through each run of them (a gap breaks the line)."""
    circles, lines, run = [], [], []
    for x, y in [*points, (math.nan, None)]:  # the sentinel flushes the last run
        if y is not None and math.isfinite(y) and math.isfinite(x):
            run.append(f"{_num(sx(x))},{_num(sy(y))}")
            circles.append({"cx": _num(sx(x)), "cy": _num(sy(y)), "r": "2.5", "data": {"x": repr(x), "y": repr(y)}})
        else:
            if len(run) > 1:
                lines.append((" ".join(run), "1.5"))
            run = []
    return {"bands": [], "lines": lines, "circles": circles}


def _bucket_marks(buckets: Sequence[Bucket], sx: Callable[[float], float], sy: Callable[[float], float]) -> dict[str, list[Any]]:
    """Per run of buckets with data: a band polygon (lows to highs), a polyline through the means, a small circle each."""
    bands, lines, circles = [], [], []
    run: list[Bucket] = []
    for k in [*buckets, Bucket(math.nan, None, None, None, 0)]:  # the sentinel flushes the last run
        if k.y is not None and math.isfinite(k.x):
            run.append(k)
            continue
        if run:
            edge = [f"{_num(sx(r.x))},{_num(sy(r.hi))}" for r in run if r.hi is not None]
            edge += [f"{_num(sx(r.x))},{_num(sy(r.lo))}" for r in reversed(run) if r.lo is not None]
            bands.append(" ".join(edge))
            if len(run) > 1:
                lines.append((" ".join(f"{_num(sx(r.x))},{_num(sy(r.y))}" for r in run if r.y is not None), "1.2"))
            for r in run:
                assert r.y is not None
                circles.append({"cx": _num(sx(r.x)), "cy": _num(sy(r.y)), "r": "1.2",
                                "data": {"x": repr(r.x), "y": repr(r.y), "lo": repr(r.lo), "hi": repr(r.hi), "n": str(r.n)}})  # fmt: skip
        run = []
    return {"bands": bands, "lines": lines, "circles": circles}


def heat_colour(v: float) -> str:
    """``rgb(r,g,b)`` of ``v`` clipped to [0, 1] between :data:`HEAT_LOW` and :data:`HEAT_HIGH`; grey for NaN."""
    if not math.isfinite(v):
        return "rgb(204,204,204)"
    t = min(1.0, max(0.0, v))
    r, g, b = (round(lo + t * (hi - lo)) for lo, hi in zip(HEAT_LOW, HEAT_HIGH, strict=True))
    return f"rgb({r},{g},{b})"


def heat_map(matrix: Sequence[Sequence[float]], labels: Sequence[str], *, title: str, cell: int = 28) -> str:
    """An SVG heat map of a square matrix in [0, 1], e.g. FedDWA's p_ij (Liu et al., IJCAI 2023, Eq. 17; row i target).

    Cells are ``<rect class="cell">`` in row-major order with ``data-i``, ``data-j``, ``data-value``, and
    show their value when n <= 12. Raises ValueError if the matrix is not n x n or ``cell`` < 8 px.
    """
    n = len(labels)
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"heat_map: the matrix must be {n} x {n} for {n} labels")
    if cell < 8:
        raise ValueError(f"heat_map: cell {cell} px is too small; use at least 8")
    left = 8 + 7 * max((len(s) for s in labels), default=1)
    top = 40 + 7 * max((len(s) for s in labels), default=1)
    cells = [{"i": i, "j": j, "x": left + j * cell, "y": top + i * cell, "fill": heat_colour(v), "value": repr(v),
              "title": f"{labels[i]} from {labels[j]}: {v:.3f}", "text": f"{v:.2f}" if n <= 12 else None,
              "tx": _num(left + j * cell + cell / 2), "ty": _num(top + i * cell + cell / 2),
              "ink": "#fff" if math.isfinite(v) and v > 0.5 else "#000"}
             for i, row in enumerate(matrix) for j, v in enumerate(row)]  # fmt: skip
    cols = [{"x": _num(left + j * cell + cell / 2), "name": name} for j, name in enumerate(labels)]
    rows = [{"y": _num(top + i * cell + cell / 2), "name": name} for i, name in enumerate(labels)]
    width, height = max(left + n * cell + 16, 300), top + n * cell + 24
    return render("heatmap.svg", map={"width": width, "height": height, "title": title, "left": left, "top": top, "cell": cell,
                                      "cells": cells, "cols": cols, "rows": rows})  # fmt: skip
