"""The marks of the model versions: newest, best, rolled back, pinned, requested.

A version is the shared model a served round made (``serve`` keeps one per completed round,
``<data>/versions/``). Its marks, from the sources ``fedhar-coordinator versions`` reads (the
registry's versions, the quality guard's decisions in the round records, the audit log, the
pending ``model_request.json``); the status page shows them (:mod:`coordinator.server.web`):

* ``newest`` — the highest version number;
* ``best`` — the newest version of the quality guard's best round (the round its newest decision names);
* ``rolled back`` — a version the guard judged worse than the best by more than its margin;
* ``pinned`` — a version an operator's ``pin VERSION`` or ``rollback VERSION`` named (the audit log);
* ``pin requested`` / ``rollback requested`` — named by a request a running ``serve`` has not taken up yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MARKS = ("newest", "best", "rolled back", "pinned", "pin requested", "rollback requested")
"""Every mark a version may carry, in the order the page lists them."""

_TO_VERSION = re.compile(r"\bto version (\d+)\b")


def operator_versions(entries: Iterable[Any]) -> dict[int, str]:
    """Versions named by operators' ``pin``/``rollback`` audit entries (:class:`coordinator.server.audit.AuditEntry`).

    Returns version -> the action of the newest entry that named it ("pin" or "rollback"). A rollback
    to the guard's best version names none.
    """
    out = {}
    for e in entries:
        if e.action in ("pin", "rollback") and (m := _TO_VERSION.search(e.detail or "")):
            out[int(m.group(1))] = e.action
    return out


def version_marks(versions: Sequence[int], rounds: Mapping[int, int], best_round: int | None, rolled_back: set[int],
                  pinned: Mapping[int, str], requested: tuple[str, int | None] | None) -> dict[int, list[str]]:  # fmt: skip
    """The marks (:data:`MARKS`) of each version.

    Parameters
    ----------
    versions : sequence of int
        Every kept version.
    rounds : mapping version -> round
        The round that made each version.
    best_round : int or None
        The guard's best round (None: it judged none).
    rolled_back : set of int
        Rounds whose version the guard rolled back.
    pinned : mapping version -> action
        :func:`operator_versions`.
    requested : (action, version) or None
        The pending operator request (``model_request.json``), if any.
    """
    newest = max(versions, default=None)
    best = max((v for v in versions if best_round is not None and rounds[v] == best_round), default=None)
    out: dict[int, list[str]] = {}
    for v in versions:
        marks = {"newest": v == newest, "best": v == best, "rolled back": rounds[v] in rolled_back, "pinned": v in pinned,
                 "pin requested": requested == ("pin", v), "rollback requested": requested == ("rollback", v)}  # fmt: skip
        out[v] = [m for m in MARKS if marks[m]]
    return out
