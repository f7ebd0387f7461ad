"""Who may read what on the home server: the data folder's owner, and the files ``serve`` reads from others' folders.

Commands run with sudo while ``serve`` runs as the data folder's owner: :func:`match_data_owner`
gives back what root created there; :func:`access_problems` finds, at start, each broker file the
server's account cannot read, with the ``chmod``/``chown`` that fixes it.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
from pathlib import Path

from coordinator.server.settings import ServerSettings

log = logging.getLogger("fedhar.devices")


def match_data_owner(data: Path) -> list[Path]:
    """Give what root created under ``data`` to the data folder's owner; returns the paths changed.

    Only files owned by root are changed, and only when this process is root and the folder
    belongs to someone else.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not data.is_dir():
        return []
    st = data.stat()
    if st.st_uid == 0:
        return []
    changed = []
    for path in [data, *data.rglob("*")]:
        try:
            if path.lstat().st_uid == 0 and not path.is_symlink():
                os.chown(path, st.st_uid, st.st_gid)
                changed.append(path)
        except OSError as exc:
            log.warning("could not give %s to the data folder's owner (uid %d): %s", path, st.st_uid, exc)
    return changed


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _allowed(st: os.stat_result, uid: int, gids: set[int], bit: str) -> bool:
    """Whether ``uid`` (in groups ``gids``) has permission ``bit`` ("r" or "x") on a file with stat ``st``."""
    if uid == 0:
        return True
    shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
    return bool(st.st_mode & ((stat.S_IROTH if bit == "r" else stat.S_IXOTH) << shift))


def read_problem(path: Path, uid: int, gids: set[int], secret: bool = False) -> str | None:
    """Why account ``uid`` (groups ``gids``) cannot read ``path``, with the fix; None when it can (or it does not exist).

    The first folder without x or file without r is named with owner, group and mode; a ``secret`` is
    never offered to everyone (the fix gives the account its own copy).
    """
    path = Path(path).absolute()
    if not path.exists():
        return None
    who = _name(uid)
    own_copy = f"fix: sudo install -m 600 -o {who} {path} <a file of {who}'s> and name that file in server.toml"
    for folder in reversed(path.parents):
        st = folder.stat()
        if not _allowed(st, uid, gids, "x"):
            fix = own_copy if secret else f"fix: sudo chmod o+x {folder}"
            return (f"{path} cannot be read by {who}: the folder {folder} ({_name(st.st_uid)}:{_group(st.st_gid)}, mode "
                    f"{stat.S_IMODE(st.st_mode):04o}) does not let it pass; {fix}")  # fmt: skip
    st = path.stat()
    if not _allowed(st, uid, gids, "r"):
        fix = own_copy if secret else f"fix: sudo chmod o+r {path}"
        return f"{path} cannot be read by {who} ({_name(st.st_uid)}:{_group(st.st_gid)}, mode {stat.S_IMODE(st.st_mode):04o}); {fix}"
    return None


def access_problems(server: ServerSettings, uid: int | None = None, gids: set[int] | None = None) -> list[str]:
    """The files ``serve`` reads outside its data folder (broker manifest, TLS certificate and CA, monitor password) it cannot read."""
    uid = os.geteuid() if uid is None else uid
    gids = ({os.getegid(), *os.getgroups()} if uid == os.geteuid() else set()) if gids is None else gids
    files: list[tuple[Path, bool]] = []
    if server.broker_dir:
        from coordinator.broker.settings import MANIFEST_NAME

        broker = Path(server.broker_dir).expanduser()
        files += [(broker / MANIFEST_NAME, False), (broker / "tls" / "server.crt", False), (broker / "tls" / "ca.crt", False)]
    if server.monitor_password_file:
        files.append((Path(server.monitor_password_file).expanduser(), True))
    return [p for p in (read_problem(f, uid, gids, secret) for f, secret in files) if p is not None]
