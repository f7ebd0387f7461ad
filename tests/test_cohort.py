"""Cohorts with a goal count, a minimum fraction and a deadline, and pace steering (coordinator/rounds/cohort.py), over the
in-memory grid (tests/support/inmemory_grid.py) with known answers; and the O(N)-per-message costs they remove."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.configs import config
from support.inmemory_grid import InMemoryGrid, device_status

from coordinator.config import CohortSettings, CoordinatorConfig, ModelSettings, Timing
from coordinator.exchange import Exchange
from coordinator.rounds import NO_STEERING, Steering, policy_of, select_clients
from coordinator.rounds.cohort import PACE_LEAD_S, CohortRounds, pace_window
from coordinator.runner import FederationRunner
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec
from har_models.wire.messages import MessageError, RoundAnnouncement
from har_models.wire.pace import Pace

IDS = [f"d{i:02d}" for i in range(20)]


def _cfg(tmp_path: Path, name: str = "run", **kw: Any) -> CoordinatorConfig:
    return config(dict(run_dir=tmp_path / name, run_id="mem", rounds=3, model=ModelSettings(conv_filters=4, dense_units=8),
                       min_clients=2, timing=Timing(start_timeout_s=1.0, start_settle_s=0.0), aggregation="fedavg"), kw)  # fmt: skip


def quorum(cfg: CoordinatorConfig) -> int:
    """The updates a round of ``cfg`` needs (its round policy's quorum)."""
    return policy_of(cfg).quorum


def cohort_cap(cfg: CoordinatorConfig) -> int:
    """The most devices a round of ``cfg`` selects (0: no cap)."""
    return CohortRounds(cfg).cap if cfg.cohort.goal else 0


def steering(cfg: CoordinatorConfig, now: float, period: float, present: int, selected: int) -> Steering:
    """The steering the round policy of ``cfg`` gives a round."""
    return policy_of(cfg).steering(now, period, present, selected)


def _full_exchange(round_: int, goal: int, selected: list[str]) -> Exchange:
    """An exchange of ``round_`` that closed at its cohort goal, the first ``goal`` of ``selected`` having answered."""
    ex = Exchange(round_, 0, ArchSpec(n_classes=6, conv_filters=4, dense_units=8), frozenset(selected), False,
                  Steering(close_at=goal, unanswered="cohort_full"))  # fmt: skip
    for cid in selected[:goal]:
        ex.add(ClientUpdate(cid, round_, 0, 40, 10, {}, None, size=1))
    assert ex.full()
    return ex


def _grid(n: int = 20) -> InMemoryGrid:
    return InMemoryGrid({cid: device_status(cid, 10 + i) for i, cid in enumerate(IDS[:n])})


def _runner(cfg: CoordinatorConfig, grid: InMemoryGrid) -> FederationRunner:
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    runner.ensure_federation()
    return runner


def _selected(grid: InMemoryGrid) -> list[tuple[str, ...]]:
    return [e[3] for e in grid.log if e[0] == "exchange"]


# ---------------------------------------------------------------------------- the settings
def test_without_a_goal_the_quorum_is_min_clients_and_nothing_is_capped_or_steered(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, min_clients=3)
    assert (quorum(cfg), cohort_cap(cfg)) == (3, 0)
    assert steering(cfg, 1000.0, 60.0, 500, 3) is NO_STEERING


def test_goal_margin_and_minimum_fraction_give_known_cap_and_quorum(tmp_path: Path) -> None:
    # Bonawitz et al.'s 130 %: goal 10 -> 13 selected; 0.8 of the goal -> 8 updates needed
    cfg = _cfg(tmp_path, cohort=CohortSettings(goal=10, overselect=0.3, min_fraction=0.8))
    assert (cohort_cap(cfg), quorum(cfg)) == (13, 8)
    # the fraction only raises the floor min_clients
    assert quorum(_cfg(tmp_path, min_clients=4, cohort=CohortSettings(goal=10, min_fraction=0.2))) == 4
    assert quorum(_cfg(tmp_path, min_clients=2, cohort=CohortSettings(goal=10, min_fraction=0.25))) == 3  # ceil(2.5)
    assert cohort_cap(_cfg(tmp_path, cohort=CohortSettings(goal=7))) == 7


@pytest.mark.parametrize(("kw", "what"), [
    (dict(min_clients=3, cohort=CohortSettings(goal=2)), r"\[cohort\] goal"),
    (dict(cohort=CohortSettings(goal=-1)), r"\[cohort\] goal"),
    (dict(cohort=CohortSettings(goal=5, min_fraction=1.5)), r"\[cohort\] min_fraction"),
    (dict(cohort=CohortSettings(goal=5, overselect=-0.1)), r"\[cohort\] overselect"),
])  # fmt: skip
def test_bad_cohort_settings_are_refused_by_name(tmp_path: Path, kw: dict[str, Any], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        _cfg(tmp_path, **kw)


# ---------------------------------------------------------------------------- selection
def test_a_cap_bounds_the_seeded_draw_reproducibly_and_no_cap_is_the_draw_of_before() -> None:
    eligible = [f"p{i:04d}" for i in range(1000)]
    first = select_clients(eligible, 4, 2, 1.0, seed=7, cap=13)
    assert len(first) == 13 and set(first) <= set(eligible) and first == sorted(first)
    assert select_clients(list(reversed(eligible)), 4, 2, 1.0, seed=7, cap=13) == first  # order of arrival does not matter
    assert select_clients(eligible, 5, 2, 1.0, seed=7, cap=13) != first  # another round, another cohort
    assert select_clients(eligible, 4, 2, 1.0, seed=8, cap=13) != first  # another seed, another cohort
    # the fraction's count below the cap stands; the cap never goes below the quorum
    assert len(select_clients(eligible, 4, 2, 0.005, seed=7, cap=13)) == 5
    assert len(select_clients(eligible, 4, 20, 1.0, seed=7, cap=13)) == 20
    # cap 0 is the selection of before: (seed, round)-seeded draw of ceil(fraction x n)
    rng = np.random.default_rng([7, 4])
    assert select_clients(eligible, 4, 2, 0.1, seed=7) == sorted(rng.choice(sorted(eligible), size=100, replace=False).tolist())
    assert select_clients(eligible[:10], 4, 2, 1.0, seed=7, cap=13) == eligible[:10]  # fewer than the cap: all


# ---------------------------------------------------------------------------- rounds over the in-memory grid
def test_a_round_selects_goal_times_margin_and_closes_at_the_goal(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, cohort=CohortSettings(goal=5, overselect=0.4))  # 7 selected of 20, closes at 5 updates
    grid = _grid()
    runner = _runner(cfg, grid)
    record = runner.run_round(0)
    assert record is not None
    (sel,) = _selected(grid)
    assert len(sel) == 7
    p = record.participation
    assert (p.selected, p.updates) == (7, 5)
    # the in-memory devices answer in id order: the last two selected were not needed
    assert p.missing == sel[5:] and p.failures == {cid: "cohort_full" for cid in sel[5:]}
    assert grid.steering.close_at == 5


def test_the_cohorts_are_reproducible_from_the_seed_and_change_from_round_to_round(tmp_path: Path) -> None:
    def cohorts(name: str, seed: int) -> list[tuple[str, ...]]:
        grid = _grid()
        runner = _runner(_cfg(tmp_path, name, seed=seed, cohort=CohortSettings(goal=4)), grid)
        for r in range(2):
            assert runner.run_round(r) is not None
        return _selected(grid)

    a, b = cohorts("a", 1), cohorts("b", 1)
    assert a == b and all(len(s) == 4 for s in a) and len(set(a)) == 2
    assert a == [tuple(select_clients(IDS, r, 2, 1.0, 1, 4)) for r in range(2)]  # the seeded draw, round by round


def test_a_round_below_the_minimum_fraction_is_closed_and_run_again(tmp_path: Path) -> None:
    # goal 5, 0.8 of it: 4 updates needed, where min_clients (2) alone would have taken 3
    cfg = _cfg(tmp_path, cohort=CohortSettings(goal=5, min_fraction=0.8))
    grid = _grid()
    runner = _runner(cfg, grid)
    sel = select_clients(IDS, 0, 4, 1.0, cfg.seed, 5)
    grid.silent = set(sel[3:])  # 3 of the 5 selected answer
    assert runner.run_round(0) is None
    assert grid.log[-1] == ("close_failed", 0)
    assert "3 update(s) with training windows, below the quorum of 4" in runner.last_failure
    grid.silent = set(sel[4:])  # 4 answer: enough
    record = runner.run_round(0)
    assert record is not None and record.attempts == 2
    assert (record.participation.updates, record.participation.failures) == (4, {sel[4]: "missed_deadline"})


def test_too_few_eligible_devices_for_the_raised_quorum_skip_the_round(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, cohort=CohortSettings(goal=5, min_fraction=1.0))
    grid = _grid(6)
    runner = _runner(cfg, grid)
    for cid in IDS[:2]:
        grid.forget(cid)  # 4 left, 5 needed
    assert runner.run_round(0) is None
    assert runner.last_failure == "fewer than 5 eligible devices at its start"
    assert not _selected(grid)


def test_without_a_goal_announcements_carry_no_pace_and_every_selected_device_is_waited_for(tmp_path: Path) -> None:
    grid = _grid(6)
    runner = _runner(_cfg(tmp_path), grid)
    record = runner.run_round(0)
    assert record is not None and record.participation.updates == 6
    assert grid.steering is NO_STEERING and grid.announced == [(0, 0, None)]


# ---------------------------------------------------------------------------- pace steering
def test_the_pace_window_of_a_small_federation_is_just_before_the_next_round() -> None:
    p = pace_window(1000.0, 600.0, present=3, cohort=5)
    assert (p.next_round_unix, p.check_in_after_unix, p.check_in_before_unix) == (1600.0, 1570.0, 1600.0)
    assert p.window_s == PACE_LEAD_S
    # a short period: the lead is at most half of it
    q = pace_window(1000.0, 10.0, present=3, cohort=5)
    assert (q.next_round_unix, q.check_in_after_unix, q.check_in_before_unix) == (1010.0, 1005.0, 1010.0)


def test_the_pace_window_spreads_a_large_population_over_the_rounds_it_needs() -> None:
    # 10,000 present, 130 per round: ceil(10000 / 130) = 77 rounds of 60 s
    p = pace_window(1000.0, 60.0, present=10_000, cohort=130)
    assert p.next_round_unix == 1060.0 and p.check_in_after_unix == 1030.0
    assert p.window_s == 76 * 60.0
    # each device draws its own time, uniformly: about cohort devices per round's worth of window
    draws = np.array([p.draw(random.Random(i)) for i in range(10_000)])
    assert draws.min() >= p.check_in_after_unix and draws.max() <= p.check_in_before_unix
    per_round = np.histogram(draws, bins=76, range=(p.check_in_after_unix, p.check_in_before_unix))[0]
    assert 90 < per_round.mean() < 140 and per_round.max() < 200  # no herd
    with pytest.raises(ValueError, match="period_s"):
        pace_window(1000.0, 0.0, present=1, cohort=1)


def test_the_runner_announces_a_pace_from_the_deadline_then_from_the_period_seen(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, cohort=CohortSettings(goal=4), timing={"round_timeout_s": 120.0})
    grid = _grid()
    runner = _runner(cfg, grid)
    t0 = time.time()
    assert runner.run_round(0) is not None
    time.sleep(0.05)
    assert runner.run_round(1) is not None
    (r0, s0, p0), (r1, s1, p1) = grid.announced
    assert (r0, s0, r1, s1) == (0, 0, 1, 0) and p0 is not None and p1 is not None
    # round 0: no period seen yet, the deadline stands for it; 20 present, 4 per round -> 5 rounds
    assert p0.next_round_unix - t0 == pytest.approx(120.0, abs=1.0)
    assert p0.check_in_after_unix == pytest.approx(p0.next_round_unix - PACE_LEAD_S)
    assert p0.window_s == pytest.approx(4 * 120.0)
    # round 1: the period is the time between the two openings (round 0 and a 50 ms pause), so short that the
    # lead is half of it; the window covers 4 more periods
    period = 2 * (p1.next_round_unix - p1.check_in_after_unix)
    assert 0.05 <= period < 5.0
    assert p1.window_s == pytest.approx(4 * period, rel=1e-6)


def test_the_pace_travels_in_the_announcement_and_its_absence_keeps_the_old_message() -> None:
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8).to_dict()
    pace = Pace(1600.0, 1570.0, 1900.0)
    ann = RoundAnnouncement("r", 3, "training", spec, "hapt6", selected=("a", "b"), pace=pace)
    back = RoundAnnouncement.from_bytes(ann.to_bytes())
    assert back == ann and back.pace == pace
    plain = RoundAnnouncement("r", 3, "training", spec, "hapt6", selected=("a", "b"))
    assert b"pace" not in plain.to_bytes() and RoundAnnouncement.from_bytes(plain.to_bytes()).pace is None
    text = ann.to_bytes().decode()
    for bad, why in ((text.replace("1900.0", "1500.0"), "before it starts"), (text.replace("1600.0", '"soon"'), "next_round_unix"),
                     (text.replace('"check_in_before_unix": 1900.0', '"x": 1'), "pace")):  # fmt: skip
        with pytest.raises(MessageError, match=why):
            RoundAnnouncement.from_bytes(bad.encode())


# ---------------------------------------------------------------------------- costs that do not grow with N
class _CountingSet(frozenset[str]):
    """A frozenset that counts the passes over it."""

    passes = 0

    def __iter__(self) -> Any:
        type(self).passes += 1
        return super().__iter__()


def test_asking_whether_an_exchange_is_complete_does_not_pass_over_the_selected_devices() -> None:
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    selected = _CountingSet(f"p{i:05d}" for i in range(10_000))
    ex = Exchange(0, 0, spec, selected, False)
    ex.offline = {"p00001", "p00002", "not-selected"}
    _CountingSet.passes = 0
    for _ in range(1000):
        assert not ex.complete()
    assert _CountingSet.passes == 0
    ex.steering = Steering(close_at=0)
    assert ex.complete()


# ---------------------------------------------------------------------------- the client side
def test_a_client_keeps_its_own_time_in_the_announced_window_once_per_announcement(tmp_path: Path) -> None:
    from edge_client.agent import ClientConfig, EdgeAgent
    from edge_client.store import ClientStore
    from har_io.broker_config import BrokerConfig
    from har_models.data.labels import HAPT_LABELS
    from har_models.wire.topics import Topics

    agents = [EdgeAgent(ClientConfig(cid, BrokerConfig(port=9), backend="numpy"), ClientStore(tmp_path / cid, HAPT_LABELS))
              for cid in ("a", "b")]  # fmt: skip
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8).to_dict()
    pace = Pace(1600.0, 1570.0, 1900.0)
    ann = RoundAnnouncement("r", 3, "training", spec, "hapt6", selected=("a",), pace=pace)
    for agent in agents:
        agent._handle(Topics().round, ann.to_bytes())
    a, b = (agent.check_in for agent in agents)
    assert a is not None and b is not None
    assert (a.run_id, a.round, a.stage, a.selected, a.pace) == ("r", 3, 0, True, pace)
    assert (b.selected, b.pace) == (False, pace)
    assert 1570.0 <= a.at_unix <= 1900.0 and 1570.0 <= b.at_unix <= 1900.0 and a.at_unix != b.at_unix  # each its own jitter
    agents[1]._handle(Topics().round, ann.to_bytes())  # the retained announcement again (a reconnection)
    assert agents[1].check_in == b
    agents[1]._handle(Topics().round, RoundAnnouncement("r", 4, "training", spec, "hapt6", selected=("a",)).to_bytes())
    assert agents[1].check_in is None  # a round without a pace: nothing to schedule


