"""The status site's routes (Starlette): the page, the JSON API, ``/metrics`` and ``/healthz``, behind an optional token.

Routes::

    GET /              the status page (HTML from templates, SVG charts, refreshes itself; ?page=N: the device table's page)
    GET /api/devices   devices (JSON list)
    GET /api/rounds    round records (JSON list; ?since=R&limit=N)
    GET /api/round     the open round and its progress, the schedule's next start (JSON)
    GET /api/versions  model versions with their quality and marks (JSON list)
    GET /metrics       Prometheus text format (:mod:`coordinator.server.metrics`)
    GET /healthz       "ok" (200), or 503 with every reason the federation cannot make progress

Each answers from the one view model. Every response carries ``Referrer-Policy: no-referrer``. Bad
requests get a 4xx with a JSON message, a damaged database a 503 with its remedy, any other error a
500 with the error's kind, never a traceback.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.server.metrics import CONTENT_TYPE, make_registry, scrape
from coordinator.server.templating import templates
from coordinator.server.web.devices import clean
from coordinator.server.web.page import PageOutOfRange, page_context
from coordinator.server.web.view import ServerView
from coordinator.state import StateDamaged
from har_io.web_thread import WebServer

log = logging.getLogger("fedhar.server.web")

MAX_ROUNDS_PER_REQUEST = 10_000

COOKIE = "fedhar_page"
"""The page's cookie: a keyed hash of the token (never the token itself), set from a visit with ``?token=``."""


def cookie_value(token: str) -> str:
    """What the cookie holds for ``token``: HMAC-SHA256 of a fixed label under it, so a copied cookie does not reveal the token."""
    return hmac.new(token.encode(), b"fedhar status page cookie", hashlib.sha256).hexdigest()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _cookie(scope: Scope) -> str | None:
    for part in (_header(scope, b"cookie") or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == COOKIE:
            return value
    return None


class TokenGate:
    """ASGI middleware: every HTTP request must carry ``token``, else 401.

    Accepted (compared in constant time): ``Authorization: Bearer <token>``, the cookie :data:`COOKIE`, or
    ``?token=``; a GET of ``/`` with a good ``?token=`` gets a 303 to the same address without it and the
    cookie (HttpOnly, SameSite=Strict). Paths under ``open_prefix`` (the signed blob URLs) pass without it.
    """

    def __init__(self, app: ASGIApp, token: str, open_prefix: str | None = None):
        self.app = app
        self._token = token.encode()
        self._cookie = cookie_value(token).encode()
        self._open_prefix = open_prefix

    def _good(self, got: str | None, want: bytes) -> bool:
        return got is not None and hmac.compare_digest(got.encode("utf-8", "replace"), want)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self._open_prefix and str(scope.get("path", "")).startswith(self._open_prefix)):
            await self.app(scope, receive, send)
            return
        auth = _header(scope, b"authorization") or ""
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if self._good(auth[7:].strip() if auth[:7].lower() == "bearer " else None, self._token) or self._good(_cookie(scope), self._cookie):
            await self.app(scope, receive, send)
        elif self._good(given, self._token) and scope.get("path") == "/" and scope.get("method") == "GET":
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            resp: Response = RedirectResponse("/" + (f"?{rest}" if rest else ""), status_code=303)
            resp.set_cookie(COOKIE, cookie_value(self._token.decode()), httponly=True, samesite="strict", path="/")
            await resp(scope, receive, send)
        elif self._good(given, self._token):
            await self.app(scope, receive, send)
        else:
            resp = JSONResponse({"error": "this server needs its token: send 'Authorization: Bearer <token>', or open the page "
                                          "once as /?token=<token> (a cookie keeps it)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
            await resp(scope, receive, send)


class NoReferrer:
    """ASGI middleware: ``Referrer-Policy: no-referrer`` on every HTTP response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"referrer-policy", b"no-referrer")]
            await send(message)

        await self.app(scope, receive, send_with)


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
    """The Starlette application of the status page, API and metrics over ``view`` (served by :class:`har_io.web_thread.WebServer`).

    With ``token`` every request must carry it (:class:`TokenGate`) except under ``/blobs/``, where
    ``blob_routes`` (the folder blob store's, checking their own signatures) are served.
    """

    def disk() -> tuple[int, int] | None:
        try:
            d = view.disk()
        except OSError:
            return None
        return (d.free, d.need_next_round) if d is not None else None

    registry = make_registry(view.totals, view.device_counts, view.malformed_counts, view.broker_link, view.seconds_since_last_round,
                             view.certificate_seconds_left, harm=view.harm, release=view.release, disk=disk,
                             damaged=view.damaged_objects)  # fmt: skip

    def page(request: Request) -> Response:
        try:
            context = page_context(view, _int_param(request, "page", 1, 1, 10**6))
        except PageOutOfRange as exc:
            raise HTTPException(404, str(exc)) from None
        return templates().TemplateResponse(request, "page.html", context, media_type="text/html")

    def api_rounds(request: Request) -> Response:
        since = _int_param(request, "since", 0, 0, 10**9)
        limit = _int_param(request, "limit", MAX_ROUNDS_PER_REQUEST, 1, MAX_ROUNDS_PER_REQUEST)
        return JSONResponse([clean(r.to_json()) for r in view.records(since, limit)])

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

    def answer(get: Any) -> Any:
        return lambda request: JSONResponse(get())

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/api/devices", answer(view.devices), methods=["GET"]),
        Route("/api/rounds", api_rounds, methods=["GET"]),
        Route("/api/round", answer(view.current_round), methods=["GET"]),
        Route("/api/versions", answer(view.versions), methods=["GET"]),
        Route("/metrics", lambda request: Response(scrape(registry), media_type=CONTENT_TYPE), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        *blob_routes,
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, StateDamaged: damaged, Exception: internal_error})
    if token:
        app.add_middleware(TokenGate, token=token, open_prefix="/blobs/" if blob_routes else None)
    app.add_middleware(NoReferrer)  # added last: outermost, so the gate's own answers carry it too
    app.state.view = view
    app.state.metrics = registry
    return app


def start_status_page(view: ServerView, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
                      blob_routes: Sequence[BaseRoute] = ()) -> WebServer:  # fmt: skip
    """Serve :func:`make_app` of ``view`` on ``host``:``port`` in a thread; stop it with ``.stop()``.

    Raises BindRefused for a non-loopback ``host`` without a token, RuntimeError if it does not start within 10 s.
    """
    server = WebServer(make_app(view, token=token, blob_routes=blob_routes), host=host, port=port, token=token)
    server.start()
    try:
        threading.Thread(target=view.warm, name="status-page-warm", daemon=True).start()
    except BaseException:  # interrupted right after the start: the page does not go on without an owner
        server.stop()
        raise
    return server


def to_json_text(obj: Any) -> str:
    """``obj`` as JSON text without NaN (None instead), as the API writes it."""
    return json.dumps(clean(obj), allow_nan=False)

