"""The files serve reads from the broker folder are readable by its own account with the modes the generator gives,
and where they are not (an older folder, a hand-made one), the start check names the file and the chmod that fixes it.

Permissions are judged from ``stat`` for an account that is neither owner nor in the group (uid 4242), so the
verdicts do not depend on the account the tests run as; the folder sits in a fresh directory under /tmp that
every account may pass through.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import coordinator.broker as gen
from coordinator.server.ownership import access_problems, read_problem
from coordinator.server.settings import ServerSettings

STRANGER = 4242


@pytest.fixture
def passable() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fedhar-access-", dir="/tmp"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def test_a_file_behind_a_closed_folder_names_the_folder_and_the_chmod(passable: Path) -> None:
    folder = passable / "broker"
    folder.mkdir()
    f = folder / "fedhar-broker.json"
    f.write_text("{}")
    os.chmod(f, 0o644)
    os.chmod(folder, 0o750)  # as the release before gave the broker folder: the server's account cannot pass
    problem = read_problem(f, STRANGER, set())
    assert problem is not None and problem.startswith(f"{f} cannot be read by 4242: the folder {folder} (")
    assert "mode 0750" in problem and problem.endswith(f"fix: sudo chmod o+x {folder}")
    os.chmod(folder, 0o751)
    assert read_problem(f, STRANGER, set()) is None
    os.chmod(f, 0o600)
    problem = read_problem(f, STRANGER, set())
    assert problem is not None and "mode 0600" in problem and f"fix: sudo chmod o+r {f}" in problem
    os.chmod(f, 0o640)
    assert read_problem(f, STRANGER, {os.stat(f).st_gid}) is None  # readable through its group
    assert read_problem(passable / "missing", STRANGER, set()) is None


def test_the_generated_broker_folder_lets_the_server_read_its_settings_and_certificates(passable: Path) -> None:
    out = passable / "broker"
    gen.generate(out, {"federation": "home"}, ["dev-a"])
    (out / "tls").mkdir(mode=0o711)
    for name in ("server.crt", "ca.crt"):
        (out / "tls" / name).write_text("-----BEGIN CERTIFICATE-----\n")
        os.chmod(out / "tls" / name, 0o644)
    assert access_problems(ServerSettings(broker_dir=str(out)), STRANGER, set()) == []
    os.chmod(out / "fedhar-broker.json", 0o600)
    problems = access_problems(ServerSettings(broker_dir=str(out), monitor_password_file=str(out / "credentials" / "monitor.password")),
                               STRANGER, set())  # fmt: skip
    assert [p.split(" cannot be read")[0] for p in problems] == [str(out / "fedhar-broker.json"),
                                                                  str(out / "credentials" / "monitor.password")]  # fmt: skip
    assert problems[0].endswith(f"fix: sudo chmod o+r {out / 'fedhar-broker.json'}")
    # a password is never offered to everyone: the account gets a copy of its own
    assert problems[1].endswith("and name that file in server.toml") and "sudo install -m 600 -o 4242 " in problems[1]
