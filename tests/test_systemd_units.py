"""The systemd units in firmware_scripts/systemd/ parse cleanly (``systemd-analyze verify``) and run the real CLIs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from coordinator.cli import build_parser as coordinator_parser
from edge_client.cli import build_parser as client_parser
from har_io import exit_codes

UNITS = Path(__file__).resolve().parents[1] / "firmware_scripts" / "systemd"


def _exec_start(unit: str) -> list[str]:
    line = next(ln for ln in (UNITS / unit).read_text().splitlines() if ln.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def test_units_parse_without_warnings(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    for unit in ("fedhar-client@.service", "fedhar-coordinator.service", "fedhar-backup.service", "fedhar-backup.timer"):
        shutil.copy(UNITS / unit, tmp_path)
    r = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "fedhar-client@hapt-01.service"), str(tmp_path / "fedhar-coordinator.service"),
         str(tmp_path / "fedhar-backup.service"), str(tmp_path / "fedhar-backup.timer")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The programs are not installed under /opt/fedhar here; anything else about our units is a mistake.
    ours = [ln for ln in (r.stdout + r.stderr).splitlines() if "fedhar" in ln and "is not executable" not in ln]
    assert ours == []


@pytest.mark.parametrize(
    ("unit", "parser"),
    [("fedhar-client@.service", client_parser), ("fedhar-coordinator.service", coordinator_parser)],
)
def test_exec_start_options_exist(unit, parser):
    """Every option the unit passes is one the program accepts (values are systemd specifiers and variables)."""
    argv = _exec_start(unit)[1:]
    options = [a for a in argv if a.startswith("--")]
    known = {s for action in parser()._actions for s in action.option_strings}
    assert options and set(options) <= known, set(options) - known


def _restart_prevented(unit: str) -> set[int]:
    line = next(ln for ln in (UNITS / unit).read_text().splitlines() if ln.startswith("RestartPreventExitStatus="))
    return {int(v) for v in line.split("=", 1)[1].split()}


@pytest.mark.parametrize("unit", sorted(exit_codes.UNITS))
def test_restart_prevent_lists_exactly_what_a_restart_cannot_fix(unit):
    """The unit's RestartPreventExitStatus= is the table's "restart cannot help" codes of its program, systemd's included.

    Exit 1 (an unexpected error) and the coordinator's 5 (the federation failed) stay restartable.
    The same units under a real systemd, on an arm64 board: tests/test_pi_board.py.
    """
    program = exit_codes.UNITS[unit]
    assert _restart_prevented(unit) == exit_codes.restart_prevented(program)
    assert {203, 217, 243} <= _restart_prevented(unit) and 1 not in _restart_prevented(unit)


def test_restart_prevent_known_values():
    """Hand-written: the client's and the coordinator's codes a restart cannot fix."""
    assert exit_codes.restart_prevented(exit_codes.CLIENT) == {2, 3, 4, 6, 7, 8, 203, 217, 243}
    assert exit_codes.restart_prevented(exit_codes.COORDINATOR) == {2, 3, 4, 6, 7, 203, 217, 243}


def test_the_backup_timer_runs_a_backup_with_retention_the_program_accepts():
    """fedhar-backup.timer starts fedhar-backup.service daily; its ExecStart is a backup the backup command parses."""
    from coordinator.server.backup_cli import build_parser

    argv = _exec_start("fedhar-backup.service")
    assert argv[:2] == ["/opt/fedhar/.venv/bin/fedhar-coordinator", "backup"]
    args = build_parser("backup").parse_args(argv[2:])
    assert args.keep == 14 and str(args.etc) == "/etc/fedhar" and str(args.data) == "/var/lib/fedhar"
    timer = (UNITS / "fedhar-backup.timer").read_text()
    assert "OnCalendar=*-*-* 03:00:00" in timer and "Persistent=true" in timer and "WantedBy=timers.target" in timer
