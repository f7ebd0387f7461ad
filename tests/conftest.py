"""Shared fixtures: a real Mosquitto on a free loopback port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulation.broker import LocalMosquitto, find_mosquitto


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[int]:
    """Start ``mosquitto`` on 127.0.0.1:<free port> (:class:`simulation.broker.LocalMosquitto`); yield the port.

    Skipped when Mosquitto is not installed, unless FEDHAR_REQUIRE_MOSQUITTO=1 (set by
    .ci/run), in which case a missing broker fails the test.
    """
    if find_mosquitto() is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    with LocalMosquitto(log_file=tmp_path / "mosquitto.log", start_timeout_s=10) as broker:
        yield broker.port
