"""Settings of ``fedhar-coordinator serve``: the ``[server]`` and ``[schedule]`` tables of ``server.toml``.

The federation's settings are :class:`coordinator.config.CoordinatorConfig`'s fields at the top level
(the names of ``run``'s options), beside the server's two tables::

    aggregation = "feddwa"

    [server]
    name = "fedhar-home"
    keep_versions = 50

    [schedule]
    min_clients = 2
    min_round_interval_s = 3600
    window = "01:00-06:00"
    require_charging = true

An unknown key or a wrong type is refused with the key, the value and what is allowed, before anything starts.
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
    """The data folder when none is given: ``$STATE_DIRECTORY`` (its first entry), else ``~/.local/share/fedhar-server``."""
    env = os.environ if env is None else env
    state = env.get("STATE_DIRECTORY", "")
    if state:
        return Path(state.split(":")[0])
    return Path.home() / ".local" / "share" / "fedhar-server"


def parse_window(text: str) -> tuple[int, int]:
    """``"HH:MM-HH:MM"`` as (start, end) minutes after local midnight; start <= t < end, crossing midnight when end < start.

    Raises ValueError for another form, hours or minutes out of range, or start equal to end (an empty window).
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
    """The ``[server]`` table; ValueError naming the key for a bad value."""

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
    """The ``[schedule]`` table: when a round may start; ValueError naming the key for a bad value."""

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
    """A ``server.toml`` read and checked: the two tables, and the federation's settings as a mapping."""

    server: ServerSettings
    schedule: ScheduleSettings
    federation: dict[str, Any]


REMOVED: dict[str, str] = {
    "home_assistant": "Home Assistant's MQTT discovery was removed (no program ever published it, so the setting did nothing)",
}
"""``[server]`` keys of earlier releases, with why; a file that still has one is refused, with the fix."""


def settings_of(data: Mapping[str, Any], what: str = "server.toml") -> ServeFile:
    """Split and check a TOML mapping: ``[server]`` and ``[schedule]`` typed, the rest returned as it is.

    Raises ValueError for an unknown key or bad value (with a "did you mean"), a table that is not one,
    or a removed key (saying to delete its line).
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
    """Read and check ``server.toml`` (missing: all defaults); ValueError for bad TOML or settings, OSError if unreadable."""
    path = Path(path)
    if not path.exists():
        return settings_of({}, str(path))
    return settings_of(read_settings_file(path), str(path))
