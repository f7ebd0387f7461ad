"""The candidate server steps for small federations: hand-computed changes below 15 clients, the default's bits from 15 on."""

from __future__ import annotations

import pytest
import torch
from support.server_step_support import federation as _fed
from support.server_step_support import tensor as _t
from support.server_step_support import update as _upd

from coordinator.strategies import REGISTRY
from coordinator.strategies.fedexp import FedExP
from simulation.step_candidates import CANDIDATES, SMALL_FEDERATION, _Candidate, small_federation_step

_D = {"w": _t(3.0, 4.0)}  # ||Delta||^2 = 25


class _Smooth(_Candidate):  # no name: not registered
    mode = "smooth"


@pytest.mark.parametrize("mode", sorted(set(CANDIDATES.values())))
def test_from_fifteen_clients_every_candidate_is_the_default(mode):
    m_prev = {"w": _t(-1.0, 0.0)}
    for n in (SMALL_FEDERATION, 30, 100):
        eta, beta, m = small_federation_step(mode, n, 1.7, 0.5, _D, m_prev, 60.0)
        assert (eta, beta) == (1.7, 0.5) and m is m_prev


def test_hand_computed_changes_below_fifteen_clients():
    m_same, m_back = {"w": _t(3.0, 4.0)}, {"w": _t(-4.0, 3.0)}  # cos +1 and 0 with Delta
    assert small_federation_step("smooth", 2, 1.0, 0.5, _D, None, 30.0)[:2] == (0.5, 0.75)
    assert small_federation_step("heavy", 2, 1.0, 0.5, _D, None, 30.0)[:2] == (0.25, 0.75)
    assert small_federation_step("bscale", 3, 1.0, 0.5, _D, None, 30.0)[:2] == pytest.approx((1.0, 0.1))
    assert small_federation_step("b0", 14, 1.0, 0.5, _D, None, 30.0)[:2] == (1.0, 0.0)
    # agreement: ||Delta||^2 / mean ||Delta_i||^2 = 25 / 50 -> half the step
    assert small_federation_step("agree", 2, 1.0, 0.5, _D, None, 50.0)[0] == pytest.approx(0.5)
    # flip: the momentum is dropped only when it points against Delta (cos < 0)
    assert small_federation_step("flip", 2, 1.0, 0.5, _D, {"w": _t(-3.0, -4.0)}, 30.0)[2] is None
    assert small_federation_step("flip", 2, 1.0, 0.5, _D, m_back, 30.0)[2] is m_back
    # damp: beta * max(0, cos): cos 1 keeps it, cos 0 removes it
    assert small_federation_step("damp", 2, 1.0, 0.5, _D, m_same, 30.0)[1] == pytest.approx(0.5)
    assert small_federation_step("damp", 2, 1.0, 0.5, _D, m_back, 30.0)[1] == 0.0
    with pytest.raises(ValueError, match="unknown change"):
        small_federation_step("bigger", 2, 1.0, 0.5, _D, None, 30.0)


def test_a_candidate_round_at_fifteen_clients_is_the_default_to_the_bit():
    g = torch.Generator().manual_seed(7)
    x0 = torch.randn(50, generator=g)
    default, cand = FedExP(), _Smooth()
    x_d = x_c = x0
    for r in range(3):
        ups = [torch.randn(50, generator=g) * 0.1 for _ in range(SMALL_FEDERATION)]
        x_d = default.aggregate_fit(r, _fed(x_d), [_upd(str(i), 10 + i, x_d + u) for i, u in enumerate(ups)]).global_state["w"]
        x_c = cand.aggregate_fit(r, _fed(x_c), [_upd(str(i), 10 + i, x_c + u) for i, u in enumerate(ups)]).global_state["w"]
        assert torch.equal(x_d, x_c) and default.last_eta == cand.last_eta
    assert default.m is not None and cand.m is not None and torch.equal(default.m["w"], cand.m["w"])


def test_two_devices_take_the_smoothed_step():
    # Delta_1 = 1, Delta_2 = -0.8: eta_t = eta_max(2) = 1 (tests/test_fedexp.py); smooth: eta 0.5, beta 0.75.
    # Round 1: m = 0.5 * 0.1 = 0.05, x = -0.05. Round 2, both clients at x - 0.2 (Delta = x_t - mean = 0.2, eta_t 1):
    # m = 0.75 * 0.05 + 0.5 * 0.2 = 0.1375, x = -0.05 - 0.1375 = -0.1875
    s = _Smooth()
    x = s.aggregate_fit(0, _fed(_t(0.0)), [_upd("a", 1, _t(-1.0)), _upd("b", 1, _t(0.8))]).global_state["w"]
    assert s.last_eta == 0.5 and x.item() == pytest.approx(-0.05, abs=1e-7)
    x = s.aggregate_fit(1, _fed(x), [_upd("a", 1, x - 0.2), _upd("b", 1, x - 0.2)]).global_state["w"]
    assert x.item() == pytest.approx(-0.1875, abs=1e-6)


def test_the_candidates_are_not_strategies_of_the_coordinator():
    assert not set(CANDIDATES) & set(REGISTRY)