def test_a_wait_before_round_0_takes_in_a_burst_of_statuses_so_eligibility_runs_once_per_burst(tmp_path: Path) -> None:
    from coordinator.service import Coordinator
    from har_io.broker_config import BrokerConfig
    from har_models.wire.topics import Topics

    grid = Coordinator(_cfg(tmp_path, broker=BrokerConfig.parse("127.0.0.1:9")), progress=False).grid
    topics = Topics()
    for cid in IDS:
        grid.inbox.put((topics.client_status(cid), device_status(cid, 10).to_bytes(), False))
    grid.wait(0.5)
    assert len(grid.eligibility().eligible) == len(IDS)  # one wait took in all 20, not one
    assert grid.inbox.qsize() == 0
    t0 = time.monotonic()
    grid.wait(0.05)  # nothing queued: it waits and returns
    assert time.monotonic() - t0 >= 0.04


@pytest.mark.slow
def test_over_mosquitto_the_announcement_names_the_cohort_with_its_pace_and_messages_cost_no_pass_over_it(
    tmp_path: Path, mosquitto: int
) -> None:
    from support.mqtt_watcher import Watcher

    from coordinator.service import Coordinator
    from har_io.broker_config import BrokerConfig
    from har_models.wire.topics import Topics

    n, goal = 1000, 400
    cfg = _cfg(tmp_path, broker=BrokerConfig(port=mosquitto), cohort=CohortSettings(goal=goal, overselect=0.25),
               timing={"round_timeout_s": 1.0})
    co = Coordinator(cfg, progress=False)
    grid, topics = co.grid, Topics()
    ids = [f"p{i:04d}" for i in range(n)]
    statuses = {cid: device_status(cid, 10).to_bytes() for cid in ids}
    for cid in ids:  # as the broker delivers them: a burst of statuses
        grid.inbox.put((topics.client_status(cid), statuses[cid], False))
    grid.wait(0.5)
    assert len(grid.eligibility().eligible) == n
    grid.open()
    try:
        watcher = Watcher(mosquitto, topics.round)
        co.runner.start(resume=False)
        co.runner.ensure_federation()
        for cid in ids * 3:  # three more statuses of every device wait to be handled while the round collects
            grid.inbox.put((topics.client_status(cid), statuses[cid], False))
        passes = 0
        fresh = grid.presence.fresh

        def counted(cid: str, now: float | None = None) -> bool:
            nonlocal passes
            passes += 1
            return fresh(cid, now)

        grid.clients.presence.fresh = counted  # type: ignore[method-assign]
        policy = co.runner.policy
        assert isinstance(policy, CohortRounds)
        policy.closed(_full_exchange(0, goal, ids), co.runner._fed)  # type: ignore[arg-type]  # an attempt of round 0 closed at its goal
        assert policy.not_needed is not None and policy.not_needed[:2] == (0, 0)
        t0 = time.time()
        assert co.runner.run_round(0) is None  # nobody trains here: closed at its 1 s deadline without quorum
        assert policy.not_needed is None  # round 0 opened again: their round-0 updates count in it, not as copies
        ann = None
        while ann is None:
            _, payload, _ = watcher.q.get(timeout=10)
            ann = RoundAnnouncement.from_bytes(payload) if payload else None
        assert len(ann.selected) == 500 and set(ann.selected) <= set(ids)  # 400 x 1.25, not 1000
        # one period (the 1 s deadline) after the round opened: after t0, and at the latest the round's own deadline, which
        # was set a moment after the pace (times the code recorded, so a loaded machine cannot move the verdict)
        assert ann.pace is not None and t0 + 1.0 <= ann.pace.next_round_unix <= ann.deadline_unix
        assert ann.pace.window_s == pytest.approx(1.0, abs=0.05)  # 1000 present, 500 a round: 2 rounds of 1 s
        assert grid.inbox.qsize() == 0  # the 3,000 statuses were handled during the round
        # one eligibility pass (1,000) and a pass over the 500 selected twice a second, not 3,000 x 500 = 1.5 M
        assert passes <= n + 500 * 6
    finally:
        grid.close()


