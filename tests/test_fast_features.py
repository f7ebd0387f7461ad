"""The torch backend's inference shortcuts for FedALA: the same numbers as the model's own forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_client.backends.torch_eager import TorchBackend, fast_features
from har_models.nn.model import ArchSpec, build_model, init_state

SMALL = ArchSpec(n_classes=6, conv_filters=6, dense_units=16)


def _x(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(n, 6, 128)) * 3).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [SMALL, ArchSpec(n_classes=6)], ids=["small", "paper"])
@pytest.mark.parametrize("chunk", [1, 16, 50])
def test_fast_features_equal_the_models_features_batch_for_batch(spec: ArchSpec, chunk: int) -> None:
    model = build_model(spec, init_state(spec, 3))
    x = torch.from_numpy(_x(50))
    with torch.no_grad():
        want = torch.cat([model.features(x[lo : lo + chunk]) for lo in range(0, 50, chunk)])
    got = fast_features(model, x, chunk)
    assert got.shape == (50, spec.dense_units) and (got >= 0).all()
    # Same operations on the same numbers (the convolution's layout and the pool's form differ): bit for bit here;
    # the tolerance only leaves room for another CPU's kernels.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.equal(fast_features(model, x[:0], chunk), torch.empty((0, spec.dense_units)))


def test_evaluate_pair_equals_two_evaluations_and_leaves_the_model_alone() -> None:
    received = {k: v.numpy() for k, v in init_state(SMALL, 1).items()}
    rng = np.random.default_rng(5)
    head = {"out.weight": (received["out.weight"] + rng.normal(size=received["out.weight"].shape)).astype(np.float32),
            "out.bias": rng.normal(size=6).astype(np.float32)}  # fmt: skip
    x, y = _x(700, 2), np.arange(700) % 6  # more than one eval_batch of 512
    backend = TorchBackend(SMALL, received)
    pair = backend.evaluate_pair(x, y, head)
    assert pair is not None
    want_received = TorchBackend(SMALL, received).evaluate(x, y)
    want_initial = TorchBackend(SMALL, {**received, **head}).evaluate(x, y)
    assert np.array_equal(pair[0].confusion, want_received.confusion) and pair[0].confusion.sum() == 700
    assert np.array_equal(pair[1].confusion, want_initial.confusion)
    assert not np.array_equal(pair[0].confusion, pair[1].confusion)  # the two heads do predict differently
    assert pair[0].loss == pytest.approx(want_received.loss, rel=1e-6) and pair[1].loss == pytest.approx(want_initial.loss, rel=1e-6)
    assert all(np.array_equal(v, received[k]) for k, v in backend.get_weights().items())
    # Only the output layer may be swapped; one of its tensors alone is fine.
    assert backend.evaluate_pair(x, y, {"hidden.bias": received["hidden.bias"]}) is None
    only_bias = backend.evaluate_pair(x, y, {"out.bias": head["out.bias"]})
    assert only_bias is not None
    assert np.array_equal(only_bias[1].confusion, TorchBackend(SMALL, {**received, "out.bias": head["out.bias"]}).evaluate(x, y).confusion)


def test_learn_ala_reads_the_received_model_in_place_and_never_writes_it() -> None:
    # The temporary model of W's learning holds the received lower tensors themselves (no copy): they must come out
    # unchanged, and the blended model must still take them as they were.
    from har_models.settings import AlaConfig

    received = {k: v.numpy() for k, v in init_state(SMALL, 1).items()}
    local = {k: (v + 0.05).astype(np.float32) for k, v in received.items()}
    before = {k: v.copy() for k, v in received.items()}
    w = {h: np.full(received[h].shape, 0.5, np.float32) for h in ("out.weight", "out.bias")}
    x, y = _x(60, 4), np.arange(60) % 6
    res = TorchBackend(SMALL).learn_ala(received, local, w, x, y, config=AlaConfig(max_passes=3), batch_size=16, seed=2,
                                        start_phase=True)  # fmt: skip
    assert res.fallback is None and len(res.losses) >= 1
    assert all(np.array_equal(received[k], before[k]) for k in received)
    assert all(np.array_equal(res.state[k], before[k]) for k in ("conv.weight", "conv.bias", "hidden.weight", "hidden.bias"))
    assert not np.array_equal(res.weights["out.weight"], w["out.weight"])  # W was learned (written into copies)
