"""The broker files :mod:`coordinator.broker` writes for the home server, and BrokerAdmin's errors, without a running broker.

The ACL lines are checked by hand against what each account must (and must not) be allowed;
``tests/test_broker_admin.py`` then runs them through a real Mosquitto.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import coordinator.broker as gen
from coordinator.server.broker_admin import BrokerAdmin, BrokerAdminError, read_pid_file

P = "fedhar/v1/home"


def rules_by_user(acl: str) -> dict[str, list[str]]:
    """The ACL's ``topic`` lines grouped under their ``user`` line (comments and blank lines left out)."""
    users: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in acl.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("user "):
            current = users.setdefault(line.split(" ", 1)[1], [])
            continue
        assert line.startswith("topic "), f"only user and topic lines, no pattern lines: {line!r}"
        assert current is not None, f"a rule before any user line: {line!r}"
        current.append(line)
    return users


def test_the_monitor_reads_the_federation_and_writes_nothing():
    acl = gen.acl_text(gen.BrokerSettings(federation="home"), ["phone-anna"])
    users = rules_by_user(acl)
    assert list(users) == ["coordinator", "monitor", "phone-anna"]
    assert users["coordinator"] == [f"topic readwrite {P}/#"]
    assert users["monitor"] == [f"topic read {P}/#"]
    assert users["phone-anna"] == [
        f"topic read {P}/round",
        f"topic read {P}/coordinator/status",
        f"topic read {P}/coordinator/outlook",
        f"topic read {P}/model/global/+",
        f"topic read {P}/client/phone-anna/model/+",
        f"topic read {P}/client/phone-anna/receipt",
        f"topic read {P}/client/phone-anna/grant",
        f"topic readwrite {P}/client/phone-anna/status",
        f"topic write {P}/client/phone-anna/update/+",
        f"topic write {P}/client/phone-anna/program_request",
        f"topic read {P}/client/phone-anna/programs/+",
    ]
    assert "homeassistant" not in acl


def test_the_configuration_names_the_pid_file_a_reload_uses(tmp_path):
    conf = gen.config_text(gen.BrokerSettings(federation="home"), tmp_path).splitlines()
    assert f"pid_file {tmp_path / 'data' / 'mosquitto.pid'}" in conf
    fake = tmp_path / "b"
    fake.mkdir()
    (fake / "mosquitto.conf").write_text("\n".join(conf) + "\n")
    assert BrokerAdmin(fake).pid_file() == tmp_path / "data" / "mosquitto.pid"


def test_a_missing_or_foreign_broker_folder_says_how_to_generate_one(tmp_path):
    with pytest.raises(BrokerAdminError, match=r"broker folder .*nowhere does not exist: generate it first with "
                       r"fedhar-coordinator broker init --out .*nowhere --federation NAME"):  # fmt: skip
        BrokerAdmin(tmp_path / "nowhere").devices()
    (tmp_path / "empty").mkdir()
    with pytest.raises(BrokerAdminError, match=r"empty holds no fedhar-broker.json: generate it first"):
        BrokerAdmin(tmp_path / "empty").add_device("phone-anna")
    with pytest.raises(BrokerAdminError, match="generate it first"):
        BrokerAdmin(tmp_path / "nowhere").monitor_credentials()
    assert not (tmp_path / "nowhere").exists(), "nothing is created by a failed call"


def test_a_folder_from_before_the_monitor_account_says_to_rerun_the_generator(tmp_path):
    (tmp_path / "fedhar-broker.json").write_text(json.dumps({"settings": {"federation": "home"}, "clients": ["phone-anna"]}))
    admin = BrokerAdmin(tmp_path)
    assert admin.devices() == ["phone-anna"] and admin.federation == "home"
    with pytest.raises(BrokerAdminError, match=r"no monitor account yet .*broker init --out .* once \(it adds it\), then reload"):
        admin.monitor_credentials()


