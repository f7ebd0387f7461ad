"""How the running Mosquitto is made to re-read its accounts: SIGHUP through its PID file, or ``systemctl reload``.

:class:`coordinator.server.broker_admin.BrokerAdmin` picks one of these by its ``reload`` setting; a
stale PID file never signals an unrelated process (the process is checked to be ``mosquitto``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

SYSTEMD_UNIT = "mosquitto"
"""The unit ``"systemctl"`` and ``"auto"`` reload unless ``"systemctl:UNIT"`` names another."""
SYSTEMCTL_TIMEOUT_S = 30.0
"""Bound on one ``systemctl`` call (seconds)."""


class BrokerAdminError(RuntimeError):
    """A broker account or reload operation failed; the message names the cause and the fix."""


class BrokerReloadFailed(BrokerAdminError):
    """The account files were written but the running broker was not reloaded.

    ``password``: for ``add_device``, the new password (also in ``credentials/``), never in the message.
    """

    def __init__(self, message: str, password: str | None = None):
        super().__init__(message)
        self.password = password

    def __repr__(self) -> str:
        return f"BrokerReloadFailed({str(self)!r})"


def process_name(pid: int) -> str | None:
    """The executable name of process ``pid`` (``/proc/<pid>/comm``, else ``ps``), or None if no such process runs."""
    comm = Path(f"/proc/{pid}/comm")
    if Path("/proc/self/comm").exists():
        try:
            return comm.read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            return None
    ps = shutil.which("ps")
    if ps is None:
        return None
    r = subprocess.run([ps, "-p", str(pid), "-o", "comm="], capture_output=True, text=True, timeout=10)
    name = r.stdout.strip()
    return Path(name).name if r.returncode == 0 and name else None


def read_pid_file(path: Path, conf: Path | None = None) -> int:
    """The process id in the PID file ``path`` of a running Mosquitto (``conf`` is named in errors).

    Raises BrokerAdminError if the file is missing or unreadable, holds no process id, or names a process
    that is not running or not ``mosquitto`` (a stale file).
    """
    start = f"mosquitto -c {conf if conf is not None else '<broker folder>/mosquitto.conf'}"
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise BrokerAdminError(
            f"PID file {path} does not exist: the broker is not running with 'pid_file {path}' "
            f"(start it with {start}, or name the right PID file)"
        ) from None
    except OSError as exc:
        raise BrokerAdminError(f"PID file {path} cannot be read ({exc.strerror or exc}); give this account read access to it") from None
    try:
        pid = int(text)
        if pid <= 0:
            raise ValueError(text)
    except ValueError:
        raise BrokerAdminError(f"PID file {path} holds {text[:40]!r}, not a process id; remove it and restart the broker") from None
    name = process_name(pid)
    if name is None:
        raise BrokerAdminError(
            f"stale PID file {path}: process {pid} is not running; start the broker ({start}) or remove the file"
        )
    if name != "mosquitto":
        raise BrokerAdminError(
            f"stale PID file {path}: process {pid} is {name!r}, not mosquitto; nothing was signalled. Start the broker "
            f"({start}) or remove the file"
        )
    return pid


def signal_reload(pid_file: Path, conf: Path | None = None) -> int:
    """SIGHUP to the Mosquitto of ``pid_file`` (it re-reads passwords and ACL); its pid.

    Raises BrokerAdminError as :func:`read_pid_file`, or if this account may not signal it.
    """
    pid = read_pid_file(pid_file, conf)
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise BrokerAdminError(f"mosquitto (pid {pid}, from {pid_file}) exited just now; start it again") from None
    except PermissionError:
        raise BrokerAdminError(
            f"not allowed to signal mosquitto (pid {pid}, from {pid_file}): it runs as another account. Run the server "
            "as the broker's account, or reload through systemd (broker reload 'systemctl', with the right to reload the unit)"
        ) from None
    return pid


def systemd_running() -> bool:
    """Whether systemd runs this machine (``/run/systemd/system``) and ``systemctl`` is on PATH."""
    return shutil.which("systemctl") is not None and Path("/run/systemd/system").is_dir()


def systemctl_reload(unit: str = SYSTEMD_UNIT) -> None:
    """``systemctl reload UNIT``; BrokerAdminError (with its message) if systemctl is missing, times out or fails."""
    exe = shutil.which("systemctl")
    if exe is None:
        raise BrokerAdminError(
            "systemctl not found: this machine has no systemd; reload the broker with kill -HUP $(cat <broker folder>/data/mosquitto.pid) "
            "or set the broker reload to 'pid:/path/to/mosquitto.pid'"
        )
    cmd = [exe, "reload", unit]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BrokerAdminError(f"{shlex.join(cmd)} did not finish in {SYSTEMCTL_TIMEOUT_S:g} s; check journalctl -u {unit}") from None
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip() or f"exit {r.returncode}"
        raise BrokerAdminError(
            f"{shlex.join(cmd)} failed: {why}. Reload it by hand (sudo systemctl reload {unit}), or allow this account "
            "to reload the unit (a polkit rule), or run the server as the broker's account with reload 'pid:...'"
        )
