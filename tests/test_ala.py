"""FedALA Adaptive Local Aggregation (edge_client.ala): the driver's edge cases, the W gradient, and its kernels against each other."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from edge_client.ala import AlaConfig, AlaState, adaptive_local_aggregation, blend, higher_tensors, learn_ala_weights, lerp, pad_like
from edge_client.backends.numpy_ref import NumpyBackend
from edge_client.backends.torch_eager import TorchBackend
from har_models.nn.growth import append_units
from har_models.nn.model import PARAM_NAMES, ArchSpec, build_model

SPEC = ArchSpec(n_classes=3, conv_filters=4, dense_units=8)
CLASS_WEIGHTS = np.array([1.0, 2.0, 0.5], np.float32)


def random_state(spec: ArchSpec, seed: int, scale: float = 0.2) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(s, generator=g) * scale).numpy() for n, s in spec.shapes().items()}


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, 128, generator=g).numpy(), torch.randint(0, 3, (n,), generator=g).numpy()


def run(
    received: dict[str, np.ndarray],
    local: dict[str, np.ndarray] | None,
    ala: AlaState,
    n: int = 24,
    spec: ArchSpec = SPEC,
    batch_size: int = 8,
    backend: str = "torch",
    seed: int = 7,
    **cfg: object,
):
    x, y = data(n)
    cfg.setdefault("max_passes", 3)  # keeps the suite fast; the cap itself is tested separately
    impl = TorchBackend(spec, received) if backend == "torch" else NumpyBackend(spec, received)
    return adaptive_local_aggregation(
        impl, received, local, ala, x, y, batch_size=batch_size, seed=seed,
        config=AlaConfig(**cfg),  # type: ignore[arg-type]
        class_weights=CLASS_WEIGHTS, context="client t round 1",
    )  # fmt: skip


RECEIVED = random_state(SPEC, 1)
LOCAL = random_state(SPEC, 2)
RETURNING = AlaState(None, start_phase=True, has_local_model=True)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_first_participation_returns_received_model_and_w_ones(backend: str) -> None:
    res = run(RECEIVED, None, AlaState(), backend=backend)
    assert res.fallback == "first participation"
    assert all(np.array_equal(res.state[n], RECEIVED[n]) for n in PARAM_NAMES)
    assert res.ala.has_local_model and res.ala.start_phase
    assert res.ala.weights is not None and set(res.ala.weights) == {"out.weight", "out.bias"}
    assert all(np.all(w == 1.0) for w in res.ala.weights.values())


def test_forty_windows_batch_64_still_learns_w() -> None:
    res = run(RECEIVED, LOCAL, RETURNING, n=40, batch_size=64, seed=3, max_passes=5)
    assert res.n_sample == 32  # floor(0.8 * 40): one partial batch per pass, kept
    assert 1 <= res.passes <= 5 and len(res.losses) == res.passes
    assert res.ala.weights is not None
    assert any(not np.all(w == 1.0) for w in res.ala.weights.values())
    assert not res.ala.start_phase


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_empty_sample_falls_back_to_received_model(backend: str, caplog: pytest.LogCaptureFixture) -> None:
    w = {"out.weight": np.full((3, 8), 0.5, np.float32), "out.bias": np.full(3, 0.5, np.float32)}
    for n in (0, 1):  # floor(0.8 * 1) = 0
        with caplog.at_level(logging.WARNING, logger="edge_client.ala"):
            res = run(RECEIVED, LOCAL, AlaState(w, True, True), n=n, backend=backend)
        assert res.fallback == "empty sample" and res.passes == 0
        assert all(np.array_equal(res.state[k], RECEIVED[k]) for k in PARAM_NAMES)
        assert res.ala.start_phase and res.ala.weights is not None  # W and the phase are kept for the next round
        assert all(np.array_equal(res.ala.weights[k], w[k]) for k in w)
        assert "0-window sample" in caplog.text and "client t round 1" in caplog.text
        caplog.clear()


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_first_ala_round_that_never_settles_stops_at_the_cap(backend: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edge_client.ala"):
        res = run(RECEIVED, LOCAL, RETURNING, backend=backend, max_passes=6, num_pre_loss=3, threshold=0.0)  # std < 0 never holds
    assert res.passes == 6 and not res.converged
    assert "pass cap" in caplog.text
    assert not res.ala.start_phase
    # Outside the start phase: exactly one pass.
    again = run(RECEIVED, res.state, res.ala, backend=backend, seed=2, max_passes=6)
    assert again.passes == 1


def test_first_ala_round_stops_when_losses_settle() -> None:
    res = run(RECEIVED, LOCAL, RETURNING, mode="eval", threshold=10.0, num_pre_loss=3, max_passes=50)
    assert res.converged and res.passes == 4  # the stop test needs M + 1 passes


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_eta_zero_blends_with_the_stored_w(backend: str) -> None:
    res = run(RECEIVED, LOCAL, RETURNING, eta=0.0, backend=backend)  # W = 1 (new): the received model
    assert all(np.array_equal(res.state[k], RECEIVED[k]) for k in PARAM_NAMES)
    w = {"out.weight": np.zeros((3, 8), np.float32), "out.bias": np.zeros(3, np.float32)}
    res = run(RECEIVED, LOCAL, AlaState(w, False, True), eta=0.0, backend=backend)  # W = 0: the local head
    assert np.array_equal(res.state["out.weight"], LOCAL["out.weight"])
    assert np.array_equal(res.state["conv.weight"], RECEIVED["conv.weight"])


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
            np.testing.assert_allclose(res.state[name], want, rtol=1e-6, atol=1e-7)
        else:
            assert np.array_equal(res.state[name], RECEIVED[name]), name
    assert not np.array_equal(res.state["out.weight"], RECEIVED["out.weight"])  # W was learned on the top tensors


def test_w_stays_in_unit_interval() -> None:
    res = run(RECEIVED, LOCAL, RETURNING, eta=1e4)
    assert res.ala.weights is not None
    allw = np.concatenate([w.reshape(-1) for w in res.ala.weights.values()])
    assert allw.min() == 0.0 and allw.max() == 1.0  # the clip is active at both ends


def test_padding_after_growth_takes_received_values_in_new_slots() -> None:
    local_w = {"out.weight": np.full((3, 8), 0.5, np.float32), "out.bias": np.full((3,), 0.5, np.float32)}
    src = {k: torch.from_numpy(v) for k, v in random_state(SPEC, 9).items()}
    wide_t, wide = append_units({k: torch.from_numpy(v) for k, v in RECEIVED.items()}, SPEC, conv=[(src, 1)],
                                dense=[(src, 3), (src, 4)], mode="paper")  # fmt: skip
    wide_received = {k: v.numpy() for k, v in wide_t.items()}
    # (received - padded local) is zero in the new slots.
    padded = pad_like(LOCAL, wide_received)
    assert np.count_nonzero((wide_received["out.weight"] - padded["out.weight"])[:, 8:]) == 0
    assert np.count_nonzero((wide_received["hidden.weight"] - padded["hidden.weight"])[8:]) == 0
    assert np.count_nonzero((wide_received["hidden.weight"] - padded["hidden.weight"])[:, 4 * 32 :]) == 0
    res = run(wide_received, LOCAL, AlaState(local_w, start_phase=False, has_local_model=True), spec=wide, eta=5.0)
    assert res.ala.weights is not None
    assert res.ala.weights["out.weight"].shape == (3, 10)
    assert np.all(res.ala.weights["out.weight"][:, 8:] == 1.0)  # W pads with 1 and (theta - theta_i) = 0 there
    assert np.array_equal(res.state["out.weight"][:, 8:], wide_received["out.weight"][:, 8:])
    assert np.array_equal(res.state["hidden.weight"], wide_received["hidden.weight"])
    with pytest.raises(ValueError, match="wider than the target"):
        run(RECEIVED, padded, RETURNING)


def test_pad_like_fills_and_names_the_tensor() -> None:
    got = pad_like({"b": np.array([1.0, 2.0], np.float32)}, {"b": np.array([7.0, 8.0, 9.0], np.float32), "c": np.zeros(1)})
    assert got["b"].tolist() == [1.0, 2.0, 9.0]
    assert pad_like({"b": np.zeros(1, np.float32)}, {"b": np.zeros(3)}, fill=1.0)["b"].tolist() == [0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="'x'"):
        pad_like({"x": np.zeros(1)}, {"y": np.zeros(1)})


def test_one_w_update_matches_finite_difference_gradient() -> None:
    """W1 = W0 - eta * dL/dW0 with no clipping; dL/dW by central differences in float64."""
    n, eta = 16, 0.05
    w0 = {"out.weight": np.full((3, 8), 0.5, np.float32), "out.bias": np.full((3,), 0.5, np.float32)}
    x, y = data(n, seed=4)
    res = adaptive_local_aggregation(
        TorchBackend(SPEC, RECEIVED), RECEIVED, LOCAL, AlaState(w0, start_phase=False, has_local_model=True), x, y,
        batch_size=n, seed=0, config=AlaConfig(eta=eta, rand_percent=100, mode="eval"), class_weights=CLASS_WEIGHTS,
    )  # fmt: skip
    assert res.passes == 1
    w1 = res.ala.weights
    assert w1 is not None
    for w in w1.values():
        assert (w > 0).all() and (w < 1).all()  # clipping inactive
    xt, yt = torch.from_numpy(x).double(), torch.from_numpy(y)

    def loss_at(w: dict[str, np.ndarray]) -> float:
        # theta_i + (theta - theta_i) * W on the top tensors, theta below, all in float64.
        state = {k: RECEIVED[k].astype(np.float64) for k in PARAM_NAMES}
        for k, wk in w.items():
            state[k] = LOCAL[k].astype(np.float64) + (RECEIVED[k].astype(np.float64) - LOCAL[k]) * wk
        model = build_model(SPEC).double().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(state[name]))
            ce = torch.nn.functional.cross_entropy(model(xt), yt, reduction="none")
            return float((ce * torch.from_numpy(CLASS_WEIGHTS).double()[yt]).mean())

    h = 1e-5
    base = {k: v.astype(np.float64) for k, v in w0.items()}
    rng = np.random.default_rng(0)
    entries: list[tuple[str, tuple[int, ...]]] = [("out.bias", (i,)) for i in range(3)]
    entries += [("out.weight", (int(rng.integers(0, 3)), int(rng.integers(0, 8)))) for _ in range(8)]
    for name, idx in entries:
        plus = {k: v.copy() for k, v in base.items()}
        minus = {k: v.copy() for k, v in base.items()}
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
    assert all(np.array_equal(a.state[k], b.state[k]) for k in PARAM_NAMES)


def test_ala_state_round_trip_and_validation() -> None:
    res = run(RECEIVED, LOCAL, RETURNING)
    tensors, flags = res.ala.to_parts()
    assert flags == {"start_phase": False, "has_local_model": True}
    back = AlaState.from_parts(tensors, flags)
    assert back.weights is not None and res.ala.weights is not None
    assert all(np.array_equal(back.weights[k], res.ala.weights[k]) for k in res.ala.weights)
    assert AlaState.from_parts({}, {"start_phase": True, "has_local_model": False}) == AlaState()
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        AlaState.from_parts({"out.bias": np.array([1.5], np.float32)}, flags)
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


def test_blend_is_exact_at_both_ends_and_lerp_is_torchs() -> None:
    w = {"out.bias": np.array([1.0, 0.0, 0.25], np.float32)}
    out = blend(LOCAL, RECEIVED, w)
    assert out["out.bias"][0] == RECEIVED["out.bias"][0] and out["out.bias"][1] == LOCAL["out.bias"][1]
    np.testing.assert_allclose(out["out.bias"][2], 0.75 * LOCAL["out.bias"][2] + 0.25 * RECEIVED["out.bias"][2], rtol=1e-6)
    assert np.array_equal(out["conv.weight"], RECEIVED["conv.weight"])
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=1000).astype(np.float32), rng.normal(size=1000).astype(np.float32)
    ww = rng.random(1000).astype(np.float32)
    np.testing.assert_allclose(lerp(a, b, ww), torch.lerp(*(torch.from_numpy(v) for v in (a, b, ww))).numpy(), rtol=0, atol=1e-6)


# -- the kernels against each other ----------------------------------------------------------------------


@pytest.mark.parametrize("start_phase", [True, False])
@pytest.mark.parametrize("layer_idx", [2, 4])
def test_torch_kernel_equals_the_generic_kernel_over_the_torch_backend(start_phase: bool, layer_idx: int) -> None:
    """The autograd kernel (cached features for p = 2), the generic one over the torch backend (whole model
    per batch) and the generic one over the numpy reference learn the same W, to float32 rounding (dropout off)."""
    x, y = data(40)  # sample of 32 = 4 batches of 8
    cfg = AlaConfig(max_passes=5, threshold=0.0, mode="eval", layer_idx=layer_idx)
    higher = higher_tensors(PARAM_NAMES, layer_idx)
    w = {h: np.full(RECEIVED[h].shape, 0.6, np.float32) for h in higher}
    kw = {"config": cfg, "batch_size": 8, "seed": 11, "start_phase": start_phase, "class_weights": CLASS_WEIGHTS}
    fast = TorchBackend(SPEC, RECEIVED).learn_ala(RECEIVED, LOCAL, w, x, y, **kw)  # type: ignore[arg-type]
    generic = learn_ala_weights(TorchBackend(SPEC, RECEIVED), RECEIVED, LOCAL, w, x, y, **kw)  # type: ignore[arg-type]
    reference = learn_ala_weights(NumpyBackend(SPEC, RECEIVED), RECEIVED, LOCAL, w, x, y, **kw)  # type: ignore[arg-type]
    passes = 5 if start_phase else 1
    assert len(fast.losses) == len(generic.losses) == len(reference.losses) == passes
    assert fast.n_sample == generic.n_sample == 32
    for other in (generic, reference):
        np.testing.assert_allclose(fast.losses, other.losses, rtol=1e-5)
        for k in RECEIVED:
            np.testing.assert_allclose(fast.state[k], other.state[k], rtol=1e-5, atol=1e-6, err_msg=k)
        for k in higher:
            np.testing.assert_allclose(fast.weights[k], other.weights[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert not np.array_equal(fast.weights["out.weight"], w["out.weight"])  # W did move
