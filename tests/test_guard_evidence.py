"""The quality guard acts only on evidence and keeps a harmful device out (issue 40 item 2): it abstains on too few
devices or windows, gives a device that just joined or came back room before clipping it, quarantines a device clipped
or rejected rounds in a row (left out of aggregation, recorded, kept across a restart) until an operator releases it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch
from support.configs import config
from support.inmemory_grid import InMemoryGrid, device_status

from coordinator import guard
from coordinator.record import GuardNote, RoundRecord
from coordinator.runner import FederationRunner
from coordinator.updates import ClientUpdate, Failure
from har_models.wire.messages import TrainingPlan

HONEST = ("a", "b", "c")


def _update(cid: str, by: float, w0: Mapping[str, torch.Tensor]) -> ClientUpdate:
    return ClientUpdate(cid, 0, 0, 10, 5, {k: v + by for k, v in w0.items()}, None, size=1)


def test_the_guard_abstains_below_its_minimum_evidence_and_says_what_it_rested_on() -> None:
    best = guard.Best(3, {"a": (0.9, 40), "b": (0.9, 40)}, None, {})  # type: ignore[arg-type]
    one = guard.judge(5, {"a": (0.1, 40)}, best, margin=10, min_devices=2, min_windows=30)
    assert (one.action, one.to_round, one.devices, one.windows) == ("abstain", 3, 1, 40)
    assert "too little evidence" in one.reason and "1 client(s) and 40 test windows" in one.reason
    few = guard.judge(5, {"a": (0.1, 10), "b": (0.1, 10)}, best, margin=10, min_devices=2, min_windows=30)
    assert (few.action, few.devices, few.windows) == ("abstain", 2, 20)
    both = guard.judge(5, {"a": (0.1, 40), "b": (0.1, 40)}, best, margin=10, min_devices=2, min_windows=30)
    assert (both.action, both.devices, both.windows) == ("rollback", 2, 80)
    rec = RoundRecord(round=6, guard=both)
    assert rec.to_json()["guard"]["windows"] == 80 and RoundRecord.from_json(rec.to_json()) == rec
    old = {"action": "keep", "judged_round": 2, "to_round": 1, "reason": ""}  # a record of an earlier release
    assert GuardNote.from_json(old) == GuardNote("keep", 2, 1, "") and "devices" not in GuardNote.from_json(old).to_json()


def test_a_device_without_a_recent_accepted_update_gets_room_and_a_known_one_is_judged_by_its_own_history() -> None:
    w0 = {"w": torch.zeros(100)}
    ups = [_update("a", 0.01, w0), _update("b", 0.01, w0), _update("c", 0.2, w0)]  # c: 20 x the others' norm (0.1)
    assert set(guard.oversized_updates(ups, w0)) == {"c"}  # the others' median alone: clipped
    assert guard.oversized_updates(ups, w0, history={"a": 0.1, "b": 0.1}) == {}  # c just came back: 20 < 10 x 5
    assert guard.oversized_updates(ups, w0, history={"a": 0.1, "b": 0.1, "c": 1.5}) == {}  # its own history: 2 < 10 x 1.5
    huge = [_update("a", 0.01, w0), _update("b", 0.01, w0), _update("c", 10.0, w0)]  # 1000 x: no room is that large
    median, text = guard.oversized_updates(huge, w0, history={"a": 0.1, "b": 0.1})["c"]
    assert math.isclose(median, 0.1, rel_tol=1e-6) and "no recent accepted update" in text


class _Poisoned(InMemoryGrid):
    """Three honest devices (+0.01 a round) and ``bad``, whose every update is x 1000 from round ``from_round`` on."""

    def __init__(self, bad: str = "z", from_round: int = 0):
        super().__init__({cid: device_status(cid, 10) for cid in (*HONEST, bad)}, step=self._step)
        self.bad, self.from_round, self._round = bad, from_round, 0

    def _step(self, cid: str) -> float:
        return 10.0 if cid == self.bad and self._round >= self.from_round else 0.01

    def train(self, cid: str, start: Mapping[str, torch.Tensor], round_: int, stage: int, plan: TrainingPlan) -> ClientUpdate:
        self._round = round_
        return super().train(cid, start, round_, stage, plan)


def _runner(tmp_path: Path, grid: InMemoryGrid) -> FederationRunner:
    cfg = config(dict(run_dir=tmp_path / "run", run_id="q", rounds=10, aggregation="fedavg", min_clients=2,
                      model={"conv_filters": 4, "dense_units": 8}, guard={"enabled": True, "quarantine_after": 3}))  # fmt: skip
    runner = FederationRunner(cfg, grid)
    runner.start(resume=True)
    runner.ensure_federation()
    return runner


def test_a_device_clipped_rounds_in_a_row_is_quarantined_left_out_kept_across_a_restart_and_released(tmp_path: Path) -> None:
    grid = _Poisoned(from_round=1)
    runner = _runner(tmp_path, grid)
    w = next(k for k, v in runner.model()[1].items() if v.is_floating_point())
    for r in range(4):  # clipped in rounds 1, 2 and 3: quarantined at the third
        assert runner.run_round(r) is not None
    assert runner.state.events("quarantined") == [(3, "z", "quarantined", "clipped or rejected in 3 rounds in a row")]
    before = runner.model()[1][w].clone()
    rec = runner.run_round(4)
    assert rec is not None and rec.participation.updates == 4  # still served a model, its update received ...
    assert torch.allclose(runner.model()[1][w], before + 0.01, atol=1e-6)  # ... and left out: the honest mean alone
    assert [(e[1], e[2]) for e in runner.state.events(("clipped_update", "quarantined"))][-1] == ("z", "quarantined")
    again = _runner(tmp_path, grid)  # a restart keeps the quarantine
    before = again.model()[1][w].clone()
    assert again.run_round(5) is not None and torch.allclose(again.model()[1][w], before + 0.01, atol=1e-6)
    assert again.release("z") and not again.release("z")  # the operator's release, once
    assert again.state.events("released") == [(None, "z", "released", "released by the operator")]
    grid.from_round = 99  # it behaves now: its updates count again
    before = again.model()[1][w].clone()
    assert again.run_round(6) is not None and torch.allclose(again.model()[1][w], before + 0.01, atol=1e-6)


def test_a_device_whose_updates_are_rejected_rounds_in_a_row_is_quarantined_and_absence_is_no_strike(tmp_path: Path) -> None:
    from coordinator.rounds.guarded import GuardedStrategy

    runner = _runner(tmp_path, InMemoryGrid({cid: device_status(cid, 10) for cid in HONEST}))
    strategy = runner.strategy
    assert isinstance(strategy, GuardedStrategy)
    assert runner._fed is not None
    fed = runner._fed
    ups = [_update(cid, 0.01, fed.global_state) for cid in ("a", "b")]
    for r in range(3):
        strategy.aggregate_fit(r, fed, ups, [Failure("c", "not_finite"), Failure("d", "offline")])
    assert set(strategy.quarantined) == {"c"}  # three rejections in a row; d was only absent
