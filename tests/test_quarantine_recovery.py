"""A device that sends its model x 1000 every round is clipped, then quarantined, and the shared model recovers
(issue 40 item 2): the same small federation of real HAPT devices, run through the coordinator's runner with
and without it, at the guard's default settings.

Three honest devices (HAPT subjects 1-3) train the HAR CNN (4 filters, 8 hidden units, 1 local epoch, the
default FedExP step) with the client's own code (support/hapt_devices.py); in the second run a fourth device
(subject 4) joins at round 5 and sends w0 + 1000 (w - w0) each round. The honest devices' start measure (the
received model's macro-F1 on their own test windows) is the shared model's quality; the runs are seeded, so
they are equal to the last digit until the fourth device joins.

What the runs show (one PyTorch thread, as the test runs them), honest devices' mean start macro-F1 in %:

    round                 5     6     7*    8     9     10    11    12    13
    without the device  74.7  68.7  65.8  77.9  77.5  78.8  76.9  79.6  72.6
    with it             74.7  74.5  75.0  76.5  75.7  77.5  72.9  78.7  76.4    (* quarantined)

Its updates changed the model by norms of 517, 479 and 377, 720-1000 times the others' median (0.715, 0.481,
0.404): clipped in rounds 5, 6 and 7, quarantined at the third. Clipped to the others' median norm, its change is a
fourth subject's honest direction at an honest size, and from round 8 its update is left out. The issue's "within
1 point in every round" does not hold: the difference ranges from -4.0 (round 11) to +9.2 points (round 7). An
honest subject-4 device that takes part in rounds 5-7 only gives the same spread (-4.2 to +9.1 points): this
federation's start macro-F1 moves by up to 12 points from one round to the next by itself (measured when this test
was written). The test therefore holds the shared model, in each round from the quarantine on, to at most the
guard's own margin (10 points) below the federation without the device. Without the guard the same device takes
the honest devices' start macro-F1 from 74.7 % to 2.4 % in the next round.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.configs import config
from support.hapt_devices import HaptDevices
from support.inmemory_grid import InMemoryGrid

from coordinator import guard
from coordinator.record import RoundRecord
from coordinator.rounds.guarded import GuardedStrategy
from coordinator.runner import FederationRunner

pytestmark = pytest.mark.slow  # two federations of 14 rounds that really train: about 15 s of CPU

HONEST = {"hapt-01": 1, "hapt-02": 2, "hapt-03": 3}  # device -> HAPT subject
BAD, JOINS, SCALE = "hapt-04", 5, 1000.0
ROUNDS = 14


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One PyTorch thread: the figures above are its, and two spinning threads on a busy machine double the CPU time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _federation(folder: Path, with_bad: bool) -> tuple[list[RoundRecord], FederationRunner]:
    """ROUNDS rounds of the honest devices, and with ``with_bad`` the x 1000 device from round JOINS on."""
    subjects = {**HONEST, BAD: 4} if with_bad else HONEST
    devices = HaptDevices(folder / "devices", subjects, run_id="q", scaled={BAD: SCALE})
    grid = InMemoryGrid({cid: devices.status(cid) for cid in HONEST}, trainer=devices)
    cfg = config(dict(run_dir=folder / "run", run_id="q", rounds=ROUNDS, model={"conv_filters": 4, "dense_units": 8},
                      guard={"enabled": True}))  # fmt: skip
    runner = FederationRunner(cfg, grid)
    runner.start(resume=False)
    try:
        for r in range(ROUNDS):
            if with_bad and r == JOINS:
                grid.devices[BAD] = devices.status(BAD)
            assert runner.run_round(r) is not None, f"round {r}: {runner.last_failure}"
    finally:
        devices.close()
    return runner.records(), runner


def _honest_start(rec: RoundRecord) -> float:
    """The honest devices' mean start macro-F1 in round ``rec``."""
    per = rec.evaluation.start_clients
    return sum(per[cid].macro_f1 for cid in HONEST) / len(HONEST)


def test_a_x1000_device_is_clipped_then_quarantined_and_the_shared_model_stays_within_the_guards_margin(
    tmp_path: Path, one_thread: None
) -> None:
    clean, _ = _federation(tmp_path / "clean", with_bad=False)
    bad, runner = _federation(tmp_path / "bad", with_bad=True)
    assert all(rec.evaluation.start is not None and rec.evaluation.start.macro_f1 == pytest.approx(_honest_start(rec))
               for rec in clean)  # the record's start figure is the honest devices' mean  # fmt: skip
    for a, b in zip(clean[:JOINS], bad[:JOINS], strict=True):  # the same federation until the device joins
        assert a.evaluation.start_clients == b.evaluation.start_clients

    events = runner.state.events(("clipped_update", "quarantined"))
    (quarantine,) = [e for e in events if e[2] == "quarantined"]
    assert quarantine == (JOINS + 2, BAD, "quarantined", "clipped or rejected in 3 rounds in a row")
    clipped = [e for e in events if e[2] == "clipped_update"]
    assert [(r, cid) for r, cid, _, _ in clipped] == [(JOINS, BAD), (JOINS + 1, BAD), (JOINS + 2, BAD)]  # no honest one
    for _, _, _, text in clipped:  # 720-1000 x the others' median, far past a newcomer's 10 x 5
        m = re.match(r"update norm (\S+) is more than 10 x the other updates' median (\S+)", text)
        assert m is not None and float(m[1]) > 300 * float(m[2]), text
    assert isinstance(runner.strategy, GuardedStrategy) and set(runner.strategy.quarantined) == {BAD}
    q = quarantine[0]
    assert all(rec.participation.updates == 4 for rec in bad[q + 1 :])  # still served a model, its update received
    for rec in bad[q:]:  # a suspect's measure of the shared model is no part of its figure (nor of the guard's judgement)
        assert rec.evaluation.start is not None and rec.evaluation.start.macro_f1 == pytest.approx(_honest_start(rec))
        assert BAD in rec.evaluation.personalisation_clients  # its own model is still measured as its own

    margin = guard.DEFAULT_MARGIN / 100
    worst = min(_honest_start(b) - _honest_start(a) for a, b in zip(clean[q:], bad[q:], strict=True))
    assert worst > -margin, f"the shared model fell {-100 * worst:.1f} points below the federation without the device"
