"""The marks of the model versions (:data:`MARKS`), as ``fedhar-coordinator versions`` and the status page show them.

``newest``: the highest number; ``best``: the newest version of the quality guard's best round;
``rolled back``: judged worse than the best by more than the margin; ``pinned``: named by an
operator's pin or rollback (audit log); ``pin requested`` / ``rollback requested``: named by a
request a running ``serve`` has not taken up yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MARKS = ("newest", "best", "rolled back", "pinned", "pin requested", "rollback requested")
"""Every mark a version may carry, in the order the page lists them."""

_TO_VERSION = re.compile(r"\bto version (\d+)\b")


def operator_versions(entries: Iterable[Any]) -> dict[int, str]:
    """Version -> the action ("pin", "rollback") of the newest audit entry that named it (a rollback to the best names none)."""
    out = {}
    for e in entries:
        if e.action in ("pin", "rollback") and (m := _TO_VERSION.search(e.detail or "")):
            out[int(m.group(1))] = e.action
    return out


def version_marks(versions: Sequence[int], rounds: Mapping[int, int], best_round: int | None, rolled_back: set[int],
                  pinned: Mapping[int, str], requested: tuple[str, int | None] | None) -> dict[int, list[str]]:  # fmt: skip
    """The marks of each kept version, from its round, the guard's best round and rollbacks, ``pinned`` and the pending request."""
    newest = max(versions, default=None)
    best = max((v for v in versions if best_round is not None and rounds[v] == best_round), default=None)
    out: dict[int, list[str]] = {}
    for v in versions:
        marks = {"newest": v == newest, "best": v == best, "rolled back": rounds[v] in rolled_back, "pinned": v in pinned,
                 "pin requested": requested == ("pin", v), "rollback requested": requested == ("rollback", v)}  # fmt: skip
        out[v] = [m for m in MARKS if marks[m]]
    return out
