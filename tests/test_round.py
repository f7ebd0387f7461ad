"""The pure round steps: selection, the exchange's bookkeeping, quorum, the summary line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from coordinator.config import CoordinatorConfig, TrainingSettings
from coordinator.exchange import Exchange
from coordinator.record import RoundRecord
from coordinator.round import base_plan, check_quorum, summary_line
from coordinator.rounds import select_clients
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.model import ArchSpec
from har_models.settings import AlaConfig

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
IDS = [f"c{i}" for i in range(10)]


def _update(cid: str, n_train: int = 5) -> ClientUpdate:
    return ClientUpdate(cid, 0, 0, n_train, 2, {"w": torch.zeros(1)}, None, size=100)


def test_selection_takes_everyone_at_fraction_one_and_nobody_below_quorum() -> None:
    assert select_clients(list(reversed(IDS)), 0, 2, 1.0, seed=1) == sorted(IDS)
    assert select_clients(IDS[:1], 0, 2, 1.0, seed=1) == []


def test_partial_selection_is_the_seeded_draw_and_repeats_on_resume() -> None:
    got = select_clients(IDS, 3, 2, 0.25, seed=7)
    # ceil(0.25 * 10) = 3 clients, drawn by the generator seeded with (seed, round).
    expect = sorted(np.random.default_rng([7, 3]).choice(sorted(IDS), size=3, replace=False).tolist())
    assert got == expect and len(got) == 3
    assert select_clients(IDS, 3, 2, 0.25, seed=7) == got
    assert select_clients(IDS, 3, 5, 0.25, seed=7).__len__() == 5  # the quorum is a floor on the sample


def test_exchange_completes_when_everyone_answered_or_went_offline() -> None:
    ex = Exchange(0, 0, SPEC, frozenset({"a", "b", "c"}), guidance=False)
    assert ex.add(_update("a")) and not ex.add(_update("a"))  # QoS 1 duplicates are kept once
    assert ex.bytes_up == 100 and not ex.complete()
    ex.offline.add("b")
    ex.rejected[("c", "sha256_mismatch")] += 3
    assert not ex.complete()
    ex.offline.add("c")
    assert ex.complete()
    assert ex.failures() == [Failure("b", "offline"), Failure("c", "offline")]
    ex.offline.discard("c")
    assert ex.failures()[1] == Failure("c", "sha256_mismatch") and ex.n_rejected == 3


def test_quorum_counts_only_results_with_training_windows() -> None:
    ok = [_update("a"), _update("b")]
    assert check_quorum(ok, [], 2) is None
    below = check_quorum([_update("a"), _update("b", n_train=0)], [Failure("c", "missed_deadline")], 2)
    assert below is not None and "1 update(s) with training windows, below the quorum of 2" in below
    nothing = check_quorum([], [Failure("a", "missed_deadline"), Failure("b", "missed_deadline"), Failure("c", "offline")], 1)
    assert nothing == "no update arrived (2 missed deadline, 1 offline)"


def test_base_plan_carries_the_ala_settings_only_when_ala_is_on() -> None:
    cfg = CoordinatorConfig(run_dir=Path("."), client_init="ala", ala=AlaConfig(eta=0.5), training=TrainingSettings(lr=0.05))
    plan = base_plan(cfg)
    assert plan.lr == 0.05 and plan.ala_config() == AlaConfig(eta=0.5)
    assert base_plan(CoordinatorConfig(run_dir=Path("."))).ala == {}


def test_summary_line_reads_as_documented() -> None:
    s = RoundRecord.from_json({"round": 7, "selected": 30, "updates": 28, "rejected": 2, "missing": ["a", "b"], "seconds": 41.24,
         "global": {"accuracy": 0.859, "macro_f1": 0.857}, "bytes_up": 773_900_000, "bytes_down": 12_000_000})
    assert summary_line(s) == (
        "round 7: 30 selected, 28 updates, 2 rejected, 2 missed the deadline, 41.2 s; "
        "global acc 85.9% F1 85.7%, personalisation acc n/a F1 n/a; up 773.9 MB, down 12.0 MB; devices: a missed, b missed"
    )
