"""FedALA Adaptive Local Aggregation (edge_client.ala): edge cases and the W gradient."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from edge_client.ala import AlaConfig, AlaState, adaptive_local_aggregation, blend, higher_tensors
from har_models.nn.growth import append_units, pad_state_like
from har_models.nn.model import PARAM_NAMES, ArchSpec, build_model

SPEC = ArchSpec(n_classes=3, conv_filters=4, dense_units=8)
CLASS_WEIGHTS = torch.tensor([1.0, 2.0, 0.5])


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Class-weighted cross-entropy, as the local trainer uses (mean of weighted per-sample losses)."""
    return (torch.nn.functional.cross_entropy(logits, y, reduction="none") * CLASS_WEIGHTS.to(logits.dtype)[y]).mean()


def random_state(spec: ArchSpec, seed: int, scale: float = 0.2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in spec.shapes().items()}


def data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, 128, generator=g), torch.randint(0, 3, (n,), generator=g)


def run(
    received: dict[str, torch.Tensor],
    local: dict[str, torch.Tensor] | None,
    ala: AlaState,
    n: int = 24,
    spec: ArchSpec = SPEC,
    batch_size: int = 8,
    **cfg: object,
):
    x, y = data(n)
    cfg.setdefault("max_passes", 3)  # keeps the suite fast; the cap itself is tested separately
    return adaptive_local_aggregation(
        received, local, ala, x, y,
        build=functools.partial(build_model, spec), loss_fn=loss_fn, batch_size=batch_size, seed=7,
        config=AlaConfig(**cfg),  # type: ignore[arg-type]
        context="client t round 1",
    )


RECEIVED = random_state(SPEC, 1)
LOCAL = random_state(SPEC, 2)
RETURNING = AlaState(None, start_phase=True, has_local_model=True)


def test_first_participation_returns_received_model_and_w_ones() -> None:
    res = run(RECEIVED, None, AlaState())
    assert res.fallback == "first participation"
    assert all(torch.equal(res.state[n], RECEIVED[n]) for n in PARAM_NAMES)
    assert res.ala.has_local_model and res.ala.start_phase
    assert res.ala.weights is not None and set(res.ala.weights) == {"out.weight", "out.bias"}
    assert all(torch.all(w == 1.0) for w in res.ala.weights.values())


def test_forty_windows_batch_64_still_learns_w() -> None:
    calls: list[int] = []

    def counting_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(len(y))
        return loss_fn(logits, y)

    x, y = data(40)
    res = adaptive_local_aggregation(
        RECEIVED, LOCAL, RETURNING, x, y, build=functools.partial(build_model, SPEC), loss_fn=counting_loss,
        batch_size=64, seed=3, config=AlaConfig(max_passes=5),
    )
    assert res.n_sample == 32  # floor(0.8 * 40)
    assert res.passes >= 1 and calls == [32] * res.passes  # one partial batch per pass, kept
    assert res.ala.weights is not None
    assert any(not torch.all(w == 1.0) for w in res.ala.weights.values())
    assert not res.ala.start_phase


def test_empty_sample_falls_back_to_received_model(caplog: pytest.LogCaptureFixture) -> None:
    for n in (0, 1):  # floor(0.8 * 1) = 0
        with caplog.at_level(logging.WARNING, logger="edge_client.ala"):
            res = run(RECEIVED, LOCAL, RETURNING, n=n)
        assert res.fallback == "empty sample" and res.passes == 0
        assert all(torch.equal(res.state[k], RECEIVED[k]) for k in PARAM_NAMES)
        assert "0-window sample" in caplog.text and "client t round 1" in caplog.text
        caplog.clear()