def test_reload_settings_are_checked_on_construction(tmp_path):
    for bad in ("pid", "pid:", "kill", "systemctl:", "sighup:/x"):
        with pytest.raises(BrokerAdminError, match=r"not understood: use 'auto', 'pid:/path/to/mosquitto.pid'"):
            BrokerAdmin(tmp_path, reload=bad)
    for good in ("auto", "none", "systemctl", "systemctl:mosquitto-fedhar", f"pid:{tmp_path}/m.pid"):
        assert BrokerAdmin(tmp_path, reload=good).reload == good
    BrokerAdmin(tmp_path, reload="none").reload_broker()  # the operator reloads: nothing to do, no error


def test_a_missing_garbled_or_stale_pid_file_signals_nothing(tmp_path):
    pid_file = tmp_path / "mosquitto.pid"
    admin = BrokerAdmin(tmp_path, reload=f"pid:{pid_file}")
    with pytest.raises(BrokerAdminError, match=rf"PID file {pid_file} does not exist: .*mosquitto -c {tmp_path}/mosquitto.conf"):
        admin.reload_broker()
    pid_file.write_text("mosquitto\n")
    with pytest.raises(BrokerAdminError, match=r"holds 'mosquitto', not a process id; remove it and restart the broker"):
        admin.reload_broker()
    # A process that has exited: its id is free (and not reused within this test's microseconds).
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    pid_file.write_text(f"{done.pid}\n")
    with pytest.raises(BrokerAdminError, match=rf"stale PID file .*process {done.pid} is not running; start the broker"):
        admin.reload_broker()
    # A running process that is not Mosquitto (this test's own): it must not get a SIGHUP.
    pid_file.write_text(f"{os.getpid()}\n")
    with pytest.raises(BrokerAdminError, match=rf"process {os.getpid()} is 'python[0-9.]*', not mosquitto; nothing was signalled"):
        read_pid_file(pid_file)
    with pytest.raises(BrokerAdminError, match="not mosquitto; nothing was signalled"):
        admin.reload_broker()


def test_auto_without_a_running_broker_says_how_to_reload_by_hand(tmp_path):
    (tmp_path / "mosquitto.conf").write_text(gen.config_text(gen.BrokerSettings(federation="home"), tmp_path))
    with pytest.raises(BrokerAdminError) as err:
        BrokerAdmin(tmp_path).reload_broker()
    text = str(err.value)
    assert f"PID file {tmp_path / 'data' / 'mosquitto.pid'} does not exist" in text
    assert "Reload it by hand (kill -HUP" in text and f"mosquitto -c {tmp_path / 'mosquitto.conf'}" in text


def test_systemctl_failure_names_the_unit_and_the_manual_reload(tmp_path):
    with pytest.raises(BrokerAdminError) as err:
        BrokerAdmin(tmp_path, reload="systemctl:fedhar-no-such-unit").reload_broker()
    text = str(err.value)
    # Either systemctl is missing, or it fails on the unknown unit (or on a machine without systemd).
    assert "systemctl not found" in text or ("systemctl reload fedhar-no-such-unit failed" in text and "by hand" in text)


def test_clear_device_topics_refuses_a_wildcard_id():
    from coordinator.server.broker_admin import clear_device_topics
    from har_models.wire.topics import Topics

    with pytest.raises(ValueError, match=r"client id '\+' is invalid"):
        clear_device_topics(None, Topics("home"), "+")  # refused before the link is used


def test_the_broker_tooling_is_the_packages_and_the_script_only_wraps_it(tmp_path):
    import coordinator.server.broker_admin as admin

    root = Path(__file__).resolve().parents[1]
    # Imported as a module of the package (an installed fedhar has no firmware_scripts/), not loaded by file path.
    assert admin.broker is gen and Path(gen.__file__) == root / "coordinator" / "broker" / "__init__.py"
    assert "spec_from_file_location" not in Path(admin.__file__).read_text()
    # The wrapper runs from a checkout with nothing but Python (-I: no PYTHONPATH, no site-packages of the venv's).
    script = root / "firmware_scripts" / "mosquitto_config.py"
    assert len(script.read_text().splitlines()) < 80
    r = subprocess.run([sys.executable, "-I", str(script), "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: mosquitto_config.py") and "--revoke ID,ID,..." in r.stdout and "openssl req -x509" in r.stdout
