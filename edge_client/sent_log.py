"""What left the device, round by round: the ledger behind the app's privacy view.

Raw sensor samples and windows never leave the device; what does is one model update per
round (an envelope of weights, :mod:`har_models.wire.codec`). The agent notes each update
it sends (:func:`note_sent`) and each receipt that says the coordinator counted it
(:func:`note_receipt`); the app shows the ledger in words (:func:`sent_words`). It lives in
the store's metadata under :data:`SENT_KEY`, the newest :data:`SENT_KEPT` entries.
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
    """The ledger with one more update sent (replacing an earlier entry of the same exchange: a retry is one round).

    Parameters
    ----------
    ledger : list of dict
        The ledger so far (not changed).
    run_id : str;  round_, stage : int
        The exchange.
    n_bytes : int
        Size of the update envelope, bytes.
    arch_version : int
        Version of the model architecture the update is for.
    t_unix : float
        When it was sent, seconds since the epoch.

    Returns
    -------
    list of dict
        At most :data:`SENT_KEPT` entries, ``counted`` False until a receipt says otherwise.
    """
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
    """The ledger with each entry's ``model_version``: the server's number of the model its round started from, where known.

    Parameters
    ----------
    ledger : list of dict
        As kept by :func:`note_sent`.
    versions : mapping (run_id, round) -> int
        The server's model version of each round (:func:`edge_client.app.round_notes.versions_of`).
    """
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
    """One line per round, newest first: what left the device, when, for which model, and whether it was counted.

    The model is named by the server's version number (``from model v18``) where the entry holds
    one (:func:`with_versions`), else by its architecture's version (``architecture v0``).

    Parameters
    ----------
    ledger : list of dict
        As kept by :func:`note_sent`.
    open_round : int, optional
        The round now open: its update may still be confirmed; an older unconfirmed one was missed.
    limit : int
        Lines at most.
    """
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
