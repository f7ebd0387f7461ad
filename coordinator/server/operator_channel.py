"""The operator's channel to a running ``serve``: a Unix socket in the data folder that only the operator can use.

``<data>/operator.sock`` has mode 0600 and each peer is checked by ``SO_PEERCRED`` (root or the
server's own account). One request per connection, JSON lines both ways::

    -> {"command": "clear_device", "args": {"name": "phone-anna"}, "by": "anna"}
    <- {"note": "round 7 is open; ..."}        (zero or more: for stderr, while the request waits)
    <- {"lines": ["the running server cleared phone-anna's retained status ...", ...], "status": 0}
    <- {"lines": [], "error": "...", "status": 2}

What travels is a command's live side (:class:`coordinator.server.device_commands.Side`), done in the
serving loop's thread; the registry and broker accounts stay with the operator's command
(:class:`RemoteSide`). ``ping`` is answered at once.
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
from har_io.threads import join_started

log = logging.getLogger("fedhar.server.operator")

SOCKET_NAME = "operator.sock"
"""The socket in the data folder."""
NOTE_EVERY_S = 15.0
"""While a request waits for the serving loop, a note is sent this often (s)."""
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
    """A socket address for ``path`` and a folder descriptor to close: ``/proc/self/fd/N/NAME`` past AF_UNIX's 108 bytes."""
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

    ``busy(command)`` says in words why a queued request waits (None: done at once).
    """

    def __init__(self, data: Path, accept: Callable[[Job], None], busy: Callable[[str], str | None]):
        self.path = Path(data) / SOCKET_NAME
        self._accept, self._busy = accept, busy
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Make the socket (mode 0600; a stale one is replaced) and listen; OSError if the data folder is not writable."""
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
        join_started(self._thread, 5)
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
        conn.settimeout(10.0)
        raw = b""
        while not raw.endswith(b"\n") and len(raw) < MAX_REQUEST_BYTES:  # read first: the client waits for its answer
            chunk = conn.recv(4096)
            if not chunk:
                break
            raw += chunk
        uid = _peer_uid(conn)
        if uid not in (0, os.geteuid()):
            _send(conn, {"error": f"uid {uid} may not give this server commands (root or its own account only)", "status": 2})
            log.warning("operator channel: a command from uid %d was refused", uid)
            return
        try:
            req = json.loads(raw)
            job = Job(str(req["command"]), dict(req.get("args") or {}), str(req.get("by") or f"uid {uid}"))
        except (ValueError, KeyError, TypeError) as exc:
            _send(conn, {"error": f"not a request ({exc})", "status": 2})
            return
        if job.command == "ping":
            _send(conn, {"lines": [], "status": 0})
            return
        self._accept(job)
        last_note = -NOTE_EVERY_S
        while True:
            why = self._busy(job.command)
            if why is not None and time.monotonic() - last_note >= NOTE_EVERY_S:  # said at once, then now and then
                _send(conn, {"note": f"{why}; the server does its part when it closes"})
                last_note = time.monotonic()
            try:
                reply = job.replies.get(timeout=1.0)
            except queue.Empty:
                continue
            _send(conn, reply)
            if "status" in reply:
                return


@dataclass(frozen=True)
class Answer:
    """The server's answer: the lines the command prints, its exit status, and for a failure its message."""

    lines: list[str]
    status: int
    error: str | None = None


def ask(data: Path, command: str, args: dict[str, Any], err: TextIO | None = None) -> Answer:
    """Give the server on ``data`` the request ``command``, printing its notes on ``err``.

    Raises ChannelClosed if no server listens, or it stopped (or fell silent for :data:`SILENT_LIMIT_S`) before answering.
    """
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
        try:
            for text in sock.makefile("r", encoding="utf-8"):
                msg = json.loads(text)
                if "note" in msg:
                    print(f"fedhar-coordinator: {msg['note']}", file=err, flush=True)
                    continue
                return Answer([str(x) for x in msg.get("lines", [])], int(msg.get("status", 1)), msg.get("error"))
        except TimeoutError:
            raise ChannelClosed(f"the server on {path} said nothing for {SILENT_LIMIT_S:.0f} s; see its log "
                                "(journalctl -u fedhar-coordinator): it may still do it") from None
    raise ChannelClosed(f"the server on {path} stopped before it answered; see its log (journalctl -u fedhar-coordinator)")


class RemoteSide:
    """A command's live side done by the running server over the socket of ``data``, between rounds.

    Each operation raises DeviceCommandError if the server refused it or stopped before answering.
    """

    def __init__(self, data: Path, err: TextIO | None = None):
        self.data, self._err = Path(data), err

    def _ask(self, op: str, **args: Any) -> list[str]:
        from coordinator.server.device_commands import DeviceCommandError

        try:
            got = ask(self.data, op, args, self._err)
        except ChannelClosed as exc:
            raise DeviceCommandError(f"{exc}; what the command did before stays done, the running server's part "
                                     "(the broker's retained topics, the run's records) is not: run it again") from None  # fmt: skip
        if got.status != 0:
            raise DeviceCommandError(got.error or f"the server could not do {op} (status {got.status})")
        return got.lines

    def clear_device(self, name: str) -> str:
        return "; ".join(self._ask("clear_device", name=name))

    def forget_device(self, name: str) -> list[str]:
        return self._ask("forget_device", name=name)

    def rename_device(self, old: str, new: str) -> list[str]:
        return self._ask("rename_device", old=old, new=new)

    def release(self, name: str) -> list[str]:
        return self._ask("release", name=name)

    def model_request(self, action: str, version: int | None) -> list[str]:
        return self._ask("model_request", action=action, version=version)
