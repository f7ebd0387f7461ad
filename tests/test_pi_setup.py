"""firmware_scripts/pi_setup.sh: the steps it would run (--dry-run) and the configuration it writes.

The real run, on an arm64 Debian board booted under systemd, is tests/test_pi_board.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from edge_client.cli import build_parser as client_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "firmware_scripts" / "pi_setup.sh"
UNIT = ROOT / "firmware_scripts" / "systemd" / "fedhar-client@.service"
BASE = ("--client-id", "pi-kitchen", "--broker", "homeserver:8883", "--federation", "home", "--password-file", "pi.password")


def _run(*args: str, stubs: dict[str, str] | None = None, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the script; ``stubs`` maps command names to shell bodies put first on PATH (raspi-config, uname)."""
    env = dict(os.environ)
    if stubs:
        assert tmp is not None
        bin_dir = tmp / "stub-bin"
        bin_dir.mkdir(exist_ok=True)
        for name, body in stubs.items():
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env)


def _steps(out: str) -> list[str]:
    return [ln[2:] for ln in out.splitlines() if ln.startswith("+ ")]


def _env_file(out: str) -> dict[str, str]:
    lines = out.split("+ write /etc/fedhar/client-pi-kitchen.env (mode 644):\n")[1].split("\n+ ")[0]
    return dict(ln.strip().split("=", 1) for ln in lines.splitlines() if "=" in ln and not ln.strip().startswith("#"))


