"""Account passwords: made with :mod:`secrets`, hashed by Mosquitto's own ``mosquitto_passwd``, kept in ``credentials/``.

No password is ever hashed here, logged, or put on a command line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from coordinator.broker.files import broker_access, give_access
from coordinator.broker.settings import PASSWORD_SUFFIX, SetupError
from har_io.exit_codes import Exit

PASSWORD_BYTES = 24
"""Random bytes per password (``secrets.token_urlsafe``: 32 characters, 192 bits)."""


def find_mosquitto_passwd(explicit: str | None = None) -> str:
    """Path of the ``mosquitto_passwd`` executable.

    Parameters
    ----------
    explicit : str, optional
        A path given by the user; else ``$PATH`` and ``/usr/bin`` are searched.

    Raises
    ------
    SetupError
        (exit code 3) If it is not found: it ships with Mosquitto.
    """
    if explicit:
        if shutil.which(explicit):
            return explicit
        raise SetupError(f"--mosquitto-passwd {explicit}: not an executable file", exit_code=Exit.DATA)
    found = shutil.which("mosquitto_passwd") or next(
        (p for p in ("/usr/bin/mosquitto_passwd", "/usr/local/bin/mosquitto_passwd") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise SetupError(
            "mosquitto_passwd not found: install Mosquitto, which ships it (Debian, Ubuntu, Raspberry Pi OS: "
            "sudo apt-get install mosquitto; macOS: brew install mosquitto), or pass --mosquitto-passwd PATH",
            exit_code=Exit.DATA,
        )
    return found


def write_passwd(path: Path, passwords: dict[str, str], mosquitto_passwd: str) -> None:
    """Write Mosquitto's password file for ``passwords`` (user -> clear-text password), hashed by ``mosquitto_passwd``.

    The clear-text lines go to a private temporary file next to ``path`` that ``mosquitto_passwd -U``
    hashes in place (one process, and no password ever appears on a command line); it then
    replaces ``path`` atomically, with the mode and group ``path`` had (new: 0600), so a broker
    that reads it through its group still can. The temporary file is removed whatever happens.

    Parameters
    ----------
    path : Path
        The password file to (re)write.
    passwords : dict of str to str
        User names (fedhar ids, so never containing ``:``) and their passwords.
    mosquitto_passwd : str
        The executable (see :func:`find_mosquitto_passwd`).

    Raises
    ------
    SetupError
        (exit code 3) If ``mosquitto_passwd`` fails or leaves a line unhashed; (exit code 2) if
        the new file cannot be given the old one's group.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".passwd-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{user}:{pw}\n" for user, pw in sorted(passwords.items()))
        r = subprocess.run([mosquitto_passwd, "-U", tmp], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise SetupError(f"{mosquitto_passwd} -U failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()}", exit_code=Exit.DATA)
        lines = Path(tmp).read_text().splitlines()
        hashed = {ln.split(":", 1)[0] for ln in lines if re.match(r"^[^:]+:\$\d+\$", ln)}
        if hashed != set(passwords) or len(lines) != len(passwords):
            raise SetupError(f"{mosquitto_passwd} -U did not hash every password; is it Mosquitto's tool?", exit_code=Exit.DATA)
        give_access(Path(tmp), path, broker_access(path))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_password_file(path: Path) -> str:
    """The password in the file ``path`` (surrounding whitespace removed).

    Raises
    ------
    SetupError
        If it is empty or holds a character no generated password has (``:`` or a line break).
    """
    password = path.read_text().strip()
    if not password or any(c in password for c in ":\n\r"):
        raise SetupError(
            f"{path}: not a password written by fedhar-coordinator broker (empty or containing ':'); "
            f"delete it or give a new one (fedhar-coordinator broker rotate --out <folder> {path.stem})"
        )
    return password


def password_file(out: Path, user: str) -> Path:
    """Path of ``user``'s clear-text password file in the output folder ``out``: ``out/credentials/<user>.password``."""
    return out.expanduser().resolve() / "credentials" / f"{user}{PASSWORD_SUFFIX}"


def read_password(out: Path, user: str) -> str:
    """``user``'s password as generated in ``out``.

    Raises
    ------
    SetupError
        If there is no such password file (the account does not exist) or it is not one this package wrote.
    """
    path = password_file(out, user)
    if not path.is_file():
        raise SetupError(
            f"{path}: no such password file; {user!r} has no account in {out} "
            f"(fedhar-coordinator broker init --out {out} adds the service accounts, broker add a device's)"
        )
    return read_password_file(path)
