"""``revoke`` against a running ``serve`` under CPU load loses no update: the command asks the server over its socket and
never logs in as the coordinator (which would take the server's broker session over and drop what is queued for it).

A real Mosquitto (TLS, ACL, accounts), ``serve`` and two devices (``fedhar-client``, the numpy backend, a small CNN)
as processes, and a third device that announces itself and never trains, so round 0 stays open until it is revoked.
Two busy processes load both cores meanwhile. The round open at the revocation completes with both other devices'
updates, the broker saw one login as the coordinator in all (the server's), and the server never lost its session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.inmemory_grid import device_status
from support.mqtt_peer import MqttPeer
from support.registry_views import kept_versions
from support.small_federation import processes, wait_for

from coordinator.server.device_commands import enrol
from coordinator.server.registry import Registry
from coordinator.server.settings import read_serve_file
from har_models.wire.topics import Topics

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
FED = "opfed"


def test_revoke_against_a_running_server_under_load_loses_no_update(tmp_path: Path, tls_mosquitto: Callable[..., Any]) -> None:
    b = tls_mosquitto(FED, [])
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text(
        "conv_filters = 4\ndense_units = 8\nround_timeout_s = 300\nlocal_epochs = 1\nmin_clients = 2\nstatus_refresh_s = 5\n"
        f'[server]\nname = "home-test"\nbroker_dir = "{b.out}"\npublic_host = "127.0.0.1"\nhttp_port = 0\n'
        "[schedule]\nmin_clients = 3\nmin_round_interval_s = 3600\n"  # one round, with all three
    )
    file = read_serve_file(data / "server.toml")
    for name in ("dev-a", "dev-b", "dev-c"):
        enrol(data, file, name, None)
    serve_log = tmp_path / "serve.log"
    logs = [serve_log, tmp_path / "dev-a.log", tmp_path / "dev-b.log", b.log]
    with processes() as procs:
        with open(serve_log, "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--no-progress"],
                                          stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))  # fmt: skip
        for i, name in enumerate(("dev-a", "dev-b")):
            cmd = [sys.executable, "-m", "edge_client.cli", "--enrolment", str(data / "enrolment" / f"{name}.json"),
                   "--source", f"hapt:{HAPT}/user{i + 1:02d}.npz", "--state-dir", str(tmp_path / f"s-{name}"),
                   "--backend", "numpy"]  # fmt: skip
            with open(tmp_path / f"{name}.log", "ab") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))
        # dev-c: present and eligible by its own account, but it never trains: round 0 waits for it
        password = json.loads((data / "enrolment" / "dev-c.json").read_text())["password"]
        silent = MqttPeer(b.port, "dev-c", password, client_id="dev-c")
        try:
            assert silent.joins()
            silent.publish(Topics(FED).client_status("dev-c"), device_status("dev-c", 100).to_bytes(), retain=True)
            wait_for(lambda: "round 0: starting with 3 eligible devices" in serve_log.read_text(), 240, "round 0 opening", logs)
            for _ in range(2):  # the load, from here on: two busy processes for the two cores
                procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
            r = subprocess.run([sys.executable, "-m", "coordinator.cli", "revoke", "dev-c", "--data", str(data)],
                               capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
        finally:
            silent.close()
        assert r.returncode == 0, r.stdout + r.stderr
        # done between the open round's messages, not after it closes: no note that it waits for round 0
        assert "round 0 is open" not in r.stderr and "dev-c recorded as revoked" in r.stdout
        assert "dev-c's broker account and ACL removed" in r.stdout
        assert "the running server cleared dev-c's retained status and models" in r.stdout
        wait_for(lambda: kept_versions(data) == [(1, 0)], 240, "round 0 kept as version 1", logs)
    reg = Registry(data)
    try:
        took = {p.name for p in reg.participation() if p.round == 0}
        assert reg.is_revoked("dev-c")
    finally:
        reg.close()
    assert took == {"dev-a", "dev-b"}  # both updates of the open round counted: none lost
    broker_log = b.log.read_text()
    assert broker_log.count(" as coordinator") == 1, "a second login as the coordinator"  # only the server's own
    text = serve_log.read_text()
    assert "disconnected (" not in text  # the server's session was never taken over
