"""Files of the broker folder with the owner, group and mode the broker needs, written atomically under one lock.

The broker (Mosquitto, often started as root and then running as its own account) reads
``passwd``, ``acl`` and the TLS key and writes ``data/``; a replacement keeps the mode and group
through which it reads them, and two runs on the same folder (the CLI and the home server) take
turns on :data:`~coordinator.broker.settings.LOCK_NAME`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from coordinator.broker.settings import LOCK_NAME, BrokerSettings, SetupError
from har_models.files import atomic_write, atomic_write_bytes


def write_file(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` atomically with ``text``, mode ``mode`` (e.g. 0o600 for a password)."""
    atomic_write_bytes(path, text, mode=mode)


def broker_access(path: Path) -> tuple[int, int] | None:
    """(permission bits, group id) of the broker-read file ``path`` as it is now, or None if it does not exist.

    A replacement keeps both: when the broker runs as another account that reads ``passwd`` and
    ``acl`` through their group (``chgrp mosquitto``, mode 0640), a file it cannot read would make
    Mosquitto 2 drop every password account on its next reload (measured with 2.0.11: every
    session closed, every login refused).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mode & 0o777, st.st_gid


def give_access(tmp: Path, target: Path, access: tuple[int, int] | None) -> None:
    """Give the not yet renamed ``tmp`` the mode and group ``target`` had (see :func:`broker_access`).

    Raises
    ------
    SetupError
        If this account may not give a file that group (it is not a member); ``target`` is untouched.
    """
    if access is None:
        return
    mode, gid = access
    os.chmod(tmp, mode)
    if gid != os.stat(tmp).st_gid:
        try:
            os.chown(tmp, -1, gid)
        except PermissionError:
            raise SetupError(
                f"{target} belongs to group {gid}, through which the broker reads it, and this account cannot give the new "
                f"file that group: add this account to the group (usermod -a -G <group> $USER) or run as the folder's owner"
            ) from None


def write_broker_file(path: Path, text: str) -> None:
    """Replace the broker-read ``path`` (the ACL) atomically, keeping its mode and group (new files: 0600)."""
    access = broker_access(path)

    def write(tmp: Path) -> None:
        tmp.write_text(text)
        give_access(tmp, path, access)

    atomic_write(path, write, mode=None if access else 0o600)


def broker_account(settings: BrokerSettings) -> Any:
    """The ``pwd`` entry of ``broker_user``; SetupError naming the fix if there is no such account."""
    import pwd

    try:
        return pwd.getpwnam(settings.broker_user)
    except KeyError:
        raise SetupError(
            f"--broker-user {settings.broker_user}: no such account; install mosquitto (it creates the 'mosquitto' account) "
            "or name the account the broker runs as"
        ) from None


def grant_broker_access(out: Path, created_out: bool, settings: BrokerSettings) -> None:
    """Started as root, Mosquitto reads passwd and acl and writes data/ as ``broker_user``: give that account access."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return  # the broker runs as the operator, who owns the files
    account = broker_account(settings)
    if account.pw_uid == 0:
        return
    gid = account.pw_gid
    if created_out:
        # Others may pass (x) but not list: the home server's own account reads fedhar-broker.json and the
        # certificates (their expiry on the status page); every secret in here has its own 0600/0640 mode.
        os.chown(out, 0, gid)
        os.chmod(out, 0o751)
    for name in ("passwd", "acl", *(("mosquitto.conf",) if settings.upstream else ())):  # a regional conf holds a password
        os.chown(out / name, 0, gid)
        os.chmod(out / name, 0o640)
    os.chown(out / "data", account.pw_uid, gid)
    os.chmod(out / "data", 0o700)


@contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out``'s :data:`LOCK_NAME` (blocking), so two runs never interleave their writes."""
    try:
        import fcntl
    except ImportError:  # not on a POSIX system: nothing to lock with
        yield
        return
    with open(out / LOCK_NAME, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
