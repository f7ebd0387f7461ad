"""The quality guard (coordinator/guard.py): the rule with hand-computed scores, and a collapse rolled back on the
in-memory grid (a device whose update is finite but 100x too large), with the smaller step and the continuation
from the best version, also after a restart."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.configs import config
from support.inmemory_grid import N_CLASSES, InMemoryGrid, device_status

from coordinator import guard
from coordinator.config import CoordinatorConfig, GuardSettings
from coordinator.record import GuardNote, RoundRecord
from coordinator.runner import FederationRunner
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.messages import TrainingPlan

DEVICES = {"a": 30, "b": 10, "c": 60}  # training windows


# ---------------------------------------------------------------------------------------------- the rule
def _best(figures: Mapping[str, tuple[float, int]], round_: int = 3) -> guard.Best:
    return guard.Best(round_, dict(figures), None, {})  # type: ignore[arg-type]


def test_scores_are_weighted_by_test_windows_over_the_clients_in_both() -> None:
    judged = {"a": (0.5, 10), "b": (0.9, 30), "new": (0.0, 100)}
    best = {"a": (0.8, 10), "b": (0.9, 30), "gone": (1.0, 5)}
    # judged over a, b: (0.5*10 + 0.9*30) / 40 = 0.8; best: (0.8*10 + 0.9*30) / 40 = 0.875
    assert guard.common_scores(judged, best) == (pytest.approx(0.8), pytest.approx(0.875), 2)


def test_a_version_more_than_the_margin_below_the_best_is_rolled_back_and_one_within_it_kept() -> None:
    best = _best({"a": (0.875, 40)})
    assert guard.judge(5, {"a": (0.8, 40)}, best, margin=10).action == "keep"  # 7.5 points below
    note = guard.judge(5, {"a": (0.7, 40)}, best, margin=10)  # 17.5 points below
    assert (note.action, note.judged_round, note.to_round) == ("rollback", 5, 3)
    assert "70.0%" in note.reason and "87.5%" in note.reason
    assert guard.judge(5, {"a": (0.9, 40)}, best, margin=10).to_round == 5  # better: the new best


def test_non_finite_figures_or_model_roll_back_and_the_first_version_or_no_common_client_is_kept() -> None:
    best = _best({"a": (0.9, 40)})
    assert guard.judge(5, {"a": (math.nan, 40)}, best, 10).action == "rollback"
    assert guard.judge(5, {"a": (0.9, 40)}, best, 10, new_model_finite=False).action == "rollback"
    assert guard.judge(0, {"a": (0.1, 40)}, None, 10) == GuardNote("keep", 0, 0, "first version judged")
    assert guard.judge(5, {"z": (0.1, 40)}, best, 10).to_round == 3  # kept, but not the best
    with pytest.raises(ValueError, match="guard-margin"):
        guard.judge(5, {"a": (0.9, 40)}, best, -1)


def _moved(cid: str, w: list[float]) -> ClientUpdate:
    return ClientUpdate(cid, 0, 0, 10, 5, {"w": torch.tensor(w), "steps": torch.tensor([7])}, None)


def test_an_update_is_oversized_beyond_ten_times_the_median_of_the_others() -> None:
    w0 = {"w": torch.zeros(2), "steps": torch.tensor([0])}  # integer tensors are no part of the norm
    a, b, c = _moved("a", [3.0, 4.0]), _moved("b", [0.0, 6.0]), _moved("c", [300.0, 400.0])
    assert guard.update_norms([a, b, c], w0) == {"a": 5.0, "b": 6.0, "c": 500.0}
    # c: 500 > 10 x median(5, 6) = 55; a: 5 against median(6, 500) = 253; b: 6 against 252.5
    out = guard.oversized_updates([a, b, c], w0)
    assert out == {"c": (5.5, "update norm 500 is more than 10 x the other updates' median 5.5")}
    # clipped to the others' median: [300, 400] x 5.5 / 500 = [3.3, 4.4]; the integer tensor as it was
    cut = guard.clipped(c, w0, 5.5)
    assert torch.allclose(cut.state["w"], torch.tensor([3.3, 4.4])) and int(cut.state["steps"][0]) == 7
    assert guard.update_norms([cut], w0) == {"c": pytest.approx(5.5)}
    assert guard.clipped(a, w0, 5.5) is a  # no larger than the bound: as it is
    assert list(guard.oversized_updates([a, c], w0)) == ["c"]  # two updates: the median of the *other* tells them apart
    assert guard.oversized_updates([a, c], w0, factor=200.0) == {}  # 500 < 200 x 5
    assert guard.oversized_updates([c], w0) == {}  # nothing to compare with
    assert guard.oversized_updates([_moved("a", [54.0, 0.0]), _moved("b", [5.5, 0.0]), _moved("c", [5.5, 0.0])], w0) == {}  # 54 < 55
    assert list(guard.oversized_updates([a, b, _moved("d", [math.inf, 0.0])], w0)) == ["d"]
    for bad in (1.0, 0.5, math.nan, math.inf):
        with pytest.raises(ValueError, match="update norm factor must be a finite number > 1"):
            guard.oversized_updates([a, b], w0, factor=bad)


def test_the_guard_note_and_attempts_are_optional_record_keys_that_round_trip() -> None:
    plain = RoundRecord(round=4)
    assert "guard" not in plain.to_json() and "attempts" not in plain.to_json()
    rec = replace(plain, attempts=3, guard=GuardNote("rollback", 3, 1, "why"))
    d = rec.to_json()
    assert d["guard"] == {"action": "rollback", "judged_round": 3, "to_round": 1, "reason": "why"} and d["attempts"] == 3
    assert RoundRecord.from_json(d) == rec and RoundRecord.from_json(d).to_json() == d


# ---------------------------------------------------------------------------------------------- a collapse
class _MeasuringGrid(InMemoryGrid):
    """Devices that also measure the model they received: all 24 test windows right while no weight has moved more
    than 0.5 from the initial model, every window called class 0 beyond (a collapsed model)."""

    def __init__(self, g0: Mapping[str, torch.Tensor]):
        super().__init__({cid: device_status(cid, n) for cid, n in DEVICES.items()}, step=self._step, n_test=24)
        self.g0 = {k: v.clone() for k, v in g0.items()}
        self._round = -1
        self.huge_in: set[int] = set()  # rounds in which the updates of the devices in ``huge`` are 100x too large
        self.huge: set[str] = {"c"}
        self.received: list[tuple[int, float]] = []  # (round, drift of the model the devices received)

    def _step(self, cid: str) -> float:
        return 1.0 if cid in self.huge and self._round in self.huge_in else 0.01

    def train(self, cid: str, start: Mapping[str, torch.Tensor], round_: int, stage: int, plan: TrainingPlan) -> ClientUpdate:
        self._round = round_
        u = super().train(cid, start, round_, stage, plan)
        drift = max(float((start[k] - self.g0[k]).abs().max()) for k in self.g0 if self.g0[k].is_floating_point())
        if cid == "a":
            self.received.append((round_, drift))
        per = self.n_test // N_CLASSES
        cm = np.diag([per] * N_CLASSES).astype(np.int64) if drift < 0.5 else np.zeros((N_CLASSES, N_CLASSES), np.int64)
        if drift >= 0.5:
            cm[:, 0] = per
        return replace(u, confusion={**u.confusion, "initial": cm})


def _scale(runner: FederationRunner) -> float:
    """The server step's scale of the strategy inside the runner's quality guard."""
    inner: Any = getattr(runner.strategy, "inner", runner.strategy)
    return float(inner.step_scale)


def _cfg(tmp_path: Path, **kw: object) -> CoordinatorConfig:
    return config(dict(run_dir=tmp_path / "run", run_id="guard", rounds=6, model={"conv_filters": 4, "dense_units": 8},
                       min_clients=2, timing={"start_timeout_s": 1.0, "start_settle_s": 0.0}, aggregation="fedavgm",
                       strategies={"server_opt": {"lr": 2.0, "momentum": 0.0}}, guard={"enabled": True}), kw)  # fmt: skip


def _first_float(state: Mapping[str, torch.Tensor]) -> str:
    return next(k for k, v in state.items() if v.is_floating_point())


@pytest.mark.slow
def test_a_collapse_is_rolled_back_to_the_best_version_with_half_the_server_step(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    g0 = init_state(_spec(cfg), cfg.seed)
    grid = _MeasuringGrid(g0)
    grid.huge_in, grid.huge = {2}, set(DEVICES)  # every update 100x: a collapse in which no update stands out
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    name = _first_float(g0)
    recs = [runner.run_round(r) for r in range(5)]
    assert all(r is not None for r in recs)
    notes = [r.guard for r in recs if r is not None]
    # FedAvgM eta 2 beta 0: every device steps 0.01, so each round moves the model by 2 x 0.01 = 0.02 ...
    # ... except round 2, where every device steps 1.0: mean 1.0, x 2 = 2.0.
    assert [round(d, 3) for _, d in grid.received] == [0.0, 0.02, 0.04, 2.04, 0.04]
    assert [(n.action, n.judged_round, n.to_round) for n in notes if n is not None] == [
        ("keep", -1, -1), ("keep", 0, 0), ("keep", 1, 1), ("rollback", 2, 1), ("keep", 3, 3)]  # fmt: skip
    assert "start macro-F1" in notes[3].reason  # type: ignore[union-attr]
    # round 3 went back to round 1's model (g0 + 0.04); round 4 stepped from it with eta 2 x 0.5 = 1: + 0.01
    _, g = runner.model()
    assert torch.allclose(g[name], g0[name] + 0.05, atol=1e-5)
    assert _scale(runner) == 0.5
    assert [e[2] for e in runner.state.events("rollback")] == ["rollback"]
    assert guard.load_best(cfg.run_dir).round == 3  # type: ignore[union-attr]

    # after a restart (kill -9 keeps the same files) the step stays halved and the best is the same
    again = FederationRunner(cfg, grid)
    assert again.start(resume=True) == 4
    assert _scale(again) == 0.5 and again.best_round == 3
    rec = again.run_round(5)
    assert rec is not None and rec.guard is not None and rec.guard.action == "keep"
    assert torch.allclose(again.model()[1][name], g0[name] + 0.06, atol=1e-5)


def test_without_the_guard_the_same_collapse_stays_in_the_model_and_records_have_no_guard_key(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, guard=GuardSettings(enabled=False))
    g0 = init_state(_spec(cfg), cfg.seed)
    grid = _MeasuringGrid(g0)
    grid.huge_in = {2}  # c's update alone 100x: (0.3 + 0.1 + 60) / 100 = 0.604, x 2 = 1.208
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    recs = [runner.run_round(r) for r in range(4)]
    assert all(r is not None and "guard" not in r.to_json() for r in recs)
    assert all(r is not None and r.participation.updates == 3 for r in recs)  # nothing left out either
    name = _first_float(g0)
    assert torch.allclose(runner.model()[1][name], g0[name] + 1.268, atol=1e-4)  # 0.02 + 0.02 + 1.208 + 0.02


def test_one_update_far_larger_than_the_others_is_clipped_and_nothing_is_rolled_back(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    g0 = init_state(_spec(cfg), cfg.seed)
    grid = _MeasuringGrid(g0)
    grid.huge_in = {2, 3}  # c's update 100x too large in two rounds running
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    recs = [runner.run_round(r) for r in range(5)]
    assert all(r is not None for r in recs)
    # the model moves 2 x 0.01 every round: in rounds 2 and 3 c's +1.0 on every weight is clipped to a's and b's +0.01
    assert [round(d, 3) for _, d in grid.received] == [0.0, 0.02, 0.04, 0.06, 0.08]
    name = _first_float(g0)
    assert torch.allclose(runner.model()[1][name], g0[name] + 0.10, atol=1e-5)
    for r in recs:  # c's clipped update still counts: no attempt fails for want of it
        assert r is not None
        p = r.participation
        assert (p.selected, p.updates, p.missing, dict(p.failures), p.rejections) == (3, 3, (), {}, ())
    assert all(r is not None and r.guard is not None and r.guard.action == "keep" for r in recs)
    assert _scale(runner) == 1.0
    events = runner.state.events("clipped_update")
    assert [(e[0], e[1]) for e in events] == [(2, "c"), (3, "c")]
    assert all(e[3].startswith("update norm") and "more than 10 x the other updates' median" in e[3] for e in events)


def _spec(cfg: CoordinatorConfig) -> ArchSpec:
    """The architecture the runner makes for the in-memory devices (the initial model is init_state(spec, seed))."""
    grid = InMemoryGrid({cid: device_status(cid, n) for cid, n in DEVICES.items()})
    probe = FederationRunner(replace(cfg, run_dir=cfg.run_dir.parent / "probe"), grid)
    probe.ensure_federation()
    assert probe.spec is not None
    return probe.spec


@pytest.mark.slow
def test_a_halved_step_doubles_back_after_versions_kept_in_a_row_also_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard, "RECOVER_AFTER", 2)
    cfg = _cfg(tmp_path, rounds=8)
    g0 = init_state(_spec(cfg), cfg.seed)
    grid = _MeasuringGrid(g0)
    grid.huge_in, grid.huge = {2}, set(DEVICES)
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    scales = []
    for r in range(5):
        rec = runner.run_round(r)
        assert rec is not None and rec.guard is not None
        scales.append(_scale(runner))
    # round 3 rolls back (x 0.5); rounds 4 and 5 keep: the second keep in a row doubles the step back
    assert scales == [1.0, 1.0, 1.0, 0.5, 0.5]
    again = FederationRunner(cfg, grid)  # a restart after round 4 replays the records: halved, one kept since
    assert again.start(resume=True) == 4  # the last completed round
    assert _scale(again) == 0.5
    rec = again.run_round(5)
    assert rec is not None and rec.guard is not None and rec.guard.action == "keep"
    assert _scale(again) == 1.0
    rec = again.run_round(6)
    assert _scale(again) == 1.0  # never above the setting
    third = FederationRunner(cfg, grid)
    third.start(resume=True)
    assert _scale(third) == 1.0
    # the model, from round 1's g0 + 0.04 after the rollback: + 0.01 in rounds 4 and 5 (eta 2 x 0.5; round 5 doubles
    # the step only once its aggregate is made), + 0.02 in round 6
    name = _first_float(g0)
    assert torch.allclose(third.model()[1][name], g0[name] + 0.04 + 0.01 + 0.01 + 0.02, atol=1e-5)
