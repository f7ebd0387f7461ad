"""Server optimisers (Reddi et al., ICLR 2021, Algorithm 2): hand-computed steps, FedAvg as a special case, state across restarts."""

from __future__ import annotations

import math

import pytest
import torch
from support.server_step_support import federation as _fed
from support.server_step_support import tensor as _t
from support.server_step_support import update as _upd

from coordinator.cli import build_parser, config_from_args
from coordinator.config import AGGREGATIONS, CoordinatorConfig
from coordinator.server_opt import adaptive_step, fedavgm_step, pseudo_gradient
from coordinator.strategies import FedAvg, make_strategy
from coordinator.strategies.fedavgm import FedAvgM
from coordinator.strategies.fedopt import FedOpt, ServerOptSettings


def test_pseudo_gradient_is_the_model_minus_the_mean():
    d = pseudo_gradient({"w": _t(1.0, 2.0)}, {"w": _t(0.5, 3.0)})
    assert d["w"].tolist() == [0.5, -1.0]
    with pytest.raises(ValueError, match="shape"):
        pseudo_gradient({"w": _t(1.0, 2.0)}, {"w": _t(1.0)})


def test_fedavgm_two_rounds_by_hand():
    # round 1: Delta = [0.5, -1], m = Delta, x = x_t - m = [0.5, 3] (the mean itself)
    x1, m1 = fedavgm_step({"w": _t(1.0, 2.0)}, {"w": _t(0.5, -1.0)}, None, eta=1.0, beta=0.9)
    assert x1["w"].tolist() == [0.5, 3.0] and m1["w"].tolist() == [0.5, -1.0]
    # round 2: mean [0.3, 3.2] -> Delta = [0.2, -0.2]; m = 0.9 [0.5, -1] + [0.2, -0.2] = [0.65, -1.1]; x = [-0.15, 4.1]
    d2 = pseudo_gradient(x1, {"w": _t(0.3, 3.2)})
    x2, m2 = fedavgm_step(x1, d2, m1, eta=1.0, beta=0.9)
    assert m2["w"].tolist() == pytest.approx([0.65, -1.1], abs=1e-6)
    assert x2["w"].tolist() == pytest.approx([-0.15, 4.1], abs=1e-6)


def test_fedadam_and_fedyogi_first_step_by_hand():
    # Delta = 0.5, m0 = 0, v0 = tau^2 = 1e-6: m = 0.1 * 0.5 = 0.05
    # Adam: v = 0.99e-6 + 0.01 * 0.25 = 0.00250099;  Yogi: v = 1e-6 - 0.01 * 0.25 * sign(1e-6 - 0.25) = 0.002501
    x, d = {"w": _t(1.0)}, {"w": _t(0.5)}
    xa, ma, va = adaptive_step(x, d, None, None, eta=0.01, rule="adam")
    xy, my, vy = adaptive_step(x, d, None, None, eta=0.01, rule="yogi")
    assert ma["w"].item() == pytest.approx(0.05) and my["w"].item() == pytest.approx(0.05)
    assert va["w"].item() == pytest.approx(0.00250099, rel=1e-6)
    assert vy["w"].item() == pytest.approx(0.002501, rel=1e-6)
    assert xa["w"].item() == pytest.approx(1.0 - 0.01 * 0.05 / (math.sqrt(0.00250099) + 1e-3), rel=1e-6)
    assert xy["w"].item() == pytest.approx(1.0 - 0.01 * 0.05 / (math.sqrt(0.002501) + 1e-3), rel=1e-6)
    # Yogi's v differs from Adam's once Delta^2 < v: second step with Delta = 0 -> Adam decays v, Yogi adds (1-b2)*0
    _, _, va2 = adaptive_step(xa, {"w": _t(0.0)}, ma, va, eta=0.01, rule="adam")
    _, _, vy2 = adaptive_step(xy, {"w": _t(0.0)}, my, vy, eta=0.01, rule="yogi")
    assert va2["w"].item() == pytest.approx(0.99 * 0.00250099, rel=1e-6) and vy2["w"].item() == pytest.approx(0.002501, rel=1e-6)
    with pytest.raises(ValueError, match="rule must be"):
        adaptive_step(x, d, None, None, eta=0.01, rule="sgd")


