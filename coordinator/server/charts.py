"""Server-side SVG charts of the status page: line charts with axes and labels, and a heat map.

The page draws its charts here, in plain SVG text, so it needs no JavaScript library and no
image library: a chart is a string that goes into the HTML as it is. Every number on a chart
comes from the series it was given; points carry their data values (``data-x``, ``data-y``)
beside their pixel coordinates, so a test (or a reader of the page's source) can check both.

Geometry of a line chart of ``width`` x ``height`` pixels: the plot area spans
``x`` in [:data:`MARGIN_LEFT`, ``width`` - :data:`MARGIN_RIGHT`] and ``y`` in
[:data:`MARGIN_TOP`, ``height`` - :data:`MARGIN_BOTTOM`]; a data value ``v`` in the axis range
[lo, hi] maps linearly, with ``y`` growing downwards (:func:`scale`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

MARGIN_LEFT = 56
MARGIN_RIGHT = 16
MARGIN_TOP = 34
MARGIN_BOTTOM = 42

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
"""Colours of the series of a chart, in order (a colour-blind-tolerant set of eight)."""

HEAT_LOW = (247, 251, 255)
HEAT_HIGH = (8, 48, 107)
"""RGB colours of the heat map's 0 and 1 (white to dark blue); values between mix linearly."""


@dataclass(frozen=True)
class Series:
    """One line of a chart.

    Attributes
    ----------
    name : str
        Shown in the legend.
    points : sequence of (x, y)
        Data points in x order; a NaN or None ``y`` leaves a gap (the measure was not taken).
    """

    name: str
    points: Sequence[tuple[float, float | None]]


