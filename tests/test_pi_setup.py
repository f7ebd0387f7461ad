"""firmware_scripts/pi_setup.sh: the steps it would run (--dry-run) and the configuration it writes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "firmware_scripts" / "pi_setup.sh"
UNIT = ROOT / "firmware_scripts" / "systemd" / "fedhar-client@.service"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_dry_run_enables_i2c_installs_the_client_extra_and_the_unit():
    r = _run("--client-id", "pi-kitchen", "--broker", "homeserver:8883", "--federation", "home", "--tls-ca", "ca.crt", "--dry-run")
    assert r.returncode == 0, r.stderr
    steps = [ln[2:] for ln in r.stdout.splitlines() if ln.startswith("+ ")]
    assert steps[0] == "raspi-config nonint do_i2c 0"
    assert "usermod -aG i2c fedhar" in steps
    assert "/opt/fedhar/.venv/bin/pip install -q -e /opt/fedhar[pi]" in steps
    assert "install -m 644 ca.crt /etc/fedhar/ca.crt" in steps
    assert f"install -m 644 {UNIT} /etc/systemd/system/fedhar-client@.service" in steps
    assert steps[-1] == "systemctl enable --now fedhar-client@pi-kitchen"
    # The environment file defines every variable the unit's ExecStart uses.
    env_lines = r.stdout.split("+ write /etc/fedhar/client-pi-kitchen.env (mode 644):\n")[1].split("\n+ ")[0]
    env = dict(ln.strip().split("=", 1) for ln in env_lines.splitlines() if "=" in ln and not ln.strip().startswith("#"))
    assert env == {
        "FEDHAR_BROKER": "homeserver:8883",
        "FEDHAR_FEDERATION": "home",
        "FEDHAR_SOURCE": "recorded:hapt6",
        "FEDHAR_CLIENT_ARGS": "--tls-ca /etc/fedhar/ca.crt --threads 2",
    }
    exec_start = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart="))
    used = set(re.findall(r"\$\{?(FEDHAR_[A-Z_]+)", exec_start))
    assert used == set(env)


def test_bad_options_are_refused_with_the_fix():
    r = _run("--client-id", "bad id", "--broker", "h:1", "--dry-run")
    assert r.returncode == 2 and "1-64 letters" in r.stderr
    r = _run("--client-id", "pi", "--broker", "homeserver", "--dry-run")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
    r = _run("--client-id", "pi", "--broker", "h:1", "--frobnicate")
    assert r.returncode == 2 and "unknown option --frobnicate" in r.stderr
