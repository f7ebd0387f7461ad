"""``fedhar-coordinator devices`` shows what each device cost the federation: its clipped updates and rejected
messages (the run's ``clipped_update`` and ``rejected`` events) and a quarantine mark while its newest
``quarantined``/``released`` event says quarantined."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.server import devices_cli
from coordinator.server.device_tables import device_table, harm_counts
from coordinator.server.registry import Registry
from coordinator.state import RunState


def _federation(data: Path) -> None:
    (data / "server.toml").parent.mkdir(parents=True, exist_ok=True)
    (data / "server.toml").write_text("[server]\nhttp_port = 0\n")
    reg = Registry(data)
    for name in ("dev-a", "dev-b", "dev-c"):
        reg.enrol(name, None)
    reg.close()
    state = RunState(data / "run")
    for r in (1, 2, 3):
        state.event(r, "dev-a", "clipped_update", "update 1000x the median; clipped")
    state.event(2, "dev-b", "rejected", "non_finite: 3 message(s)")
    state.event(3, "dev-b", "rejected", "stale_round: 1 message(s)")
    state.event(3, "dev-a", "quarantined", "clipped in 3 rounds in a row")
    state.event(2, "dev-c", "quarantined", "rejected in 3 rounds in a row")
    state.event(4, "dev-c", "released", "by the operator")
    state.event(4, None, "round_failed", "no quorum")
    state.close()


def test_the_device_table_counts_clipped_and_rejected_and_marks_the_quarantined(tmp_path: Path) -> None:
    _federation(tmp_path)
    clipped, rejected, quarantined = harm_counts(tmp_path / "run")
    assert (dict(clipped), dict(rejected), quarantined) == ({"dev-a": 3}, {"dev-b": 2}, {"dev-a"})
    rows = {r["name"]: (r["clipped"], r["rejected"], r["quarantined"]) for r in device_table(tmp_path, None)}
    assert rows == {"dev-a": (3, 0, True), "dev-b": (0, 2, False), "dev-c": (0, 0, False)}
    assert harm_counts(tmp_path / "no-run") == ({}, {}, set())


def test_devices_prints_the_counts_and_how_to_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _federation(tmp_path)
    assert devices_cli.main("devices", ["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[0].split()
    assert header[:9] == ["name", "owner", "state", "online", "rounds", "last_round", "clipped", "rejected", "quarantine"]
    a = out[1].split()
    assert a[0] == "dev-a" and a[6:9] == ["3", "0", "yes"]
    assert "dev-a is quarantined: its updates are left out of the shared model; fedhar-coordinator release dev-a" in out[-1]
    assert devices_cli.main("devices", ["--data", str(tmp_path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["dev-b"]["rejected"], rows["dev-b"]["quarantined"], rows["dev-c"]["quarantined"]) == (2, False, False)
