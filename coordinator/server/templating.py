"""The status site's templates: one Jinja2 environment with autoescaping, and the filters its templates use.

Every piece of the page's markup, its SVG charts included, comes from a template under
``coordinator/server/templates/``, rendered by :func:`render` (or by Starlette's
:class:`~starlette.templating.Jinja2Templates` over the same environment, :func:`templates`).
Autoescaping is on for ``.html`` and ``.svg`` templates, so a device name, an owner or a reason
that holds ``<script>`` reaches the page as text. The filters below turn values into words
(times, ages, percentages, sizes); they return plain text, never markup.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jinja2

from har_models.nn.metrics import pct

STAMP = "%Y-%m-%d %H:%M:%S %Z"
"""How the page writes a time: the server's local time with its zone."""

DASH = "—"
"""What the page writes for a value it does not have."""


def dash(v: Any) -> Any:
    """``v``, or :data:`DASH` for None."""
    return DASH if v is None else v


def stamp(t: float) -> str:
    """``t`` (s since the epoch) as the server's local time with its zone (:data:`STAMP`)."""
    return time.strftime(STAMP, time.localtime(t))


def ago(t: float, now: float) -> str:
    """How far ``t`` is from ``now`` in words: ``42 s ago``, ``in 5 min``, ``3.5 h ago``."""
    age = now - t
    if abs(age) < 120:
        n, unit = f"{abs(age):.0f}", "s"
    elif abs(age) < 7200:
        n, unit = f"{abs(age) / 60:.0f}", "min"
    else:
        n, unit = f"{abs(age) / 3600:.1f}", "h"
    return f"{n} {unit} ago" if age >= 0 else f"in {n} {unit}"


def age(seconds: float) -> str:
    """An age in words: ``1.5 s``, ``42 s``, ``12 min``, ``3.2 h``, ``4.0 days``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def percent(v: float | None) -> str:
    """A fraction as a percentage with one decimal (``0.5`` -> ``50.0%``); :data:`DASH` for None or NaN."""
    return pct(v, missing=DASH)


def plural(n: int, noun: str) -> str:
    """``noun`` for one, ``noun + "s"`` for any other count."""
    return noun if n == 1 else noun + "s"


def size(n: float | None) -> str:
    """Bytes in words with the unit that fits (``812 kB``, ``1.3 GB``; powers of 1000); :data:`DASH` for None."""
    if n is None:
        return DASH
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def fixed(v: float | None, digits: int = 1) -> str:
    """``v`` with ``digits`` decimals; :data:`DASH` for None."""
    return DASH if v is None else f"{v:.{digits}f}"


FILTERS = {"dash": dash, "stamp": stamp, "ago": ago, "age": age, "percent": percent, "plural": plural, "size": size, "fixed": fixed}


@functools.cache
def environment() -> jinja2.Environment:
    """The one environment of the site's templates (built once): autoescaping for .html and .svg, undefined names an error."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("coordinator.server", "templates"),
        autoescape=jinja2.select_autoescape(["html", "svg"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    return env


@functools.cache
def templates() -> Any:
    """Starlette's :class:`~starlette.templating.Jinja2Templates` over :func:`environment` (for routes' TemplateResponse)."""
    from starlette.templating import Jinja2Templates

    return Jinja2Templates(env=environment())


def render(template: str, /, **context: Any) -> str:
    """Template ``template`` rendered with ``context`` (escaped as its extension says).

    Raises
    ------
    jinja2.TemplateNotFound
        For a template the package does not hold.
    jinja2.UndefinedError
        When the template reads a name the context lacks.
    """
    return environment().get_template(template).render(**context)
