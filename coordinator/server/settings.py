"""Settings of ``fedhar-coordinator serve``: the ``[server]`` and ``[schedule]`` tables of ``server.toml``.

One TOML file holds a served federation: the federation's settings are
:class:`coordinator.config.CoordinatorConfig`'s fields at the top level (the same names as
``fedhar-coordinator run``'s options and a run folder's ``config.toml``), and two tables add
the server's own::

    aggregation = "feddwa"
    conv_filters = 64

    [server]
    name = "fedhar-home"
    keep_versions = 50

    [schedule]
    min_clients = 2
    min_round_interval_s = 3600
    window = "01:00-06:00"
    require_charging = true

Everything goes through the project's typed settings (:func:`har_models.settings.from_mapping`,
:func:`har_io.cli.settings_from`): an unknown key or a wrong type is refused with the key, the
value and what is allowed, before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from har_io.cli import read_settings_file
from har_models.settings import doc, from_mapping

SERVE_ROUNDS = 1_000_000
"""``rounds`` of a served federation's configuration: it has no last round (progress messages carry it)."""

BROKER_RELOADS = ("auto", "systemctl", "none")
"""``[server] broker_reload`` choices besides ``"pid:/path/to/mosquitto.pid"`` and ``"systemctl:UNIT"``."""


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The data folder when none is given: ``$STATE_DIRECTORY`` (systemd's StateDirectory=, e.g.
    ``/var/lib/fedhar``; its first entry when it lists several), else ``~/.local/share/fedhar-server``."""
    env = os.environ if env is None else env
    state = env.get("STATE_DIRECTORY", "")
    if state:
        return Path(state.split(":")[0])
    return Path.home() / ".local" / "share" / "fedhar-server"


def parse_window(text: str) -> tuple[int, int]:
    """``"HH:MM-HH:MM"`` as (start, end) in minutes after local midnight, 0..1439.

    The window holds times t with start <= t < end; when end < start it crosses midnight
    (``"22:00-06:00"``: from 22:00 to 06:00 the next morning).

    Raises
    ------
    ValueError
        If the text is not ``HH:MM-HH:MM`` with hours 00..23 and minutes 00..59, or start
        equals end (an empty window; leave ``window`` out for the whole day).
    """
    parts = str(text).strip().split("-")
    try:
        if len(parts) != 2:
            raise ValueError
        out = []
        for p in parts:
            hh, mm = p.strip().split(":")
            if len(hh) != 2 or len(mm) != 2 or not (hh.isdigit() and mm.isdigit()):
                raise ValueError
            h, m = int(hh), int(mm)
            if not (0 <= h <= 23 and 0 <= m <= 59):
                raise ValueError
            out.append(60 * h + m)
    except ValueError:
        raise ValueError(f'window = {text!r}: expected "HH:MM-HH:MM" in local time, e.g. "01:00-06:00" or "22:00-06:00"') from None
    if out[0] == out[1]:
        raise ValueError(f"window = {text!r}: start and end are equal (an empty window); leave window out for the whole day")
    return out[0], out[1]


@dataclass(frozen=True)
class ServerSettings:
    """The ``[server]`` table.

    Raises
    ------
    ValueError
        For a bad value (the message names the key): an empty name, a port outside 1..65535,
        ``keep_versions`` < 1, an unknown ``broker_reload``.
    """

    name: str = field(default="fedhar-home", metadata=doc("the coordinator's name, written into every enrolment bundle"))
    data_dir: str | None = field(
        default=None, metadata=doc("data folder (default $STATE_DIRECTORY, else ~/.local/share/fedhar-server)")
    )
    http_bind: str = field(default="127.0.0.1", metadata=doc("address of the status page; any other than loopback needs a token"))
    http_port: int = field(default=8765, metadata=doc("port of the status page (0: no status page)"))
    token: str | None = field(default=None, metadata=doc("bearer token the status page asks for (needed off loopback)"))
    broker_dir: str | None = field(
        default=None, metadata=doc("folder written by fedhar-coordinator broker init (holds fedhar-broker.json)")
    )
    broker_reload: str = field(
        default="auto",
        metadata=doc('how the broker is reloaded after an account change: auto, systemctl, "systemctl:UNIT", none, or "pid:FILE"'),
    )
    public_host: str | None = field(default=None, metadata=doc("broker host name written into enrolment bundles (default the broker's)"))
    keep_versions: int = field(default=50, metadata=doc("model versions kept (older version files are deleted)", "versions"))
    stall_after: float = field(
        default=3.0,
        metadata=doc("/healthz says the federation is stalled when no round completed for this many times "
                     "(min_round_interval_s + round_timeout_s) while enough devices are eligible"),
    )  # fmt: skip
    monitor_user: str = field(
        default="monitor", metadata=doc("user name of the broker's read-only monitor account (broker init --monitor-user)")
    )
    monitor_password_file: str | None = field(
        default=None,
        metadata=doc("the monitor account's password file for the status page (default $CREDENTIALS_DIRECTORY/monitor, else broker_dir's)"),
    )

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("[server] name must not be empty (the coordinator's name in enrolment bundles)")
        if not 0 <= self.http_port <= 65535:
            raise ValueError(f"[server] http_port = {self.http_port}: must be in 0..65535 (0 = no status page)")
        if self.keep_versions < 1:
            raise ValueError(f"[server] keep_versions = {self.keep_versions}: must be >= 1 (joining devices get the newest)")
        if not self.stall_after >= 1:
            raise ValueError(f"[server] stall_after = {self.stall_after}: must be >= 1 (a multiple of one round's interval and deadline)")
        kind, sep, arg = self.broker_reload.partition(":")
        if self.broker_reload not in BROKER_RELOADS and not (sep and arg and kind in ("pid", "systemctl")):
            raise ValueError(
                f"[server] broker_reload = {self.broker_reload!r}: must be one of {list(BROKER_RELOADS)}, "
                '"pid:/path/to/mosquitto.pid" or "systemctl:UNIT"'
            )
        if self.token is not None and not self.token.strip():
            raise ValueError("[server] token must not be empty; leave it out for no token")


@dataclass(frozen=True)
class ScheduleSettings:
    """The ``[schedule]`` table: when a round may start (:mod:`coordinator.server.schedule`).

    Raises
    ------
    ValueError
        For a bad value (the message names the key): ``min_clients`` < 1, a negative
        interval, a window that is not ``"HH:MM-HH:MM"`` or is empty.
    """

    min_clients: int = field(default=2, metadata=doc("eligible enrolled devices a round needs to start", "devices"))
    min_round_interval_s: float = field(
        default=3600.0, metadata=doc("seconds from the end of a round to the start of the next, at least", "s")
    )
    window: str | None = field(
        default=None, metadata=doc('daily local-time window rounds start in, "HH:MM-HH:MM" (may cross midnight); default all day')
    )
    require_charging: bool = field(default=False, metadata=doc("leave out devices that report they are not charging"))

    def __post_init__(self) -> None:
        if self.min_clients < 1:
            raise ValueError(f"[schedule] min_clients = {self.min_clients}: must be >= 1")
        if self.min_round_interval_s < 0:
            raise ValueError(f"[schedule] min_round_interval_s = {self.min_round_interval_s}: must be >= 0 seconds")
        if self.window is not None:
            try:
                parse_window(self.window)
            except ValueError as exc:
                raise ValueError(f"[schedule] {exc}") from None


@dataclass(frozen=True)
class ServeFile:
    """A ``server.toml`` read and checked: the two tables, and the rest (the federation's settings,
    a mapping for :func:`har_io.cli.settings_from` with :class:`~coordinator.config.CoordinatorConfig`)."""

    server: ServerSettings
    schedule: ScheduleSettings
    federation: dict[str, Any]


REMOVED: dict[str, str] = {
    "home_assistant": "Home Assistant's MQTT discovery was removed (no program ever published it, so the setting did nothing)",
}
"""``[server]`` keys of earlier releases that no longer exist, with why; a file that still has one is refused, with the fix."""


def settings_of(data: Mapping[str, Any], what: str = "server.toml") -> ServeFile:
    """Split and check a TOML mapping: ``[server]`` and ``[schedule]`` typed, the rest returned as it is.

    Raises
    ------
    ValueError
        For an unknown key or a bad value in either table (``what [server]: unknown setting 'nmae'
        (did you mean 'name'?)``), a table that is not a table, or a removed key of :data:`REMOVED`
        (the message says to delete its line).
    """
    rest = dict(data)
    server_table = rest.get("server", {})
    if isinstance(server_table, Mapping):
        removed = sorted(set(server_table) & set(REMOVED))
        if removed:
            key = removed[0]
            raise ValueError(f"{what} [server]: setting {key!r} was removed: {REMOVED[key]}; delete the line '{key} = ...' from [server]")
    server = from_mapping(ServerSettings, rest.pop("server", {}), f"{what} [server]")
    schedule = from_mapping(ScheduleSettings, rest.pop("schedule", {}), f"{what} [schedule]")
    return ServeFile(server, schedule, rest)


def read_serve_file(path: Path) -> ServeFile:
    """Read ``server.toml`` (:func:`har_io.cli.read_settings_file`) and check it with :func:`settings_of`.

    A file that does not exist reads as all defaults.

    Raises
    ------
    ValueError
        If it is not TOML (file and line named), or holds an unknown key or bad value (key named).
    OSError
        If it exists but cannot be read.
    """
    path = Path(path)
    if not path.exists():
        return settings_of({}, str(path))
    return settings_of(read_settings_file(path), str(path))
