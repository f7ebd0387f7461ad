"""An ASGI app served by uvicorn in a thread of this process, and the rule for which addresses may be served.

The status page (:mod:`coordinator.server.web`) and the folder blob store
(:mod:`coordinator.transport.folder_store`) both start a :class:`WebServer`; uvicorn is imported
only when one is built. :func:`check_bind`: a non-loopback address shows the federation to the
network, so it needs a token, unless every URL carries the coordinator's signature (``signed``).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from typing import Any

from har_io.threads import join_started


class BindRefused(ValueError):
    """An HTTP address that must not be served as asked (a non-loopback address without a token)."""


MIN_TOKEN_CHARS = 16
"""A token shorter than this is refused: it could be guessed."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve ``host`` without a token unless it is a loopback address: BindRefused (naming the setting and the
    fix) for a non-loopback host (0.0.0.0 and host names included) without a token, or a token under :data:`MIN_TOKEN_CHARS`."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise BindRefused(f"[server] token is shorter than {MIN_TOKEN_CHARS} characters; use a long random one "
                          "(e.g. `openssl rand -hex 24`)")  # fmt: skip
    if not is_loopback(host) and not token:
        raise BindRefused(
            f"[server] http_bind = {host!r} would show the federation to the network without a login; "
            f"set [server] token to a long random string (e.g. `openssl rand -hex 24`), or bind 127.0.0.1"
        )


class WebServer:
    """uvicorn serving an ASGI app in a daemon thread of this process (what ``serve``, ``run`` and the tests use).

    ``port`` 0 picks a free one (:attr:`port` after :meth:`start`); ``token`` is only checked against
    the address (BindRefused from :func:`check_bind`), unless the app is ``signed`` (answers only URLs
    the coordinator signed).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8765, token: str | None = None, signed: bool = False):
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
        """Start serving; return the bound port (RuntimeError if not started within ``timeout`` s, e.g. a port taken)."""
        self._thread = threading.Thread(target=self._serve, name="fedhar-web", daemon=True)
        try:
            self._thread.start()
            end = time.monotonic() + timeout
            while not self._server.started and time.monotonic() < end and self._thread.is_alive():
                time.sleep(0.02)
        except BaseException:  # interrupted (SIGINT) while starting: nothing is left serving
            self.stop()
            raise
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
        join_started(self._thread, timeout)
