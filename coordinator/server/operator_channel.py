"""The operator's channel to a running ``serve``: a Unix socket in the data folder that only the operator can use.

``<data>/operator.sock`` is made by ``serve`` with mode 0600 (its owner is the server's account;
root, as ``sudo fedhar-coordinator ...`` runs, passes any file mode) and every connection's peer
is checked again by its credentials (``SO_PEERCRED``: root or the server's own account). One
request per connection, JSON lines both ways::

    -> {"command": "revoke", "args": {"name": "phone-anna"}, "by": "anna"}
    <- {"note": "round 7 is open; ..."}        (zero or more: for stderr, while the request waits)
    <- {"lines": ["phone-anna recorded as revoked ...", ...], "status": 0}
    <- {"error": "device 'x' is not enrolled ...", "status": 2}

The server takes one request at a time and does it in its serving loop's thread, between rounds
(:class:`coordinator.server.operator_desk.OperatorDesk`); the client (:func:`ask`) prints the lines
and returns the status, the same exit status the command has when it acts on the folder itself.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from coordinator.server.audit import who

log = logging.getLogger("fedhar.server.operator")

SOCKET_NAME = "operator.sock"
"""The socket in the data folder."""
NOTE_EVERY_S = 15.0
"""While a request waits for the serving loop, a note is sent this often (s), so the client knows the server lives."""
SILENT_LIMIT_S = 120.0
"""A client gives up after this long (s) without a word from the server."""
MAX_REQUEST_BYTES = 65536


class ChannelClosed(ConnectionError):
    """No server answers on the socket (none runs, it is starting, or it stopped while asked)."""


@dataclass
class Job:
    """One operator request on its way through the server: what was asked, by whom, and where the answer goes."""

    command: str
    args: dict[str, Any]
    by: str
    replies: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def answer(self, lines: list[str], status: int = 0, error: str | None = None) -> None:
        """The final answer: the lines the command prints, its exit status and, for a failure, its message."""
        self.replies.put({"lines": lines, "status": status} if error is None else {"lines": lines, "status": status, "error": error})


def _address(path: Path) -> tuple[str, int | None]:
    """A socket address for ``path`` and a folder descriptor to close after use: ``path`` itself when it fits
    AF_UNIX's 108 bytes, else ``/proc/self/fd/N/NAME`` through the folder opened by descriptor (Linux)."""
    if len(os.fsencode(str(path))) < 100:
        return str(path), None
    fd = os.open(path.parent, os.O_PATH)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def _peer_uid(conn: socket.socket) -> int:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])


def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
    conn.sendall(json.dumps(msg).encode() + b"\n")


class OperatorChannel:
    """The server's end: listens on ``<data>/operator.sock`` in a thread and hands each request to ``accept``.

    Parameters
    ----------
    data : Path
        The data folder (the server holds its lock).
    accept : callable
        ``accept(job)``, called in the channel's thread: queue the job for the serving loop (or answer it).
    busy : callable
        Why a queued request waits, in words (``"round 7 is open ..."``), or None when the loop is between rounds.
    """

    def __init__(self, data: Path, accept: Callable[[Job], None], busy: Callable[[], str | None]):
        self.path = Path(data) / SOCKET_NAME
        self._accept, self._busy = accept, busy
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Make the socket (mode 0600; a stale one left by a killed server is replaced) and listen.

        Raises
        ------
        OSError
            If the socket cannot be made (the data folder is not writable).
        """
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = _address(self.path)
        old = os.umask(0o177)  # the file is 0600 from its first moment, not after a chmod
        try:
            sock.bind(address)
        finally:
            os.umask(old)
            if fd is not None:
                os.close(fd)
        os.chmod(self.path, 0o600)
        sock.listen(4)
        sock.settimeout(0.5)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="operator-channel", daemon=True)
        self._thread.start()
        log.info("operator commands are taken on %s (revoke, reissue, rename, forget, pin, rollback, approve, release)", self.path)

    def stop(self) -> None:
        """Stop listening and delete the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._sock is not None:
            self._sock.close()
        self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    self._one(conn)
                except OSError as exc:  # the client went away: the request, if queued, is still done
                    log.info("operator channel: the client left before its answer (%s)", exc)

    def _one(self, conn: socket.socket) -> None:
        uid = _peer_uid(conn)
        if uid not in (0, os.geteuid()):
            _send(conn, {"error": f"uid {uid} may not give this server commands (root or its own account only)", "status": 2})
            log.warning("operator channel: a command from uid %d was refused", uid)
            return
        conn.settimeout(10.0)
        raw = b""
        while not raw.endswith(b"\n") and len(raw) < MAX_REQUEST_BYTES:
            chunk = conn.recv(4096)
            if not chunk:
                break
            raw += chunk
        try:
            req = json.loads(raw)
            job = Job(str(req["command"]), dict(req.get("args") or {}), str(req.get("by") or f"uid {uid}"))
        except (ValueError, KeyError, TypeError) as exc:
            _send(conn, {"error": f"not a request ({exc})", "status": 2})
            return
        self._accept(job)
        last_note = -NOTE_EVERY_S
        while True:
            why = self._busy()
            if why is not None and time.monotonic() - last_note >= NOTE_EVERY_S:  # said at once, then now and then
                _send(conn, {"note": f"{why}; the server does '{job.command}' when it closes"})
                last_note = time.monotonic()
            try:
                reply = job.replies.get(timeout=1.0)
            except queue.Empty:
                continue
            _send(conn, reply)
            if "status" in reply:
                return


def ask(data: Path, command: str, args: dict[str, Any], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Give the server on ``data`` the command; print its notes (``err``) and lines (``out``); return its exit status.

    Raises
    ------
    ChannelClosed
        If no server listens on the socket, or it stopped before answering.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    path = Path(data) / SOCKET_NAME
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, fd = _address(path)
    try:
        sock.connect(address)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise ChannelClosed(f"no server answers on {path} ({exc.strerror or exc})") from None
    finally:
        if fd is not None:
            os.close(fd)
    with sock:
        sock.settimeout(SILENT_LIMIT_S)
        sock.sendall(json.dumps({"command": command, "args": args, "by": who()}).encode() + b"\n")
        reader = sock.makefile("r", encoding="utf-8")
        try:
            for text in reader:
                msg = json.loads(text)
                if "note" in msg:
                    print(f"fedhar-coordinator {command}: {msg['note']}", file=err, flush=True)
                    continue
                for line in msg.get("lines", []):
                    print(line, file=out)
                if msg.get("error"):
                    print(f"fedhar-coordinator {command}: {msg['error']}", file=err)
                return int(msg.get("status", 1))
        except TimeoutError:
            raise ChannelClosed(f"the server on {path} said nothing for {SILENT_LIMIT_S:.0f} s; see its log "
                                "(journalctl -u fedhar-coordinator): the command may still be done") from None
    raise ChannelClosed(f"the server on {path} stopped before it answered; see its log (journalctl -u fedhar-coordinator)")
