"""What left the device, round by round: the ledger behind the app's privacy view.

Raw samples never leave the device; one model update per round does. The agent notes each update
sent (:func:`note_sent`) and each receipt that counted it (:func:`note_receipt`) in the store's
metadata (:data:`SENT_KEY`); the app shows it in words (:func:`sent_words`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

SENT_KEY = "sent_log"
"""Store metadata key of the ledger (a JSON list of dicts, oldest first)."""

SENT_KEPT = 50
"""Entries kept: the newest 50 rounds."""


def note_sent(
    ledger: list[dict[str, Any]], run_id: str, round_: int, stage: int, n_bytes: int, arch_version: int, t_unix: float
) -> list[dict[str, Any]]:
    """The ledger with one more update sent (``n_bytes``, for ``arch_version``, at ``t_unix``), replacing an earlier entry
    of the same exchange (a retry is one round): at most :data:`SENT_KEPT` entries, ``counted`` False until a receipt."""
    key = (run_id, int(round_), int(stage))
    kept = [e for e in ledger if (e.get("run_id"), e.get("round"), e.get("stage")) != key]
    entry = {"run_id": run_id, "round": int(round_), "stage": int(stage), "bytes": int(n_bytes), "arch_version": int(arch_version),
             "t_unix": float(t_unix), "counted": False}  # fmt: skip
    return [*kept, entry][-SENT_KEPT:]


def note_receipt(ledger: list[dict[str, Any]], run_id: str, round_: int, stage: int) -> list[dict[str, Any]]:
    """The ledger with the update of that exchange marked as counted by the coordinator (an accepted receipt)."""
    key = (run_id, int(round_), int(stage))
    return [e | {"counted": True} if (e.get("run_id"), e.get("round"), e.get("stage")) == key else e for e in ledger]


def with_versions(ledger: list[dict[str, Any]], versions: Mapping[tuple[str, int], int]) -> list[dict[str, Any]]:
    """The ledger with each entry's ``model_version``, the server's number of the model its round started from, where
    ``versions`` ((run_id, round) -> version, :func:`edge_client.app.round_notes.versions_of`) knows it."""
    out = []
    for e in ledger:
        v = versions.get((str(e.get("run_id")), int(e.get("round", -1))))
        out.append(e | {"model_version": v} if v is not None else dict(e))
    return out


def size_words(n_bytes: int) -> str:
    """``1234`` -> ``"1.2 kB"``, ``2_500_000`` -> ``"2.5 MB"``, ``800`` -> ``"800 B"``."""
    if n_bytes < 1000:
        return f"{n_bytes} B"
    if n_bytes < 1_000_000:
        return f"{n_bytes / 1e3:.1f} kB"
    return f"{n_bytes / 1e6:.1f} MB"


def sent_words(ledger: list[dict[str, Any]], open_round: int | None = None, limit: int = 8) -> list[str]:
    """At most ``limit`` lines, newest first: what left the device, when, for which model (the server's version where
    known, else the architecture's), and whether it was counted (``open_round``'s may still be confirmed)."""
    out = []
    for e in reversed(ledger[-limit:]):
        when = dt.datetime.fromtimestamp(e["t_unix"]).strftime("%d %b %H:%M")
        if e["counted"]:
            fate = "counted"
        elif open_round is not None and e["round"] == open_round:
            fate = "waiting for the coordinator's receipt"
        else:
            fate = "not confirmed: the round went on without it"
        stage = f".{e['stage']}" if e["stage"] else ""
        # The server's version number where it said one; else only the architecture's, named as such.
        model = f"from model v{e['model_version']}" if e.get("model_version") is not None else f"architecture v{e['arch_version']}"
        out.append(f"round {e['round']}{stage}, {when}: a model update of {size_words(e['bytes'])} ({model}), {fate}")
    return out
