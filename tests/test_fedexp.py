"""FedExP's server step (Jhunjhunwala, Wang, Joshi, ICLR 2023): hand-computed step sizes and steps, its cap, its validation."""

from __future__ import annotations

import pytest
import torch
from support.server_step_support import federation as _fed
from support.server_step_support import tensor as _t
from support.server_step_support import update as _upd

from coordinator.cli import build_parser, config_from_args
from coordinator.config import CoordinatorConfig
from coordinator.server_opt import fedexp_eta, mean_sq_update_norm, pseudo_gradient
from coordinator.strategies import DEFAULT_AGGREGATION, make_strategy
from coordinator.strategies.fedavgm import FEDAVGM_BETA, FEDAVGM_ETA, FedAvgM
from coordinator.strategies.fedexp import FEDEXP_BETA, FedExP
from coordinator.strategies.fedopt import ServerOptSettings


def _eta(x_t: torch.Tensor, xs: list[torch.Tensor], ns: list[float], eps: float = 1e-3, eta_max: float = 100.0) -> float:
    mean = torch.stack([n * x for n, x in zip(ns, xs, strict=True)]).sum(0) / sum(ns)
    msq = mean_sq_update_norm({"w": x_t}, [{"w": x} for x in xs], ns)
    return fedexp_eta(msq, pseudo_gradient({"w": x_t}, {"w": mean}), eps, eta_max)


def test_two_orthogonal_updates_give_the_fedavg_step():
    # Delta_1 = [1, 0], Delta_2 = [0, 1]: mean ||Delta_i||^2 = 1, Delta = [0.5, 0.5], ||Delta||^2 = 0.5
    # ratio = 1 / (2 (0.5 + 0.001)) = 0.998 -> eta = max(1, 0.998) = 1
    assert _eta(_t(1.0, 2.0), [_t(0.0, 2.0), _t(1.0, 1.0)], [1, 1]) == 1.0


def test_identical_updates_give_the_fedavg_step():
    # every Delta_i = Delta: ratio = ||Delta||^2 / (2 (||Delta||^2 + eps)) < 1/2 -> eta = 1
    assert _eta(_t(1.0, 1.0), [_t(0.0, 3.0)] * 3, [1, 2, 5]) == 1.0


def test_four_orthogonal_updates_extrapolate():
    # Delta_i = e_i in R^4: mean ||Delta_i||^2 = 1, Delta = [0.25] * 4, ||Delta||^2 = 0.25
    # ratio = 1 / (2 (0.25 + 0.001)) = 1 / 0.502 = 1.99203187...
    xs = [-torch.eye(4)[i] for i in range(4)]
    assert _eta(torch.zeros(4), xs, [1, 1, 1, 1]) == pytest.approx(1 / 0.502, rel=1e-9)


def test_weights_are_the_training_windows():
    # n = 3, 1 -> p = 0.75, 0.25; Delta_1 = [2, 0], Delta_2 = [0, 4]
    # sum p_i ||Delta_i||^2 = 0.75 * 4 + 0.25 * 16 = 7; Delta = [1.5, 1]; ||Delta||^2 = 3.25
    # eta = 7 / (2 * 3.251) = 1.0765990...
    assert _eta(_t(0.0, 0.0), [_t(-2.0, 0.0), _t(0.0, -4.0)], [3, 1]) == pytest.approx(7 / 6.502, rel=1e-9)


def test_cancelling_updates_are_capped():
    # Delta_1 = 1, Delta_2 = -0.8: mean ||Delta_i||^2 = 0.82, Delta = 0.1, ||Delta||^2 = 0.01
    # ratio = 0.82 / (2 * 0.011) = 37.27 -> capped at eta_max = 3
    assert _eta(_t(0.0), [_t(-1.0), _t(0.8)], [1, 1], eta_max=3.0) == 3.0
    assert _eta(_t(0.0), [_t(-1.0), _t(0.8)], [1, 1], eta_max=100.0) == pytest.approx(0.82 / 0.022, rel=1e-6)


def test_mean_sq_update_norm_is_a_running_sum_that_skips_empty_clients():
    # a generator of states, and a client with 0 windows whose state (even NaN) is never read:
    # p = 1/3, 2/3; ||Delta_1||^2 = 1 + 4 = 5, ||Delta_2||^2 = 4 -> 5/3 + 8/3 = 13/3
    x_t = {"w": _t(1.0, 2.0)}
    states = ({"w": v} for v in (_t(0.0, 0.0), _t(float("nan"), 0.0), _t(1.0, 0.0)))
    assert mean_sq_update_norm(x_t, states, [1, 0, 2]) == pytest.approx(13 / 3, rel=1e-12)


