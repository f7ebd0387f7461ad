"""A model version's figures as every release wrote them, read under today's names.

Releases before this one wrote a version's personalisation figures as ``personalization_accuracy``
and ``personalization_macro_f1`` (``server.sqlite``'s ``versions.figures``); fedhar spells it
"personalisation" everywhere. :func:`read_figures` gives one spelling whatever the writer used, so
the registry, the status page and ``devices versions`` read old and new data folders alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OLD_PREFIX = "personalization_"
"""The prefix older releases wrote (and this release still reads)."""

PREFIX = "personalisation_"
"""The prefix of a version's personalisation figures."""


def read_figures(figures: Mapping[str, Any]) -> dict[str, Any]:
    """``figures`` with every ``personalization_*`` key renamed ``personalisation_*``, order kept.

    Where both spellings are present (a folder upgraded mid-write) the new one wins.

    Examples
    --------
    >>> read_figures({"personalization_macro_f1": 0.5, "global_accuracy": None})
    {'personalisation_macro_f1': 0.5, 'global_accuracy': None}
    """
    out: dict[str, Any] = {}
    for key, value in figures.items():
        new = PREFIX + key[len(OLD_PREFIX) :] if key.startswith(OLD_PREFIX) else key
        if new != key and new in figures:
            continue
        out[new] = value
    return out
