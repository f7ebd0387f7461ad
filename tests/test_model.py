"""The HAR CNN's constructor: copies of the state by default, the state's own tensors with ``copy=False``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from har_models.nn.model import ArchSpec, build_model, init_state

SMALL = ArchSpec(n_classes=6, conv_filters=6, dense_units=16)


def test_copy_false_holds_the_states_tensors_and_computes_the_same_logits() -> None:
    state = init_state(SMALL, 4)
    shared = build_model(SMALL, state, copy=False).eval()
    copied = build_model(SMALL, state).eval()
    params = dict(shared.named_parameters())
    assert list(params) == list(dict(copied.named_parameters()))  # registration order (FedALA's "higher" tensors) kept
    for name, t in state.items():
        assert params[name].data_ptr() == t.data_ptr()  # the same memory, nothing copied
        assert dict(copied.named_parameters())[name].data_ptr() != t.data_ptr()
    x = torch.from_numpy((np.random.default_rng(0).normal(size=(5, 6, 128)) * 3).astype(np.float32))
    with torch.no_grad():
        assert torch.equal(shared(x), copied(x))
    # A write into a shared parameter is a write into the state: why callers pass copies of what they write.
    with torch.no_grad():
        params["out.bias"].add_(1.0)
    assert torch.equal(state["out.bias"], torch.ones(6))


def test_copy_false_converts_another_dtype_and_still_checks_the_state() -> None:
    state = {k: v.double() for k, v in init_state(SMALL, 5).items()}
    model = build_model(SMALL, state, copy=False)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    bad = dict(init_state(SMALL, 5))
    bad["hidden.weight"] = bad["hidden.weight"][:, :3]
    with pytest.raises(ValueError, match=r"hidden\.weight"):
        build_model(SMALL, bad, copy=False)
