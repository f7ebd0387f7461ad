"""The tables of ``fedhar-coordinator devices`` and ``versions``: JSON-ready rows, and a plain-text printer.

A device's row carries what the registry knows (owner, state, times, rounds taken part in), whether
it is online (from the running server's page or the broker: :mod:`coordinator.server.broker_view`),
whether it asked to leave from its app, and what the run's events say it cost the federation: its
clipped updates (``clipped_update``), its rejected messages (``rejected``, one event per round and
reason) and whether it is quarantined now (its newest ``quarantined``/``released`` event is ``quarantined``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from coordinator.server.registry import Registry

log = logging.getLogger("fedhar.devices")


def harm_counts(run_dir: Path) -> tuple[Counter[str], Counter[str], set[str]]:
    """``(clipped, rejected, quarantined)`` from the run's events: clipped updates and rejections per device, and the
    devices whose newest quarantine event is ``quarantined``. Empty when the run has no database yet.

    Raises
    ------
    coordinator.state.StateDamaged
        If the run's database cannot be read.
    """
    from coordinator.state import RunState

    if not (Path(run_dir) / "state.sqlite").is_file():
        return Counter(), Counter(), set()
    state = RunState(run_dir)
    try:
        clipped = Counter(c for _, c, _, _ in state.events("clipped_update") if c)
        rejected = Counter(c for _, c, _, _ in state.events("rejected") if c)
        newest: dict[str, str] = {}
        for _, c, kind, _ in state.events():  # oldest first: the last word per device wins
            if c and kind in ("quarantined", "released"):
                newest[c] = kind
    finally:
        state.close()
    return clipped, rejected, {c for c, kind in newest.items() if kind == "quarantined"}


def device_table(data: Path, online: dict[str, str] | None) -> list[dict[str, Any]]:
    """One row per registered device: name, owner, state, online ("yes"/"no"/"unknown"), rounds taken part in, times,
    ``left`` ("forget" or "keep" for a device that left from its app, :func:`.lifecycle.leave_requests`, else None),
    ``clipped`` and ``rejected`` (counts) and ``quarantined`` (bool) from the run's events (:func:`harm_counts`)."""
    from coordinator.server.lifecycle import leave_requests

    left = leave_requests(data)
    clipped, rejected, quarantined = harm_counts(Path(data) / "run")
    reg = Registry(data)
    try:
        summary = reg.participation_summary()
        rows = []
        for d in reg.devices():
            took = summary.get(d.name)
            seen = "unknown" if online is None else ("yes" if online.get(d.name) not in (None, "offline") else "no")
            rows.append({**asdict(d), "online": seen if d.state == "enrolled" else "no", "rounds": took.rounds if took else 0,
                         "last_round": took.last.round if took else None,
                         "left": ("forget" if left[d.name].get("forget") else "keep") if d.name in left else None,
                         "clipped": clipped[d.name], "rejected": rejected[d.name],
                         "quarantined": d.name in quarantined and d.state == "enrolled"})  # fmt: skip
        return rows
    finally:
        reg.close()


def version_table(data: Path) -> list[dict[str, Any]]:
    """The kept versions (oldest first) as JSON-ready rows, each with ``mark``: "newest", "best", "best, newest" or "".

    The best is the newest version of the quality guard's best round (``<data>/run/guard_best.safetensors``).

    Raises
    ------
    coordinator.server.device_commands.DeviceCommandError
        If ``data`` holds no server database.
    """
    from coordinator import guard
    from coordinator.server.device_commands import existing_registry

    existing_registry(data)
    reg = Registry(data)
    try:
        rows = [{**asdict(v), "path": str(v.path)} for v in reg.versions()]
    finally:
        reg.close()
    try:
        best = guard.load_best(data / "run")
    except ValueError as exc:
        log.warning("%s", exc)
        best = None
    best_version = max((r["version"] for r in rows if best is not None and r["round"] == best.round), default=None)
    for r in rows:
        marks = (["best"] if r["version"] == best_version else []) + (["newest"] if r is rows[-1] else [])
        r["mark"] = ", ".join(marks)
    return rows


def when(t: float | None) -> str | None:
    """``2026-03-10 14:05`` local time of UNIX time ``t``; None for None."""
    return None if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def print_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    """Print ``rows`` as aligned columns ``cols`` (None as ``-``), or ``(none)``."""
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c) if r.get(c) is not None else "-")) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c) if r.get(c) is not None else "-").ljust(widths[c]) for c in cols))
