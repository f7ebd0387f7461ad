"""The data folder's lock: ``serve`` holds it while it runs; an operator command holds it while it acts on the folder.

``<data>/serve.lock`` is an ``fcntl.flock`` the kernel releases when its process ends (even by
SIGKILL): a command that gets it knows no ``serve`` uses the folder; one that does not asks the
running server over its operator channel. The file names its holder (``serve pid 1234``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("fedhar.server.lock")

LOCK_NAME = "serve.lock"
"""The lock file in the data folder."""
SERVE = "serve"
"""What a serving process writes as its name in the lock file."""
COMMAND_WAIT_S = 120.0
"""How long (s) ``serve`` waits at start for an operator command that holds the folder (a command takes seconds)."""


class FolderInUse(RuntimeError):
    """Another ``serve`` (or a command that did not let go in time) holds the data folder; the message names it."""


class DataLock:
    """``<data>/serve.lock`` held by this process as ``what`` (written into the file for others' messages)."""

    def __init__(self, data: Path, what: str):
        self.data = Path(data)
        self.what = what
        self.path = self.data / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def holder(self) -> str:
        """Who the file says holds (or last held) the folder, e.g. ``"serve pid 1234"``; ``"another program"`` if unknown."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        return text or "another program"

    def try_acquire(self) -> bool:
        """Take the lock if it is free; True when taken (the file then names this process)."""
        if self._fd is not None:
            return True
        self.data.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            writable = True
        except PermissionError:  # made by another account (root's command before the chown): a lock needs no write
            fd, writable = os.open(self.path, os.O_RDONLY), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.what} pid {os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def acquire_for_serve(self, wait_s: float = COMMAND_WAIT_S) -> None:
        """Take the lock for ``serve``: wait (logged) while a command holds it, refuse at once when a server does.

        Raises FolderInUse if another ``serve`` holds the folder, or a command holds it past ``wait_s``.
        """
        end = time.monotonic() + wait_s
        said = False
        while not self.try_acquire():
            holder = self.holder()
            if holder.startswith(f"{SERVE} "):
                raise FolderInUse(f"data folder {self.data} is in use by another fedhar-coordinator serve ({holder}): stop it "
                                  "first; two servers of one federation would take each other's place on the broker")  # fmt: skip
            if time.monotonic() >= end:
                raise FolderInUse(f"data folder {self.data} is held by {holder} for more than {wait_s:.0f} s; "
                                  f"let it finish (or stop it), then start again")  # fmt: skip
            if not said:
                log.info("data folder %s is held by %s; waiting for it to finish", self.data, holder)
                said = True
            time.sleep(0.2)

    def release(self) -> None:
        """Let go of the lock (idempotent); the file stays, naming the last holder."""
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def holder_now(data: Path) -> str | None:
    """Who holds ``data``'s lock now (``"serve pid 1234"``), or None when nobody does; creates nothing."""
    path = Path(data) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return DataLock(data, "").holder()
    finally:
        os.close(fd)  # closing the descriptor lets go of a lock taken just now
    return None