def test_first_ala_round_that_never_settles_stops_at_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    def noisy_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits, y) + 10.0 * torch.rand(())  # a constant offset: same gradient, never settles

    x, y = data(24)
    with caplog.at_level(logging.WARNING, logger="edge_client.ala"):
        res = adaptive_local_aggregation(
            RECEIVED, LOCAL, RETURNING, x, y, build=functools.partial(build_model, SPEC), loss_fn=noisy_loss,
            batch_size=8, seed=1, config=AlaConfig(max_passes=6, num_pre_loss=3, threshold=0.1),
        )
    assert res.passes == 6 and not res.converged
    assert "pass cap" in caplog.text
    assert not res.ala.start_phase
    # Outside the start phase: exactly one pass.
    again = adaptive_local_aggregation(
        RECEIVED, res.state, res.ala, x, y, build=functools.partial(build_model, SPEC), loss_fn=noisy_loss,
        batch_size=8, seed=2, config=AlaConfig(max_passes=6),
    )
    assert again.passes == 1


def test_first_ala_round_stops_when_losses_settle() -> None:
    res = run(RECEIVED, LOCAL, RETURNING, mode="eval", threshold=10.0, num_pre_loss=3, max_passes=50)
    assert res.converged and res.passes == 4  # the stop test needs M + 1 passes


def test_eta_zero_returns_received_model_on_top_layers() -> None:
    res = run(RECEIVED, LOCAL, RETURNING, eta=0.0)
    assert all(torch.equal(res.state[k], RECEIVED[k]) for k in PARAM_NAMES)


@pytest.mark.parametrize("layer_idx", [2, 4, 0])
def test_p_covers_exactly_the_intended_tensors(layer_idx: int) -> None:
    res = run(RECEIVED, LOCAL, RETURNING, layer_idx=layer_idx, eta=5.0)
    top = PARAM_NAMES[len(PARAM_NAMES) - layer_idx :] if layer_idx else PARAM_NAMES
    assert res.higher == top
    assert res.ala.weights is not None and set(res.ala.weights) == set(top)
    for name in PARAM_NAMES:
        if name in top:
            w = res.ala.weights[name]
            want = LOCAL[name] + (RECEIVED[name] - LOCAL[name]) * w
            torch.testing.assert_close(res.state[name], want)
        else:
            assert torch.equal(res.state[name], RECEIVED[name]), name
    assert not torch.equal(res.state["out.weight"], RECEIVED["out.weight"])  # W was learned on the top tensors


def test_w_stays_in_unit_interval() -> None:
    res = run(RECEIVED, LOCAL, RETURNING, eta=1e4)
    assert res.ala.weights is not None
    allw = torch.cat([w.reshape(-1) for w in res.ala.weights.values()])
    assert allw.min() == 0.0 and allw.max() == 1.0  # the clip is active at both ends


def test_padding_after_growth_takes_received_values_in_new_slots() -> None:
    local_w = {"out.weight": torch.full((3, 8), 0.5), "out.bias": torch.full((3,), 0.5)}
    src = random_state(SPEC, 9)
    wide_received, wide = append_units(RECEIVED, SPEC, conv=[(src, 1)], dense=[(src, 3), (src, 4)], mode="paper")
    # (received - padded local) is zero in the new slots.
    padded = pad_state_like(LOCAL, wide_received)
    assert torch.count_nonzero((wide_received["out.weight"] - padded["out.weight"])[:, 8:]) == 0
    assert torch.count_nonzero((wide_received["hidden.weight"] - padded["hidden.weight"])[8:]) == 0
    assert torch.count_nonzero((wide_received["hidden.weight"] - padded["hidden.weight"])[:, 4 * 32 :]) == 0
    res = run(wide_received, LOCAL, AlaState(local_w, start_phase=False, has_local_model=True), spec=wide, eta=5.0)
    assert res.ala.weights is not None
    assert res.ala.weights["out.weight"].shape == (3, 10)
    assert torch.all(res.ala.weights["out.weight"][:, 8:] == 1.0)  # W pads with 1 and (theta - theta_i) = 0 there
    assert torch.equal(res.state["out.weight"][:, 8:], wide_received["out.weight"][:, 8:])
    assert torch.equal(res.state["hidden.weight"], wide_received["hidden.weight"])
    with pytest.raises(ValueError, match="wider than the target"):
        run(RECEIVED, padded, RETURNING)


