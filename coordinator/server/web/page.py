"""The status page: the view's answers arranged for the template ``page.html``, and the page rendered.

Words and classes are decided here, markup lives in the autoescaped templates. The device table is
paged (:data:`DEVICES_PER_PAGE` rows, ``?page=N``) so a thousand devices make a page of bounded size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.server.metrics import RoundTotals
from coordinator.server.settings import SERVE_ROUNDS
from coordinator.server.templating import percent, render
from coordinator.server.web.devices import RATE_OK_HZ, TARGET_RATE_HZ
from coordinator.server.web.fold import GuardDecision

REFRESH_S = 10
"""The page reloads itself this often (s; a meta refresh, no script)."""

DEVICES_PER_PAGE = 50
"""Rows of the device table on one page; ``?page=N`` shows the others."""

VERSIONS_SHOWN = 50
"""The page's versions table shows this many of the newest model versions."""

AUDIT_SHOWN = 10
"""Entries of the operator audit log on the page (the newest first); the file keeps all."""

HARM_SHOWN = 20
"""Devices the harm table lists at most (quarantined first, then by clipped and rejected counts)."""

LINKS = (("api/devices", "devices"), ("api/round", "round"), ("api/rounds", "rounds"), ("api/versions", "versions"),
         ("metrics", "metrics"), ("healthz", "health"))  # fmt: skip
"""The JSON and metrics links at the foot of the page (relative, never carrying a token)."""


class PageOutOfRange(ValueError):
    """A device page number past the last page (the message names the range)."""


def page_of(n_items: int, page: int, per_page: int | None = None) -> tuple[int, int, int]:
    """``(first index, end index, pages)`` of 1-based ``page``; PageOutOfRange below 1 or past the last (page 1 always exists)."""
    per_page = DEVICES_PER_PAGE if per_page is None else per_page
    pages = max(1, math.ceil(n_items / per_page))
    if not 1 <= page <= pages:
        raise PageOutOfRange(f"?page={page} is out of range; the device table has pages 1 to {pages}")
    return (page - 1) * per_page, min(n_items, page * per_page), pages


def _presence(d: Mapping[str, Any]) -> tuple[str, str]:
    """The presence cell's class and words."""
    if d["online"] is None:
        return "muted", "unknown (the broker cannot be reached)"
    cls = d["state"] if d["state"] in ("revoked", "forgotten") else ("online" if d["online"] else "offline")
    if cls == "forgotten":
        return cls, "gone (forgotten)"
    return cls, f"renamed to {d['renamed_to']}" if d.get("renamed_to") else cls


def _sensing(s: Mapping[str, Any], online: bool) -> dict[str, Any]:
    """The sensing cell: ``parts`` joined by commas (one may be ``{"rates": [...]}``), ``prefix`` for an offline device."""
    health = ("rate_hz", "newest_window_age_s", "gaps", "late")
    if not online and not s.get("state") and all(s.get(k) is None for k in health):
        return {"prefix": "", "parts": ["not reported while offline"]}
    parts: list[Any] = [s["state"] if s.get("state") else "sensing state not reported"]
    if all(s.get(k) is None for k in health):
        parts.append("health not reported")  # an older client, or windows ingested before this start
    else:
        lo, hi = RATE_OK_HZ
        rates = [{"label": label, "value": f"{s[k]:.1f}", "cls": "rate-ok" if lo <= s[k] <= hi else "rate-warn"}
                 for k, label in (("acc_hz", "acc"), ("gyro_hz", "gyro")) if s.get(k) is not None]  # fmt: skip
        parts.append({"rates": rates, "target": f"{TARGET_RATE_HZ:.0f}"} if s.get("rate_hz") is not None else "rate not reported")
        if s.get("newest_window_age_s") is not None:
            parts.append({"age": s["newest_window_age_s"]})
            if s.get("window_stream_stopped"):
                parts.append("no new window since (the stream stopped or ended)")
        if s.get("gaps") is not None:
            parts.append(f"{s['gaps']} gaps in 1 h")
        if s.get("late") is not None:
            parts.append(f"{s['late']} late samples")
    if s.get("charging") is not None:
        parts.append("charging" if s["charging"] else "on battery")
    return {"prefix": "" if online else "last reported: ", "parts": parts}