def test_bad_inputs_are_refused_with_the_argument_named():
    x_t, d = {"w": _t(1.0)}, {"w": _t(0.5)}
    with pytest.raises(ValueError, match="mean_sq_norm"):
        fedexp_eta(-1.0, d)
    with pytest.raises(ValueError, match="eta_max"):
        fedexp_eta(1.0, d, eta_max=0.5)
    with pytest.raises(ValueError, match="eps"):
        fedexp_eta(1.0, d, eps=0.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        fedexp_eta(1.0, {"w": _t(float("inf"))})
    with pytest.raises(ValueError, match="2 states but 3 weights"):
        mean_sq_update_norm(x_t, [x_t, x_t], [1, 1, 1])
    with pytest.raises(ValueError, match="total weight is 0"):
        mean_sq_update_norm(x_t, [x_t], [0])
    with pytest.raises(ValueError, match="shape"):
        mean_sq_update_norm(x_t, [{"w": _t(1.0, 2.0)}], [1])
    with pytest.raises(ValueError, match="eta_max"):
        FedExP(ServerOptSettings(lr=0.5))
    with pytest.raises(ValueError, match="eps"):
        ServerOptSettings(eps=0.0)


def test_strategy_two_rounds_by_hand_with_momentum():
    # beta 0.5, eta_max 3. Round 1: x_t = [0, 0]; clients [-2, 0] (n 3) and [0, -4] (n 1):
    # eta_1 = 7 / 6.502 (above), Delta = [1.5, 1]; m = eta_1 Delta; x = -m
    s = FedExP(ServerOptSettings(lr=3.0, momentum=0.5))
    e1 = 7 / 6.502
    x1 = s.aggregate_fit(0, _fed(_t(0.0, 0.0)), [_upd("a", 3, _t(-2.0, 0.0)), _upd("b", 1, _t(0.0, -4.0))]).global_state["w"]
    assert s.last_eta == pytest.approx(e1, rel=1e-9)
    assert x1.tolist() == pytest.approx([-1.5 * e1, -1.0 * e1], rel=1e-6)
    # Round 2: both clients return x1 - [1, 1] (they agree): eta_2 = 1, Delta = [1, 1];
    # m = 0.5 eta_1 [1.5, 1] + [1, 1]; x2 = x1 - m
    x2 = s.aggregate_fit(1, _fed(x1), [_upd("a", 3, x1 - 1), _upd("b", 1, x1 - 1)]).global_state["w"]
    assert s.last_eta == 1.0
    m2 = [0.5 * e1 * 1.5 + 1, 0.5 * e1 + 1]
    assert x2.tolist() == pytest.approx([x1[0].item() - m2[0], x1[1].item() - m2[1]], rel=1e-6)
    assert set(s.state_dict()) == {"m.w"}


def test_the_cap_grows_with_the_clients_unless_set():
    # eta_max(M) = min(2, max(1, M / 15)): 1 up to 15 clients, 1.5 at 22.5 -> 22 gives 22/15, 2 from 30
    s = FedExP()
    assert [s.eta_max(m) for m in (1, 2, 10, 15, 30, 100)] == [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]
    assert s.eta_max(22) == pytest.approx(22 / 15)
    assert FedExP(ServerOptSettings(lr=3.0)).eta_max(2) == 3.0
    with pytest.raises(ValueError, match="at least one"):
        s.eta_max(0)


def test_two_devices_with_cancelling_updates_take_the_fedavg_step_under_the_default():
    # the 2-device case of issue 28: Delta_1 = 1, Delta_2 = -0.8 (ratio 37, above) -> eta_t = eta_max(2) = 1;
    # with beta 0.5 and m_0 = 0: m = 1 * Delta = 0.1, x = 0 - 0.1
    s = FedExP()
    x = s.aggregate_fit(0, _fed(_t(0.0)), [_upd("a", 1, _t(-1.0)), _upd("b", 1, _t(0.8))]).global_state["w"]
    assert s.last_eta == 1.0 and x.item() == pytest.approx(-0.1, abs=1e-7)


def test_the_default_is_fedexp_and_fedavgm_stays_available_by_flag(tmp_path):
    assert DEFAULT_AGGREGATION == "fedexp"
    s = make_strategy(DEFAULT_AGGREGATION)
    assert isinstance(s, FedExP) and s.beta == FEDEXP_BETA == 0.5 and s.settings.lr is None
    old = make_strategy("fedavgm")
    assert isinstance(old, FedAvgM) and (old.eta, old.beta) == (FEDAVGM_ETA, FEDAVGM_BETA) == (3.0, 0.5)
    assert CoordinatorConfig(run_dir=tmp_path).aggregation == "fedexp"
    cfg = config_from_args(build_parser().parse_args(["--aggregation", "fedavgm", "--server-eps", "0.01"]), run_dir=tmp_path)
    assert cfg.aggregation == "fedavgm" and cfg.strategies.server_opt.eps == 0.01
