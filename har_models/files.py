"""Crash-safe file writes: the one way fedhar puts a file on disk (standard library only, so the core may use it).

A file is written under a temporary name in its own folder, flushed and ``fsync``-ed,
renamed over the target (atomic on POSIX), and then the folder itself is ``fsync``-ed so
the rename survives a power cut. Readers therefore see the old file or the new one,
never a half-written one, and a database row that names the file can be committed only
after :func:`atomic_write` returned (docs/reliability.md, "state on disk").
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (renames, new files) to disk; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a folder
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], object], mode: int | None = None) -> None:
    """Create or replace ``path`` atomically and durably.

    Parameters
    ----------
    path : Path
        Target file; its folder is created if missing.
    write : callable
        Called with a temporary path in the same folder; writes the whole content there
        (e.g. ``safetensors.numpy.save_file(d, str(tmp))`` or ``fig.savefig(tmp)``).
    mode : int, optional
        Permission bits of the new file (e.g. ``0o600`` for secrets); default: the umask's.

    Raises
    ------
    OSError
        If the folder is not writable or the disk is full; the old file, if any, is untouched
        and the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """:func:`atomic_write` of a bytes or text (UTF-8) payload."""
    payload = data.encode() if isinstance(data, str) else data
    atomic_write(path, lambda tmp: tmp.write_bytes(payload), mode=mode)
