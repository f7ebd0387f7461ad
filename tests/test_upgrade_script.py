"""``firmware_scripts/upgrade_server.sh`` run on the previous release's folders and unit files.

The folders are ``tests/fixtures/upgrade-2ffcc27.tar.gz`` (a data folder and broker folder written by commit 2ffcc27),
the unit file is that release's ``fedhar-coordinator.service`` (``tests/fixtures/units-2ffcc27/``), and the paths the
script takes (checkout, data, /etc/fedhar, units, backups) are folders of the test. ``systemctl``, ``git`` and the
venv's ``pip`` are stand-ins that note how they were called; the venv's ``fedhar-coordinator`` is this checkout's.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from support.upgrade_fixture import move_upgrade_fixture

from coordinator.server import devices_cli

ROOT = Path(__file__).resolve().parents[1]
OLD_UNIT = ROOT / "tests" / "fixtures" / "units-2ffcc27" / "fedhar-coordinator.service"
NEW_UNIT = ROOT / "firmware_scripts" / "systemd" / "fedhar-coordinator.service"


def _digests(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode & 0o7777)
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _stand_in(path: Path, calls: Path) -> None:
    path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n')
    path.chmod(0o755)


def test_the_upgrade_script_backs_up_each_folder_apart_and_installs_the_new_units(tmp_path: Path) -> None:
    root, _, _, _ = move_upgrade_fixture(tmp_path)
    data, broker = root / "data", root / "broker"
    os.chmod(broker, 0o750)  # as the previous release's generator left it: the server's account could not pass
    etc = tmp_path / "etc-fedhar"
    etc.mkdir()
    (etc / "coordinator.env").write_text("FEDHAR_FEDERATION=homefed\n")
    (etc / "coordinator.password").write_text("secret\n")
    os.chmod(etc / "coordinator.password", 0o600)
    units = tmp_path / "systemd"
    units.mkdir()
    (units / "fedhar-coordinator.service").write_bytes(OLD_UNIT.read_bytes())
    calls = tmp_path / "calls.log"
    prefix = tmp_path / "opt-fedhar"
    (prefix / ".venv" / "bin").mkdir(parents=True)
    (prefix / "firmware_scripts").symlink_to(ROOT / "firmware_scripts")
    _stand_in(prefix / ".venv" / "bin" / "pip", calls)
    (prefix / ".venv" / "bin" / "python").symlink_to(sys.executable)
    coordinator = prefix / ".venv" / "bin" / "fedhar-coordinator"
    coordinator.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -c "
                           "'import sys; from har_io import entry; sys.exit(entry.coordinator())' \"$@\"\n")  # fmt: skip
    coordinator.chmod(0o755)
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("systemctl", "git"):
        _stand_in(tools / tool, calls)
    before = {"data": _digests(data), "broker": _digests(broker), "etc": _digests(etc)}
    backups = tmp_path / "backups"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "firmware_scripts" / "upgrade_server.sh"), "--prefix", str(prefix), "--data", str(data),
                        "--etc", str(etc), "--units", str(units), "--backup", str(backups)],
                       capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls.read_text().splitlines() == [
        "systemctl stop fedhar-coordinator",
        f"git -C {prefix} pull --ff-only",
        f"pip install --quiet -e {prefix}[coordinator]",
        "systemctl daemon-reload",
        "systemctl start fedhar-coordinator",
    ]
    # one backup, each folder under its own name, every file with its mode
    (dest,) = list(backups.iterdir())
    assert dest.name.startswith("before-upgrade-") and stat.S_IMODE(dest.stat().st_mode) == 0o700
    assert sorted(p.name for p in dest.iterdir()) == ["broker", "data", "etc", "units"]
    assert {part: _digests(dest / part) for part in ("data", "broker", "etc")} == before
    assert (dest / "units" / "fedhar-coordinator.service").read_bytes() == OLD_UNIT.read_bytes()
    # the new unit installed (its reload works without /bin/kill), the broker folder passable for the server's account
    assert (units / "fedhar-coordinator.service").read_bytes() == NEW_UNIT.read_bytes()
    assert "replaced by this release's" in r.stdout and not (units / "fedhar-backup.timer").exists()
    assert stat.S_IMODE(broker.stat().st_mode) == 0o751 and stat.S_IMODE((broker / "tls").stat().st_mode) & 0o001
    assert "upgraded to fedhar-coordinator " in r.stdout
    # this release reads the previous release's data folder as it is now
    assert devices_cli.main("versions", ["--data", str(data)]) == 0