def test_one_w_update_matches_finite_difference_gradient() -> None:
    """W1 = W0 - eta * dL/dW0 with no clipping; dL/dW by central differences in float64."""
    n, eta = 16, 0.05
    w0 = {"out.weight": torch.full((3, 8), 0.5), "out.bias": torch.full((3,), 0.5)}
    x, y = data(n, seed=4)
    res = adaptive_local_aggregation(
        RECEIVED, LOCAL, AlaState(w0, start_phase=False, has_local_model=True), x, y,
        build=functools.partial(build_model, SPEC), loss_fn=loss_fn, batch_size=n, seed=0,
        config=AlaConfig(eta=eta, rand_percent=100, mode="eval"),
    )
    assert res.passes == 1
    w1 = res.ala.weights
    assert w1 is not None
    for w in w1.values():
        assert (w > 0).all() and (w < 1).all()  # clipping inactive

    def loss_at(w: dict[str, torch.Tensor]) -> float:
        # theta_i + (theta - theta_i) * W on the top tensors, theta below, all in float64.
        state = {k: RECEIVED[k].double() for k in PARAM_NAMES}
        for k, wk in w.items():
            state[k] = LOCAL[k].double() + (RECEIVED[k].double() - LOCAL[k].double()) * wk
        model = build_model(SPEC).double().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(state[name].double())
            return float(loss_fn(model(x.double()), y))

    h = 1e-5
    base = {k: v.double() for k, v in w0.items()}
    g = torch.Generator().manual_seed(0)
    entries: list[tuple[str, tuple[int, ...]]] = [("out.bias", (i,)) for i in range(3)]
    entries += [("out.weight", (int(torch.randint(0, 3, (), generator=g)), int(torch.randint(0, 8, (), generator=g))))
                for _ in range(8)]
    for name, idx in entries:
        plus = {k: v.clone() for k, v in base.items()}
        minus = {k: v.clone() for k, v in base.items()}
        plus[name][idx] += h
        minus[name][idx] -= h
        numeric = (loss_at(plus) - loss_at(minus)) / (2 * h)
        analytic = float(w0[name][idx] - w1[name][idx]) / eta
        assert analytic == pytest.approx(numeric, rel=2e-3, abs=2e-5), (name, idx)


def test_same_seed_same_result_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = run(RECEIVED, LOCAL, RETURNING)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = run(RECEIVED, LOCAL, RETURNING)
    assert a.passes == b.passes
    assert all(torch.equal(a.state[k], b.state[k]) for k in PARAM_NAMES)


def test_ala_state_round_trip_and_validation() -> None:
    res = run(RECEIVED, LOCAL, RETURNING)
    tensors, flags = res.ala.to_parts()
    assert flags == {"start_phase": False, "has_local_model": True}
    back = AlaState.from_parts(tensors, flags)
    assert back.weights is not None and res.ala.weights is not None
    assert all(torch.equal(back.weights[k], res.ala.weights[k]) for k in res.ala.weights)
    assert AlaState.from_parts({}, {"start_phase": True, "has_local_model": False}) == AlaState()
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        AlaState.from_parts({"out.bias": torch.tensor([1.5])}, flags)
    with pytest.raises(ValueError, match="start_phase"):
        AlaState.from_parts({}, {"has_local_model": True})


def test_validation_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="local is None"):
        run(RECEIVED, None, RETURNING)
    with pytest.raises(ValueError, match="batch_size"):
        run(RECEIVED, LOCAL, RETURNING, batch_size=0)
    with pytest.raises(ValueError, match="rand_percent"):
        AlaConfig(rand_percent=0)
    with pytest.raises(ValueError, match="layer_idx=7 exceeds"):
        higher_tensors(list(PARAM_NAMES), 7)


