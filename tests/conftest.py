"""Shared fixtures: a real Mosquitto on a free loopback port."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.broker import free_port, stop_process, wait_for_port


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[int]:
    """Start ``mosquitto`` on 127.0.0.1:<free port>; yield the port.

    Skipped when Mosquitto is not installed, unless FEDHAR_REQUIRE_MOSQUITTO=1 (set by
    .ci/run), in which case a missing broker fails the test.
    """
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    if exe is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stdout\n")
    with open(tmp_path / "mosquitto.log", "wb") as out:
        proc = subprocess.Popen([exe, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        if not wait_for_port("127.0.0.1", port, 10):
            pytest.fail(f"mosquitto did not start; log: {(tmp_path / 'mosquitto.log').read_text()}")
        yield port
    finally:
        stop_process(proc)
