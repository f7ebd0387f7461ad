"""``fedhar-coordinator broker init|add|remove|rotate|list``: the broker tooling as a subcommand, also from a wheel install.

The subcommands do what the one-command generator (``firmware_scripts/mosquitto_config.py``,
``tests/test_mosquitto_config.py``) does with ``--clients``, ``--revoke`` and ``--rotate``; here
they run in-process on real files hashed by Mosquitto's ``mosquitto_passwd``. The last test
builds fedhar's wheel and installs it, not editable and without its dependencies, in a fresh
venv: the broker tooling must run there from the package alone.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli import main

ROOT = Path(__file__).resolve().parents[1]
ME = pwd.getpwuid(os.geteuid()).pw_name  # started as root, Mosquitto would switch to an account that cannot read tmp


def _mosquitto_passwd() -> str:
    found = shutil.which("mosquitto_passwd") or next((p for p in ("/usr/bin/mosquitto_passwd",) if os.access(p, os.X_OK)), None)
    if found is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto_passwd is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto_passwd not installed (apt-get install mosquitto)")
    return found


def broker(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``fedhar-coordinator broker ARGS``; (exit status, stdout, stderr)."""
    code = main(["broker", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_init_add_rotate_remove_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _mosquitto_passwd()
    out = tmp_path / "broker"
    code, text, _ = broker(capsys, "init", "--out", str(out), "--federation", "home", "--clients", "phone-anna",
                           "--broker-user", ME, "--port", "1999", "--json")  # fmt: skip
    assert code == 0
    doc = json.loads(text)
    assert doc["added"] == ["coordinator", "monitor", "phone-anna"] and doc["settings"]["port"] == 1999
    assert "user phone-anna" in (out / "acl").read_text()
    passwords = {u: Path(f).read_text() for u, f in doc["password_files"].items()}

    code, text, _ = broker(capsys, "add", "--out", str(out), "pi-kitchen,pi-hall", "--json")
    doc = json.loads(text)
    assert code == 0 and doc["added"] == ["pi-hall", "pi-kitchen"] and doc["kept"] == ["coordinator", "monitor", "phone-anna"]
    assert doc["settings"]["port"] == 1999, "settings not given again are kept"
    assert {u: Path(doc["password_files"][u]).read_text() for u in passwords} == passwords

    code, text, _ = broker(capsys, "rotate", "--out", str(out), "phone-anna", "--json")
    doc = json.loads(text)
    assert code == 0 and doc["rotated"] == ["phone-anna"]
    assert Path(doc["password_files"]["phone-anna"]).read_text() != passwords["phone-anna"]
    assert Path(doc["password_files"]["coordinator"]).read_text() == passwords["coordinator"]

    code, text, _ = broker(capsys, "revoke", "--out", str(out), "pi-hall", "--json")  # the alias of remove
    doc = json.loads(text)
    assert code == 0 and doc["revoked"] == ["pi-hall"] and doc["clients"] == ["phone-anna", "pi-kitchen"]
    assert not (out / "credentials" / "pi-hall.password").exists() and "user pi-hall" not in (out / "acl").read_text()

    code, text, _ = broker(capsys, "list", "--out", str(out), "--json")
    assert code == 0
    assert json.loads(text) == {"out": str(out), "federation": "home", "service_users": ["coordinator", "monitor"],
                                "clients": ["phone-anna", "pi-kitchen"]}  # fmt: skip
    code, text, _ = broker(capsys, "list", "--out", str(out))
    assert code == 0 and "devices (2): phone-anna, pi-kitchen" in text

    code, text, _ = broker(capsys, "rotate", "--out", str(out), "--json")  # no id: every user
    assert code == 0 and json.loads(text)["rotated"] == ["coordinator", "monitor", "phone-anna", "pi-kitchen"]


def test_errors_name_the_folder_the_id_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = tmp_path / "nowhere"
    for action in (["add", "phone-anna"], ["remove", "phone-anna"], ["rotate"], ["list"]):
        code, _, err = broker(capsys, action[0], "--out", str(nowhere), *action[1:])
        assert code == 2, action
        assert f"broker folder {nowhere} does not exist: generate it first with fedhar-coordinator broker init --out {nowhere}" in err
    assert not nowhere.exists(), "nothing is written by a failed command"
    code, _, err = broker(capsys, "init", "--out", str(tmp_path / "a"), "--federation", "home", "--clients", "ok-1,bad/id")
    assert code == 2 and "client id 'bad/id' is invalid" in err and "letters, digits" in err
    code, _, err = broker(capsys, "init", "--out", str(tmp_path / "a"), "--federation", "home", "--no-tls", "--tls-ca", "ca.crt")
    assert code == 2 and "--no-tls contradicts" in err

    _mosquitto_passwd()
    out = tmp_path / "b"
    assert broker(capsys, "init", "--out", str(out), "--federation", "home", "--broker-user", ME)[0] == 0
    code, _, err = broker(capsys, "add", "--out", str(out))
    assert code == 2 and "name at least one device id" in err
    code, _, err = broker(capsys, "remove", "--out", str(out), "hapt-77")
    assert code == 2 and "hapt-77: no such device" in err
    code, _, err = broker(capsys, "add", "--out", str(out), "coordinator")
    assert code == 2 and "coordinator's user name" in err


def test_the_help_names_every_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["broker", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: fedhar-coordinator broker")
    for action in ("init", "add", "remove", "rotate", "list"):
        assert f"fedhar-coordinator broker {action} --out DIR" in text
    assert "openssl req -x509" in text, "the TLS recipe"


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_runs_the_broker_tooling(tmp_path: Path) -> None:
    """``pip wheel`` (offline, no build isolation) of a copy of the sources; installed non-editable with ``--no-deps``."""
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("har_models", "har_io", "edge_client", "coordinator", "simulation"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    r = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("fedhar-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=env)
    r = subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    installed = subprocess.run([str(venv / "bin" / "python"), "-c", "import coordinator.broker as b; print(b.__file__)"],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)  # fmt: skip
    assert installed.stdout.strip().startswith(str(venv)), "the wheel's copy, not the checkout's"

    script = venv / "bin" / "fedhar-coordinator"
    r = subprocess.run([str(script), "broker", "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("usage: fedhar-coordinator broker") and "fedhar-coordinator broker add --out DIR" in r.stdout
    # No numpy, paho or torch in this venv (--no-deps): the broker tooling needs none of them.
    if shutil.which("mosquitto_passwd") or os.access("/usr/bin/mosquitto_passwd", os.X_OK):
        out = tmp_path / "broker"
        r = subprocess.run([str(script), "broker", "init", "--out", str(out), "--federation", "home", "--clients", "phone-anna",
                            "--broker-user", ME, "--json"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["clients"] == ["phone-anna"] and "user phone-anna" in (out / "acl").read_text()