def test_numpy_backend_by_default_with_raspberry_pi_os_tools(tmp_path):
    r = _run(*BASE, "--tls-ca", "ca.crt", "--dry-run", stubs={"raspi-config": "exit 0"}, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    steps = _steps(r.stdout)
    assert steps[0] == "raspi-config nonint do_i2c 0"
    assert "usermod -aG i2c fedhar" in steps
    pips = [s for s in steps if "/bin/pip " in s]
    assert pips == ["/opt/fedhar/.venv/bin/pip install -q -e /opt/fedhar[pi]"]  # no torch at all
    assert "/opt/fedhar/.venv/bin/python -m edge_client.install_check --backend numpy --prog pi_setup.sh" in steps
    assert not any("scipy" in s for s in steps)  # scipy is no device dependency
    assert "install -m 644 ca.crt /etc/fedhar/ca.crt" in steps
    assert "install -m 600 pi.password /etc/fedhar/pi-kitchen.password" in steps
    assert f"install -m 644 {UNIT} /etc/systemd/system/fedhar-client@.service" in steps
    assert steps[-2:] == ["systemctl enable fedhar-client@pi-kitchen", "systemctl restart fedhar-client@pi-kitchen"]
    assert not any("python3-dev" in s for s in steps)  # every dependency has an aarch64 wheel
    env = _env_file(r.stdout)
    assert env == {
        "FEDHAR_BROKER": "homeserver:8883",
        "FEDHAR_FEDERATION": "home",
        "FEDHAR_SOURCE": "recorded:hapt6",
        "FEDHAR_CLIENT_ARGS": "--tls-ca /etc/fedhar/ca.crt --backend numpy",
    }
    # The options the unit passes select the backend the venv holds, and no PyTorch thread setting.
    args = client_parser().parse_args(["--client-id", "x", "--source", "recorded:hapt6", *shlex.split(env["FEDHAR_CLIENT_ARGS"])])
    assert (args.backend, args.threads) == ("numpy", 0)
    exec_start = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart="))
    assert set(re.findall(r"\$\{?(FEDHAR_[A-Z_]+)", exec_start)) == set(env)


def test_torch_backend_installs_the_cpu_build_first_and_sets_threads():
    r = _run(*BASE, "--backend", "torch", "--no-i2c", "--dry-run")
    assert r.returncode == 0, r.stderr
    pips = [s for s in _steps(r.stdout) if "/bin/pip " in s]
    assert pips == [
        "/opt/fedhar/.venv/bin/pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
        "/opt/fedhar/.venv/bin/pip install -q -e /opt/fedhar[pi,client]",
    ]
    assert _env_file(r.stdout)["FEDHAR_CLIENT_ARGS"] == "--backend torch --threads 2"
    assert "/opt/fedhar/.venv/bin/python -m edge_client.install_check --backend torch --prog pi_setup.sh" in _steps(r.stdout)


def test_wheelhouse_installs_offline(tmp_path):
    wh = tmp_path / "wheels"
    wh.mkdir()
    r = _run(*BASE, "--wheelhouse", str(wh), "--no-i2c", "--dry-run")
    assert r.returncode == 0, r.stderr
    pips = [s for s in _steps(r.stdout) if "/bin/pip " in s]
    assert pips == [f"/opt/fedhar/.venv/bin/pip install -q --no-index --find-links {wh} -e /opt/fedhar[pi]"]
    r = _run(*BASE, "--wheelhouse", str(wh), "--backend", "torch", "--threads", "3", "--no-i2c", "--dry-run")
    pips = [s for s in _steps(r.stdout) if "/bin/pip " in s]
    assert pips[0] == f"/opt/fedhar/.venv/bin/pip install -q --no-index --find-links {wh} torch==2.13.0"
    assert _env_file(r.stdout)["FEDHAR_CLIENT_ARGS"] == "--backend torch --threads 3"


def test_missing_raspberry_pi_os_tools_are_skipped_with_a_message(tmp_path):
    r = _run(*BASE, "--dry-run", stubs={"raspi-config": "exit 0"}, tmp=tmp_path)
    assert "raspi-config not found" not in r.stdout
    (tmp_path / "stub-bin" / "raspi-config").unlink()
    r = _run(*BASE, "--dry-run", stubs={"uname": "echo aarch64"}, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "raspi-config not found (not Raspberry Pi OS)" in r.stdout
    assert "+ write /etc/modules-load.d/fedhar-i2c.conf (mode 644):\n    i2c-dev\n" in r.stdout
    if not Path("/boot/firmware/config.txt").exists() and not Path("/boot/config.txt").exists():
        assert "skipped dtparam=i2c_arm=on" in r.stdout


def test_no_password_file_installs_but_does_not_start():
    r = _run("--client-id", "pi-kitchen", "--broker", "homeserver:8883", "--no-i2c", "--dry-run")
    assert r.returncode == 0, r.stderr
    steps = _steps(r.stdout)
    assert steps[-1] == "systemctl enable fedhar-client@pi-kitchen"
    assert "copy the broker's credentials/pi-kitchen.password to /etc/fedhar/pi-kitchen.password" in r.stdout


def test_uninstall_removes_what_it_installed_and_keeps_the_data_unless_purge():
    r = _run("--client-id", "pi-kitchen", "--uninstall", "--dry-run")
    assert r.returncode == 0, r.stderr
    steps = _steps(r.stdout)
    assert steps[0] == "systemctl disable --now fedhar-client@pi-kitchen"
    assert "rm -f /etc/fedhar/client-pi-kitchen.env /etc/fedhar/pi-kitchen.password /etc/fedhar/pi-kitchen.ca.crt" in steps
    assert "rm -f /etc/systemd/system/fedhar-client@.service /etc/modules-load.d/fedhar-i2c.conf /etc/fedhar/ca.crt" in steps
    assert "rm -rf /opt/fedhar" in steps
    assert not any(s.startswith("rm -rf /var/lib/fedhar") for s in steps)
    assert "kept the recorded windows and the local model in /var/lib/fedhar/pi-kitchen" in r.stdout
    r = _run("--client-id", "pi-kitchen", "--uninstall", "--purge", "--dry-run")
    assert "rm -rf /var/lib/fedhar/pi-kitchen" in _steps(r.stdout)


def test_bad_options_are_refused_with_the_fix(tmp_path):
    r = _run("--client-id", "bad id", "--broker", "h:1", "--dry-run")
    assert r.returncode == 2 and "1-64 letters" in r.stderr
    r = _run("--client-id", "pi", "--broker", "homeserver", "--dry-run")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
    r = _run("--client-id", "pi", "--broker", "h:1", "--frobnicate")
    assert r.returncode == 2 and "unknown option --frobnicate" in r.stderr
    r = _run("--client-id", "pi", "--broker", "h:1", "--threads", "2", "--dry-run")
    assert r.returncode == 2 and "use it with --backend torch" in r.stderr
    r = _run("--client-id", "pi", "--broker", "h:1", "--backend", "tensorflow", "--dry-run")
    assert r.returncode == 2 and "--backend must be numpy" in r.stderr
    r = _run("--client-id", "pi", "--broker", "h:1", "--wheelhouse", str(tmp_path / "nope"), "--dry-run")
    assert r.returncode == 2 and "is not a folder" in r.stderr
    # 32-bit Raspberry Pi OS: PyTorch has no wheel; the numpy backend is allowed with a warning.
    r = _run("--client-id", "pi", "--broker", "h:1", "--backend", "torch", "--dry-run", stubs={"uname": "echo armv7l"}, tmp=tmp_path)
    assert r.returncode == 2 and "install 64-bit Raspberry Pi OS" in r.stderr
    r = _run("--client-id", "pi", "--broker", "h:1", "--no-i2c", "--dry-run", stubs={"uname": "echo armv7l"}, tmp=tmp_path)
    assert r.returncode == 0 and "only the numpy backend can run" in r.stdout


def _bundle_file(tmp: Path, **over: object) -> Path:
    from har_io.enrolment import EnrolmentBundle

    kw: dict = dict(
        coordinator="fedhar-home", federation="home", client_id="pi-kitchen", password="pi-secret-1", host="homeserver", port=8883
    )
    kw.update(over)
    path = tmp / "pi-kitchen.json"
    path.write_text(EnrolmentBundle(**kw).to_json())
    return path


def _ca(tmp: Path) -> tuple[Path, Path]:
    from support.secured_broker import Missing, make_pki

    try:
        ca, _, _, other = make_pki(tmp / "pki")
    except Missing as exc:
        pytest.skip(str(exc))
    return ca, other


def test_an_enrolment_bundle_gives_the_id_broker_federation_password_and_ca(tmp_path):
    ca, _ = _ca(tmp_path)
    bundle = _bundle_file(tmp_path, tls_ca_pem=ca.read_text())
    r = _run("--enrolment", str(bundle), "--no-i2c", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert (
        "enrolment bundle" in r.stdout
        and "client pi-kitchen of federation home (coordinator fedhar-home), broker homeserver:8883" in r.stdout
    )
    steps = _steps(r.stdout)
    writes = "--write-password /etc/fedhar/pi-kitchen.password --write-ca /etc/fedhar/pi-kitchen.ca.crt"
    assert f"/opt/fedhar/.venv/bin/python -m har_io.enrolment {bundle} --prog pi_setup.sh {writes}" in steps
    assert steps[-2:] == ["systemctl enable fedhar-client@pi-kitchen", "systemctl restart fedhar-client@pi-kitchen"]
    assert _env_file(r.stdout) == {
        "FEDHAR_BROKER": "homeserver:8883",
        "FEDHAR_FEDERATION": "home",
        "FEDHAR_SOURCE": "recorded:hapt6",
        "FEDHAR_CLIENT_ARGS": "--tls-ca /etc/fedhar/pi-kitchen.ca.crt --backend numpy",
    }
    assert "pi-secret-1" not in r.stdout + r.stderr
    assert "holds the device's password: delete it once the client has joined" in r.stdout


@pytest.mark.slow
def test_a_fingerprint_bundle_takes_the_ca_file_it_names(tmp_path):
    from har_io.enrolment import pem_fingerprints

    ca, other = _ca(tmp_path)
    bundle = _bundle_file(tmp_path, tls_ca_sha256=pem_fingerprints(ca.read_text())[0])
    r = _run("--enrolment", str(bundle), "--no-i2c", "--dry-run")
    assert r.returncode == 2 and "names the broker's CA by its SHA-256" in r.stderr and "give --tls-ca" in r.stderr
    r = _run("--enrolment", str(bundle), "--tls-ca", str(other), "--no-i2c", "--dry-run")
    assert r.returncode == 2 and "(ca_mismatch)" in r.stderr and "setup stopped" in r.stderr and "+ " not in r.stdout
    r = _run("--enrolment", str(bundle), "--tls-ca", str(ca), "--no-i2c", "--dry-run")
    assert r.returncode == 0, r.stderr
    steps = _steps(r.stdout)
    assert f"install -m 644 {ca} /etc/fedhar/ca.crt" in steps
    assert (
        f"/opt/fedhar/.venv/bin/python -m har_io.enrolment {bundle} --prog pi_setup.sh --write-password /etc/fedhar/pi-kitchen.password"
        in steps
    )
    assert _env_file(r.stdout)["FEDHAR_CLIENT_ARGS"] == "--tls-ca /etc/fedhar/ca.crt --backend numpy"


@pytest.mark.slow
def test_a_refused_bundle_stops_setup_with_the_reason_before_any_step(tmp_path):
    cases = [
        ("{not json", (), "(bad_json): not JSON"),
        ('{"format": "fedhar-enrolment", "version": 2}', (), "(unknown_version): bundle version 2"),
        (None, ("--federation", "office"), "(wrong_federation): the bundle is for federation 'home'"),
        (None, ("--client-id", "pi-den"), "--client-id pi-den contradicts the bundle's client id pi-kitchen"),
        (None, ("--broker", "other:8883"), "--broker other:8883 contradicts the bundle's broker homeserver:8883"),
        (None, ("--password-file", "pw"), "the password comes from the bundle"),
    ]
    for text, extra, words in cases:
        bundle = _bundle_file(tmp_path)
        if text is not None:
            bundle.write_text(text)
        r = _run("--enrolment", str(bundle), *extra, "--no-i2c", "--dry-run")
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert words in r.stderr and r.stderr.startswith("pi_setup.sh: "), r.stderr
        assert _steps(r.stdout) == [] and "pi-secret-1" not in r.stderr
    r = _run("--enrolment", str(tmp_path / "missing.json"), "--dry-run")
    assert r.returncode == 2 and "No such file or directory" in r.stderr and "setup stopped" in r.stderr


def _check(backend: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """The installed venv's check (``python -m edge_client.install_check``) in a fresh interpreter where ``blocked`` cannot import."""
    code = (
        f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
        f"from edge_client.install_check import main\nsys.exit(main(['--backend', {backend!r}, '--prog', 'pi_setup.sh']))"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_install_check_needs_only_the_chosen_backend_and_names_what_is_missing_in_words():
    # smbus2 is not in the development venv: the check is given an empty module of that name.
    ok = ("scipy", "torch", "safetensors", "kivy")
    code = (
        f"import sys, types\nsys.modules['smbus2'] = types.ModuleType('smbus2')\nfor name in {ok!r}:\n    sys.modules[name] = None\n"
        "from edge_client.install_check import main\nsys.exit(main(['--backend', 'numpy']))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr  # the numpy backend runs without scipy, torch, safetensors
    r = _check("numpy", ("smbus2", "scipy"))
    assert r.returncode == 7 and "Traceback" not in r.stderr
    assert "pi_setup.sh: smbus2 (the [pi] extra) is not installed: it is needed for reading the MPU-6050 on the I2C bus" in r.stderr
    assert "scipy" not in r.stderr and "the numpy backend cannot run in" in r.stderr
    r = _check("torch", ("smbus2", "torch", "paho"))
    lines = r.stderr.splitlines()
    assert r.returncode == 7 and len(lines) == 4, r.stderr
    assert lines[0].startswith("pi_setup.sh: paho-mqtt is not installed: it is needed for the link to the broker")
    assert lines[2].startswith("pi_setup.sh: torch, PyTorch's CPU build (the [client] extra) is not installed")


def test_a_failed_install_check_stops_the_setup_before_the_unit(tmp_path):
    # The venv's python is stubbed to fail the check the way edge_client.install_check does.
    prefix = tmp_path / "opt"
    (prefix / ".venv" / "bin").mkdir(parents=True)
    py = prefix / ".venv" / "bin" / "python"
    py.write_text("#!/bin/sh\necho 'pi_setup.sh: smbus2 (the [pi] extra) is not installed' >&2\nexit 7\n")
    py.chmod(0o755)
    pip = prefix / ".venv" / "bin" / "pip"
    pip.write_text("#!/bin/sh\nexit 0\n")
    pip.chmod(0o755)
    stubs = {name: "exit 0" for name in ("id", "groupadd", "useradd", "usermod", "rsync", "dpkg", "install", "systemctl")}
    stubs["id"] = 'case "$1" in -u) echo 0 ;; *) exit 0 ;; esac'
    password = tmp_path / "pi.password"
    password.write_text("secret\n")
    args = [a if a != "pi.password" else str(password) for a in BASE]
    r = _run(*args, "--no-i2c", "--prefix", str(prefix), stubs=stubs, tmp=tmp_path)
    assert r.returncode == 7, (r.stdout, r.stderr)
    assert "smbus2 (the [pi] extra) is not installed" in r.stderr and "setup stopped" in r.stderr
    assert "Done." not in r.stdout
