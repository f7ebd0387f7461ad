"""The round-wise client lr schedule: hand-computed factors, the coordinator's plans, the CLI and TOML, and old clients."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from coordinator.cli import build_parser, config_from_args
from coordinator.config import CoordinatorConfig, TrainingSettings
from coordinator.round import base_plan
from har_io.cli import write_settings_file
from har_models.settings import LrSchedule
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

_OLD_PLAN_KEYS = {"local_epochs", "lr", "batch_size", "prox_mu", "client_init", "guidance", "keep_local", "frozen",
                  "class_weights", "seed", "ala", "update_encoding"}
"""The plan fields a client built before the schedule knows (``update_encoding`` is left out when it is float32)."""


def test_the_default_schedule_leaves_every_round_at_the_given_lr() -> None:
    s = LrSchedule()
    assert s.is_constant and [s.factor(r, 15) for r in range(15)] == [1.0] * 15
    cfg = CoordinatorConfig(run_dir=Path("."))
    assert [base_plan(cfg, r).lr for r in range(cfg.rounds)] == [0.1] * 15


def test_warmup_then_cosine_by_hand() -> None:
    # W = 1, R = 5: round 0 at 1/2; then t = 0..3 over a span of 4: (1 + cos(pi t / 4)) / 2.
    s = LrSchedule("cosine", warmup_rounds=1)
    want = [0.5, 1.0, (1 + math.sqrt(0.5)) / 2, 0.5, (1 - math.sqrt(0.5)) / 2]
    assert [s.factor(r, 5) for r in range(5)] == pytest.approx(want, abs=1e-12)
    # A floor lifts the whole curve: f = m + (1 - m) * c.
    floor = LrSchedule("cosine", min_factor=0.2)
    assert floor.factor(2, 4) == pytest.approx(0.2 + 0.8 * 0.5) and floor.factor(0, 4) == 1.0
    assert not s.is_constant and LrSchedule("cosine", min_factor=1.0).is_constant


def test_warmup_then_step_by_hand() -> None:
    s = LrSchedule("step", warmup_rounds=2, step_every=3, step_gamma=0.1)
    got = [s.factor(r, 10) for r in range(10)]
    assert got == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01])
    assert LrSchedule("constant", warmup_rounds=3).factor(1, 10) == 0.5


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"kind": "linear"}, "LrSchedule.kind (--lr-schedule) must be one of"),
        ({"warmup_rounds": -1}, "warmup_rounds (--lr-warmup) must be an integer >= 0"),
        ({"min_factor": 1.5}, "min_factor (--lr-min-factor) must be in [0, 1]"),
        ({"step_every": 0}, "step_every (--lr-step-every) must be an integer >= 1"),
        ({"step_gamma": 0.0}, "step_gamma (--lr-step-gamma) must be in (0, 1]"),
    ],
)
def test_a_bad_schedule_is_refused_with_its_flag_named(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        LrSchedule(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="need rounds >= 1"):
        LrSchedule().factor(0, 0)


def test_options_and_toml_set_the_schedule_and_it_round_trips(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--lr-schedule", "cosine", "--lr-warmup", "1", "--rounds", "5", "--lr", "0.2"])
    cfg = config_from_args(args, run_dir=tmp_path)
    assert cfg.training.lr_schedule == LrSchedule("cosine", warmup_rounds=1)
    assert [cfg.round_lr(r) for r in range(5)] == pytest.approx([0.1, 0.2, 0.2 * (1 + math.sqrt(0.5)) / 2, 0.1,
                                                                 0.2 * (1 - math.sqrt(0.5)) / 2])
    write_settings_file(tmp_path / "config.toml", cfg.settings())
    assert "[training.lr_schedule]" in (tmp_path / "config.toml").read_text()
    back = config_from_args(build_parser().parse_args(["--config", str(tmp_path / "config.toml")]), run_dir=tmp_path)
    assert back == cfg
    bad = tmp_path / "bad.toml"
    bad.write_text('[training.lr_schedule]\nkind = "cosin"\n')
    with pytest.raises(ValueError, match=r"lr_schedule.*must be one of"):
        config_from_args(build_parser().parse_args(["--config", str(bad)]), run_dir=tmp_path)


def test_a_client_that_knows_no_schedule_still_takes_each_rounds_plan() -> None:
    """The schedule travels as the plan's lr alone: no new key, so a client built before it parses every round's plan."""
    cfg = CoordinatorConfig(run_dir=Path("."), rounds=4,
                            training=TrainingSettings(lr_schedule=LrSchedule("step", step_every=2, step_gamma=0.5)))
    lrs = []
    for r in range(cfg.rounds):
        ann = RoundAnnouncement(run_id="r", round=r, state="training", arch={}, label_set="hapt6", selected=("c",),
                                plan=base_plan(cfg, r))
        plan = json.loads(ann.to_bytes())["plan"]
        assert set(plan) == _OLD_PLAN_KEYS and plan["update_encoding"] == cfg.training.update_encoding == "int8_delta"
        lrs.append(TrainingPlan.from_json(plan).lr)
    assert lrs == [0.1, 0.1, 0.05, 0.05]
