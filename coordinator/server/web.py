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

import bisect
import copy
import hmac
import html
import ipaddress
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.broker.certificates import EXPIRY_WARNING_S
from coordinator.record import RecordError, RoundRecord
from coordinator.server import charts
from coordinator.server.figures import read_figures
from coordinator.server.metrics import CONTENT_TYPE, RoundTotals, make_registry, scrape
from coordinator.server.monitor import DeviceSeen, Monitor, MonitorSnapshot
from coordinator.server.settings import SERVE_ROUNDS
from coordinator.state import RunState, StateDamaged
from har_models.nn.metrics import pct
from har_models.wire.messages import ClientStatus

log = logging.getLogger("fedhar.server.web")

AUDIT_SHOWN = 10
"""Entries of the operator audit log on the page (the newest first); the file keeps all."""

TARGET_RATE_HZ = 50.0
"""The sample rate every device must deliver (the model's 50 Hz grid)."""

RATE_OK_HZ = (45.0, 55.0)
"""A delivered rate outside this range (Hz, bounds included as fine) is shown in the warning colour."""

REFRESH_S = 10
"""The page reloads itself this often (s; a meta refresh, no script)."""

MAX_ROUNDS_PER_REQUEST = 10_000

VERSIONS_SHOWN = 50
"""The page's versions table shows this many of the newest model versions."""


class RegistryLike(Protocol):
    """What the web part reads of the server database (``coordinator.server.registry.Registry``)."""

    def devices(self) -> Sequence[Any]: ...  # rows with name, owner, enrolled_unix, revoked_unix, forgotten_unix, state

    # rows with version, round, created_unix, arch_version, path, figures
    def versions(self, newest: int | None = None) -> Sequence[Any]: ...

    def participation_summary(self) -> Mapping[str, Any]: ...  # name -> rounds, last_t, last (round, accuracy, macro_f1)


