"""edge_client.power.charging_linux over real folders laid out as the kernel's power-supply class."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_client.power import charging_linux


def _supply(root: Path, name: str, **files: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    for key, value in files.items():
        (d / key).write_text(value + "\n")  # the kernel ends each value with a newline


@pytest.mark.parametrize(
    ("supplies", "expected"),
    [
        ({}, None),  # a desktop or a Pi without a UPS HAT: nothing reported
        ({"AC": {"type": "Mains", "online": "1"}}, True),
        ({"AC": {"type": "Mains", "online": "0"}}, None),  # no battery: on mains whatever the flag says
        ({"BAT0": {"type": "Battery", "status": "Discharging"}, "AC": {"type": "Mains", "online": "0"}}, False),
        ({"BAT0": {"type": "Battery", "status": "Charging"}}, True),
        ({"BAT0": {"type": "Battery", "status": "Full"}}, True),
        ({"BAT0": {"type": "Battery", "status": "Not charging"}}, False),
        ({"BAT0": {"type": "Battery", "status": "Discharging"}, "usb": {"type": "USB_C", "online": "1"}}, True),
        ({"BAT0": {"type": "Battery", "status": "Discharging"}, "odd": {"online": "1"}}, False),  # no type: ignored
    ],
)
def test_charging_state_from_the_power_supply_class(tmp_path: Path, supplies: dict, expected: bool | None) -> None:
    root = tmp_path / "power_supply"
    root.mkdir()
    for name, files in supplies.items():
        _supply(root, name, **files)
    assert charging_linux(root) is expected


def test_a_missing_or_unreadable_folder_is_not_reported(tmp_path: Path) -> None:
    assert charging_linux(tmp_path / "absent") is None
    f = tmp_path / "a-file"
    f.write_text("")
    assert charging_linux(f) is None  # not a folder: NotADirectoryError is an OSError
