"""A board set up by ``pi_setup.sh --enrolment FILE`` joins a real TLS Mosquitto with what the script installed, and nothing else.

The script's real run needs root and systemd (tests/test_pi_board.py boots a board for that);
here its dry run gives the configuration it writes, the bundle's own checker writes the
password and CA files as the script runs it, and the unit's ``ExecStart`` line is run with
systemd's substitutions (``%i``, ``%d``, ``%S``, the environment file), /etc/fedhar mapped
into the test's folder.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from har_io.enrolment import EnrolmentBundle

pytestmark = pytest.mark.mosquitto

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "firmware_scripts" / "pi_setup.sh"
UNIT = ROOT / "firmware_scripts" / "systemd" / "fedhar-client@.service"
HAPT = ROOT / "datasets" / "hapt" / "user02.npz"


@pytest.mark.slow
def test_the_service_joins_with_what_the_script_installed_from_the_bundle(tmp_path, tls_mosquitto):
    broker = tls_mosquitto("home", ["pi-kitchen"])
    password = broker.password("pi-kitchen")
    bundle = EnrolmentBundle(
        "fedhar-home", "home", "pi-kitchen", password, "127.0.0.1", broker.tls_port, tls_ca_pem=broker.ca.read_text()
    )
    path = tmp_path / "pi-kitchen.json"
    path.write_text(bundle.to_json())
    r = subprocess.run(["bash", str(SCRIPT), "--enrolment", str(path), "--source", f"hapt:{HAPT}", "--no-i2c", "--dry-run"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert password not in r.stdout + r.stderr
    etc = tmp_path / "etc"
    steps = [ln[2:] for ln in r.stdout.splitlines() if ln.startswith("+ ")]
    install = next(s for s in steps if "har_io.enrolment" in s).replace("/etc/fedhar", str(etc)).split()
    assert install[0] == "/opt/fedhar/.venv/bin/python"
    subprocess.run([sys.executable, *install[1:]], cwd=ROOT, check=True, timeout=60)
    assert stat.S_IMODE(os.stat(etc / "pi-kitchen.password").st_mode) == 0o600
    assert (etc / "pi-kitchen.ca.crt").read_text() == broker.ca.read_text()
    env_text = r.stdout.split("+ write /etc/fedhar/client-pi-kitchen.env (mode 644):\n")[1].split("\n+ ")[0]
    env = dict(ln.strip().split("=", 1) for ln in env_text.splitlines() if "=" in ln and not ln.strip().startswith("#"))
    # The unit's command line, as systemd expands it for fedhar-client@pi-kitchen.
    exec_start = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart=")).removeprefix("ExecStart=")
    words = []
    for w in shlex.split(exec_start):
        w = w.replace("%i", "pi-kitchen").replace("%d/password", str(etc / "pi-kitchen.password")).replace("%S", str(tmp_path / "var"))
        if w == "$FEDHAR_CLIENT_ARGS":
            words += [a.replace("/etc/fedhar", str(etc)) for a in shlex.split(env["FEDHAR_CLIENT_ARGS"])]
        elif w.startswith("${"):
            words.append(env[w[2:-1]])
        else:
            words.append(w)
    assert words[0] == "/opt/fedhar/.venv/bin/fedhar-client"
    cmd = [sys.executable, "-m", "edge_client.cli", *words[1:], "--max-seconds", "6"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    log = broker.log.read_text()
    assert f"on port {broker.tls_port}" in log and "as pi-kitchen" in log and "u'pi-kitchen'" in log, log[-3000:]
    assert "Received PUBLISH from pi-kitchen" in log and "fedhar/v1/home/client/pi-kitchen/status" in log
    assert password not in r.stdout + r.stderr