def test_blend_is_exact_at_both_ends() -> None:
    w = {"out.bias": torch.tensor([1.0, 0.0, 0.25])}
    out = blend(LOCAL, RECEIVED, w)
    assert out["out.bias"][0] == RECEIVED["out.bias"][0] and out["out.bias"][1] == LOCAL["out.bias"][1]
    torch.testing.assert_close(out["out.bias"][2], 0.75 * LOCAL["out.bias"][2] + 0.25 * RECEIVED["out.bias"][2])
    assert torch.equal(out["conv.weight"], RECEIVED["conv.weight"])


class _Unsplit(torch.nn.Module):
    """The same CNN, parameters and names, but not a HarCNN: ALA runs the whole model every batch (no cached features)."""

    def __init__(self, spec: ArchSpec, state: dict[str, torch.Tensor]):
        super().__init__()
        inner = build_model(spec, state)
        self.conv, self.hidden, self.out = inner.conv, inner.hidden, inner.out
        self.inner = [inner]  # a list: not registered again, its parameters are the ones above

    def train(self, mode: bool = True) -> _Unsplit:
        self.inner[0].train(mode)
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner[0](x)


def _counting(build, calls: list[int]):
    """``build`` whose models count their convolution's forward calls (PyTorch's forward hooks) into ``calls``."""

    def make(state):
        model = build(state)
        model.conv.register_forward_hook(lambda *_: calls.append(1))
        return model

    return make


@pytest.mark.parametrize("start_phase", [True, False])
def test_cached_features_give_the_same_result_as_the_whole_model(start_phase: bool) -> None:
    x, y = data(40)  # sample of 32 = 4 batches of 8
    cfg = AlaConfig(max_passes=5, threshold=0.0, mode="train")  # dropout on; 5 passes in the start phase
    state = AlaState({"out.weight": torch.full((3, 8), 0.7), "out.bias": torch.full((3,), 0.4)}, start_phase, True)
    out = {}
    for name, build in (("cached", functools.partial(build_model, SPEC)), ("whole", functools.partial(_Unsplit, SPEC))):
        calls: list[int] = []
        out[name] = adaptive_local_aggregation(
            RECEIVED, LOCAL, state, x, y, build=_counting(build, calls), loss_fn=loss_fn, batch_size=8, seed=11, config=cfg
        )
        out[name + " conv calls"] = len(calls)  # type: ignore[assignment]
    passes = 5 if start_phase else 1
    assert out["cached"].passes == out["whole"].passes == passes
    # The lower layers ran once over the sample instead of once per pass.
    assert out["cached conv calls"] == 4 and out["whole conv calls"] == 4 * passes
    torch.testing.assert_close(torch.tensor(out["cached"].losses), torch.tensor(out["whole"].losses), rtol=1e-5, atol=1e-6)
    for k in RECEIVED:
        torch.testing.assert_close(out["cached"].state[k], out["whole"].state[k], rtol=1e-5, atol=1e-6, msg=k)
    cached_w, whole_w = out["cached"].ala.weights, out["whole"].ala.weights
    assert cached_w is not None and whole_w is not None and state.weights is not None  # both runs learned W
    for k in ("out.weight", "out.bias"):
        torch.testing.assert_close(cached_w[k], whole_w[k], rtol=1e-5, atol=1e-6, msg=k)
    assert not torch.equal(cached_w["out.weight"], state.weights["out.weight"])  # W did move


def test_blending_below_the_head_runs_the_whole_model() -> None:
    calls: list[int] = []
    x, y = data(40)
    res = adaptive_local_aggregation(
        RECEIVED, LOCAL, RETURNING, x, y, build=_counting(functools.partial(build_model, SPEC), calls), loss_fn=loss_fn,
        batch_size=8, seed=11, config=AlaConfig(layer_idx=4, max_passes=3, threshold=0.0),
    )
    assert res.passes == 3 and len(calls) == 3 * 4  # hidden.* blended: its input is not fixed, so no cache
