"""The shared small-federation options mean what the end-to-end tests rely on, as the programs' own parsers read them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from support.small_federation import coordinator_args, model_args, simulate_args

from coordinator import cli
from coordinator.config import CoordinatorConfig
from simulation import simulate


def _cfg(a: argparse.Namespace) -> CoordinatorConfig:
    return cli.config_from_args(a, run_dir=Path("."))


def test_simulate_args_parse_to_the_small_federation() -> None:
    a = simulate.build_parser().parse_args(simulate_args())
    c = _cfg(a)
    assert (a.clients, c.model.conv_filters, c.model.dense_units, c.evaluation.generalisation_every) == (3, 8, 32, 1)
    assert a.no_progress and c.timing.start_timeout_s == 120.0 and c.timing.round_timeout_s == 120.0


def test_overrides_and_left_out_options_fall_back_to_the_programs_defaults() -> None:
    args = simulate_args(clients=None, generalisation_every=None, conv_filters=4, dense_units=8, start_timeout_s=300, round_timeout_s=60)
    assert "--clients" not in args and "--generalisation-every" not in args
    a, default = simulate.build_parser().parse_args(args), simulate.build_parser().parse_args([])
    assert a.clients == default.clients
    assert _cfg(a).evaluation.generalisation_every == _cfg(default).evaluation.generalisation_every
    c = _cfg(a)
    assert (c.model.conv_filters, c.model.dense_units, c.timing.start_timeout_s, c.timing.round_timeout_s) == (4, 8, 300.0, 60.0)
    # A later repeat wins, which is how tests widen the CNN for one run.
    b = _cfg(simulate.build_parser().parse_args([*simulate_args(), *model_args(32, 128)]))
    assert (b.model.conv_filters, b.model.dense_units) == (32, 128)
    with pytest.raises(TypeError):
        simulate_args(rounds=2)  # not a shared option: the test writes --rounds itself


def test_the_coordinator_reads_the_same_options() -> None:
    a = cli.build_parser().parse_args(coordinator_args(dense_units=16, start_timeout_s=240))
    c = _cfg(a)
    assert (c.model.conv_filters, c.model.dense_units, a.no_progress, c.timing.start_timeout_s, c.timing.round_timeout_s) == (
        8, 16, True, 240.0, 120.0)
