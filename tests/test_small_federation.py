"""The shared small-federation options mean what the end-to-end tests rely on, as the programs' own parsers read them."""

from __future__ import annotations

import pytest
from support.small_federation import coordinator_args, model_args, simulate_args

from coordinator import cli
from simulation import simulate


def test_simulate_args_parse_to_the_small_federation() -> None:
    a = simulate.build_parser().parse_args(simulate_args())
    assert (a.clients, a.conv_filters, a.dense_units, a.generalisation_every) == (3, 8, 32, 1)
    assert a.no_progress and a.start_timeout_s == 120.0 and a.round_timeout_s == 120.0


def test_overrides_and_left_out_options_fall_back_to_the_programs_defaults() -> None:
    args = simulate_args(clients=None, generalisation_every=None, conv_filters=4, dense_units=8, start_timeout_s=300, round_timeout_s=60)
    assert "--clients" not in args and "--generalisation-every" not in args
    a, default = simulate.build_parser().parse_args(args), simulate.build_parser().parse_args([])
    for name in ("clients", "generalisation_every"):
        assert getattr(a, name, None) == getattr(default, name, None), name
    assert (a.conv_filters, a.dense_units, a.start_timeout_s, a.round_timeout_s) == (4, 8, 300.0, 60.0)
    # A later repeat wins, which is how tests widen the CNN for one run.
    b = simulate.build_parser().parse_args([*simulate_args(), *model_args(32, 128)])
    assert (b.conv_filters, b.dense_units) == (32, 128)
    with pytest.raises(TypeError):
        simulate_args(rounds=2)  # not a shared option: the test writes --rounds itself


def test_the_coordinator_reads_the_same_options() -> None:
    a = cli.build_parser().parse_args(coordinator_args(dense_units=16, start_timeout_s=240))
    assert (a.conv_filters, a.dense_units, a.no_progress, a.start_timeout_s, a.round_timeout_s) == (8, 16, True, 240.0, 120.0)