def _cost(c: Mapping[str, Any]) -> str | None:
    """The cost cell's words (None: not reported)."""
    parts = []
    if c.get("sensing_cpu_s_per_h") is not None:
        parts.append(f"sensing {c['sensing_cpu_s_per_h']:.0f} s CPU/h")
    if c.get("round_cpu_s") is not None:
        on = f" ({c['round_backend']})" if c.get("round_backend") else ""
        parts.append(f"round {c['round_cpu_s']:.1f} s CPU{on}")
    if c.get("battery_pct_per_day") is not None:
        parts.append(f"battery {c['battery_pct_per_day']:.0f} %/day")
    elif parts:
        parts.append("battery unknown")
    return ", ".join(parts) if parts else None


def device_cells(d: Mapping[str, Any]) -> dict[str, Any]:
    """What one row of the device table shows, from the device's ``/api/devices`` object."""
    cls, label = _presence(d)
    windows = f"{d['n_train']}/{d['n_test']}" if d["n_train"] is not None else None
    backend, backend_known, windows_known = d["backend"] or ("not reported" if d["online"] else None), False, None
    known = d.get("last_known")
    if not d["online"] and known:  # its last word (the will) says 0/0 and no backend: show what it last had
        if known.get("n_train") is not None:
            windows, windows_known = f"{known['n_train']}/{known['n_test']}", known["windows_unix"]
        if known.get("backend"):
            backend, backend_known = known["backend"], True
    elif not d["online"] and d["n_train"] in (None, 0) and d["n_test"] in (None, 0):
        windows = None
    return {"d": d, "online_attr": "unknown" if d["online"] is None else str(bool(d["online"])).lower(), "presence_cls": cls,
            "presence": label, "arch": f"v{d['arch_version']}" if d["arch_version"] is not None else None, "windows": windows,
            "windows_known": windows_known, "backend": backend, "backend_known": backend_known,
            "sensing": _sensing(d["sensing"], d["online"] is True), "cost": _cost(d["cost"])}  # fmt: skip


def harm_rows(devs: Sequence[Mapping[str, Any]], shown: int = HARM_SHOWN) -> tuple[list[Mapping[str, Any]], int]:
    """The devices with clipped, rejected, damaged-object or quarantined counts, quarantined first, then by counts; and how many."""
    harmed = [d for d in devs if d["clipped"] or d["rejected"] or d["quarantined"] or d["bad_objects"]]
    harmed.sort(key=lambda d: (not d["quarantined"], -(d["clipped"] + d["rejected"]), d["name"]))
    return harmed[:shown], len(harmed)


def guard_words(g: GuardDecision | None) -> dict[str, Any] | None:
    """The guard's newest decision for the page (None: it never judged)."""
    if g is None:
        return None
    n = g.note
    verdict = f"rolled back to the version of round {n.to_round}" if n.action == "rollback" else "kept it"
    best = f"; best: round {n.to_round}" if n.action == "keep" else ""
    return {"round": g.round, "judged": n.judged_round, "action": n.action, "verdict": verdict + best, "reason": n.reason,
            "devices": g.devices, "windows": g.windows}  # fmt: skip


def version_cells(v: Mapping[str, Any], last_round: int) -> dict[str, Any]:
    """One row of the versions table: quality per measure (the registry's figures where the records have none), marks,
    and ``pending``: whether the shared model's measure is still to come (its next round has not completed)."""
    q, figs = v["quality"], v["figures"]
    cells = {}
    for key in ("shared", "global", "personalisation"):
        m = q.get(key)
        f1 = m["macro_f1"] if m is not None else figs.get(f"{key}_macro_f1")
        cells[key] = {"f1": percent(f1) if f1 is not None else None, "devices": m["devices"] if m else None,
                      "windows": m["windows"] if m else None}  # fmt: skip
    return {"v": v, **cells, "marks": v["marks"], "pending": int(v["round"]) >= last_round}


