"""Device accounts on the federation's Mosquitto, for the home server: add, remove, reload, clear.

The broker folder is the output of ``fedhar-coordinator broker init`` (:mod:`coordinator.broker`;
``firmware_scripts/mosquitto_config.py`` is its wrapper): it holds ``fedhar-broker.json``,
``passwd``, ``acl``, ``credentials/`` and ``mosquitto.conf``. :class:`BrokerAdmin` changes one
device's account through :func:`coordinator.broker.add_device` and
:func:`coordinator.broker.remove_device` (``passwd`` and ``acl`` are rewritten atomically under
the folder's lock) and then makes the running broker re-read them (:meth:`BrokerAdmin.reload_broker`):

* ``"pid:/path/mosquitto.pid"``: SIGHUP to the process named in that file, once it is checked
  to be a running ``mosquitto`` (a stale PID file never signals an unrelated process);
* ``"systemctl"`` (or ``"systemctl:UNIT"``): ``systemctl reload mosquitto`` (or ``UNIT``);
* ``"auto"``: the ``pid_file`` the generated ``mosquitto.conf`` names, if a Mosquitto runs with
  it; else ``systemctl reload mosquitto`` where systemd runs that unit; else an error that says
  how to reload by hand;
* ``"none"``: nothing (the operator reloads).

What Mosquitto 2 does on that reload (measured with 2.0.11 in ``tests/test_broker_admin.py``):
the live session of an account no longer in ``passwd`` is closed at once, without its last will;
a reconnect with the old password gets CONNACK "not authorised". Revocation is therefore final on
the broker once :meth:`BrokerAdmin.remove_device` returns; what stays is the device's retained
status and personalised model, which :func:`clear_device_topics` deletes (call it afterwards,
when the device can no longer publish them again).

Passwords are never logged; :meth:`BrokerAdmin.add_device` returns the new one, and it stays in
``credentials/<name>.password`` (mode 0600) for a later enrolment bundle.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator import broker
from coordinator.broker.passwords import password_file

if TYPE_CHECKING:
    from har_io.mqtt_link import MqttLink
    from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.server.broker")

SYSTEMD_UNIT = "mosquitto"
"""The unit ``"systemctl"`` and ``"auto"`` reload unless ``"systemctl:UNIT"`` names another."""
SYSTEMCTL_TIMEOUT_S = 30.0
"""Bound on one ``systemctl`` call (seconds)."""


class BrokerAdminError(RuntimeError):
    """A broker account or reload operation failed; the message names the cause and the fix."""


class BrokerReloadFailed(BrokerAdminError):
    """The account files were written but the running broker was not reloaded.

    Attributes
    ----------
    password : str or None
        For :meth:`BrokerAdmin.add_device`: the new device's password (also in
        ``credentials/<name>.password``), so an enrolment can go on once the broker is reloaded by
        hand. Never part of the message.
    """

    def __init__(self, message: str, password: str | None = None):
        super().__init__(message)
        self.password = password

    def __repr__(self) -> str:
        return f"BrokerReloadFailed({str(self)!r})"


def _reload_spec(reload: str) -> tuple[str, str]:
    """(kind, argument) of a reload setting; see :class:`BrokerAdmin`."""
    if reload in ("auto", "none"):
        return reload, ""
    if reload == "systemctl":
        return "systemctl", SYSTEMD_UNIT
    kind, sep, arg = reload.partition(":")
    if sep and arg and kind in ("pid", "systemctl"):
        return kind, arg
    raise BrokerAdminError(
        f"broker reload {reload!r} is not understood: use 'auto', 'pid:/path/to/mosquitto.pid', 'systemctl', "
        "'systemctl:UNIT' or 'none'"
    )


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
    """The process id in the PID file ``path`` of a running Mosquitto (``conf``: its configuration, named in errors).

    Raises
    ------
    BrokerAdminError
        If the file is missing or unreadable, holds no process id, or names a process that is
        not running or is not ``mosquitto`` (a stale file: the broker stopped and the id may
        have been reused).
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
    """Send SIGHUP to the Mosquitto named in ``pid_file`` (checked by :func:`read_pid_file`); return its pid.

    Mosquitto then re-reads its password file and ACL (and closes sessions of removed accounts).

    Raises
    ------
    BrokerAdminError
        As :func:`read_pid_file`, or if this account may not signal the broker's.
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


def _systemd_running() -> bool:
    return shutil.which("systemctl") is not None and Path("/run/systemd/system").is_dir()


def systemctl_reload(unit: str = SYSTEMD_UNIT) -> None:
    """``systemctl reload UNIT``.

    Raises
    ------
    BrokerAdminError
        If systemctl is missing, times out, or fails (its message is included).
    """
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


@dataclass(frozen=True)
class BrokerAdmin:
    """The federation's broker accounts, changed one device at a time.

    Parameters
    ----------
    broker_dir : Path
        Output folder of ``fedhar-coordinator broker init`` (holds ``fedhar-broker.json``).
    reload : str
        How to make the running broker re-read its accounts: ``"auto"``, ``"pid:/path/to/mosquitto.pid"``,
        ``"systemctl"``, ``"systemctl:UNIT"`` or ``"none"`` (see the module's docstring).
    mosquitto_passwd : str, optional
        Path of ``mosquitto_passwd`` (default: searched on PATH).

    Raises
    ------
    BrokerAdminError
        On construction, for a ``reload`` it does not understand.
    """

    broker_dir: Path
    reload: str = "auto"
    mosquitto_passwd: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "broker_dir", Path(self.broker_dir).expanduser().resolve())
        _reload_spec(self.reload)

    # -- reading ---------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run the broker tooling's function ``fn``, turning its errors into BrokerAdminError."""
        try:
            return fn(*args, **kw)
        except broker.SetupError as exc:
            raise BrokerAdminError(str(exc)) from None
        except PermissionError as exc:
            raise BrokerAdminError(
                f"{exc.filename or self.broker_dir}: permission denied; the server's account must be able to write the broker "
                f"folder {self.broker_dir} (run the server as its owner, or give that account the folder)"
            ) from None
        except OSError as exc:
            raise BrokerAdminError(f"{exc.filename or self.broker_dir}: {exc.strerror or exc}") from None

    def settings(self) -> broker.BrokerSettings:
        """The broker folder's settings (federation, user names, ports, TLS).

        Raises
        ------
        BrokerAdminError
            If the folder is missing or not a generated one.
        """
        return self._call(broker.read_settings, self.broker_dir)

    @property
    def federation(self) -> str:
        """The federation the broker folder was generated for."""
        return str(self.settings().federation)

    def devices(self) -> list[str]:
        """Device ids that have an account, sorted.

        Raises
        ------
        BrokerAdminError
            If the folder is missing or not a generated one.
        """
        return list(self._call(broker.configured_devices, self.broker_dir))

    def password(self, name: str) -> str:
        """The current password of account ``name`` (a device, the coordinator, the monitor).

        Raises
        ------
        BrokerAdminError
            If the account does not exist.
        """
        self.settings()  # a missing folder says so first
        return str(self._call(broker.read_password, self.broker_dir, name))

    def monitor_credentials(self) -> tuple[str, str]:
        """(user name, password) of the read-only monitor account (reads ``fedhar/v1/<fed>/#``, writes nothing).

        Raises
        ------
        BrokerAdminError
            If the folder is missing, or was generated before the monitor account existed (the
            message says to re-run fedhar-coordinator broker init on it and reload).
        """
        user = str(self.settings().monitor_user)
        path = password_file(self.broker_dir, user)
        if not path.is_file():
            raise BrokerAdminError(
                f"{self.broker_dir} has no monitor account yet ({path} is missing): run "
                f"fedhar-coordinator broker init --out {self.broker_dir} once (it adds it), then reload the broker"
            )
        return user, str(self._call(broker.read_password, self.broker_dir, user))

    # -- changing --------------------------------------------------------------------------------
    def add_device(self, name: str, replace: bool = False) -> str:
        """Create device ``name``'s account and ACL rules, reload the broker, and return its password.

        Parameters
        ----------
        name : str
            The device's fedhar client id (its user name).
        replace : bool
            If the device has an account already, give it a new password instead of refusing; at
            the reload Mosquitto closes a session logged in with the old one and refuses it from then on.

        Returns
        -------
        str
            The new password (clear text; never logged; also in ``credentials/<name>.password``).

        Raises
        ------
        BrokerReloadFailed
            The account was written but the broker was not reloaded; ``.password`` holds the password.
        BrokerAdminError
            For a missing broker folder, an invalid or reserved name, an existing device
            (without ``replace``), or a failing ``mosquitto_passwd``; nothing was changed then.
        """
        _, password = self._call(broker.add_device, self.broker_dir, name, replace=replace, mosquitto_passwd=self.mosquitto_passwd)
        log.info("broker account for %s %s", name, "given a new password" if replace else "created")
        try:
            self.reload_broker()
        except BrokerAdminError as exc:
            raise BrokerReloadFailed(f"the account of {name!r} was written, but {exc}", password=password) from None
        return str(password)

    def remove_device(self, name: str) -> None:
        """Remove device ``name``'s account and ACL rules and reload the broker.

        On the reload Mosquitto 2 closes the device's live session (without its last will) and
        from then on refuses its old password (CONNACK "not authorised"). Its retained status and
        personalised model stay on the broker: :func:`clear_device_topics` deletes them.

        Raises
        ------
        BrokerReloadFailed
            The account was removed from the files but the broker was not reloaded: the device
            can still use its live session until it is (the message says how).
        BrokerAdminError
            For a missing broker folder or an unknown device; nothing was changed then.
        """
        self._call(broker.remove_device, self.broker_dir, name, mosquitto_passwd=self.mosquitto_passwd)
        log.info("broker account for %s removed", name)
        try:
            self.reload_broker()
        except BrokerAdminError as exc:
            raise BrokerReloadFailed(f"the account of {name!r} was removed from the files, but {exc}") from None

    def pid_file(self) -> Path | None:
        """The ``pid_file`` named in the broker folder's ``mosquitto.conf``, or None if it names none."""
        conf = self.broker_dir / "mosquitto.conf"
        try:
            lines = conf.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.strip().partition(" ")
            if key == "pid_file" and value.strip():
                return Path(value.strip())
        return None

    def reload_broker(self) -> None:
        """Make the running broker re-read its password file and ACL, as :attr:`reload` says.

        Raises
        ------
        BrokerAdminError
            If the broker could not be reloaded; the message names the cause and how to reload by hand.
        """
        kind, arg = _reload_spec(self.reload)
        if kind == "none":
            log.info("broker reload left to the operator (reload 'none')")
            return
        if kind == "pid":
            pid = signal_reload(Path(arg), self.broker_dir / "mosquitto.conf")
            log.info("reloaded mosquitto (SIGHUP to pid %d)", pid)
            return
        if kind == "systemctl":
            systemctl_reload(arg)
            log.info("reloaded the broker (systemctl reload %s)", arg)
            return
        # auto
        pid_file = self.pid_file()
        pid_problem = f"{self.broker_dir / 'mosquitto.conf'} names no pid_file"
        if pid_file is not None:
            try:
                pid = signal_reload(pid_file, self.broker_dir / "mosquitto.conf")
            except BrokerAdminError as exc:
                pid_problem = str(exc)
            else:
                log.info("reloaded mosquitto (SIGHUP to pid %d from %s)", pid, pid_file)
                return
        if _systemd_running():
            try:
                active = subprocess.run(
                    ["systemctl", "is-active", "--quiet", SYSTEMD_UNIT], timeout=SYSTEMCTL_TIMEOUT_S, stdin=subprocess.DEVNULL
                ).returncode
            except subprocess.TimeoutExpired:
                active = -1
            if active == 0:
                systemctl_reload(SYSTEMD_UNIT)
                log.info("reloaded the broker (systemctl reload %s)", SYSTEMD_UNIT)
                return
        conf = self.broker_dir / "mosquitto.conf"
        raise BrokerAdminError(
            f"the broker was not reloaded: {pid_problem}; and no systemd unit {SYSTEMD_UNIT!r} is active. Reload it by hand "
            f"(kill -HUP <pid of the mosquitto running with {conf}>, or sudo systemctl reload <its unit>), or start it "
            f"(mosquitto -c {conf})"
        )


def clear_device_topics(link: MqttLink, topics: Topics, name: str, timeout: float = 60.0) -> list[str]:
    """Delete what the broker retains of device ``name``: its status and its personalised model chunks.

    Publishes an empty retained message on ``{p}/client/<name>/status`` and on every retained
    ``{p}/client/<name>/model/<i>`` (found with :meth:`MqttLink.sweep_retained`, which waits until
    retained messages stop arriving). ``link`` must be logged in with an account that may write
    there: the coordinator's (``topic readwrite {p}/#`` in the generated ACL). Call it after
    :meth:`BrokerAdmin.remove_device`, once the device can no longer publish its status again.

    Parameters
    ----------
    link : MqttLink
        A connected link (the coordinator's).
    topics : Topics
        The federation's topics.
    name : str
        The device's client id.
    timeout : float
        Bound on the sweep and on each acknowledgement (seconds).

    Returns
    -------
    list of str
        The topics cleared: the status topic first, then the model chunks found (sorted).

    Raises
    ------
    ValueError
        For an invalid client id (a ``+`` or ``#`` would widen the sweep to other devices).
    TimeoutError, BrokerRefused
        As :meth:`MqttLink.publish` (not connected, or not acknowledged in time).
    """
    from har_models.wire.topics import check_client_id

    check_client_id(name)
    status = topics.client_status(name)
    link.clear_retained([status], timeout=timeout)
    models = link.sweep_retained([topics.client_model(name, "+")], timeout=timeout)
    log.info("cleared the retained status and %d model chunk(s) of %s", len(models), name)
    return [status, *models]
