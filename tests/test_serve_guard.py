"""The quality guard in a served federation: on by default in ``serve``, off by default in ``run``."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator.config import CoordinatorConfig
from coordinator.server.serve import archive_strategy_change, federation_config
from coordinator.server.settings import settings_of
from har_io.broker_config import BrokerConfig

BROKER = BrokerConfig.parse("127.0.0.1:9")


def test_serve_guards_by_default_run_does_not_and_server_toml_can_turn_it_off(tmp_path: Path) -> None:
    served = federation_config(settings_of({}), tmp_path, BROKER, "home", "home")
    assert (served.guard.enabled, served.guard.margin) == (True, 10.0)
    assert CoordinatorConfig(run_dir=tmp_path).guard.enabled is False  # run and simulate: research figures stay raw
    off = federation_config(settings_of({"guard": {"enabled": False, "margin": 5.0}}), tmp_path, BROKER, "home", "home")
    assert (off.guard.enabled, off.guard.margin) == (False, 5.0)
    old = federation_config(settings_of({"guard": False, "guard_margin": 5.0}), tmp_path, BROKER, "home", "home")
    assert (old.guard.enabled, old.guard.margin) == (False, 5.0)  # an earlier release's flat keys still load


def test_a_server_toml_without_aggregation_takes_this_release_default_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run an older release started with another default switches to this release's, with a WARNING saying how to keep it."""
    default = federation_config(settings_of({}), tmp_path, BROKER, "home", "home")
    other = "fedavgm" if default.aggregation != "fedavgm" else "fedavg"
    run = tmp_path / "run"
    (run / "models" / "r0005").mkdir(parents=True)
    (run / "config.toml").write_text(f'aggregation = "{other}"\n')  # what an older release's run wrote
    (run / "models" / "r0005" / "strategy_state.safetensors").write_bytes(b"old state")
    assert federation_config(settings_of({}), tmp_path, BROKER, "home", "home").aggregation == default.aggregation
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        assert archive_strategy_change(run, default, now=0.0, named=False) == other
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = warning.getMessage()
    assert f"this release's default is {default.aggregation!r}, not {other!r}" in text
    assert f"put aggregation = {other!r} in server.toml" in text and "in server.toml:" not in text
    assert (run / "models" / "r0005" / f"strategy_state.{other}.{time.strftime('%Y%m%d-%H%M%S', time.localtime(0))}.safetensors").exists()
    caplog.clear()
    named = federation_config(settings_of({"aggregation": other}), tmp_path, BROKER, "home", "home")
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        assert archive_strategy_change(run, named, now=1.0) == default.aggregation  # named: the operator's change, INFO
    assert [r.levelno for r in caplog.records] == [logging.INFO] and "changed from" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------------------------- operators
def _server(data: Path) -> tuple[Any, int]:
    """A Server over ``data`` whose runner drives in-memory devices (no broker): rounds, versions and requests for real."""
    from support.inmemory_grid import InMemoryGrid, device_status

    from coordinator.server.serve import Server

    data.mkdir(parents=True, exist_ok=True)
    if not (data / "server.toml").exists():
        (data / "server.toml").write_text(
            "min_clients = 2\naggregation = \"fedavgm\"\n[model]\nconv_filters = 4\ndense_units = 8\n"
            "[strategies.server_opt]\nlr = 2.0\nmomentum = 0.0\n[server]\nhttp_port = 0\nkeep_versions = 5\n"
            "[schedule]\nmin_clients = 2\nmin_round_interval_s = 1\n"
        )
    class Measuring(InMemoryGrid):  # devices that also report the start measure of the model they received
        def train(self, cid: str, start: Any, round_: int, stage: int, plan: Any) -> Any:
            u = super().train(cid, start, round_, stage, plan)
            return dataclasses.replace(u, confusion={**u.confusion, "initial": np.diag([4] * 6)})

    grid = Measuring({cid: device_status(cid, n) for cid, n in {"a": 30, "b": 10, "c": 60}.items()}, step=lambda cid: 0.01)
    server = Server(data, BROKER, "home", grid=lambda needs: grid)
    return server, server.runner.start(resume=True)