class _Took:
    """A device's rounds in the round records: how many, and its newest ``(round, accuracy, macro-F1)``."""

    __slots__ = ("last", "rounds")

    def __init__(self) -> None:
        self.rounds = 0
        self.last: tuple[int, float | None, float | None] | None = None

    def add(self, round_: int, accuracy: float | None, macro_f1: float | None) -> None:
        self.rounds += 1
        self.last = (round_, accuracy, macro_f1)


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
    length of the expected token). Paths under ``open_prefix`` (the blob store's, whose every
    URL carries the coordinator's own signature: :mod:`coordinator.blob_folder`) pass without it:
    devices hold those URLs, never the page's token.
    """

    def __init__(self, app: ASGIApp, token: str, open_prefix: str | None = None):
        self.app = app
        self._token = token.encode()
        self._open_prefix = open_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not (self._open_prefix and str(scope.get("path", "")).startswith(self._open_prefix)):
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


def sensing_json(st: ClientStatus | None, seen: DeviceSeen | None = None, now: float | None = None) -> dict[str, Any]:
    """The ``sensing`` object of a device in ``/api/devices`` from its latest status (None: no status).

    Keys: ``state`` ("live"/"paused"/None), ``target_hz`` (:data:`TARGET_RATE_HZ`), ``acc_hz`` and
    ``gyro_hz`` (delivered rates over the last minute, Hz), ``rate_hz`` (the lower of the two:
    the slower stream limits the 50 Hz grid), ``rate_ok``
    (both reported rates inside :data:`RATE_OK_HZ`; None without a rate), ``newest_window_age_s``
    (s), ``gaps`` (silences longer than a window in the last hour), ``late`` (samples dropped as
    late), ``charging``. Each is None where the status does not carry it. With ``seen`` (the monitor's
    :class:`~coordinator.server.monitor.DeviceSeen`) and ``now`` (s since the epoch) the window age is
    the age now: the reported age plus the time since it was first reported, so a stream that stopped
    (a replay that ended, repeating its last age) ages on the page; ``window_stream_stopped`` is True
    when a later status repeated the same age (no new window since), else False (None: no age).
    """
    h = st.sensing_health if st is not None else None
    age = h.window_age_s if h is not None else None
    stopped: bool | None = None
    if age is not None and seen is not None and seen.window_age_since_unix is not None and now is not None:
        stopped = seen.received_unix > seen.window_age_since_unix + 0.5
        age = age + max(0.0, now - seen.window_age_since_unix)
    rates = [r for r in ((h.acc_hz, h.gyro_hz) if h is not None else ()) if r is not None]
    lo, hi = RATE_OK_HZ
    return {
        "state": (st.sensing or None) if st is not None else None,
        "target_hz": TARGET_RATE_HZ,
        "rate_hz": min(rates) if rates else None,
        "acc_hz": h.acc_hz if h is not None else None,
        "gyro_hz": h.gyro_hz if h is not None else None,
        "rate_ok": all(lo <= r <= hi for r in rates) if rates else None,
        "newest_window_age_s": age,
        "window_stream_stopped": stopped,
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
    waiting : callable returning str or None, optional
        Why no round runs now, in words (the devices not eligible and why, a last attempt that
        closed without quorum, the schedule's next start); None while one runs. ``serve`` provides it.
    wall : callable returning float
        Wall-clock time (s since the epoch).
    stall_after_s : float, optional
        :meth:`health` reports the federation stalled when no round completed for longer than
        this (s) while the schedule has a next start (enough devices are eligible). ``serve``
        sets it from its schedule; None: never.
    broker_dir : Path, optional
        The broker folder (``[server] broker_dir``): the expiry of its TLS certificates is shown
        (:meth:`certificates`). ``serve`` passes it; None: no certificates shown.
    """

    name: str = "fedhar-home"
    run_state: RunState | None = None
    registry: RegistryLike | None = None
    monitor: Monitor | None = None
    next_start: Callable[[], float | None] | None = None
    waiting: Callable[[], str | None] | None = None
    wall: Callable[[], float] = time.time
    stall_after_s: float | None = None
    broker_dir: Path | None = None
    _certs: tuple[tuple[tuple[str, float], ...], list[Any]] = field(default=((), []), repr=False)
    _warned: dict[str, float] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _seen: tuple[int, int] | None = field(default=None, repr=False)
    _last: int = field(default=-1, repr=False)
    _last_t: float | None = field(default=None, repr=False)
    _born: float = field(default_factory=time.time, repr=False)
    _totals: RoundTotals = field(default_factory=RoundTotals, repr=False)
    _took: dict[str, _Took] = field(default_factory=dict, repr=False)
    _arch: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _series: RoundSeries = field(default_factory=lambda: RoundSeries(), repr=False)
    _charts: tuple[tuple[int, int] | None, list[str]] = field(default=(None, []), repr=False)
    bad_rows: int = 0

    # ------------------------------------------------------------------ sources
    def snapshot(self) -> MonitorSnapshot:
        """The monitor's view now (an empty one without a monitor)."""
        return self.monitor.snapshot() if self.monitor is not None else MonitorSnapshot()

    def _sync(self) -> tuple[int, int] | None:
        """Bring the cached records, totals and per-device index up to the run's database; its version after.

        Only rounds newer than the cached ones are read while the database says nothing was
        rewritten (:meth:`coordinator.state.RunState.rounds_version`); a rewrite (a round
        recorded again, rounds forgotten after a crash) reads every round once more. A row
        that does not read as a record is skipped and counted in :attr:`bad_rows`.

        Raises
        ------
        coordinator.state.StateDamaged
            If the run's database cannot be read.
        """
        assert self.run_state is not None
        with self._lock:
            version = self.run_state.rounds_version()
            if version == self._seen:
                return version
            rewritten = self._seen is None or version[0] != self._seen[0] or version[1] < self._seen[1]
            if rewritten:
                self._last, self._totals, self._took, self._arch, self.bad_rows = -1, RoundTotals(), {}, [], 0
                self._series = RoundSeries()
            for row in self.run_state.rounds(after=self._last):
                try:
                    rec = RoundRecord.from_json(row)
                except RecordError as exc:
                    self.bad_rows += 1
                    log.warning("status page: a round row is not a record and is left out: %s", exc)
                    continue
                self._last = rec.round
                self._totals.add(rec)
                self._series.add(rec)
                for cid, m in rec.evaluation.personalisation_clients.items():
                    self._took.setdefault(cid, _Took()).add(rec.round, m.accuracy, m.macro_f1)
                if not self._arch or self._arch[-1][1] != rec.arch.version:
                    self._arch.append((rec.round, rec.arch.version))
            self._last_t = self.run_state.completed_unix(self._last) if self._last >= 0 else None
            self._seen = version
            return version

    def records(self, since: int = 0, limit: int | None = None) -> list[RoundRecord]:
        """The completed rounds from round ``since`` on, in order, at most ``limit`` of them.

        Read from the run's database at each call (O(rounds asked for); the page and
        ``/metrics`` use :meth:`totals` and :meth:`charts` instead). A row that does not read as
        a record is left out (and counted in :attr:`bad_rows`). Without a database, the
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
                rec = RoundRecord.from_json(snap.progress.record)
            except RecordError:
                return []
            return [rec] if rec.round >= since and (limit is None or limit > 0) else []
        self._sync()
        out = []
        for row in self.run_state.rounds(after=since - 1, limit=limit):
            try:
                out.append(RoundRecord.from_json(row))
            except RecordError:
                continue  # counted and logged once by _sync
        return out

    def warm(self) -> None:
        """Read and fold every round record now (what the first request would do), logging a damaged database.

        ``start_status_page`` runs it in a thread, so after a restart of a server with a long
        history the first page does not wait for the fold (about 0.3 ms a round).
        """
        if self.run_state is None:
            return
        try:
            t0 = time.monotonic()
            self._sync()
            log.info("status page: %d rounds read in %.1f s", self._totals.rounds, time.monotonic() - t0)
        except StateDamaged as exc:
            log.error("status page: %s", exc)

    def broker_link(self) -> bool | None:
        """Whether the page's own session with the broker is up; None when it has none (no monitor link)."""
        if self.monitor is None or self.monitor.link is None:
            return None
        return self.snapshot().connected

    def certificates(self) -> list[Any]:
        """The broker's certificates' expiry (:class:`coordinator.broker.certificates.CertificateExpiry`, server and CA).

        Read from the files of :attr:`broker_dir` again only when one of them changed (a renewal);
        [] without a broker folder, without TLS, or when a file cannot be read (logged). Logs a
        warning, at most once a day per certificate, from 30 days before one expires.
        """
        from coordinator.broker.certificates import EXPIRY_WARNING_S, certificate_expiry
        from coordinator.broker.settings import SetupError, read_settings

        if self.broker_dir is None:
            return []
        try:
            settings = read_settings(Path(self.broker_dir))
            paths = [p for p in (settings.tls_cert, settings.tls_ca) if p]
            key = tuple((str(p), Path(p).stat().st_mtime) for p in paths)
            with self._lock:
                cached_key, cached = self._certs
            if key != cached_key:
                cached = certificate_expiry(settings)
                with self._lock:
                    self._certs = (key, cached)
        except (SetupError, OSError) as exc:
            log.warning("status page: the broker's certificates cannot be read: %s", exc)
            return []
        now = self.wall()
        for c in cached:
            left = c.seconds_left(now)
            if left < EXPIRY_WARNING_S and now - self._warned.get(c.which, -1e18) > 86400:
                self._warned[c.which] = now
                when = time.strftime(_STAMP, time.localtime(c.not_after_unix))
                log.warning("the broker's %s certificate %s %s on %s: renew it (fedhar-coordinator broker renew --out %s "
                            "--ca-key ca.key)", c.which, c.path, "expired" if left < 0 else f"expires in {left / 86400:.0f} days",
                            when, self.broker_dir)  # fmt: skip
        return list(cached)

    def certificate_seconds_left(self) -> dict[str, float]:
        """Seconds until each certificate of :meth:`certificates` expires, by ``which`` (negative: expired)."""
        now = self.wall()
        return {c.which: c.seconds_left(now) for c in self.certificates()}

    def audit(self, newest: int = 10) -> list[Any]:
        """The ``newest`` entries of the operator audit log (:mod:`coordinator.server.audit`) of the registry's data folder."""
        from coordinator.server.audit import read_audit

        data = getattr(self.registry, "data_dir", None)
        if data is None:
            return []
        try:
            return read_audit(Path(data), newest)
        except OSError as exc:
            log.warning("status page: the audit log cannot be read: %s", exc)
            return []

    def seconds_since_last_round(self) -> float | None:
        """Seconds since the newest completed round was recorded (None: no round yet, or no database)."""
        if self.run_state is None:
            return None
        self._sync()
        with self._lock:
            return None if self._last_t is None else max(0.0, self.wall() - self._last_t)

    def health(self) -> list[str]:
        """Why the federation is not healthy now, in words; empty when it is.

        Unhealthy: the broker link of the page is down (the coordinator's state cannot be known),
        or, with :attr:`stall_after_s` set, no round completed for longer than that while the
        schedule has a next start (enough devices are eligible).
        """
        out = []
        if self.broker_link() is False:
            out.append("the broker cannot be reached: presence, the open round and the coordinator's state are unknown; "
            "what the page shows is the last known")
        if self.stall_after_s is not None and self.next_start is not None and self.next_start() is not None:
            since = self.seconds_since_last_round()
            waited = since if since is not None else max(0.0, self.wall() - self._born)
            if waited > self.stall_after_s:
                out.append(f"no round completed for {waited / 60:.0f} min (more than {self.stall_after_s / 60:.0f} min) "
                           "while enough devices are eligible")  # fmt: skip
        return out

    def totals(self) -> RoundTotals:
        """What ``/metrics`` exports of the completed rounds, kept current as rounds complete (O(new rounds) a call).

        ``without_quorum`` also counts the exchanges of a round that has not completed yet: the run's
        ``round_failed`` events are written as each exchange closes without quorum, so a federation that
        keeps failing one round shows it at once (the records alone count a round's failed exchanges only
        once it completes, and lose them if the coordinator restarts within it). The larger of the two is
        taken: records written without those events still count.
        """
        if self.run_state is None:
            return RoundTotals.of(self.records())
        self._sync()
        failed = self.run_state.count_events("round_failed")
        with self._lock:
            out = copy.deepcopy(self._totals)
        out.without_quorum = max(out.without_quorum, failed)
        return out

    def charts(self) -> list[str]:
        """The page's round charts (:func:`round_charts`), drawn again only when a round was added or rewritten."""
        if self.run_state is None:
            return round_charts(self.records())
        version = self._sync()
        with self._lock:
            if self._charts[0] != version:
                self._charts = (version, self._series.draw())
            return list(self._charts[1])

    def _registry_devices(self) -> list[Any]:
        return list(self.registry.devices()) if self.registry is not None else []

    def _participation(self) -> Mapping[str, Any]:
        return self.registry.participation_summary() if self.registry is not None else {}

    def _arch_at(self, round_: int) -> int | None:
        """The architecture version of completed round ``round_``'s model (None: not recorded)."""
        if self.run_state is None:
            return next((r.arch.version for r in self.records() if r.round == round_), None)
        self._sync()
        with self._lock:
            if round_ > self._last:
                return None
            i = bisect.bisect_right(self._arch, (round_, math.inf)) - 1
            return self._arch[i][1] if i >= 0 else None

    def _took_from_records(self) -> dict[str, _Took]:
        if self.run_state is None:
            out: dict[str, _Took] = {}
            for r in self.records():
                for cid, m in r.evaluation.personalisation_clients.items():
                    out.setdefault(cid, _Took()).add(r.round, m.accuracy, m.macro_f1)
            return out
        self._sync()
        with self._lock:
            return dict(self._took)

    # ------------------------------------------------------------------ what the page shows
    def devices(self) -> list[dict[str, Any]]:
        """One JSON object per device: enrolled ones, and any other the broker or the records show.

        Keys: ``name``, ``owner``, ``state`` ("enrolled", "revoked", "forgotten", or "unenrolled"
        for a device the registry does not list), ``renamed_to`` (the name a renamed device has now,
        else None; its rounds count under that name, so its own ``rounds`` is 0), ``online`` (None: unknown, for an enrolled device
        the broker showed while the page's broker link is down), ``status`` (its last status state
        or None), ``last_seen_unix``, ``rounds`` (rounds taken part in), ``last_round``,
        ``last_accuracy``, ``last_macro_f1`` (its own model on its own test split, latest round),
        ``arch_version`` (of the model after its latest round), ``backend``, ``program_fault``,
        ``fault`` (why the device says it cannot take part: storage or sensor, in its words; None: none),
        ``n_train``, ``n_test``, ``refresh_s`` (its status's refresh period, s),
        ``last_contribution_unix`` (when the round of its latest contribution opened; None without
        a registry row), ``sensing`` (:func:`sensing_json`: ``state`` "live"/"paused"/None,
        ``target_hz`` 50, ``rate_hz``, ``acc_hz``, ``gyro_hz``, ``rate_ok``,
        ``newest_window_age_s`` (the age now), ``window_stream_stopped``, ``gaps`` (last hour), ``late``,
        ``charging``: None where the device's status does not carry them), ``last_known`` (for a device
        not online: ``n_train``, ``n_test`` and ``backend`` of the last status that carried them, with
        ``windows_unix`` and ``backend_unix``, when it was received; None for an online device or
        one never seen with them: an offline device's own last word says 0/0 and no backend), ``cost`` (what the device
        measured of its own cost, :class:`~har_models.wire.messages.DeviceCost` as JSON: ``sensing_cpu_s_per_h``,
        ``round_cpu_s``, ``round_wall_s``, ``round_backend``, ``battery_pct_per_day``, each left out where the
        status does not carry it; {} from a device that does not measure it). ``backend`` and ``arch_version`` are what the
        device's status reports; ``arch_version`` falls back to the architecture of the device's
        latest round in the records for a device that does not report it.
        """
        snap = self.snapshot()
        rows = {str(r.name): r for r in self._registry_devices()}
        part = self._participation()
        took = self._took_from_records()
        link_down = self.broker_link() is False
        names = sorted(set(rows) | set(snap.devices) | set(took))
        out = []
        for name in names:
            row = rows.get(name)
            state = str(row.state) if row is not None else "unenrolled"
            gone = state == "forgotten"
            seen = None if gone else snap.devices.get(name)
            own = took.get(name) if not gone else None
            last: tuple[int, float | None, float | None] | None
            last_contribution: float | None
            renamed_to = getattr(row, "renamed_to", None)
            if renamed_to is not None:  # its participation moved to the new name: counted there, not twice
                n_rounds, last, last_contribution = 0, None, None
            elif name in part:
                p = part[name]
                n_rounds, last = p.rounds, (int(p.last.round), p.last.accuracy, p.last.macro_f1)
                last_contribution = p.last_t
            else:
                n_rounds = own.rounds if own is not None else 0
                last = own.last if own is not None else None
                last_contribution = None
            st = seen.status if seen is not None else None
            online: bool | None = bool(seen is not None and seen.online and state != "revoked")
            if link_down and seen is not None and state == "enrolled":
                online = None  # its presence cannot be known while the page's broker link is down
            last_known = None
            if seen is not None and not online and (seen.windows is not None or seen.backend is not None):
                last_known = {
                    "n_train": seen.windows[0] if seen.windows else None, "n_test": seen.windows[1] if seen.windows else None,
                    "windows_unix": seen.windows[2] if seen.windows else None,
                    "backend": seen.backend[0] if seen.backend else None, "backend_unix": seen.backend[1] if seen.backend else None,
                }  # fmt: skip
            out.append(_clean({
                "name": name,
                "owner": getattr(row, "owner", None),
                "state": state,
                "renamed_to": renamed_to,
                "online": online,
                "status": st.state if st is not None else None,
                "last_seen_unix": seen.last_seen_unix if seen is not None else None,
                "refresh_s": (st.refresh_s or None) if st is not None else None,
                "last_contribution_unix": last_contribution,
                "rounds": n_rounds,
                "last_round": last[0] if last else (st.last_round if st is not None and st.last_round >= 0 else None),
                "last_accuracy": last[1] if last else None,
                "last_macro_f1": last[2] if last else None,
                "arch_version": (st.arch_version if st is not None and st.arch_version is not None
                                 else self._arch_at(last[0]) if last else None),
                "backend": (st.backend or None) if st is not None else None,
                "program_fault": (st.program_fault or None) if st is not None else None,
                "fault": (st.fault or None) if st is not None else None,
                "n_train": st.n_train if st is not None else None,
                "n_test": st.n_test if st is not None else None,
                "sensing": sensing_json(st, seen, self.wall()),
                "cost": st.cost.to_json() if st is not None and st.cost is not None else {},
                "last_known": last_known,
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
        ``next_start_unix``, ``waiting`` (while no round is open: why, in words; None when not known).
        ``answered`` holds only the updates counted in the open attempt (:class:`MonitorSnapshot`).
        """
        snap = self.snapshot()
        now = self.wall()
        ann = snap.announcement
        last = snap.progress.round if snap.progress is not None else None
        done = self.totals().last_round if self.run_state is not None else -1
        if done >= 0:
            last = done if last is None else max(last, done)
        open_ = ann is not None and ann.state == "training" and (last is None or ann.round > last)
        out: dict[str, Any] = {
            "coordinator": {"online": snap.coordinator_online, "state": snap.coordinator.state if snap.coordinator else None,
                            "run_id": snap.coordinator.run_id if snap.coordinator else None},
            "state": ("training" if open_ else ann.state if ann is not None and ann.state == "finished" else "idle"),
            "run_id": ann.run_id if ann is not None else None,
            "epoch": ann.epoch if ann is not None else None,
            "round": ann.round if open_ and ann is not None else None,
            "stage": ann.stage if open_ and ann is not None else None,
            "selected": sorted(snap.selected) if open_ else [],
            "answered": sorted(snap.answered) if open_ else [],
            "missing": sorted(snap.selected - snap.answered) if open_ else [],
            "deadline_unix": ann.deadline_unix if open_ and ann is not None else None,
            "deadline_in_s": round(ann.deadline_unix - now, 1) if open_ and ann is not None and ann.deadline_unix else None,
            "last_completed": last,
            "rounds_planned": snap.progress.rounds if snap.progress is not None else None,
            "next_start_unix": self.next_start() if self.next_start is not None else None,
            "waiting": self.waiting() if self.waiting is not None and not open_ else None,
        }  # fmt: skip
        return _clean(out)

    def versions(self, newest: int | None = None) -> list[dict[str, Any]]:
        """Model versions (all, or the ``newest`` ones), newest first: ``version``, ``round``, ``created_unix``,
        ``arch_version``, ``path``, ``figures``."""
        if self.registry is None:
            return []
        rows = [_clean({"version": v.version, "round": v.round, "created_unix": v.created_unix, "arch_version": v.arch_version,
                        "path": str(v.path), "figures": read_figures(v.figures or {})})
                for v in self.registry.versions(newest)]  # fmt: skip
        return sorted(rows, key=lambda r: -int(r["version"]))

    def malformed_counts(self) -> dict[str, int]:
        """The monitor's counts of ignored messages by kind."""
        return dict(self.snapshot().malformed)


# ---------------------------------------------------------------------- HTML
def _when(t: float | None, now: float) -> str:
    if t is None:
        return "—"
    age = now - t
    stamp = time.strftime(_STAMP, time.localtime(t))
    if abs(age) < 120:
        rel = f"{age:.0f} s ago" if age >= 0 else f"in {-age:.0f} s"
    elif abs(age) < 7200:
        rel = f"{age / 60:.0f} min ago" if age >= 0 else f"in {-age / 60:.0f} min"
    else:
        rel = f"{age / 3600:.1f} h ago" if age >= 0 else f"in {-age / 3600:.1f} h"
    return f'<span title="{stamp}">{rel}</span>'


def _plural(n: int, noun: str) -> str:
    """``noun`` for one, ``noun + "s"`` for any other count."""
    return noun if n == 1 else noun + "s"


_STAMP = "%Y-%m-%d %H:%M:%S %Z"
"""How the page writes a time: the server's local time with its zone."""

def _figure_label(key: str) -> str:
    """A version figure's key in words: ``personalisation_macro_f1`` -> ``personalisation macro-F1``."""
    return key.replace("macro_f1", "macro-F1").replace("_", " ")


def _pct(v: float | None) -> str:
    return pct(v, missing="—")


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


def _sensing(s: dict[str, Any], online: bool = True) -> str:
    """The sensing cell: its state, rates, the newest window's age now, gaps, late samples, charging.

    For a device not online the figures are its last status's, said so ("last reported"); its will
    carries none, which reads "not reported while offline".
    """
    if not online and not s.get("state") and all(s.get(k) is None for k in ("rate_hz", "newest_window_age_s", "gaps", "late")):
        return "not reported while offline"
    parts = [_e(s["state"]) if s.get("state") else "sensing state not reported"]
    if all(s.get(k) is None for k in ("rate_hz", "newest_window_age_s", "gaps", "late")):
        parts.append("health not reported")  # an older client, or windows ingested before this start
    else:
        parts.append(_rate(s))
        if s.get("newest_window_age_s") is not None:
            parts.append(f"newest window {_age(s['newest_window_age_s'])} old")
            if s.get("window_stream_stopped"):
                parts.append("no new window since (the stream stopped or ended)")
        if s.get("gaps") is not None:
            parts.append(f"{s['gaps']} gaps in 1 h")
        if s.get("late") is not None:
            parts.append(f"{s['late']} late samples")
    if s.get("charging") is not None:
        parts.append("charging" if s["charging"] else "on battery")
    text = ", ".join(parts)
    return text if online else f"last reported: {text}"


def _cost(c: dict[str, Any]) -> str:
    """The cost cell: CPU of sensing per hour and of the latest round, and the battery's drain, as the device measured them."""
    parts = []
    if c.get("sensing_cpu_s_per_h") is not None:
        parts.append(f"sensing {c['sensing_cpu_s_per_h']:.0f} s CPU/h")
    if c.get("round_cpu_s") is not None:
        on = f" ({_e(c['round_backend'])})" if c.get("round_backend") else ""
        parts.append(f"round {c['round_cpu_s']:.1f} s CPU{on}")
    if c.get("battery_pct_per_day") is not None:
        parts.append(f"battery {c['battery_pct_per_day']:.0f} %/day")
    elif parts:
        parts.append("battery unknown")
    return ", ".join(parts) if parts else '<span class="muted">not reported</span>'


def _age(seconds: float) -> str:
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


class RoundSeries:
    """The page's per-round chart series, folded one round record at a time into bounded sketches.

    Each line is a :class:`coordinator.server.charts.Sketch` of at most
    :data:`coordinator.server.charts.MAX_POINTS` buckets, so drawing the charts costs the same
    at round 100 as at round 100,000, and adding a round is O(1).
    """

    LINES = ("acc.global", "acc.personalisation", "f1.global", "f1.personalisation", "up", "down", "seconds", "F", "H")

    def __init__(self) -> None:
        self.lines = {k: charts.Sketch() for k in self.LINES}
        self.feddwa: RoundRecord | None = None

    def add(self, r: RoundRecord) -> None:
        """Fold the newest completed round ``r``."""
        for measure in ("global", "personalisation"):
            m = r.measure(measure)
            self.lines[f"acc.{measure}"].add(r.round, m.accuracy if m is not None else None)
            self.lines[f"f1.{measure}"].add(r.round, m.macro_f1 if m is not None else None)
        self.lines["up"].add(r.round, r.traffic.bytes_up / 1e6 if r.traffic else None)
        self.lines["down"].add(r.round, r.traffic.bytes_down / 1e6 if r.traffic else None)
        self.lines["seconds"].add(r.round, r.seconds)
        self.lines["F"].add(r.round, r.arch.conv_filters)
        self.lines["H"].add(r.round, r.arch.dense_units)
        if r.feddwa_weights is not None:
            self.feddwa = r

    def draw(self) -> list[str]:
        """The charts (SVG text): accuracy, macro-F1, bytes, duration, widths, and FedDWA's p_ij of the latest round that has them."""
        def S(name: str, key: str) -> charts.BucketSeries:  # noqa: N802
            return charts.BucketSeries(name, self.lines[key].buckets())

        out = [
            charts.line_chart([S("global", "acc.global"), S("personalisation", "acc.personalisation")],
                              title="Accuracy", x_label="round", y_label="accuracy", y_range=(0, 1), y_format="%"),
            charts.line_chart([S("global", "f1.global"), S("personalisation", "f1.personalisation")],
                              title="Macro-F1", x_label="round", y_label="macro-F1", y_range=(0, 1), y_format="%"),
            charts.line_chart([S("up", "up"), S("down", "down")], title="Traffic per round", x_label="round", y_label="MB"),
            charts.line_chart([S("duration", "seconds")], title="Round duration", x_label="round", y_label="seconds"),
            charts.line_chart([S("conv filters F", "F"), S("dense units H", "H")],
                              title="Architecture widths", x_label="round", y_label="units"),
        ]  # fmt: skip
        if self.feddwa is not None and (w := self.feddwa.feddwa_weights) is not None:
            out.append(charts.heat_map(w.p, w.clients, title=f"FedDWA weights p_ij, round {self.feddwa.round}"))
        return out


def round_charts(recs: Sequence[RoundRecord]) -> list[str]:
    """The page's per-round charts (SVG text) of ``recs`` (:meth:`RoundSeries.draw`)."""
    series = RoundSeries()
    for r in recs:
        series.add(r)
    return series.draw()


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
    n_rounds = view.totals().rounds
    versions = view.versions(VERSIONS_SHOWN)
    coord = cur["coordinator"]
    link = view.broker_link()
    link_word, link_cls = {True: ("up", "online"), False: ("down", "offline"), None: ("not watched", "muted")}[link]
    if link is False:
        coord_word, coord_cls = "unknown (the broker cannot be reached)", "muted"
    else:
        coord_word, coord_cls = ("online", "online") if coord["online"] else ("offline", "offline")
    problems = view.health()
    n_online = sum(1 for d in devs if d["online"])
    online_words = (f'<span id="online-count">{n_online}</span> online' if link is not False
                    else 'online <span id="online-count">unknown</span>')  # fmt: skip
    n_enrolled = sum(1 for d in devs if d["state"] == "enrolled")
    h: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        f"<title>{_e(view.name)} · fedhar</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(view.name)}</h1>",
        f'<p id="summary">broker link <span id="broker-link" class="{link_cls}">{link_word}</span> · '
        f'coordinator <span id="coordinator-state" class="{coord_cls}">{coord_word}</span> · '
        f'<span id="device-count">{len(devs)}</span> {_plural(len(devs), "device")} '
        f'(<span id="enrolled-count">{n_enrolled}</span> enrolled, {online_words}) · '
        f'<span id="rounds-completed">{n_rounds}</span> {_plural(n_rounds, "round")} completed</p>',
        *(f'<p id="health" class="rate-warn">{_e(p)}</p>' for p in problems),
        "<h2>Devices</h2>",
        '<table id="devices"><tr><th>device</th><th>owner</th><th>presence</th><th>last seen</th><th>rounds</th>'
        "<th>last local accuracy</th><th>backend</th><th>arch</th><th>sensing</th><th>windows (train/test)</th><th>cost</th></tr>",
    ]
    for d in devs:
        presence = d["state"] if d["state"] in ("revoked", "forgotten") else ("online" if d["online"] else "offline")
        label = "gone (forgotten)" if presence == "forgotten" else f"renamed to {_e(d['renamed_to'])}" if d.get("renamed_to") else presence
        if d["online"] is None:
            presence, label = "muted", "unknown (the broker cannot be reached)"
        fault = f'<br><span class="fault">cannot take part: {_e(d["fault"])}</span>' if d.get("fault") else ""
        arch = f"v{d['arch_version']}" if d["arch_version"] is not None else "—"
        windows = f"{d['n_train']}/{d['n_test']}" if d["n_train"] is not None else "—"
        online_attr = "unknown" if d["online"] is None else str(d["online"]).lower()
        backend = _e(d["backend"] or "not reported")
        known = d.get("last_known")
        if not d["online"] and known:  # its last word (the will) says 0/0 and no backend: show what it last had
            if known.get("n_train") is not None:
                when = _when(known["windows_unix"], now)
                windows = f'{known["n_train"]}/{known["n_test"]} <span class="muted">(last known, {when})</span>'
            if known.get("backend"):
                backend = f'{_e(known["backend"])} <span class="muted">(last known)</span>'
        elif not d["online"]:
            windows = "—" if d["n_train"] in (None, 0) and d["n_test"] in (None, 0) else windows
            backend = _e(d["backend"] or "—")
        h.append(
            f'<tr class="device" data-name="{_e(d["name"])}" data-online="{online_attr}">'
            f'<td>{_e(d["name"])}</td><td>{_e(d["owner"])}</td><td class="presence {presence}">{label}{fault}</td>'
            f"<td>{_when(d['last_seen_unix'], now)}</td><td>{d['rounds']}</td><td>{_pct(d['last_accuracy'])}</td>"
            f"<td>{backend}</td><td>{arch}</td><td>{_sensing(d['sensing'], d['online'] is True)}</td><td>{windows}</td>"
            f"<td>{_cost(d['cost'])}</td></tr>"
        )
    if not devs:
        h.append('<tr><td colspan="11" class="muted">no device enrolled or seen yet</td></tr>')
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
        if cur["waiting"]:
            h.append(f'<p id="waiting">{_e(cur["waiting"])}</p>')
    last = cur["last_completed"]
    # A served federation's round budget (SERVE_ROUNDS) is no plan an operator made: show no "of N" for it.
    planned = f" of {cur['rounds_planned']}" if cur["rounds_planned"] and cur["rounds_planned"] < SERVE_ROUNDS else ""
    h.append(f'<p>last completed round: <span id="last-round">{_e(last)}</span>{planned} · next start: '
             f'<span id="next-start">{_when(cur["next_start_unix"], now) if cur["next_start_unix"] else "when enough devices are eligible"}'
             f"</span></p>")  # fmt: skip
    h.append(_attempts_line(view.totals()))
    h.append("<h2>Rounds</h2>")
    h.append('<div class="charts">' + "\n".join(view.charts()) + "</div>")
    h.append("<h2>Model versions</h2>")
    h.append('<table id="versions"><tr><th>version</th><th>round</th><th>created</th><th>arch</th><th>figures</th></tr>')
    for v in versions:
        figs = ", ".join(f"{_e(_figure_label(k))} {_figure(k, x)}" for k, x in sorted(v["figures"].items()))
        h.append(f"<tr><td>{v['version']}</td><td>{_e(v['round'])}</td><td>{_when(v['created_unix'], now)}</td>"
                 f"<td>v{_e(v['arch_version'])}</td><td>{figs or '—'}</td></tr>")  # fmt: skip
    if not versions:
        h.append('<tr><td colspan="5" class="muted">no model version yet</td></tr>')
    h.append("</table>")
    certs = view.certificates()
    if certs:
        h.append("<h2>Certificates</h2>")
        for c in certs:
            left = c.seconds_left(now)
            cls = "rate-warn" if left < EXPIRY_WARNING_S else "muted"
            words = "expired" if left < 0 else f"{left / 86400:.0f} days left"
            h.append(f'<p class="certificate {cls}" data-which="{_e(c.which)}">{_e("server certificate" if c.which == "server" else "CA")}'
                     f" valid until {time.strftime(_STAMP, time.localtime(c.not_after_unix))} ({words})</p>")  # fmt: skip
    entries = view.audit(AUDIT_SHOWN)
    if entries:
        h.append("<h2>Operator actions</h2>")
        h.append('<table id="audit"><tr><th>when</th><th>action</th><th>device</th><th>by</th><th>detail</th></tr>')
        for a in reversed(entries):
            h.append(f"<tr><td>{_when(a.t, now)}</td><td>{_e(a.action)}</td><td>{_e(a.device)}</td><td>{_e(a.by)}</td>"
                     f"<td>{_e(a.detail) if a.detail else '—'}</td></tr>")  # fmt: skip
        h.append("</table>")
    h.append(f'<p class="muted">updated {time.strftime(_STAMP, time.localtime(now))}; '
             "JSON: " + " · ".join(f'<a href="{path}{html.escape(query)}">{label}</a>' for path, label in
                                   (("api/devices", "devices"), ("api/round", "round"), ("api/rounds", "rounds"),
                                    ("api/versions", "versions"), ("metrics", "metrics"))) + "</p>")  # fmt: skip
    h.append("</body></html>")
    return "\n".join(h)


def _attempts_line(t: RoundTotals) -> str:
    """One line on how the rounds went: exchanges per round, exchanges without quorum, quality-guard rollbacks (the last one's why)."""
    per = f"{t.attempts / t.rounds:.2f}" if t.rounds else "—"
    words = (f'<p id="round-health">attempts per round <span id="attempts-per-round">{per}</span> · '
             f'closed without quorum <span id="rounds-without-quorum">{t.without_quorum}</span> · '
             f'rollbacks <span id="rollbacks">{t.rollbacks}</span>')  # fmt: skip
    if t.last_rollback is not None:
        rnd, note = t.last_rollback
        words += (f' (last: round {rnd} went back to the version of round <span id="rollback-to">{note.to_round}</span>: '
                  f"{_e(note.reason)})")  # fmt: skip
    return words + "</p>"


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


def make_app(view: ServerView, token: str | None = None, blob_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The Starlette application of the status page, API and metrics over ``view``.

    Parameters
    ----------
    view : ServerView
    token : str, optional
        When given, every request must carry it (see :class:`TokenGate`), except those to ``/blobs/``.
    blob_routes : sequence of Route
        The folder blob store's routes (:func:`coordinator.blob_folder.blob_app`), served under
        ``/blobs/`` when the federation uses the blob transport; they check their own signatures.

    Returns
    -------
    Starlette
        Serve it with uvicorn (:class:`WebServer` does that in a thread).
    """
    registry = make_registry(view.totals, view.device_counts, view.malformed_counts, view.broker_link, view.seconds_since_last_round,
                             view.certificate_seconds_left)  # fmt: skip

    def page(request: Request) -> Response:
        # A browser that came with ?token= keeps it on the page's links (the meta refresh keeps the URL as it is).
        given = request.query_params.get("token")
        return HTMLResponse(render_page(view, f"?{urlencode({'token': given})}" if token and given else ""))

    def api_devices(request: Request) -> Response:
        return JSONResponse(view.devices())

    def api_rounds(request: Request) -> Response:
        since = _int_param(request, "since", 0, 0, 10**9)
        limit = _int_param(request, "limit", MAX_ROUNDS_PER_REQUEST, 1, MAX_ROUNDS_PER_REQUEST)
        rows = [_clean(r.to_json()) for r in view.records(since, limit)]
        return JSONResponse(rows)

    def api_round(request: Request) -> Response:
        return JSONResponse(view.current_round())

    def api_versions(request: Request) -> Response:
        return JSONResponse(view.versions())

    def metrics(request: Request) -> Response:
        return Response(scrape(registry), media_type=CONTENT_TYPE)

    def healthz(request: Request) -> Response:
        problems = view.health()
        if problems:
            return JSONResponse({"status": "unhealthy", "name": view.name, "reasons": problems}, status_code=503)
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
        *blob_routes,
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, StateDamaged: damaged, Exception: internal_error})
    if token:
        app.add_middleware(TokenGate, token=token, open_prefix="/blobs/" if blob_routes else None)
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
    signed : bool
        The app answers only requests whose URL the coordinator signed (the blob app,
        :mod:`coordinator.blob_folder`): it may face the network without a token.

    Raises
    ------
    BindRefused
        From :func:`check_bind` (not for a ``signed`` app).
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 8765, token: str | None = None, signed: bool = False):
        import uvicorn

        if not signed:
            check_bind(host, token)
        self.host = host
        self.port = port
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._refused = False  # uvicorn gave up at start (it ends its thread with SystemExit, e.g. a port in use)

    def _serve(self) -> None:
        try:
            self._server.run()
        except SystemExit:  # uvicorn's startup failure: start() reports it; the thread ends without a stray traceback
            self._refused = True

    def start(self, timeout: float = 10.0) -> int:
        """Start serving; return the bound port.

        Raises
        ------
        RuntimeError
            If the server has not started within ``timeout`` s (e.g. the port is taken).
        """
        self._thread = threading.Thread(target=self._serve, name="fedhar-web", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started and time.monotonic() < end and self._thread.is_alive():
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            why = "it could not bind" if self._refused else f"not within {timeout} s"
            raise RuntimeError(f"the status page did not start on {self.host}:{self.port}: {why} "
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


def start_status_page(view: ServerView, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
                      blob_routes: Sequence[BaseRoute] = ()) -> WebServer:  # fmt: skip
    """Serve :func:`make_app` of ``view`` on ``host``:``port`` in a thread (what ``serve`` calls); stop it with ``.stop()``.

    ``blob_routes``: the folder blob store's, served under ``/blobs/`` beside the page (:func:`make_app`).

    Raises
    ------
    BindRefused
        For a non-loopback ``host`` without a token (:func:`check_bind`).
    RuntimeError
        If it does not start within 10 s (e.g. the port is taken).
    """
    server = WebServer(make_app(view, token=token, blob_routes=blob_routes), host=host, port=port, token=token)
    server.start()
    threading.Thread(target=view.warm, name="status-page-warm", daemon=True).start()
    return server


def to_json_text(obj: Any) -> str:
    """``obj`` as JSON text without NaN (None instead), as the API writes it."""
    return json.dumps(_clean(obj), allow_nan=False)
