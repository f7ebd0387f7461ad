"""The training program's building blocks (har_models/nn/export.py) against PyTorch's own layers, in eager mode.

The exported program's backward is autograd's rule for these operators, so equal values and
gradients here are what the program computes (tests/test_backends.py runs the program itself).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from har_models.nn.arch import ArchSpec
from har_models.nn.export import _pool_max, _relu, _TrainGraph
from har_models.nn.model import build_model, init_state


def test_pool_max_is_max_pool_with_its_gradient_to_the_first_maximum() -> None:
    rng = np.random.default_rng(0)
    v = torch.from_numpy(rng.integers(-2, 3, size=(3, 200, 4)).astype(np.float32))  # many ties, some all equal
    g = torch.from_numpy(rng.normal(size=(3, 200)).astype(np.float32))
    ref = v.clone().requires_grad_(True)
    F.max_pool1d(ref, 4).squeeze(-1).mul(g).sum().backward()
    zs = [v[..., i].clone().requires_grad_(True) for i in range(4)]
    out = _pool_max(zs)
    out.mul(g).sum().backward()
    assert torch.equal(out, v.amax(-1))
    assert ref.grad is not None
    for i, z in enumerate(zs):
        assert z.grad is not None and torch.equal(z.grad, ref.grad[..., i]), f"offset {i}"
    assert int((ref.grad != 0).sum()) == g.numel()  # each window's gradient went to exactly one offset


def test_relu_equals_relu_and_its_gradient() -> None:
    x = torch.tensor([-3.0, -0.0, 0.0, 1e-30, 2.5, -1e-30, 7.0])
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    g = torch.arange(1.0, 8.0)
    ya, yb = _relu(a), F.relu(b)
    assert torch.equal(ya, yb)  # -0.0 == 0.0
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    assert a.grad is not None and b.grad is not None
    assert torch.equal(a.grad, b.grad)
    assert a.grad.tolist() == [0.0, 0.0, 0.0, 4.0, 5.0, 0.0, 7.0]


@pytest.mark.slow
def test_training_graph_computes_harcnn() -> None:
    spec = ArchSpec(n_classes=5, conv_filters=7, dense_units=12, input_mean=(0.5, -0.2, 9.0, 0.0, 0.1, -0.1))
    state = init_state(spec, 3)
    graph, model = _TrainGraph(spec, state), build_model(spec, state).eval()
    rng = np.random.default_rng(1)
    for b in (1, 5, 32):
        x = torch.from_numpy((rng.normal(size=(b, 6, spec.window)) * 3).astype(np.float32))
        y = torch.from_numpy(rng.integers(0, spec.n_classes, b))
        loss, logits = graph(x, y, torch.ones(b), torch.ones(b, spec.dense_units))
        want = model(x)
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss, F.cross_entropy(want, y), rtol=1e-5, atol=1e-6)