def test_the_announcement_bytes_benchmark_counts_a_capped_cohort(capsys: pytest.CaptureFixture[str]) -> None:
    from support.script_module import load_script

    bench = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cohort_bytes.py")
    n_all, b_all, n_cohort, b_cohort = bench.announcement_bytes(1000, goal=100, margin=0.3)
    assert (n_all, n_cohort) == (1000, 130)
    # each id costs its 9 characters, quotes, comma and space in the list: 13 bytes; the cohort's message adds the
    # pace object, with three times of 12 characters each (1700000000.0 and the like)
    pace = len(b'"pace": {"check_in_after_unix": , "check_in_before_unix": , "next_round_unix": }, ') + 3 * 12
    assert b_all - b_cohort == 13 * (1000 - 130) - pace
    assert bench.main(["--sizes", "100,1000"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("announcement bytes per round with goal 100 over without")


def test_the_rounds_line_counts_the_devices_not_needed_apart_from_those_that_missed_the_deadline(tmp_path: Path) -> None:
    from coordinator.round import summary_line

    grid = _grid()
    runner = _runner(_cfg(tmp_path, min_clients=2, cohort=CohortSettings(goal=3, overselect=0.6)), grid)  # ceil(4.8) = 5 selected
    sel = select_clients(IDS, 0, 2, 1.0, 1, 5)
    grid.silent = {sel[0]}  # never answers; the next three reach the goal: neither it nor the last was waited for
    record = runner.run_round(0)
    assert record is not None and record.participation.failures == {sel[0]: "cohort_full", sel[4]: "cohort_full"}
    assert "5 selected, 3 updates, 0 rejected, 0 missed the deadline, 2 not needed (cohort goal reached), " in summary_line(record)
    sel1 = select_clients(IDS, 1, 2, 1.0, 1, 5)
    grid.silent = set(sel1[:3])  # 2 of round 1's cohort answer: below the goal, the round waits for its deadline
    record = runner.run_round(1)
    assert record is not None and record.participation.updates == 2
    assert "5 selected, 2 updates, 0 rejected, 3 missed the deadline, " in summary_line(record)
    assert "not needed" not in summary_line(record)


@pytest.mark.slow
def test_a_simulated_federation_with_a_cohort_goal_runs_its_rounds_with_real_clients(
    small_simulation: Callable[..., dict[str, Any]],
) -> None:
    # 3 clients, goal 2 with margin 0.5: all 3 selected, each round closes at 2 updates; the clients take the pace
    doc = small_simulation("--rounds", "2", "--cohort-goal", "2", "--cohort-overselect", "0.5", clients=3)
    assert [r["round"] for r in doc["rounds"]] == [0, 1]
    for r in doc["rounds"]:
        assert r["selected"] == 3 and r["updates"] >= 2  # updates already received at the close count too
        assert set(r["failures"].values()) <= {"cohort_full"} and len(r["missing"]) == 3 - r["updates"]
    assert doc["config"]["cohort"]["goal"] == 2


def test_the_late_update_of_a_device_a_round_closed_at_its_goal_did_not_wait_for_is_no_rejection(tmp_path: Path) -> None:
    from coordinator.service import Coordinator
    from har_io.broker_config import BrokerConfig
    from har_models.nn.model import init_state
    from har_models.wire import codec
    from har_models.wire.chunking import split_payload

    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    co = Coordinator(_cfg(tmp_path, broker=BrokerConfig.parse("127.0.0.1:9"), run_id="r1", cohort=CohortSettings(goal=2)),
                     progress=False)  # fmt: skip
    grid = co.grid

    def send(cid: str, round_: int) -> None:
        state = {k: v.numpy() for k, v in init_state(spec, 1).items()}
        meta = {"run_id": "r1", "stage": 0, "n_train": 40, "n_test": 10}
        for i, chunk in enumerate(split_payload(codec.encode(state, kind="update", round=round_, arch_version=spec.version,
                                                             client_id=cid, meta=meta), 1 << 20)):  # fmt: skip
            grid.handle(grid.topics.client_update(cid, i), chunk)

    co.runner.policy.closed(_full_exchange(3, 2, ["a", "b", "late"]), co.runner._fed)  # type: ignore[arg-type]
    ex = Exchange(4, 0, spec, frozenset({"late", "other"}), False)  # round 3 closed at its goal before "late" answered
    grid.intake.open(ex, 1 << 30)
    grid.receipts.open(4, 0)
    send("late", 3)  # round 3's update, trained before the close, arrives in round 4
    send("other", 3)  # a round-3 update of a device round 3 did not leave out stays a rejection
    assert ex.duplicates == {"late": 1} and ex.rejected == {("other", "stale_round"): 1}
    assert {f.client_id: f.reason for f in ex.failures()} == {"late": "missed_deadline", "other": "stale_round"}


def test_serve_refuses_a_schedule_that_starts_rounds_below_a_cohorts_quorum(tmp_path: Path) -> None:
    from coordinator.server.serve import federation_config
    from coordinator.server.settings import read_serve_file
    from har_io.broker_config import BrokerConfig

    path = tmp_path / "server.toml"
    path.write_text("min_clients = 2\n[cohort]\ngoal = 10\nmin_fraction = 0.5\n[schedule]\nmin_clients = 4\n")
    with pytest.raises(ValueError, match=r"\[schedule\] min_clients = 4 is below the quorum ceil\(\[cohort\] min_fraction x goal\) = 5"):
        federation_config(read_serve_file(path), tmp_path, BrokerConfig(), "home", "run")
    path.write_text("min_clients = 2\n[cohort]\ngoal = 10\nmin_fraction = 0.5\n[schedule]\nmin_clients = 5\n")
    cfg = federation_config(read_serve_file(path), tmp_path, BrokerConfig(), "home", "run")
    assert (cfg.cohort.goal, CohortRounds(cfg).quorum) == (10, 5)
