"""The previous release's home-server folders (``tests/fixtures/upgrade-2ffcc27.tar.gz``) moved to a new place, and a
broker login probe; shared by ``tests/test_upgrade.py``, ``tests/test_device_lifecycle.py`` and
``benchmarks/scripted_month.py``."""

from __future__ import annotations

import json
import os
import pwd
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from simulation.broker import free_ports

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade-2ffcc27.tar.gz"
"""Made by ``tests/support/make_upgrade_fixture.py``: ``root/data``, ``root/broker``, ``root/pki`` and ``root/made.json``."""


def move_upgrade_fixture(tmp: Path) -> tuple[Path, dict[str, Any], int, int]:
    """Unpack the fixture under ``tmp`` and point its files at their new place, new ports and this account,
    as an operator moving a server would (``server.toml``, ``mosquitto.conf``, ``fedhar-broker.json``).

    Returns (root folder holding ``data``, ``broker`` and ``pki``; the fixture's ``made.json``; plain port; TLS port).
    """
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp, filter="data")
    root = tmp / "root"
    made = json.loads((root / "made.json").read_text())
    port, tls_port = free_ports(2)
    me = pwd.getpwuid(os.geteuid()).pw_name
    for rel in ("data/server.toml", "broker/mosquitto.conf", "broker/fedhar-broker.json"):
        f = root / rel
        text = f.read_text().replace(made["root"], str(root))
        for old, new in ((made["port"], port), (made["tls_port"], tls_port)):
            text = text.replace(f"listener {old} ", f"listener {new} ")
        text = text.replace(f'"port": {made["port"]},', f'"port": {port},').replace(
            f'"tls_port": {made["tls_port"]},', f'"tls_port": {tls_port},'
        )
        text = text.replace("\nuser root\n", f"\nuser {me}\n").replace('"broker_user": "root"', f'"broker_user": "{me}"')
        f.write_text(text)
    return root, made, port, tls_port


def mqtt_login(port: int, user: str, password: str) -> int:
    """The CONNACK reason code of one login on ``127.0.0.1:port`` (0 accepted; 4, 5, 134, 135 refused).

    Raises
    ------
    RuntimeError
        If no CONNACK comes within 10 s.
    """
    import paho.mqtt.client as mqtt

    got: list[int] = []
    done = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"probe-{user}-{time.monotonic_ns()}")
    c.username_pw_set(user, password)

    def on_connect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any = None) -> None:
        got.append(int(rc.value if hasattr(rc, "value") else rc))
        done.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        if not done.wait(10):
            raise RuntimeError(f"no CONNACK for {user} on port {port}")
    finally:
        c.loop_stop()
        c.disconnect()
    return got[0]