def _round(server: Any, r: int) -> None:
    """One served round as ``Server.run`` does it: take a request up, run, keep the version, finish the request."""
    server.versions.take_request()
    rec = server.runner.run_round(r)
    assert rec is not None
    server.versions.keep(rec)
    server.versions.finish_request()


def _ask(server: Any, data: Path, action: str, version: int | None) -> list[str]:
    """What the running server does with an operator's pin or rollback (its desk's command, in its loop's thread)."""
    from coordinator.server.operator_commands import perform

    return perform(action, {"version": version}, data, server.file, server.desk.side)


def _weight(server: Any) -> float:
    _, g = server.runner.model()
    return float(g[min(k for k, v in g.items() if v.is_floating_point())].flatten()[0])  # by name: files keep no order


@pytest.mark.slow
def test_pin_makes_serve_continue_from_that_version_once_and_across_a_restart(tmp_path: Path) -> None:
    from coordinator.server import model_request
    from coordinator.server.device_commands import DeviceCommandError
    from coordinator.server.device_tables import version_table
    from coordinator.server.operator_commands import check_model_request
    from coordinator.server.serve_versions import REQUEST_DONE_KEY

    data = tmp_path / "data"
    server, last = _server(data)
    assert last == -1
    w = []
    for r in range(3):  # versions 1, 2, 3: each round moves every weight by 2 x 0.01 (FedAvgM eta 2, beta 0)
        _round(server, r)
        w.append(_weight(server))
    assert w[1] - w[0] == pytest.approx(0.02, abs=1e-5) and w[2] - w[1] == pytest.approx(0.02, abs=1e-5)
    marks = {r["version"]: r["mark"] for r in version_table(data)}
    # rounds 1 and 2 judged versions 1 and 2 (rounds 0, 1) with equal start figures: the later one is the best
    assert marks == {1: "", 2: "best", 3: "newest"}
    with pytest.raises(DeviceCommandError, match="version 9 is not kept"):
        check_model_request(data, "pin", 9)

    _ask(server, data, "pin", 1)  # as the operator's command does it, through the running server
    req = model_request.read_request(data)
    assert req is not None and (req.action, req.version) == ("pin", 1)
    # a kill -9 before the next round completes: the restarted serve takes the request up again
    server.close()
    server, last = _server(data)
    assert last == 2 and model_request.read_request(data) == req
    _round(server, 3)
    assert _weight(server) == pytest.approx(w[0] + 0.02, abs=1e-5)  # from version 1 (w[0]), one step of 0.02
    assert model_request.read_request(data) is None and server.runner.state.get(REQUEST_DONE_KEY) == req.id
    _round(server, 4)  # taken up once: rounds go on from there
    assert _weight(server) == pytest.approx(w[0] + 0.04, abs=1e-5)
    server.close()


def test_rollback_goes_to_the_best_version_with_half_the_step(tmp_path: Path) -> None:
    from coordinator.server.device_commands import DeviceCommandError

    data = tmp_path / "data"
    server, _ = _server(data)
    with pytest.raises(DeviceCommandError):
        _ask(server, data, "rollback", None)  # no round yet: no versions at all
    w = []
    for r in range(3):
        _round(server, r)
        w.append(_weight(server))
    lines = _ask(server, data, "rollback", None)  # the best: version 2 (round 1's model); taken up at once
    assert lines == ["rollback to the best version: the server's next round starts from it with a halved server step"]
    assert server.runner.strategy.inner.step_scale == 0.5  # then a kill -9 before its round completes: taken up again, halved once
    server.close()
    server, _ = _server(data)
    _round(server, 3)
    assert _weight(server) == pytest.approx(w[1] + 0.01, abs=1e-5)  # half the step: 2 x 0.5 x 0.01
    assert server.runner.strategy.inner.step_scale == 0.5
    entries = [json.loads(line) for line in (data / "audit.jsonl").read_text().splitlines()]
    assert entries[-1]["action"] == "rollback" and entries[-1]["detail"] == "rollback to the best version"
    server.close()
    server, _ = _server(data)  # after a restart the step stays halved
    assert server.runner.strategy.inner.step_scale == 0.5
    server.close()
