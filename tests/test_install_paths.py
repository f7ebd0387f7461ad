"""The README's home-server commands work as written: each documented ``fedhar-coordinator`` line is run.

The lines of the README's home-server section that call the venv's ``fedhar-coordinator`` are run
in document order against a real Mosquitto (``tests/support/secured_broker.py``), with only their paths
mapped to temporary folders (``/opt/fedhar/.venv/bin/fedhar-coordinator`` to this venv's
program, ``/var/lib/fedhar``, ``/etc/mosquitto/fedhar``, ``/srv/backup``). What cannot run here
(apt, useradd, systemctl) is checked as text: full paths under sudo, no ``sudo -u fedhar
fedhar-coordinator``, the apt line, and the unit's ``ExecReload`` without procps' ``/bin/kill``,
which is run as systemd runs it.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.broker.report import program

ROOT = Path(__file__).resolve().parents[1]
VENV_PROG = "/opt/fedhar/.venv/bin/fedhar-coordinator"


def _home_server_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## The home server") : text.index("## Research runs")]


def _command_lines(section: str) -> list[str]:
    """Indented code lines (4+ spaces) of ``section``, with backslash continuations joined."""
    out: list[str] = []
    for line in section.splitlines():
        if not line.startswith("    ") or not line.strip():
            continue
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + " " + line.strip()
        else:
            out.append(line.strip())
    return out


def test_documented_lines_use_full_paths_and_the_apt_line_has_what_the_units_need() -> None:
    for doc in (_home_server_section(), (ROOT / "firmware_scripts" / "README.md").read_text()):
        lines = _command_lines(doc)
        for line in lines:
            assert not re.search(r"sudo( -u \S+)? fedhar-(coordinator|client)\b", line), line  # not on sudo's PATH
            for part in re.split(r"&&|\|", line):  # the program each sudo runs
                words = part.split()
                if words[:1] == ["sudo"]:
                    words = words[3:] if words[1:2] == ["-u"] else words[1:]
                    if words and words[0].rsplit("/", 1)[-1] == "fedhar-coordinator":
                        assert words[0] == VENV_PROG, line
        assert "sudo -u fedhar fedhar-coordinator" not in doc
    apt = next(x for x in _command_lines(_home_server_section()) if "apt-get install" in x)
    for pkg in ("mosquitto", "openssl", "python3-venv", "git"):
        assert pkg in apt.split(), f"the apt line lacks {pkg}"
    assert "procps" not in apt  # not needed any more: the unit reloads with the shell's kill


def test_exec_reload_needs_no_procps_and_signals_the_main_process(tmp_path: Path) -> None:
    unit = (ROOT / "firmware_scripts" / "systemd" / "fedhar-coordinator.service").read_text()
    reload = next(x for x in unit.splitlines() if x.startswith("ExecReload="))[len("ExecReload=") :]
    assert "/bin/kill" not in reload and reload.startswith("/bin/sh -c ")
    # as systemd runs it: "$$" is a literal "$", MAINPID is in the environment
    argv = shlex.split(reload.replace("$$", "$"))
    marker = tmp_path / "hup"
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, sys, time, pathlib\n"
                              f"signal.signal(signal.SIGHUP, lambda *a: (pathlib.Path({str(marker)!r}).write_text('hup'), sys.exit(0)))\n"
                              "print('ready', flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        r = subprocess.run(argv, env={"MAINPID": str(child.pid), "PATH": "/nonexistent"}, capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stderr
        assert child.wait(10) == 0 and marker.read_text() == "hup"
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)


def test_the_generator_prints_commands_that_run_as_written() -> None:
    prog = program("fedhar-coordinator")
    assert Path(prog).is_absolute() and Path(prog).is_file()  # the venv's, not a bare name sudo cannot find


@pytest.mark.slow
def test_each_documented_fedhar_coordinator_line_runs(tmp_path: Path, tls_mosquitto: Callable[..., Any]) -> None:
    b = tls_mosquitto("home", ["spare"], device_certs=True)
    data, backups = tmp_path / "var-lib-fedhar", tmp_path / "srv-backup"
    data.mkdir()
    # step 3's server.toml (broker_dir), with the test broker's address and no page
    (data / "server.toml").write_text(f'[server]\nbroker_dir = "{b.out}"\npublic_host = "127.0.0.1"\nhttp_port = 0\n'
                                      "\n[schedule]\nmin_clients = 2\nmin_round_interval_s = 600\n")  # fmt: skip
    # step 4's enrolment by certificate: a device's request waits on the broker under the code the README's approve names
    from coordinator.server.enrol_desk import invitation
    from coordinator.server.settings import read_serve_file
    from edge_client.cert_enrol import EnrolmentNotApproved, prepare, request_certificate

    inv = invitation(read_serve_file(data / "server.toml"))
    asked = prepare(tmp_path / "pi-kitchen", "pi-kitchen", inv)
    with contextlib.suppress(EnrolmentNotApproved):  # the request stays, retained, until the documented approve
        request_certificate(asked, inv, wait_s=0.5)
    mapping = {"/var/lib/fedhar": str(data), "/etc/mosquitto/fedhar": str(b.out), "/srv/backup": str(backups),
               "fedhar-$(date +%F)": "fedhar-bk", "fedhar-2026-12-01": "fedhar-bk",
               "fedhar/fedhar-20261201-031500": "fedhar-bk",  # the timer's folder the restore names: the backup made above
               "ca.key": str(b.ca.with_name("ca.key")),
               "ABCDE-FGHJK": asked.code}  # fmt: skip
    lines = [x for x in _command_lines(_home_server_section()) if x.startswith(f"sudo {VENV_PROG} ")]
    ran = []
    for line in lines:
        for a, z in mapping.items():
            line = line.replace(a, z)
        argv = shlex.split(line)[2:]
        r = subprocess.run([sys.executable, "-m", "coordinator.cli", *argv], capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
        ran.append(argv[0] if argv[0] != "broker" else f"broker {argv[1]}")
    assert ran == ["enrol", "invite", "pending", "approve", "reissue", "rename", "revoke", "devices", "broker renew", "backup", "restore"]
    assert (tmp_path / "pi-kitchen" / "device.crt").exists() is False  # approved on the server; the device fetches it when it asks again
    assert (data / "server.sqlite").is_file() and (backups / "fedhar-bk" / "manifest.json").is_file()
    assert any(p.name.startswith("var-lib-fedhar.before-restore-") for p in tmp_path.iterdir())  # moved aside, not deleted
