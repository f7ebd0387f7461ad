"""The federation runner over an in-memory grid (tests/support/inmemory_grid.py): rounds, a failed quorum, resume,
FedDist growth and strategy state, with known answers and no broker."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from support.configs import config
from support.inmemory_grid import InMemoryGrid, device_status

from coordinator.config import CoordinatorConfig, FedDistSettings
from coordinator.runner import FederationRunner, StateError
from har_models.nn.model import init_state

DEVICES = {"a": 30, "b": 10, "c": 60}  # training windows


def _cfg(tmp_path: Path, **kw: object) -> CoordinatorConfig:
    return config(dict(run_dir=tmp_path / "run", run_id="mem", rounds=3, model={"conv_filters": 4, "dense_units": 8},
                       min_clients=2, timing={"start_timeout_s": 1.0, "start_settle_s": 0.0}, aggregation="fedavg"), kw)  # fmt: skip


def _grid() -> InMemoryGrid:
    return InMemoryGrid({cid: device_status(cid, n) for cid, n in DEVICES.items()})


def test_a_round_is_the_weighted_mean_of_known_steps_and_is_persisted_and_published(tmp_path: Path) -> None:
    cfg, grid = _cfg(tmp_path), _grid()
    runner = FederationRunner(cfg, grid)
    assert runner.start(resume=False) == -1
    runner.wait_for_clients()
    runner.ensure_federation()
    spec, g0 = runner.model()
    g0 = {k: v.clone() for k, v in g0.items()}
    assert g0.keys() == init_state(spec, cfg.seed).keys()
    record = runner.run_round(0)
    assert record is not None and grid.progress == [0]
    png = tmp_path / "run" / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the first round's report draws the plot
    # FedAvg of steps 0.01, 0.02, 0.03 weighted by 30, 10, 60 windows: (0.3 + 0.2 + 1.8) / 100 = 0.023
    _, g1 = runner.model()
    name = next(k for k, v in g0.items() if v.is_floating_point())
    assert torch.allclose(g1[name], g0[name] + 0.023, atol=1e-6)
    p = record.participation
    assert (p.selected, p.updates, p.missing, record.traffic.bytes_up if record.traffic else None) == (3, 3, (), 3000)
    # personalisation: each device's own hits (10, 11, 12 of 20), unweighted mean of the accuracies
    ev = record.evaluation.personalisation
    assert ev is not None and ev.accuracy == pytest.approx((10 + 11 + 12) / 60)
    assert [r.round for r in runner.records()] == [0]
    png.write_bytes(b"stale")
    runner._plotted = time.monotonic()  # drawn just now, as far as the runner knows: the next round leaves the plot
    assert runner.run_round(1) is not None and png.read_bytes() == b"stale"
    assert len(runner.report(plot=False)["rounds"]) == 2 and png.read_bytes() == b"stale"
    doc = runner.report({"wall_seconds": 1.5})  # a report with run facts (the end of a run) always draws it
    assert doc["wall_seconds"] == 1.5 and doc["label_set"] == "hapt6" and len(doc["rounds"]) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_round_without_quorum_is_closed_at_once_and_run_again_as_a_new_attempt(tmp_path: Path) -> None:
    cfg, grid = _cfg(tmp_path, min_clients=3), _grid()
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    runner.ensure_federation()
    _, g0 = runner.model()
    g0 = {k: v.clone() for k, v in g0.items()}
    grid.silent = {"b"}
    assert runner.run_round(0) is None
    assert grid.log[-1] == ("close_failed", 0) and grid.progress == []
    _, unchanged = runner.model()
    assert all(torch.equal(unchanged[k], g0[k]) for k in g0)  # the model is left as it was
    grid.silent = set()
    record = runner.run_round(0)
    assert record is not None and record.participation.updates == 3
    assert record.attempts == 2 and record.to_json()["attempts"] == 2  # one failed quorum, then the attempt that closed
    assert [e for e in grid.log if e[0] in ("new_attempt", "exchange", "close_failed")] == [
        ("exchange", 0, 0, ("a", "b", "c")), ("close_failed", 0), ("new_attempt", 0), ("exchange", 0, 0, ("a", "b", "c"))]
    assert runner.run_round(1).attempts == 1  # type: ignore[union-attr]
    assert ("new_attempt", 1) not in grid.log  # a round's first attempt is not a re-run


def test_a_resumed_run_continues_from_its_last_round_with_the_strategy_state(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, aggregation="fedavgm", rounds=4)
    first = FederationRunner(cfg, _grid())
    first.start(resume=False)
    for r in range(2):
        assert first.run_round(r) is not None
    spec, g = first.model()
    saved = first.strategy.state_dict()
    assert saved  # FedAvgM keeps its momentum
    first.state.close()

    again = FederationRunner(cfg, _grid())
    with pytest.raises(StateError, match="--resume"):
        again.start(resume=False)
    assert again.start(resume=True) == 1
    spec2, g2 = again.model()
    assert spec2 == spec and all(torch.equal(g2[k], g[k]) for k in g)
    assert all(torch.equal(again.strategy.state_dict()[k], v) for k, v in saved.items())
    assert again.run_round(2) is not None and [r.round for r in again.records()] == [0, 1, 2]


def test_feddist_grows_the_model_when_devices_diverge_and_records_it(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, growth="feddist", feddist=FedDistSettings(k0=0.1, period=1, mode="function_preserving"))
    # one device far from the others: its neurons are outliers to the aggregate
    grid = InMemoryGrid({cid: device_status(cid, n) for cid, n in DEVICES.items()},
                        step=lambda cid: {"a": 0.0, "b": 0.0, "c": 1.0}[cid])  # fmt: skip
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    runner.ensure_federation()
    spec0, _ = runner.model()
    record = runner.run_round(0)
    assert record is not None and record.growth is not None
    spec1, g1 = runner.model()
    added = {layer: info.added for layer, info in record.growth.layers.items()}
    assert added and spec1.version > spec0.version
    assert spec1.conv_filters == spec0.conv_filters + added.get("conv", 0)
    assert spec1.dense_units == spec0.dense_units + added.get("hidden", 0)
    assert record.arch is not None and record.arch.version == spec1.version
    assert all(torch.isfinite(v).all() for v in g1.values() if v.is_floating_point())
    # the next round is announced with the grown model, and the devices train on it
    assert runner.run_round(1) is not None and grid.log[-1][0] == "exchange"


class _ComesBack(InMemoryGrid):
    """Device ``a`` was restarted at t = 1000 s: offline (its last will) until the 3rd wait, then online as a new instance."""

    def __init__(self) -> None:
        super().__init__({cid: replace(device_status(cid, n), instance="old", sent_unix=990.0) for cid, n in DEVICES.items()})
        self.devices["a"] = replace(self.devices["a"], state="offline")
        self.restarts = {"a": 1000.0}
        self.waits = 0

    def wait(self, seconds: float) -> None:
        super().wait(seconds)
        self.waits += 1
        if self.waits == 3:
            self.devices["a"] = replace(self.devices["a"], state="online", instance="new", sent_unix=1003.0)


def test_a_restarted_device_is_waited_for_once_so_its_crash_costs_it_one_round(tmp_path: Path) -> None:
    cfg, grid = _cfg(tmp_path, timing={"start_timeout_s": 30.0}), _ComesBack()
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    runner.ensure_federation()
    runner.wait_for_restarted(1)
    assert grid.waits == 3  # waited until its new process said it is online, not longer
    assert runner.run_round(1).participation.selected == 3  # type: ignore[union-attr]
    runner.wait_for_restarted(2)
    assert grid.waits == 3  # that restart was waited for: no new wait


def test_a_restarted_device_back_with_its_old_instance_counts_only_by_a_status_sent_after_the_restart(tmp_path: Path) -> None:
    cfg, grid = _cfg(tmp_path, timing={"start_timeout_s": 30.0}), _ComesBack()
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    runner.ensure_federation()
    # Its retained status still says online (the last will not handled yet), sent before the restart: not back.
    grid.devices["a"] = replace(grid.devices["a"], state="online")
    grid.waits = 1  # the 2nd wait brings the new status
    runner.wait_for_restarted(1)
    assert grid.waits == 3


def test_a_restarted_device_that_never_comes_back_delays_one_round_by_the_start_timeout_then_not_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, grid = _cfg(tmp_path, timing={"start_timeout_s": 0.5}), _ComesBack()
    grid.waits = -10**9  # never back
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    runner.ensure_federation()
    with caplog.at_level(logging.WARNING, logger="coordinator.runner"):
        t0 = time.monotonic()
        runner.wait_for_restarted(1)
        waited = grid.waits
        runner.wait_for_restarted(2)
    assert time.monotonic() - t0 >= 0.5 and grid.waits == waited  # the second round did not wait again
    assert "restarted client(s) a not back within 0.5 s; the round opens without them" in caplog.text
    # A device given up by its launcher is not waited for; a new restart of it is.
    grid.restarts = {}
    runner.wait_for_restarted(3)
    assert grid.waits == waited


def test_devices_ahead_of_a_restored_run_folder_make_it_continue_after_their_round(tmp_path: Path) -> None:
    """After a restore from backup the devices may have done rounds the folder never completed: the numbering continues
    after theirs (a round they already did would be ignored by a device of an earlier release); one device at the
    round itself (a crash mid-round) re-sends its stored update, so that round opens as it is."""
    import dataclasses

    grid = _grid()
    runner = FederationRunner(_cfg(tmp_path), grid)
    runner.start(resume=False)
    assert runner.run_round(0) is not None
    grid.devices["a"] = dataclasses.replace(grid.devices["a"], run_id="mem", last_round=1)
    assert runner.catch_up(1) == 1  # a crash mid-round 1: round 1 again
    grid.devices["b"] = dataclasses.replace(grid.devices["b"], run_id="mem", last_round=4)
    grid.devices["c"] = dataclasses.replace(grid.devices["c"], run_id="other", last_round=9)  # another run's: no matter
    assert runner.catch_up(1) == 5
    assert [(e[0], e[3]) for e in runner.state.events("devices_ahead")] == [(1, "b at round 4; continuing at round 5")]
    rec = runner.run_round(5)
    assert rec is not None and [r.round for r in runner.records()] == [0, 5]
