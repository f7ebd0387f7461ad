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
    """Path of ``mosquitto_passwd``: ``explicit``, else searched on ``$PATH`` and ``/usr/bin``; SetupError (exit 3) if not found."""
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
    """Write Mosquitto's password file for ``passwords`` (user -> clear text), hashed by ``mosquitto_passwd -U``.

    The clear text goes to a private temporary file beside ``path`` (never on a command line), hashed in
    place, then replaces ``path`` atomically with its old mode and group (new: 0600). Raises SetupError
    (exit 3) if ``mosquitto_passwd`` fails or leaves a line unhashed, (exit 2) if the group cannot be kept.
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
    """The password in the file ``path``; SetupError if it is empty or holds ``:`` or a line break."""
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
    """``user``'s password as generated in ``out``; SetupError if the account has no password file or a foreign one."""
    path = password_file(out, user)
    if not path.is_file():
        raise SetupError(
            f"{path}: no such password file; {user!r} has no account in {out} "
            f"(fedhar-coordinator broker init --out {out} adds the service accounts, broker add a device's)"
        )
    return read_password_file(path)
