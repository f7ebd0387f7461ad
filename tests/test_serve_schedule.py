"""The served federation's schedule (coordinator/server/schedule.py) and settings (coordinator/server/settings.py):
hand-computed start times in an injected fixed-offset timezone (no daylight saving), windows that cross
midnight, eligibility with its reasons, and settings refused with the key named."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from coordinator.server.schedule import eligible_devices, in_window, minutes_of_day, next_start, waiting_line
from coordinator.server.settings import (
    ScheduleSettings,
    ServerSettings,
    default_data_dir,
    parse_window,
    read_serve_file,
    settings_of,
)
from har_models.wire.messages import ClientStatus

TZ = dt.timezone(dt.timedelta(hours=2))  # a local time of UTC+02:00 without daylight saving
D = 1773093600.0  # 2026-03-10 00:00 at UTC+02:00 = 2026-03-09 22:00 UTC
H, M = 3600.0, 60.0
DAY = 24 * H


def test_midnight_of_the_injected_zone() -> None:
    assert minutes_of_day(D, TZ) == 0.0
    assert minutes_of_day(D + 90 * M + 30, TZ) == 90.5
    assert minutes_of_day(D, dt.UTC) == 22 * 60  # the same instant is 22:00 in UTC


def test_parse_window() -> None:
    assert parse_window("01:00-06:00") == (60, 360)
    assert parse_window("22:30-06:15") == (1350, 375)
    assert parse_window(" 00:00 - 23:59 ") == (0, 1439)
    for bad in ("1:00-6:00", "01:00", "24:00-06:00", "01:60-02:00", "aa:bb-cc:dd", "01:00-02:00-03:00"):
        with pytest.raises(ValueError, match='expected "HH:MM-HH:MM"'):
            parse_window(bad)
    with pytest.raises(ValueError, match="empty window"):
        parse_window("05:00-05:00")


def test_no_window_only_the_interval_counts() -> None:
    assert next_start(D + 5 * H, None, 3600, None, TZ) == D + 5 * H  # no round yet: now
    assert next_start(D + 5 * H, D + 4.5 * H, 3600, None, TZ) == D + 5.5 * H  # 30 min to wait
    assert next_start(D + 5 * H, D + 3 * H, 3600, None, TZ) == D + 5 * H  # interval already over
    assert next_start(D + 5 * H, D + 5 * H, 0, None, TZ) == D + 5 * H


def test_a_window_within_one_day() -> None:
    w = "01:00-06:00"
    assert next_start(D + 30 * M, None, 0, w, TZ) == D + 1 * H  # 00:30 -> 01:00 today
    assert next_start(D + 1 * H, None, 0, w, TZ) == D + 1 * H  # start included
    assert next_start(D + 3 * H, None, 0, w, TZ) == D + 3 * H  # inside
    assert next_start(D + 6 * H, None, 0, w, TZ) == D + DAY + 1 * H  # end excluded: tomorrow 01:00
    assert next_start(D + 14 * H, None, 0, w, TZ) == D + DAY + 1 * H  # afternoon: tomorrow 01:00
    # the interval ends at 06:30, after the window closed: tomorrow 01:00
    assert next_start(D + 5 * H, D + 5.5 * H, 3600, w, TZ) == D + DAY + 1 * H
    # the interval ends at 02:15, inside the window
    assert next_start(D + 30 * M, D + 75 * M, 3600, w, TZ) == D + 135 * M


def test_a_window_across_midnight() -> None:
    w = "22:00-06:00"
    assert next_start(D + 12 * H, None, 0, w, TZ) == D + 22 * H  # noon -> 22:00 today
    assert next_start(D + 21 * H, None, 0, w, TZ) == D + 22 * H
    assert next_start(D + 23.5 * H, None, 0, w, TZ) == D + 23.5 * H  # before midnight: inside
    assert next_start(D + DAY + 5 * H + 59 * M, None, 0, w, TZ) == D + DAY + 5 * H + 59 * M  # 05:59 next morning: inside
    assert next_start(D + DAY + 6 * H, None, 0, w, TZ) == D + DAY + 22 * H  # 06:00: closed until 22:00
    assert next_start(D + 20 * H, D + 20 * H, 3 * H, w, TZ) == D + 23 * H  # interval ends at 23:00, inside
    assert next_start(D + 23 * H, D + 23 * H, 2 * H, w, TZ) == D + DAY + 1 * H  # ends at 01:00 past midnight, inside
    assert in_window(D + 23 * H, w, TZ) and in_window(D + DAY + 1 * H, w, TZ) and not in_window(D + 7 * H, w, TZ)


def test_the_timezone_decides_the_local_time() -> None:
    # D is 00:00 at UTC+2 but 22:00 in UTC: the window "01:00-06:00" opens 1 h later there, 3 h later here
    assert next_start(D, None, 0, "01:00-06:00", TZ) == D + 1 * H
    assert next_start(D, None, 0, "01:00-06:00", dt.UTC) == D + 3 * H
    assert next_start(D, None, 0, "22:00-23:00", dt.UTC) == D  # 22:00 UTC: inside


def test_a_bad_interval_or_window_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0 seconds"):
        next_start(D, None, -1, None, TZ)
    with pytest.raises(ValueError, match='expected "HH:MM-HH:MM"'):
        next_start(D, None, 0, "6-7", TZ)


def _st(cid: str, state: str = "online", n_train: int = 10, label_set: str = "hapt6", **kw: object) -> ClientStatus:
    return ClientStatus(cid, state, label_set=label_set, n_train=n_train, **kw)  # type: ignore[arg-type]


def test_eligibility_and_its_reasons() -> None:
    statuses = {
        "a": _st("a"),
        "b": _st("b", state="training"),
        "c": _st("c", state="offline"),
        "d": _st("d"),  # stale
        "e": _st("e"),  # not enrolled
        "f": _st("f"),  # revoked
        "g": _st("g", n_train=0),
        "h": _st("h", label_set="other"),
        "i": _st("i", fault="state folder /var/lib/fedhar/i cannot be written (the local model: Read-only file system)"),
    }
    got = eligible_devices(
        statuses,
        fresh=lambda c: c != "d",
        enrolled=lambda c: c not in ("e",),
        revoked=lambda c: c == "f",
        label_set="hapt6",
    )
    assert got.eligible == ("a", "b")
    assert got.left_out == {
        "c": "offline", "d": "stale", "e": "not_enrolled", "f": "revoked", "g": "no_training_windows", "h": "label_set",
        "i": "device_fault",
    }  # fmt: skip
    no_label = eligible_devices(statuses, fresh=lambda c: True, enrolled=lambda c: True, revoked=lambda c: False)
    assert no_label.eligible == ("a", "b", "d", "e", "f", "h")  # a device fault leaves "i" out whatever else holds


def test_require_charging_leaves_out_only_devices_that_say_they_are_not() -> None:
    statuses = {"mains": _st("mains"), "plugged": _st("plugged", charging=True), "battery": _st("battery", charging=False)}
    yes = {"fresh": lambda c: True, "enrolled": lambda c: True, "revoked": lambda c: False}
    assert eligible_devices(statuses, require_charging=True, **yes).eligible == ("mains", "plugged")  # type: ignore[arg-type]
    assert eligible_devices(statuses, require_charging=True, **yes).left_out == {"battery": "not_charging"}  # type: ignore[arg-type]
    assert eligible_devices(statuses, require_charging=False, **yes).eligible == ("battery", "mains", "plugged")  # type: ignore[arg-type]


def test_waiting_line() -> None:
    # 12:00 UTC+2 now, next start 14:05 local
    assert waiting_line(1, 2, D + 14 * H + 5 * M, D + 12 * H, TZ) == "waiting: 1 of 2 eligible devices (next start not before 14:05 local)"
    assert waiting_line(0, 2, D, D + 1, TZ) == "waiting: 0 of 2 eligible devices"
    assert waiting_line(3, 2, D + 2 * H, D, TZ) == "waiting: 3 eligible devices, 2 needed (next start not before 02:00 local)"
    # A start minutes away is named to the second (a 20 s min_round_interval_s), the same line all through the wait.
    lines = {waiting_line(2, 2, D + 12 * H + 20.4, D + 12 * H + t, TZ) for t in (0.0, 5.0, 19.9)}
    assert lines == {"waiting: 2 eligible devices, 2 needed (next start not before 12:00:20 local)"}


# --------------------------------------------------------------------------------------- settings
def test_settings_defaults_and_tables(tmp_path: Path) -> None:
    f = settings_of({})
    assert f.server == ServerSettings() and f.schedule == ScheduleSettings() and f.federation == {}
    assert (f.server.name, f.server.http_bind, f.server.http_port, f.server.keep_versions) == ("fedhar-home", "127.0.0.1", 8765, 50)
    sch = f.schedule
    assert (sch.min_clients, sch.min_round_interval_s, sch.window, sch.require_charging) == (2, 3600.0, None, False)
    path = tmp_path / "server.toml"
    path.write_text('rounds = 3\naggregation = "fedavg"\n[server]\nname = "nuc"\nkeep_versions = 3\n'
                    '[schedule]\nmin_clients = 3\nwindow = "22:00-06:00"\nmin_round_interval_s = 60\n')  # fmt: skip
    got = read_serve_file(path)
    assert got.server.name == "nuc" and got.server.keep_versions == 3
    assert got.schedule == ScheduleSettings(min_clients=3, min_round_interval_s=60.0, window="22:00-06:00")
    assert got.federation == {"rounds": 3, "aggregation": "fedavg"}
    assert read_serve_file(tmp_path / "missing.toml").server == ServerSettings()  # no file: defaults


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nnmae = 'x'\n", r"\[server\]: unknown setting 'nmae' \(did you mean 'name'\?\)"),
        ("[schedule]\nwindow = '1-6'\n", r'\[schedule\] window = .1-6.: expected "HH:MM-HH:MM"'),
        ("[schedule]\nmin_clients = 'two'\n", r"\[schedule\]: ScheduleSettings.min_clients = 'two': expected an integer"),
        ("[schedule]\nmin_clients = 0\n", r"\[schedule\] min_clients = 0: must be >= 1"),
        ("[schedule]\nmin_round_interval_s = -5\n", r"min_round_interval_s = -5.0: must be >= 0"),
        ("[schedule]\nrequire_charging = 1\n", r"require_charging = 1: expected true or false"),
        ("[server]\nkeep_versions = 0\n", r"\[server\] keep_versions = 0: must be >= 1"),
        ("[server]\nhttp_port = 70000\n", r"http_port = 70000: must be in 0..65535"),
        ("[server]\nbroker_reload = 'kill'\n", r"broker_reload = 'kill': must be one of"),
        # An old server.toml with the removed Home Assistant switch: the key, why, and the fix.
        ("[server]\nname = 'nuc'\nhome_assistant = true\n",
         r"\[server\]: setting 'home_assistant' was removed: Home Assistant's MQTT discovery was removed .*; "
         r"delete the line 'home_assistant = \.\.\.' from \[server\]"),
        ("server = 5\n", r"\[server\]: expected a table/object of ServerSettings"),
        ("[server\n", r"not valid TOML"),
    ],
)
def test_bad_settings_are_refused_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "server.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_serve_file(path)


def test_default_data_dir() -> None:
    assert default_data_dir({"STATE_DIRECTORY": "/var/lib/fedhar"}) == Path("/var/lib/fedhar")
    assert default_data_dir({"STATE_DIRECTORY": "/var/lib/fedhar:/var/lib/other"}) == Path("/var/lib/fedhar")
    assert default_data_dir({}) == Path.home() / ".local" / "share" / "fedhar-server"
