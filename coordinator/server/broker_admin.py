"""Device accounts on the federation's Mosquitto, for the home server: add, remove, reload, clear.

:class:`BrokerAdmin` changes one account of a folder written by ``fedhar-coordinator broker init``
(through :func:`coordinator.broker.add_device` / ``remove_device``) and then reloads the running broker:

* ``"pid:/path/mosquitto.pid"``: SIGHUP to that process, once checked to be a running ``mosquitto``;
* ``"systemctl"`` (or ``"systemctl:UNIT"``): ``systemctl reload mosquitto`` (or ``UNIT``);
* ``"auto"``: the ``pid_file`` of the generated ``mosquitto.conf`` if a Mosquitto runs with it, else
  the systemd unit if active, else an error saying how to reload by hand;
* ``"none"``: nothing (the operator reloads).

On that reload Mosquitto 2 closes the live session of an account no longer in ``passwd`` (without its
will) and refuses its old password (``tests/test_broker_admin.py``), so revocation is final when
:meth:`BrokerAdmin.remove_device` returns; retained topics are cleared by
:func:`coordinator.server.broker_session.clear_device_topics`, and a certificate session by
``close_session``. Passwords are never logged; they stay in ``credentials/<name>.password`` (0600).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator import broker
from coordinator.broker.passwords import password_file
from coordinator.server.broker_reload import (
    SYSTEMCTL_TIMEOUT_S,
    SYSTEMD_UNIT,
    BrokerAdminError,
    BrokerReloadFailed,
    read_pid_file,
    signal_reload,
    systemctl_reload,
    systemd_running,
)
from coordinator.server.broker_session import clear_device_topics

__all__ = ["BrokerAdmin", "BrokerAdminError", "BrokerReloadFailed", "clear_device_topics", "read_pid_file"]

log = logging.getLogger("fedhar.server.broker")

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


@dataclass(frozen=True)
class BrokerAdmin:
    """The federation's broker accounts, changed one device at a time.

    ``reload`` is one of the module docstring's forms (BrokerAdminError at construction otherwise);
    ``mosquitto_passwd`` defaults to the one on PATH. Every method raises BrokerAdminError for a missing
    or not generated folder.
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
        """The broker folder's settings (federation, user names, ports, TLS)."""
        return self._call(broker.read_settings, self.broker_dir)

    @property
    def federation(self) -> str:
        """The federation the broker folder was generated for."""
        return str(self.settings().federation)

    def devices(self) -> list[str]:
        """Device ids that have an account, sorted."""
        return list(self._call(broker.configured_devices, self.broker_dir))

    def password(self, name: str) -> str:
        """The current password of account ``name`` (a device, the coordinator, the monitor); BrokerAdminError if none."""
        self.settings()  # a missing folder says so first
        return str(self._call(broker.read_password, self.broker_dir, name))

    def monitor_credentials(self) -> tuple[str, str]:
        """(user name, password) of the read-only monitor account; BrokerAdminError (saying to re-run init) if the folder lacks it."""
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
        """Create device ``name``'s account and ACL rules, reload the broker, and return its password (never logged).

        ``replace`` gives an existing account a new password (the old session is closed at the reload).
        Raises BrokerReloadFailed (with ``.password``) if the account was written but not reloaded;
        BrokerAdminError for an invalid or reserved name, an existing device or a failing ``mosquitto_passwd``
        (nothing changed).
        """
        _, password = self._call(broker.add_device, self.broker_dir, name, replace=replace, mosquitto_passwd=self.mosquitto_passwd)
        log.info("broker account for %s %s", name, "given a new password" if replace else "created")
        try:
            self.reload_broker()
        except BrokerAdminError as exc:
            raise BrokerReloadFailed(f"the account of {name!r} was written, but {exc}", password=password) from None
        return str(password)

    def remove_device(self, name: str) -> None:
        """Remove device ``name``'s account and ACL rules and reload the broker (its session closed, password refused).

        Raises BrokerReloadFailed if the files changed but the broker was not reloaded (the session lives on
        until it is); BrokerAdminError for an unknown device (nothing changed).
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
        """Make the running broker re-read its password file and ACL, as :attr:`reload` says; BrokerAdminError naming the fix."""
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
        if systemd_running():
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
