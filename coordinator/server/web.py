"""The home server's status page, JSON API and metrics endpoint (Starlette, served by uvicorn).

Read-only. What it shows comes from three places, gathered by :class:`ServerView`:

* the server database (``coordinator.server.registry.Registry``): enrolled, revoked and
  forgotten devices with their owners, the numbered model versions with their figures, and
  each device's participation;
* the run's database (:class:`coordinator.state.RunState`): the round records
  (:class:`coordinator.record.RoundRecord`) the charts and the metrics are drawn from;
* the broker, through the read-only monitor account (:class:`coordinator.server.monitor.Monitor`):
  each device's latest status and presence, the coordinator's status, the open round and its
  answers.

Routes::

    GET /              the status page (HTML, server-rendered, SVG charts, refreshes itself)
    GET /api/devices   devices (JSON list)
    GET /api/rounds    round records (JSON list; ?since=R&limit=N)
    GET /api/round     the open round and its progress, the schedule's next start (JSON)
    GET /api/versions  model versions (JSON list)
    GET /metrics       Prometheus text format (:mod:`coordinator.server.metrics`)
    GET /healthz       "ok" (JSON), for a supervisor

It binds 127.0.0.1 by default; :func:`check_bind` refuses any other address without a token,
and with a token every request must carry it (``Authorization: Bearer <token>`` or
``?token=<token>``), compared in constant time. A bad request gets a 4xx answer with a message
in JSON; a damaged database a 503 with its message (the file and the remedy); any other
internal error a 500 with the error's kind, never a traceback.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.record import RecordError, RoundRecord
from coordinator.server import charts
from coordinator.server.metrics import CONTENT_TYPE, make_registry, scrape
from coordinator.server.monitor import Monitor, MonitorSnapshot
from coordinator.server.settings import SERVE_ROUNDS
from coordinator.state import RunState, StateDamaged
from har_models.wire.messages import ClientStatus

log = logging.getLogger("fedhar.server.web")

TARGET_RATE_HZ = 50.0
"""The sample rate every device must deliver (the model's 50 Hz grid)."""

RATE_OK_HZ = (45.0, 55.0)
"""A delivered rate outside this range (Hz, bounds included as fine) is shown in the warning colour."""

REFRESH_S = 10
"""The page reloads itself this often (s; a meta refresh, no script)."""

MAX_ROUNDS_PER_REQUEST = 10_000

RECORDS_MAX_AGE_S = 5.0
"""The round records are read again after a new round, and at least this often (s)."""


class RegistryLike(Protocol):
    """What the web part reads of the server database (``coordinator.server.registry.Registry``)."""

    def devices(self) -> Sequence[Any]: ...  # rows with name, owner, enrolled_unix, revoked_unix, forgotten_unix, state

    def versions(self) -> Sequence[Any]: ...  # rows with version, round, created_unix, arch_version, path, figures

    def participation(self, name: str | None = None) -> Sequence[Any]: ...  # rows with round, name, accuracy, macro_f1


class BindRefused(ValueError):
    """An HTTP address that must not be served as asked (a non-loopback address without a token)."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve ``host`` without a token unless it is a loopback address.

    Raises
    ------
    BindRefused
        For a non-loopback ``host`` (including 0.0.0.0 and a host name) and no token, or a
        token shorter than 16 characters; the message names the setting and the fix.
    """
    if token is not None and len(token) < 16:
        raise BindRefused("[server] token is shorter than 16 characters; use a long random one (e.g. `openssl rand -hex 24`)")
    if not is_loopback(host) and not token:
        raise BindRefused(
            f"[server] http_bind = {host!r} would show the federation to the network without a login; "
            f"set [server] token to a long random string (e.g. `openssl rand -hex 24`), or bind 127.0.0.1"
        )


def _token_of(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    q = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    got = q.get("token")
    return got[0] if got else None


class TokenGate:
    """ASGI middleware: every HTTP request must carry ``token`` (header or query), else 401.

    The comparison is :func:`hmac.compare_digest` over UTF-8 bytes (constant time in the
    length of the expected token).
    """

    def __init__(self, app: ASGIApp, token: str):
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            got = _token_of(scope)
            if got is None or not hmac.compare_digest(got.encode("utf-8", "replace"), self._token):
                resp = JSONResponse({"error": "this server needs its token: send 'Authorization: Bearer <token>' or ?token=<token>"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _finite(v: Any) -> Any:
    """JSON has no NaN: None for a NaN or infinite float."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return _finite(obj)


def sensing_json(st: ClientStatus | None) -> dict[str, Any]:
    """The ``sensing`` object of a device in ``/api/devices`` from its latest status (None: no status).

    Keys: ``state`` ("live"/"paused"/None), ``target_hz`` (:data:`TARGET_RATE_HZ`), ``acc_hz`` and
    ``gyro_hz`` (delivered rates over the last minute, Hz), ``rate_hz`` (the lower of the two:
    the slower stream limits the 50 Hz grid; Home Assistant's sample-rate sensor), ``rate_ok``
    (both reported rates inside :data:`RATE_OK_HZ`; None without a rate), ``newest_window_age_s``
    (s), ``gaps`` (silences longer than a window in the last hour), ``late`` (samples dropped as
    late), ``charging``. Each is None where the status does not carry it.
    """
    h = st.sensing_health if st is not None else None
    rates = [r for r in ((h.acc_hz, h.gyro_hz) if h is not None else ()) if r is not None]
    lo, hi = RATE_OK_HZ
    return {
        "state": (st.sensing or None) if st is not None else None,
        "target_hz": TARGET_RATE_HZ,
        "rate_hz": min(rates) if rates else None,
        "acc_hz": h.acc_hz if h is not None else None,
        "gyro_hz": h.gyro_hz if h is not None else None,
        "rate_ok": all(lo <= r <= hi for r in rates) if rates else None,
        "newest_window_age_s": h.window_age_s if h is not None else None,
        "gaps": h.gaps_1h if h is not None else None,
        "late": h.late if h is not None else None,
        "charging": st.charging if st is not None else None,
    }


@dataclass
class ServerView:
    """Everything the page and the API read, in one place; every method is safe to call from any thread.

    Parameters
    ----------
    name : str
        The coordinator's name (``[server] name``), shown as the page's title.
    run_state : RunState, optional
        The run's database; its round records feed the charts, the rounds API and the metrics.
        Best a RunState of its own on the run folder (only read here), not the coordinator's
        instance, so that the page's reads never sit inside the coordinator's transactions.
    registry : RegistryLike, optional
        The server database (devices, versions, participation).
    monitor : Monitor, optional
        The read-only broker observer (presence, the open round).
    next_start : callable returning float or None, optional
        When the schedule will start the next round (s since the epoch; None: not known / waiting
        for devices). ``serve`` provides it.
    wall : callable returning float
        Wall-clock time (s since the epoch).
    """

    name: str = "fedhar-home"
    run_state: RunState | None = None
    registry: RegistryLike | None = None
    monitor: Monitor | None = None
    next_start: Callable[[], float | None] | None = None
    wall: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _cache: tuple[int, list[RoundRecord]] = field(default=(-2, []), repr=False)
    _cache_t: float = field(default=0.0, repr=False)
    bad_rows: int = 0

    # ------------------------------------------------------------------ sources
    def snapshot(self) -> MonitorSnapshot:
        """The monitor's view now (an empty one without a monitor)."""
        return self.monitor.snapshot() if self.monitor is not None else MonitorSnapshot()

    def records(self) -> list[RoundRecord]:
        """The completed rounds, in order.

        From the run's database (re-read only when a round was added); a row that does not
        read as a record is skipped and counted in :attr:`bad_rows`. Without a database, the
        monitor's retained progress message gives the last round alone.

        Raises
        ------
        coordinator.state.StateDamaged
            If the run's database cannot be read.
        """
        if self.run_state is None:
            snap = self.snapshot()
            if snap.progress is None:
                return []
            try:
                return [RoundRecord.from_json(snap.progress.record)]
            except RecordError:
                return []
        with self._lock:
            last = self.run_state.last_completed_round()
            # Re-read when a round was added, and at least every RECORDS_MAX_AGE_S: a restart that forgot
            # damaged rounds and ran them again leaves the same last round with other figures.
            if last == self._cache[0] and time.monotonic() - self._cache_t < RECORDS_MAX_AGE_S:
                return list(self._cache[1])
            out, bad = [], 0
            for row in self.run_state.rounds():
                try:
                    out.append(RoundRecord.from_json(row))
                except RecordError as exc:
                    bad += 1
                    log.warning("status page: a round row is not a record and is left out: %s", exc)
            self._cache, self._cache_t, self.bad_rows = (last, out), time.monotonic(), bad
            return list(out)

    def _registry_devices(self) -> list[Any]:
        return list(self.registry.devices()) if self.registry is not None else []

    def _participation(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        if self.registry is None:
            return out
        for row in self.registry.participation(None):
            out.setdefault(str(row.name), []).append(row)
        return out

    # ------------------------------------------------------------------ what the page shows
    def devices(self) -> list[dict[str, Any]]:
        """One JSON object per device: enrolled ones, and any other the broker or the records show.

        Keys: ``name``, ``owner``, ``state`` ("enrolled", "revoked", "forgotten", or "unenrolled"
        for a device the registry does not list), ``online``, ``status`` (its last status state
        or None), ``last_seen_unix``, ``rounds`` (rounds taken part in), ``last_round``,
        ``last_accuracy``, ``last_macro_f1`` (its own model on its own test split, latest round),
        ``arch_version`` (of the model after its latest round), ``backend``, ``program_fault``,
        ``fault`` (why the device says it cannot take part: storage or sensor, in its words; None: none),
        ``n_train``, ``n_test``, ``refresh_s`` (its status's refresh period, s),
        ``last_contribution_unix`` (when the registry noted its latest contribution; None without
        a registry row), ``sensing`` (:func:`sensing_json`: ``state`` "live"/"paused"/None,
        ``target_hz`` 50, ``rate_hz``, ``acc_hz``, ``gyro_hz``, ``rate_ok``,
        ``newest_window_age_s``, ``gaps`` (last hour), ``late``, ``charging``: None where the
        device's status does not carry them). ``backend`` and ``arch_version`` are what the
        device's status reports; ``arch_version`` falls back to the architecture of the device's
        latest round in the records for a device that does not report it.
        """
        recs = self.records()
        snap = self.snapshot()
        rows = {str(r.name): r for r in self._registry_devices()}
        part = self._participation()
        took: dict[str, list[tuple[int, float | None, float | None]]] = {}
        arch_of = {r.round: r.arch.version for r in recs}
        for r in recs:
            for cid, m in r.evaluation.personalisation_clients.items():
                took.setdefault(cid, []).append((r.round, m.accuracy, m.macro_f1))
        names = sorted(set(rows) | set(snap.devices) | set(took))
        out = []
        for name in names:
            row = rows.get(name)
            state = str(row.state) if row is not None else "unenrolled"
            gone = state == "forgotten"
            seen = None if gone else snap.devices.get(name)
            if name in part:
                history = sorted((int(p.round), p.accuracy, p.macro_f1) for p in part[name])
            else:
                history = [] if gone else took.get(name, [])
            last = history[-1] if history else None
            st = seen.status if seen is not None else None
            out.append(_clean({
                "name": name,
                "owner": getattr(row, "owner", None),
                "state": state,
                "online": bool(seen is not None and seen.online and state != "revoked"),
                "status": st.state if st is not None else None,
                "last_seen_unix": seen.last_seen_unix if seen is not None else None,
                "refresh_s": (st.refresh_s or None) if st is not None else None,
                "last_contribution_unix": max((float(p.t) for p in part.get(name, [])), default=None),
                "rounds": len(history),
                "last_round": last[0] if last else (st.last_round if st is not None and st.last_round >= 0 else None),
                "last_accuracy": last[1] if last else None,
                "last_macro_f1": last[2] if last else None,
                "arch_version": (st.arch_version if st is not None and st.arch_version is not None
                                 else arch_of.get(last[0]) if last else None),
                "backend": (st.backend or None) if st is not None else None,
                "program_fault": (st.program_fault or None) if st is not None else None,
                "fault": (st.fault or None) if st is not None else None,
                "n_train": st.n_train if st is not None else None,
                "n_test": st.n_test if st is not None else None,
                "sensing": sensing_json(st),
            }))  # fmt: skip
        return out

    def device_counts(self) -> dict[str, int]:
        """Devices by state for the metrics: enrolled, revoked, forgotten (registry) and online (monitor)."""
        counts: dict[str, int] = {"enrolled": 0, "online": 0, "revoked": 0, "forgotten": 0}
        for r in self._registry_devices():
            if str(r.state) in counts:
                counts[str(r.state)] += 1
        revoked = {str(r.name) for r in self._registry_devices() if str(r.state) != "enrolled"}
        counts["online"] = sum(1 for cid, d in self.snapshot().devices.items() if d.online and cid not in revoked)
        return counts

    def current_round(self) -> dict[str, Any]:
        """The open round and its progress, the last completed round and the schedule's next start (JSON object).

        Keys: ``coordinator`` (``online``, ``state``, ``run_id``), ``state`` ("training",
        "finished" or "idle" when no round is open), ``run_id``, ``round``, ``stage``,
        ``epoch``, ``selected``, ``answered``, ``missing`` (selected, not answered yet), ``deadline_unix``,
        ``deadline_in_s``, ``last_completed`` (round index or None), ``rounds_planned``,
        ``next_start_unix``.
        """
        snap = self.snapshot()
        now = self.wall()
        ann = snap.announcement
        last = snap.progress.round if snap.progress is not None else None
        recs = self.records() if self.run_state is not None else []
        if recs:
            last = recs[-1].round if last is None else max(last, recs[-1].round)
        open_ = ann is not None and ann.state == "training" and (last is None or ann.round > last)
        out: dict[str, Any] = {
            "coordinator": {"online": snap.coordinator_online, "state": snap.coordinator.state if snap.coordinator else None,
                            "run_id": snap.coordinator.run_id if snap.coordinator else None},
            "state": ("training" if open_ else ann.state if ann is not None and ann.state == "finished" else "idle"),
            "run_id": ann.run_id if ann is not None else None,
            "epoch": ann.epoch if ann is not None else None,
            "round": ann.round if open_ and ann is not None else None,
            "stage": ann.stage if open_ and ann is not None else None,
            "selected": sorted(ann.selected) if open_ and ann is not None else [],
            "answered": sorted(snap.answered) if open_ else [],
            "missing": sorted(set(ann.selected) - snap.answered) if open_ and ann is not None else [],
            "deadline_unix": ann.deadline_unix if open_ and ann is not None else None,
            "deadline_in_s": round(ann.deadline_unix - now, 1) if open_ and ann is not None and ann.deadline_unix else None,
            "last_completed": last,
            "rounds_planned": snap.progress.rounds if snap.progress is not None else None,
            "next_start_unix": self.next_start() if self.next_start is not None else None,
        }  # fmt: skip
        return _clean(out)

    def versions(self) -> list[dict[str, Any]]:
        """Model versions, newest first: ``version``, ``round``, ``created_unix``, ``arch_version``, ``path``, ``figures``."""
        if self.registry is None:
            return []
        rows = [_clean({"version": v.version, "round": v.round, "created_unix": v.created_unix, "arch_version": v.arch_version,
                        "path": str(v.path), "figures": dict(v.figures or {})}) for v in self.registry.versions()]  # fmt: skip
        return sorted(rows, key=lambda r: -int(r["version"]))

    def malformed_counts(self) -> dict[str, int]:
        """The monitor's counts of ignored messages by kind."""
        return dict(self.snapshot().malformed)


# ---------------------------------------------------------------------- HTML
def _when(t: float | None, now: float) -> str:
    if t is None:
        return "—"
    age = now - t
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    if abs(age) < 120:
        rel = f"{age:.0f} s ago" if age >= 0 else f"in {-age:.0f} s"
    elif abs(age) < 7200:
        rel = f"{age / 60:.0f} min ago" if age >= 0 else f"in {-age / 60:.0f} min"
    else:
        rel = f"{age / 3600:.1f} h ago" if age >= 0 else f"in {-age / 3600:.1f} h"
    return f'<span title="{stamp}">{rel}</span>'


def _pct(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def _e(v: Any) -> str:
    return "—" if v is None else html.escape(str(v))


def _figure(key: str, v: Any) -> str:
    """A version's figure: accuracies and F1 scores (fractions) in %, anything else as it is."""
    if isinstance(v, float) and ("acc" in key or "f1" in key.lower()):
        return _pct(v)
    return f"{v:.4g}" if isinstance(v, float) else _e(v)


def _rate(s: dict[str, Any]) -> str:
    """The delivered rates against 50 Hz, in the warning colour outside :data:`RATE_OK_HZ`."""
    if s.get("rate_hz") is None:
        return "rate not reported"
    lo, hi = RATE_OK_HZ
    parts = []
    for key, label in (("acc_hz", "acc"), ("gyro_hz", "gyro")):
        v = s.get(key)
        if v is not None:
            cls = "rate-ok" if lo <= v <= hi else "rate-warn"
            parts.append(f'{label} <span class="{cls}" data-rate="{label}">{v:.1f}</span>')
    return " · ".join(parts) + f" / {TARGET_RATE_HZ:.0f} Hz"


def _sensing(s: dict[str, Any]) -> str:
    parts = [_e(s.get("state") or "not reported")]
    if all(s.get(k) is None for k in ("rate_hz", "newest_window_age_s", "gaps", "late")):
        parts.append("health not reported")  # an older client, or windows ingested before this start
    else:
        parts.append(_rate(s))
        if s.get("newest_window_age_s") is not None:
            age = s["newest_window_age_s"]
            parts.append(f"newest window {age:.1f} s old" if age < 10 else f"newest window {age:.0f} s old")
        if s.get("gaps") is not None:
            parts.append(f"{s['gaps']} gaps in 1 h")
        if s.get("late") is not None:
            parts.append(f"{s['late']} late samples")
    if s.get("charging") is not None:
        parts.append("charging" if s["charging"] else "on battery")
    return ", ".join(parts)


def round_charts(recs: Sequence[RoundRecord]) -> list[str]:
    """The page's per-round charts (SVG text): accuracy, macro-F1, bytes, duration, widths, and FedDWA's p_ij."""
    S = charts.Series

    def measure(name: str, key: str) -> list[tuple[float, float | None]]:
        return [(r.round, getattr(m, key) if (m := r.measure(name)) is not None else None) for r in recs]

    out = [
        charts.line_chart([S("global", measure("global", "accuracy")), S("personalisation", measure("personalisation", "accuracy"))],
                          title="Accuracy", x_label="round", y_label="accuracy", y_range=(0, 1), y_format="%"),
        charts.line_chart([S("global", measure("global", "macro_f1")), S("personalisation", measure("personalisation", "macro_f1"))],
                          title="Macro-F1", x_label="round", y_label="macro-F1", y_range=(0, 1), y_format="%"),
        charts.line_chart([S("up", [(r.round, r.traffic.bytes_up / 1e6 if r.traffic else None) for r in recs]),
                           S("down", [(r.round, r.traffic.bytes_down / 1e6 if r.traffic else None) for r in recs])],
                          title="Traffic per round", x_label="round", y_label="MB"),
        charts.line_chart([S("duration", [(r.round, r.seconds) for r in recs])], title="Round duration", x_label="round",
                          y_label="seconds"),
        charts.line_chart([S("conv filters F", [(r.round, r.arch.conv_filters) for r in recs]),
                           S("dense units H", [(r.round, r.arch.dense_units) for r in recs])],
                          title="Architecture widths", x_label="round", y_label="units"),
    ]  # fmt: skip
    latest = next((r for r in reversed(recs) if r.feddwa_weights is not None), None)
    if latest is not None and latest.feddwa_weights is not None:
        w = latest.feddwa_weights
        out.append(charts.heat_map(w.p, w.clients, title=f"FedDWA weights p_ij, round {latest.round}"))
    return out


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;font-size:.9em;background:#fff} th,td{border:1px solid #ddd;padding:3px 7px;text-align:left}
th{background:#f0f0f0} .online{color:#137333;font-weight:bold} .offline{color:#a50e0e} .revoked,.forgotten{color:#777}
.fault{color:#a50e0e;font-weight:normal} .rate-ok{color:#137333} .rate-warn{color:#b06000;font-weight:bold;background:#fef7e0}
.charts{display:flex;flex-wrap:wrap;gap:10px} .charts svg{background:#fff;border:1px solid #ddd} .muted{color:#777}
"""


def render_page(view: ServerView, query: str = "") -> str:
    """The status page (HTML5) of ``view`` now; ``query`` (e.g. ``"?token=..."``) is appended to its links."""
    now = view.wall()
    devs = view.devices()
    cur = view.current_round()
    recs = view.records()
    versions = view.versions()
    coord = cur["coordinator"]
    n_online = sum(1 for d in devs if d["online"])
    n_enrolled = sum(1 for d in devs if d["state"] == "enrolled")
    h: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        f"<title>{_e(view.name)} · fedhar</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(view.name)}</h1>",
        f'<p id="summary">coordinator <span id="coordinator-state" class="{"online" if coord["online"] else "offline"}">'
        f'{"online" if coord["online"] else "offline"}</span> · <span id="device-count">{len(devs)}</span> devices '
        f'(<span id="enrolled-count">{n_enrolled}</span> enrolled, <span id="online-count">{n_online}</span> online) · '
        f'<span id="rounds-completed">{len(recs)}</span> rounds completed</p>',
        "<h2>Devices</h2>",
        '<table id="devices"><tr><th>device</th><th>owner</th><th>presence</th><th>last seen</th><th>rounds</th>'
        "<th>last local accuracy</th><th>backend</th><th>arch</th><th>sensing</th><th>windows (train/test)</th></tr>",
    ]
    for d in devs:
        presence = d["state"] if d["state"] in ("revoked", "forgotten") else ("online" if d["online"] else "offline")
        label = "gone (forgotten)" if presence == "forgotten" else presence
        fault = f'<br><span class="fault">cannot take part: {_e(d["fault"])}</span>' if d.get("fault") else ""
        arch = f"v{d['arch_version']}" if d["arch_version"] is not None else "—"
        windows = f"{d['n_train']}/{d['n_test']}" if d["n_train"] is not None else "—"
        h.append(
            f'<tr class="device" data-name="{_e(d["name"])}" data-online="{str(d["online"]).lower()}">'
            f'<td>{_e(d["name"])}</td><td>{_e(d["owner"])}</td><td class="presence {presence}">{label}{fault}</td>'
            f"<td>{_when(d['last_seen_unix'], now)}</td><td>{d['rounds']}</td><td>{_pct(d['last_accuracy'])}</td>"
            f"<td>{_e(d['backend'] or 'not reported')}</td><td>{arch}</td><td>{_sensing(d['sensing'])}</td><td>{windows}</td></tr>"
        )
    if not devs:
        h.append('<tr><td colspan="10" class="muted">no device enrolled or seen yet</td></tr>')
    h.append("</table>")
    h.append("<h2>Round</h2>")
    if cur["state"] == "training":
        stage = f" (stage {cur['stage']})" if cur["stage"] else ""
        h.append(
            f'<p id="round">round <span id="round-index">{cur["round"]}</span> is open'
            f"{stage}: "
            f"{len(cur['selected'])} selected, {len(cur['answered'])} answered, {len(cur['missing'])} missing "
            f"({_e(', '.join(cur['missing']) or 'none')}); deadline {_when(cur['deadline_unix'], now)}</p>"
        )
    else:
        h.append(f'<p id="round">no round open ({_e(cur["state"])})</p>')
    last = cur["last_completed"]
    # A served federation's round budget (SERVE_ROUNDS) is no plan an operator made: show no "of N" for it.
    planned = f" of {cur['rounds_planned']}" if cur["rounds_planned"] and cur["rounds_planned"] < SERVE_ROUNDS else ""
    h.append(f'<p>last completed round: <span id="last-round">{_e(last)}</span>{planned} · next start: '
             f'<span id="next-start">{_when(cur["next_start_unix"], now) if cur["next_start_unix"] else "when enough devices are eligible"}'
             f"</span></p>")  # fmt: skip
    h.append("<h2>Rounds</h2>")
    h.append('<div class="charts">' + "\n".join(round_charts(recs)) + "</div>")
    h.append("<h2>Model versions</h2>")
    h.append('<table id="versions"><tr><th>version</th><th>round</th><th>created</th><th>arch</th><th>figures</th></tr>')
    for v in versions[:50]:
        figs = ", ".join(f"{_e(k)} {_figure(k, x)}" for k, x in sorted(v["figures"].items()))
        h.append(f"<tr><td>{v['version']}</td><td>{_e(v['round'])}</td><td>{_when(v['created_unix'], now)}</td>"
                 f"<td>v{_e(v['arch_version'])}</td><td>{figs or '—'}</td></tr>")  # fmt: skip
    if not versions:
        h.append('<tr><td colspan="5" class="muted">no model version yet</td></tr>')
    h.append("</table>")
    h.append(f'<p class="muted">updated {time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))}; '
             "JSON: " + " · ".join(f'<a href="{path}{html.escape(query)}">{label}</a>' for path, label in
                                   (("api/devices", "devices"), ("api/round", "round"), ("api/rounds", "rounds"),
                                    ("api/versions", "versions"), ("metrics", "metrics"))) + "</p>")  # fmt: skip
    h.append("</body></html>")
    return "\n".join(h)


# ---------------------------------------------------------------------- app
def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise HTTPException(400, f"?{name}={raw[:40]!r} is not an integer; use ?{name}=N with {lo} <= N <= {hi}") from None
    if not lo <= v <= hi:
        raise HTTPException(400, f"?{name}={v} is out of range; use {lo} <= {name} <= {hi}")
    return v


def make_app(view: ServerView, token: str | None = None) -> Starlette:
    """The Starlette application of the status page, API and metrics over ``view``.

    Parameters
    ----------
    view : ServerView
    token : str, optional
        When given, every request must carry it (see :class:`TokenGate`).

    Returns
    -------
    Starlette
        Serve it with uvicorn (:class:`WebServer` does that in a thread).
    """
    registry = make_registry(view.records, view.device_counts, view.malformed_counts)

    def page(request: Request) -> Response:
        # A browser that came with ?token= keeps it on the page's links (the meta refresh keeps the URL as it is).
        given = request.query_params.get("token")
        return HTMLResponse(render_page(view, f"?{urlencode({'token': given})}" if token and given else ""))

    def api_devices(request: Request) -> Response:
        return JSONResponse(view.devices())

    def api_rounds(request: Request) -> Response:
        since = _int_param(request, "since", 0, 0, 10**9)
        limit = _int_param(request, "limit", MAX_ROUNDS_PER_REQUEST, 1, MAX_ROUNDS_PER_REQUEST)
        rows = [_clean(r.to_json()) for r in view.records() if r.round >= since][:limit]
        return JSONResponse(rows)

    def api_round(request: Request) -> Response:
        return JSONResponse(view.current_round())

    def api_versions(request: Request) -> Response:
        return JSONResponse(view.versions())

    def metrics(request: Request) -> Response:
        return Response(scrape(registry), media_type=CONTENT_TYPE)

    def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "name": view.name})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    async def damaged(request: Request, exc: Exception) -> Response:
        # A damaged database is the operator's to fix, and its message says how (file and remedy).
        log.error("status page: %s", exc)
        return JSONResponse({"error": str(exc)}, status_code=503)

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("status page: %s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); the server log has the details"}, status_code=500)

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/api/devices", api_devices, methods=["GET"]),
        Route("/api/rounds", api_rounds, methods=["GET"]),
        Route("/api/round", api_round, methods=["GET"]),
        Route("/api/versions", api_versions, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, StateDamaged: damaged, Exception: internal_error})
    if token:
        app.add_middleware(TokenGate, token=token)
    app.state.view = view
    app.state.metrics = registry
    return app


class WebServer:
    """uvicorn serving an app in a thread of this process (what ``serve`` and the tests use).

    Parameters
    ----------
    app : ASGI app (:func:`make_app`)
    host : str
        Address to bind (default 127.0.0.1).
    port : int
        TCP port; 0 picks a free one (:attr:`port` says which after :meth:`start`).
    token : str, optional
        The app's token; only checked here against the address (:func:`check_bind`).

    Raises
    ------
    BindRefused
        From :func:`check_bind`.
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 8765, token: str | None = None):
        import uvicorn

        check_bind(host, token)
        self.host = host
        self.port = port
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> int:
        """Start serving; return the bound port.

        Raises
        ------
        RuntimeError
            If the server has not started within ``timeout`` s (e.g. the port is taken).
        """
        self._thread = threading.Thread(target=self._server.run, name="fedhar-web", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started and time.monotonic() < end and self._thread.is_alive():
            time.sleep(0.02)
        if not self._server.started:
            raise RuntimeError(f"the status page did not start on {self.host}:{self.port} within {timeout} s "
                               f"(is the port in use? set [server] http_port)")  # fmt: skip
        for srv in getattr(self._server, "servers", []):
            for sock in srv.sockets:
                self.port = int(sock.getsockname()[1])
                break
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and wait for the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def start_status_page(view: ServerView, host: str = "127.0.0.1", port: int = 8765, token: str | None = None) -> WebServer:
    """Serve :func:`make_app` of ``view`` on ``host``:``port`` in a thread (what ``serve`` calls); stop it with ``.stop()``.

    Raises
    ------
    BindRefused
        For a non-loopback ``host`` without a token (:func:`check_bind`).
    RuntimeError
        If it does not start within 10 s (e.g. the port is taken).
    """
    server = WebServer(make_app(view, token=token), host=host, port=port, token=token)
    server.start()
    return server


def to_json_text(obj: Any) -> str:
    """``obj`` as JSON text without NaN (None instead), as the API writes it."""
    return json.dumps(_clean(obj), allow_nan=False)
