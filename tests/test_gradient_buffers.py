"""Local training keeps its gradient buffers across steps and computes the same weights, bit for bit.

``train_local`` and the torch backend clear gradients with ``zero_grad(set_to_none=False)``:
each parameter's ``.grad`` tensor is allocated at the first step and zeroed in place at the
next ones, instead of being dropped and allocated again at every step (24 MB a step for the
paper CNN's hidden layer). Adding a step's gradient to a zeroed buffer gives that gradient
exactly (0 + g = g in IEEE 754), so the weights must equal those of the loop that drops the
buffers, to the last bit. The reference below is that loop, written out here as it stood
before (``zero_grad(set_to_none=True)``), with the same seeds, batches, loss and SGD.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_client.backends import train
from edge_client.backends.torch_eager import TorchBackend
from har_models.data.labels import LabelSet, balanced_class_weights
from har_models.data.windowing import WindowSet
from har_models.nn.model import PARAM_NAMES, ArchSpec, build_model, get_state, init_state
from har_models.nn.training import TrainConfig, make_loss, train_local

SMALL = ArchSpec(n_classes=4, conv_filters=8, dense_units=16)
PAPER = ArchSpec(n_classes=6)  # F=196, H=1024: the main job's CNN (6,448,714 parameters)
LABELS = LabelSet("t", tuple("abcdef"))


def _windows(spec: ArchSpec, n: int, seed: int = 0) -> WindowSet:
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 6, spec.window)) * 3).astype(np.float32)
    y = rng.integers(0, spec.n_classes, n).astype(np.int64)
    return WindowSet(x, y, LabelSet("t", LABELS.names[: spec.n_classes]))


def _train_dropping_buffers(
    spec: ArchSpec, state: dict[str, torch.Tensor], data: WindowSet, cfg: TrainConfig, cw: np.ndarray | None,
    prox_ref: dict[str, torch.Tensor] | None,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``train_local``'s loop with the gradients set to None before every step (a fresh buffer per step)."""
    model = build_model(spec, state)
    model.train()
    params = [(n, p) for n, p in model.named_parameters() if n not in cfg.frozen]
    for n, p in model.named_parameters():
        p.requires_grad_(n not in cfg.frozen)
    opt = torch.optim.SGD([p for _, p in params], lr=cfg.lr, momentum=0.0)
    loss_fn = make_loss(cw)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    losses = []
    for _ in range(cfg.epochs):
        order = torch.randperm(len(data), generator=gen)
        total = 0.0
        for s in range(0, len(data), cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            if cfg.prox_mu > 0 and prox_ref is not None:
                loss = loss + 0.5 * cfg.prox_mu * sum(((p - prox_ref[n]) ** 2).sum() for n, p in params)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(data))
    return get_state(model), losses


CASES = [
    pytest.param(SMALL, 71, TrainConfig(epochs=3, lr=0.05, batch_size=32, seed=11), id="small-3-epochs"),
    pytest.param(SMALL, 71, TrainConfig(epochs=2, lr=0.05, batch_size=16, prox_mu=0.1, frozen=("conv.weight", "conv.bias"), seed=5),
                 id="small-fedprox-frozen"),
    pytest.param(PAPER, 100, TrainConfig(epochs=1, lr=0.01, batch_size=32, seed=7), id="paper-cnn-4-steps", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("spec", "n", "cfg"), CASES)
def test_train_local_equals_the_loop_that_drops_its_buffers(spec: ArchSpec, n: int, cfg: TrainConfig) -> None:
    data = _windows(spec, n)
    cw = balanced_class_weights(data.y, spec.n_classes)
    state, ref = init_state(spec, 1), init_state(spec, 2)
    prox = ref if cfg.prox_mu > 0 else None
    want, want_losses = _train_dropping_buffers(spec, state, data, cfg, cw, prox)
    got = train_local(spec, state, data, cfg, make_loss(cw), prox_ref=prox)
    assert set(got.state) == set(PARAM_NAMES)
    for name in PARAM_NAMES:
        assert torch.equal(got.state[name], want[name]), name
    assert list(got.epoch_losses) == want_losses
    moved = [name for name in PARAM_NAMES if not torch.equal(got.state[name], state[name])]
    assert set(moved) == set(PARAM_NAMES) - set(cfg.frozen)  # the training did move every free tensor


@pytest.mark.parametrize(("spec", "n", "cfg"), CASES)
def test_torch_backend_equals_the_loop_that_drops_its_buffers(spec: ArchSpec, n: int, cfg: TrainConfig) -> None:
    data = _windows(spec, n)
    cw = balanced_class_weights(data.y, spec.n_classes)
    state, ref = init_state(spec, 1), init_state(spec, 2)
    prox = ref if cfg.prox_mu > 0 else None
    want, want_losses = _train_dropping_buffers(spec, state, data, cfg, cw, prox)
    backend = TorchBackend(spec, {k: v.numpy() for k, v in state.items()})
    got = train(backend, data.x, data.y, epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed, class_weights=cw,
                prox_mu=cfg.prox_mu, prox_ref={k: v.numpy() for k, v in ref.items()} if prox else None, frozen=cfg.frozen)
    weights = backend.get_weights()
    for name in PARAM_NAMES:
        assert torch.equal(torch.from_numpy(weights[name]), want[name]), name
    assert list(got.epoch_losses) == want_losses


def test_the_backend_reuses_one_gradient_buffer_per_tensor_across_steps_and_epochs() -> None:
    data = _windows(SMALL, 71)
    backend = TorchBackend(SMALL, {k: v.numpy() for k, v in init_state(SMALL, 1).items()})
    train(backend, data.x, data.y, epochs=1, lr=0.05, batch_size=32, seed=3)  # 3 steps
    first = {n: p.grad.data_ptr() for n, p in backend.model.named_parameters() if p.grad is not None}
    assert set(first) == set(PARAM_NAMES)
    train(backend, data.x, data.y, epochs=2, lr=0.05, batch_size=32, seed=4)  # 6 more steps
    assert {n: p.grad.data_ptr() for n, p in backend.model.named_parameters() if p.grad is not None} == first
