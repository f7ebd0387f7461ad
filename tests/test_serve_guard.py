"""The quality guard in a served federation: on by default in ``serve``, off by default in ``run``."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.server.serve import federation_config
from coordinator.server.settings import settings_of
from har_io.broker_config import BrokerConfig

BROKER = BrokerConfig.parse("127.0.0.1:9")


def test_serve_guards_by_default_run_does_not_and_server_toml_can_turn_it_off(tmp_path: Path) -> None:
    served = federation_config(settings_of({}), tmp_path, BROKER, "home", "home")
    assert (served.guard, served.guard_margin) == (True, 10.0)
    assert CoordinatorConfig(run_dir=tmp_path).guard is False  # run and simulate: research figures stay raw
    off = federation_config(settings_of({"guard": False, "guard_margin": 5.0}), tmp_path, BROKER, "home", "home")
    assert (off.guard, off.guard_margin) == (False, 5.0)
