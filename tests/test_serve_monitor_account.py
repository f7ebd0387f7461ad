"""Which account the status page's monitor session logs in with (coordinator.server.serve.monitor_broker).

A generated broker allows one session per user name, so the monitor must never borrow the
coordinator's account when ``[server] broker_dir`` names such a broker: the two sessions would
disconnect each other for ever (seen on a fresh install, where the unit's user cannot read the
root-owned broker folder).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.server.serve import monitor_broker
from coordinator.server.settings import ServerSettings
from har_io.broker_config import BrokerConfig

ROOT = Path(__file__).resolve().parents[1]
COORD = BrokerConfig(host="127.0.0.1", port=1883, username="coordinator", password="coord-secret")


def test_the_systemd_credential_gives_the_monitor_its_own_account(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "monitor").write_text("mon-secret\n")
    got = monitor_broker(ServerSettings(broker_dir="/nonexistent/broker"), COORD, str(creds))
    assert got is not None and got.credentials() == ("monitor", "mon-secret") and (got.host, got.port) == ("127.0.0.1", 1883)
    # An explicit file wins over the credential, and [server] monitor_user names the account.
    own = tmp_path / "mon.password"
    own.write_text("other-secret\n")
    got = monitor_broker(ServerSettings(monitor_password_file=str(own), monitor_user="watcher"), COORD, str(creds))
    assert got is not None and got.credentials() == ("watcher", "other-secret")


def test_an_unusable_monitor_account_never_borrows_the_coordinators(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="fedhar.serve"):
        got = monitor_broker(ServerSettings(broker_dir=str(tmp_path / "missing")), COORD, None)
    assert got is None
    assert "/etc/fedhar/monitor.password" in caplog.text and "coord-secret" not in caplog.text
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert monitor_broker(ServerSettings(monitor_password_file=str(empty)), COORD, None) is None


def test_a_generated_broker_folders_monitor_password_is_read_by_its_owner(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    r = subprocess.run(
        [sys.executable, str(ROOT / "firmware_scripts/mosquitto_config.py"), "--out", str(out), "--federation", "home",
         "--broker-user", "root", "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    if r.returncode == 3:
        pytest.skip("mosquitto_passwd not installed")
    assert r.returncode == 0, r.stderr
    got = monitor_broker(ServerSettings(broker_dir=str(out)), COORD, None)
    assert got is not None
    assert got.credentials() == ("monitor", (out / "credentials/monitor.password").read_text().strip())


def test_without_a_broker_folder_the_development_broker_is_read_with_the_coordinators_settings() -> None:
    assert monitor_broker(ServerSettings(), COORD, None) == COORD