def attempts(t: RoundTotals) -> dict[str, Any]:
    """How the rounds went: exchanges per round, exchanges without quorum, rollbacks and the last one's why."""
    back = t.last_rollback
    last = {"round": back[0], "to": back[1].to_round, "reason": back[1].reason} if back is not None else None
    return {"per_round": f"{t.attempts / t.rounds:.2f}" if t.rounds else "—", "without_quorum": t.without_quorum,
            "rollbacks": t.rollbacks, "last": last}  # fmt: skip


def page_context(view: Any, page: int = 1) -> dict[str, Any]:
    """Everything ``page.html`` writes, from one pass over the view; PageOutOfRange past the last page, StateDamaged."""
    now = view.wall()
    devs = view.devices()
    first, end, pages = page_of(len(devs), page)
    cur = view.current_round()
    totals = view.totals()
    link = view.broker_link()
    coordinator = (("unknown (the broker cannot be reached)", "muted") if link is False else
                   ("online", "online") if cur["coordinator"]["online"] else ("offline", "offline"))  # fmt: skip
    harmed, n_harmed = harm_rows(devs)
    planned = cur["rounds_planned"]
    return {
        "name": view.name, "release": view.release, "now": now, "refresh_s": REFRESH_S, "links": LINKS,
        "link": {True: ("up", "online"), False: ("down", "offline"), None: ("not watched", "muted")}[link],
        "coordinator": coordinator, "n_devices": len(devs), "n_enrolled": sum(1 for d in devs if d["state"] == "enrolled"),
        "n_online": sum(1 for d in devs if d["online"]) if link is not False else None,
        "n_quarantined": sum(1 for d in devs if d["quarantined"]), "n_rounds": totals.rounds,
        "health": view.health(), "warnings": view.warnings(),
        "devices": [device_cells(d) for d in devs[first:end]], "page": page, "pages": pages, "first": first + 1, "end": end,
        "harmed": harmed, "n_harmed": n_harmed, "cur": cur,
        # a served federation's round budget (SERVE_ROUNDS) is no plan an operator made: no "of N" for it
        "planned": planned if planned and planned < SERVE_ROUNDS else None,
        "attempts": attempts(totals), "guard": guard_words(view.guard()), "charts": view.charts(),
        "versions": [version_cells(v, totals.last_round) for v in view.versions(VERSIONS_SHOWN)], "disk": _disk(view),
        "certificates": certificate_cells(view.certificates(), now), "audit": list(reversed(view.audit(AUDIT_SHOWN))),
    }  # fmt: skip


def _disk(view: Any) -> Any:
    try:
        return view.disk()
    except OSError:
        return None  # the health line says why


def certificate_cells(certs: Sequence[Any], now: float) -> list[dict[str, Any]]:
    """The broker's certificates for the page: which, its end, the days left, in the warning colour from 30 days before."""
    from coordinator.broker.certificates import EXPIRY_WARNING_S

    out = []
    for c in certs:
        left = c.seconds_left(now)
        out.append({"which": c.which, "label": "server certificate" if c.which == "server" else "CA", "until": c.not_after_unix,
                    "cls": "rate-warn" if left < EXPIRY_WARNING_S else "muted",
                    "words": "expired" if left < 0 else f"{left / 86400:.0f} days left"})  # fmt: skip
    return out


def render_page(view: Any, page: int = 1) -> str:
    """The status page (HTML5) of ``view`` now, its device table at ``page`` (:func:`page_context`, ``page.html``)."""
    return render("page.html", **page_context(view, page))
