"""Gradient buffers kept across steps give the same weights as fresh ones, bit for bit.

``zero_grad(set_to_none=False)`` allocates each parameter's ``.grad`` once and zeroes it in
place at every later step; ``set_to_none=True`` (what :func:`har_models.nn.training.train_local`
and the torch backend do) drops it and lets autograd allocate a new one. Adding a step's
gradient to a zeroed buffer gives that gradient exactly (0 + g = g in IEEE 754), so the two
loops must reach the same weights to the last bit. ``benchmarks/bench_grad_buffers.py`` compares
their cost on that basis (docs/benchmarks-server.md section 3: keeping the buffers does not pay
here, autograd still allocates each step's gradient and then adds it into the kept buffer).
The loop below is ``train_local``'s, written out with the clearing mode as a parameter, and
``train_local`` itself must equal it.
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


def _sgd(
    spec: ArchSpec, state: dict[str, torch.Tensor], data: WindowSet, cfg: TrainConfig, cw: np.ndarray | None,
    prox_ref: dict[str, torch.Tensor] | None, keep_buffers: bool,
) -> tuple[dict[str, torch.Tensor], list[float], dict[str, int]]:
    """``train_local``'s loop; ``keep_buffers`` zeroes the gradients in place instead of dropping them.

    Returns the parameters, the epoch losses, and the number of distinct gradient buffers each tensor had.
    """
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
    buffers: dict[str, set[int]] = {n: set() for n, _ in params}
    for _ in range(cfg.epochs):
        order = torch.randperm(len(data), generator=gen)
        total = 0.0
        for s in range(0, len(data), cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            opt.zero_grad(set_to_none=not keep_buffers)
            loss = loss_fn(model(x[idx]), y[idx])
            if cfg.prox_mu > 0 and prox_ref is not None:
                loss = loss + 0.5 * cfg.prox_mu * sum(((p - prox_ref[n]) ** 2).sum() for n, p in params)
            loss.backward()
            opt.step()
            for n, p in params:
                assert p.grad is not None
                buffers[n].add(p.grad.data_ptr())
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(data))
    return get_state(model), losses, {n: len(b) for n, b in buffers.items()}


CASES = [
    pytest.param(SMALL, 71, TrainConfig(epochs=3, lr=0.05, batch_size=32, seed=11), id="small-3-epochs"),
    pytest.param(SMALL, 71, TrainConfig(epochs=2, lr=0.05, batch_size=16, prox_mu=0.1, frozen=("conv.weight", "conv.bias"), seed=5),
                 id="small-fedprox-frozen"),
    pytest.param(PAPER, 100, TrainConfig(epochs=1, lr=0.01, batch_size=32, seed=7), id="paper-cnn-4-steps", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("spec", "n", "cfg"), CASES)
def test_kept_buffers_give_the_weights_of_fresh_ones_bit_for_bit(spec: ArchSpec, n: int, cfg: TrainConfig) -> None:
    data = _windows(spec, n)
    cw = balanced_class_weights(data.y, spec.n_classes)
    state, ref = init_state(spec, 1), init_state(spec, 2)
    prox = ref if cfg.prox_mu > 0 else None
    fresh, fresh_losses, _ = _sgd(spec, state, data, cfg, cw, prox, keep_buffers=False)
    kept, kept_losses, n_buffers = _sgd(spec, state, data, cfg, cw, prox, keep_buffers=True)
    assert set(n_buffers.values()) == {1}  # one buffer per tensor for the whole training
    for name in PARAM_NAMES:
        assert torch.equal(kept[name], fresh[name]), name
    assert kept_losses == fresh_losses
    moved = [name for name in PARAM_NAMES if not torch.equal(kept[name], state[name])]
    assert set(moved) == set(PARAM_NAMES) - set(cfg.frozen)  # the training did move every free tensor


@pytest.mark.parametrize(("spec", "n", "cfg"), CASES)
def test_train_local_and_the_torch_backend_are_that_loop(spec: ArchSpec, n: int, cfg: TrainConfig) -> None:
    data = _windows(spec, n)
    cw = balanced_class_weights(data.y, spec.n_classes)
    state, ref = init_state(spec, 1), init_state(spec, 2)
    prox = ref if cfg.prox_mu > 0 else None
    want, want_losses, _ = _sgd(spec, state, data, cfg, cw, prox, keep_buffers=False)
    got = train_local(spec, state, data, cfg, make_loss(cw), prox_ref=prox)
    backend = TorchBackend(spec, {k: v.numpy() for k, v in state.items()})
    summary = train(backend, data.x, data.y, epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed, class_weights=cw,
                    prox_mu=cfg.prox_mu, prox_ref={k: v.numpy() for k, v in ref.items()} if prox else None, frozen=cfg.frozen)
    weights = backend.get_weights()
    for name in PARAM_NAMES:
        assert torch.equal(got.state[name], want[name]), name
        assert torch.equal(torch.from_numpy(weights[name]), want[name]), name
    assert list(got.epoch_losses) == want_losses == list(summary.epoch_losses)