def scale(v: float, lo: float, hi: float, a: float, b: float) -> float:
    """Map ``v`` in [lo, hi] linearly onto [a, b]; the middle of [a, b] when lo == hi."""
    if hi == lo:
        return (a + b) / 2
    return a + (v - lo) / (hi - lo) * (b - a)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].

    Raises
    ------
    ValueError
        If ``lo`` or ``hi`` is not finite, ``hi < lo`` or ``n < 2``.
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
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 460,
    height: int = 240,
    y_range: tuple[float, float] | None = None,
    y_format: str = "",
) -> str:
    """An SVG line chart of ``series`` with x and y axes, round ticks, axis labels and a legend.

    Parameters
    ----------
    series : sequence of Series
        Up to eight lines (:data:`PALETTE`); points with a NaN/None y are left out and break the line.
    title, x_label, y_label : str
        Text of the chart (escaped).
    width, height : int
        Size in pixels (>= 160 x 120).
    y_range : (lo, hi), optional
        Fixed y axis (e.g. (0, 1) for accuracy); default: the data's range (0 included for
        non-negative data).
    y_format : str
        ``"%"`` labels y ticks as percentages of 1 (0.5 -> "50%").

    Returns
    -------
    str
        ``<svg>`` element text (well-formed XML). A chart without any finite point says "no data yet".

    Raises
    ------
    ValueError
        For a size below 160 x 120, more than eight series, or a y_range with hi <= lo.
    """
    if width < 160 or height < 120:
        raise ValueError(f"line_chart: size {width}x{height} is too small; use at least 160x120 pixels")
    if len(series) > len(PALETTE):
        raise ValueError(f"line_chart: {len(series)} series, at most {len(PALETTE)} fit one chart")
    if y_range is not None and not y_range[1] > y_range[0]:
        raise ValueError(f"line_chart: y_range {y_range!r} must have hi > lo")
    x0, x1 = MARGIN_LEFT, width - MARGIN_RIGHT
    y0, y1 = MARGIN_TOP, height - MARGIN_BOTTOM
    pts = [(float(x), float(y)) for s in series for x, y in s.points if y is not None and math.isfinite(y) and math.isfinite(x)]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label={quoteattr(title)}>',
        f'<text class="title" x="{x0}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    if not pts:
        out.append(f'<text class="empty" x="{_num((x0 + x1) / 2)}" y="{_num((y0 + y1) / 2)}" text-anchor="middle" '
                   f'font-size="12" fill="#777">no data yet</text>')  # fmt: skip
        out.append("</svg>")
        return "\n".join(out)
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
    out.append(f'<g class="axes" stroke="#444" stroke-width="1">'
               f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/></g>')  # fmt: skip
    for t in yticks:
        ty = _num(sy(t))
        lab = f"{100 * t:.0f}%" if y_format == "%" else _label(t)
        out.append(f'<line class="grid" x1="{x0}" y1="{ty}" x2="{x1}" y2="{ty}" stroke="#ddd"/>'
                   f'<text class="ytick" x="{x0 - 4}" y="{ty}" dy="4" text-anchor="end" font-size="10">{lab}</text>')  # fmt: skip
    for t in xticks:
        tx = _num(sx(t))
        out.append(f'<line x1="{tx}" y1="{y1}" x2="{tx}" y2="{y1 + 4}" stroke="#444"/>'
                   f'<text class="xtick" x="{tx}" y="{y1 + 15}" text-anchor="middle" font-size="10">{_label(t)}</text>')  # fmt: skip
    out.append(f'<text class="xlabel" x="{_num((x0 + x1) / 2)}" y="{height - 6}" text-anchor="middle" font-size="11">'
               f"{escape(x_label)}</text>")  # fmt: skip
    out.append(f'<text class="ylabel" x="12" y="{_num((y0 + y1) / 2)}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 12 {_num((y0 + y1) / 2)})">{escape(y_label)}</text>')  # fmt: skip
    for i, s in enumerate(series):
        colour = PALETTE[i]
        out.append(f'<g class="series" data-name={quoteattr(s.name)} stroke="{colour}" fill="{colour}">')
        run: list[str] = []
        for x, y in [*s.points, (math.nan, None)]:  # the sentinel flushes the last run
            if y is not None and math.isfinite(y) and math.isfinite(x):
                run.append(f"{_num(sx(x))},{_num(sy(y))}")
                out.append(f'<circle cx="{_num(sx(x))}" cy="{_num(sy(y))}" r="2.5" data-x="{x!r}" data-y="{y!r}"/>')
            else:
                if len(run) > 1:
                    out.append(f'<polyline fill="none" stroke-width="1.5" points="{" ".join(run)}"/>')
                run = []
        out.append("</g>")
        lx = x1 - 130
        ly = 14 + 12 * i if len(series) > 1 else 14
        if len(series) > 1:
            out.append(f'<g class="legend"><rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{colour}"/>'
                       f'<text x="{lx + 14}" y="{ly - 4}" font-size="10">{escape(s.name)}</text></g>')  # fmt: skip
    out.append("</svg>")
    return "\n".join(out)


def heat_colour(v: float) -> str:
    """``rgb(r,g,b)`` of ``v`` clipped to [0, 1] between :data:`HEAT_LOW` and :data:`HEAT_HIGH`; grey for NaN."""
    if not math.isfinite(v):
        return "rgb(204,204,204)"
    t = min(1.0, max(0.0, v))
    r, g, b = (round(lo + t * (hi - lo)) for lo, hi in zip(HEAT_LOW, HEAT_HIGH, strict=True))
    return f"rgb({r},{g},{b})"


def heat_map(matrix: Sequence[Sequence[float]], labels: Sequence[str], *, title: str, cell: int = 28) -> str:
    """An SVG heat map of a square matrix in [0, 1], e.g. FedDWA's p_ij (row i target, column j source).

    Parameters
    ----------
    matrix : (n, n) nested sequence of float
        Values in [0, 1] (clipped for colour); each cell shows its value with two decimals when
        ``n`` <= 12.
    labels : sequence of str, length n
        Row and column names (client ids).
    title : str
    cell : int
        Side of one cell in pixels (>= 8).

    Returns
    -------
    str
        ``<svg>`` text with n*n ``<rect class="cell">`` elements, in row-major order, each with
        ``data-i``, ``data-j`` and ``data-value``.

    Raises
    ------
    ValueError
        If the matrix is not n x n for the n labels, or ``cell`` < 8.

    Notes
    -----
    FedDWA: Liu et al., IJCAI 2023, Eq. 17 (the weights this map shows).
    """
    n = len(labels)
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"heat_map: the matrix must be {n} x {n} for {n} labels")
    if cell < 8:
        raise ValueError(f"heat_map: cell {cell} px is too small; use at least 8")
    left = 8 + 7 * max((len(s) for s in labels), default=1)
    top = 40 + 7 * max((len(s) for s in labels), default=1)
    width, height = max(left + n * cell + 16, 300), top + n * cell + 24
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label={quoteattr(title)}>',
        f'<text class="title" x="8" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    if n == 0:
        out.append('<text class="empty" x="8" y="40" font-size="12" fill="#777">no data yet</text></svg>')
        return "\n".join(out)
    for j, name in enumerate(labels):
        x = left + j * cell + cell / 2
        out.append(f'<text class="col" x="{_num(x)}" y="{top - 4}" font-size="10" '
                   f'transform="rotate(-60 {_num(x)} {top - 4})">{escape(name)}</text>')  # fmt: skip
    for i, name in enumerate(labels):
        y = top + i * cell + cell / 2
        out.append(f'<text class="row" x="{left - 4}" y="{_num(y)}" dy="4" text-anchor="end" font-size="10">{escape(name)}</text>')
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            x, y = left + j * cell, top + i * cell
            out.append(f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{heat_colour(v)}" '
                       f'data-i="{i}" data-j="{j}" data-value="{v!r}"><title>{escape(labels[i])} from {escape(labels[j])}: '
                       f"{v:.3f}</title></rect>")  # fmt: skip
            if n <= 12:
                ink = "#fff" if math.isfinite(v) and v > 0.5 else "#000"
                out.append(f'<text x="{_num(x + cell / 2)}" y="{_num(y + cell / 2)}" dy="3" text-anchor="middle" '
                           f'font-size="8" fill="{ink}">{v:.2f}</text>')  # fmt: skip
    out.append(f'<text class="note" x="8" y="{height - 8}" font-size="10">row i: target client, column j: source</text>')
    out.append("</svg>")
    return "\n".join(out)