def test_fedavgm_without_momentum_at_eta_one_is_fedavg():
    x_t = {"w": _t(1.0, -1.0, 0.0)}
    ups = [_upd("a", 10, _t(0.0, 1.0, 2.0)), _upd("b", 30, _t(4.0, 1.0, -2.0))]
    avg = FedAvg().aggregate_fit(0, _fed(x_t["w"]), ups).global_state
    opt = FedAvgM(ServerOptSettings(lr=1.0, momentum=0.0))
    for _ in range(2):  # twice: no momentum carries over
        got = opt.aggregate_fit(0, _fed(x_t["w"]), ups).global_state
        assert torch.allclose(got["w"], avg["w"]) and got["w"].tolist() == pytest.approx([3.0, 1.0, -1.0])


def test_moments_survive_a_restart_and_follow_growth():
    ups1 = [_upd("a", 1, _t(0.5, 3.0))]
    ups2 = [_upd("a", 1, _t(0.3, 3.2))]
    for name in ("fedavgm", "fedadam", "fedyogi"):
        straight = make_strategy(name)
        x1 = straight.aggregate_fit(0, _fed(_t(1.0, 2.0)), ups1).global_state
        x2 = straight.aggregate_fit(1, _fed(x1["w"]), ups2).global_state
        first = make_strategy(name)
        first.aggregate_fit(0, _fed(_t(1.0, 2.0)), ups1)
        saved = first.state_dict()
        assert set(saved) == ({"m.w"} if name == "fedavgm" else {"m.w", "v.w"})
        restarted = make_strategy(name)
        restarted.load_state_dict(saved)
        assert torch.equal(restarted.aggregate_fit(1, _fed(x1["w"]), ups2).global_state["w"], x2["w"])
    # FedDist appended a unit: the momentum of the new entry starts at 0. By hand with the default beta = 0.5:
    # m1 = delta1 = (1 - 0.5, 2 - 3) = (0.5, -1); delta2 = (0.2, -0.2, 0); m2 = 0.5 m1 + delta2 = (0.45, -0.7, 0).
    grown = make_strategy("fedavgm")
    grown.aggregate_fit(0, _fed(_t(1.0, 2.0)), ups1)
    grown.aggregate_fit(1, _fed(_t(0.5, 3.0, 7.0)), [_upd("a", 1, _t(0.3, 3.2, 7.0))])
    assert isinstance(grown, FedOpt) and grown.m is not None and grown.m["w"].tolist() == pytest.approx([0.45, -0.7, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="unexpected state keys"):
        grown.load_state_dict({"w": _t(1.0)})


def test_registry_and_settings_know_the_server_optimisers():
    for name in ("fedavgm", "fedadam", "fedyogi"):
        assert name in AGGREGATIONS
        s = make_strategy(name)
        assert isinstance(s, FedOpt) and s.name == name
        CoordinatorConfig(run_dir=".", aggregation=name)
    assert make_strategy("fedadam", ServerOptSettings(lr=0.1)).eta == 0.1
    eta_beta = {n: (s.eta, s.beta) for n in ("fedavgm", "fedadam", "fedyogi") if isinstance(s := make_strategy(n), FedOpt)}
    assert eta_beta == {"fedavgm": (3.0, 0.5), "fedadam": (0.01, 0.9), "fedyogi": (0.01, 0.9)}


def test_the_server_flags_fill_the_server_opt_table(tmp_path):
    args = build_parser().parse_args(["--aggregation", "fedyogi", "--server-lr", "0.03", "--server-momentum", "0.8",
                                      "--server-beta2", "0.9", "--server-tau", "0.01"])
    cfg = config_from_args(args, run_dir=tmp_path)
    assert cfg.strategies.server_opt == ServerOptSettings(lr=0.03, momentum=0.8, beta2=0.9, tau=0.01)
    opt = make_strategy(cfg.aggregation, cfg)
    assert isinstance(opt, FedOpt) and (opt.eta, opt.beta, opt.beta2, opt.tau) == (0.03, 0.8, 0.9, 0.01)
    for bad, named in (("--server-lr=0", "lr (--server-lr) must be > 0"), ("--server-momentum=1", "momentum"),
                       ("--server-tau=0", "tau > 0")):
        with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
            config_from_args(build_parser().parse_args([bad]), run_dir=tmp_path)


def test_a_diverged_step_is_refused_and_leaves_the_moments_alone():
    opt = make_strategy("fedavgm")
    opt.aggregate_fit(0, _fed(_t(1.0, 2.0)), [_upd("a", 1, _t(0.5, 3.0))])
    before = opt.state_dict()
    with pytest.raises(ValueError, match="non-finite"):
        opt.aggregate_fit(1, _fed(_t(0.5, 3.0)), [_upd("a", 1, _t(float("inf"), 3.0))])
    assert all(torch.equal(before[k], v) for k, v in opt.state_dict().items())
