"""Shape operations for FedDist growth: padding and unit appending (har_models.nn.growth)."""

from __future__ import annotations

import pytest
import torch

from har_models.nn.growth import append_units, pad_state_like, pad_tensor
from har_models.nn.model import ArchSpec, build_model

SPEC = ArchSpec(n_classes=4, conv_filters=8, dense_units=16)
T_P = SPEC.pooled_len  # 32


def random_state(spec: ArchSpec, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * 0.1 for n, s in spec.shapes().items()}


def logits(spec: ArchSpec, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    model = build_model(spec, state).eval()
    with torch.no_grad():
        return model(x)


def test_pad_tensor_copies_leading_slice_and_fills_the_rest() -> None:
    local = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    like = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100
    out = pad_tensor(local, (3, 4), like)
    assert torch.equal(out[:2, :2], local)
    assert torch.equal(out[2], like[2])
    assert torch.equal(out[:2, 2:], like[:2, 2:])
    const = pad_tensor(local, (2, 3), 1.0)
    assert torch.equal(const, torch.tensor([[1.0, 2.0, 1.0], [3.0, 4.0, 1.0]]))


def test_pad_tensor_rejects_shrinking_and_rank_change() -> None:
    with pytest.raises(ValueError, match="wider than the target"):
        pad_tensor(torch.zeros(3), (2,), 0.0)
    with pytest.raises(ValueError, match="dimensions"):
        pad_tensor(torch.zeros(3), (3, 1), 0.0)
    with pytest.raises(ValueError, match="fill has shape"):
        pad_tensor(torch.zeros(3), (4,), torch.zeros(5))


def test_pad_state_like_makes_received_minus_local_zero_in_new_slots() -> None:
    local = random_state(SPEC, 0)
    wide = SPEC.grown(conv_filters=10, dense_units=19)
    received = random_state(wide, 1)
    padded = pad_state_like(local, received)
    for name, t in padded.items():
        assert tuple(t.shape) == tuple(received[name].shape)
        lead = tuple(slice(0, s) for s in local[name].shape)
        assert torch.equal(t[lead], local[name])
        delta = received[name] - t
        delta[lead] = 0.0
        assert torch.count_nonzero(delta) == 0, name
    # The FedALA weights pad with ones, and only need the names they have.
    w = {"out.weight": torch.full(SPEC.shapes()["out.weight"], 0.25)}
    w_pad = pad_state_like(w, received, fill=1.0)
    assert set(w_pad) == {"out.weight"}
    assert w_pad["out.weight"].shape == (4, 19)
    assert torch.all(w_pad["out.weight"][:, :16] == 0.25) and torch.all(w_pad["out.weight"][:, 16:] == 1.0)


def test_pad_state_like_names_missing_tensor() -> None:
    with pytest.raises(ValueError, match="not in the target"):
        pad_state_like({"x": torch.zeros(1)}, {"y": torch.zeros(1)})


def test_append_units_shapes_version_and_copied_values() -> None:
    state, src = random_state(SPEC, 0), random_state(SPEC, 1)
    grown, spec2 = append_units(state, SPEC, conv=[(src, 3), (src, 0)], dense=[(src, 5)], mode="paper")
    assert (spec2.conv_filters, spec2.dense_units, spec2.version) == (10, 17, SPEC.version + 1)
    assert {n: tuple(t.shape) for n, t in grown.items()} == spec2.shapes()
    # Old values untouched.
    assert torch.equal(grown["conv.weight"][:8], state["conv.weight"])
    assert torch.equal(grown["hidden.weight"][:16, : 8 * T_P], state["hidden.weight"])
    assert torch.equal(grown["out.weight"][:, :16], state["out.weight"])
    assert torch.equal(grown["out.bias"], state["out.bias"])
    # New filters 8, 9 = source filters 3, 0; their dense blocks are the source's blocks.
    assert torch.equal(grown["conv.weight"][8], src["conv.weight"][3])
    assert torch.equal(grown["conv.bias"][9], src["conv.bias"][0])
    assert torch.equal(grown["hidden.weight"][:16, 8 * T_P : 9 * T_P], src["hidden.weight"][:, 3 * T_P : 4 * T_P])
    assert torch.equal(grown["hidden.weight"][:16, 9 * T_P : 10 * T_P], src["hidden.weight"][:, 0 : T_P])
    # New hidden unit 16 = source unit 5; no columns for the filters its source never had.
    assert torch.equal(grown["hidden.weight"][16, : 8 * T_P], src["hidden.weight"][5])
    assert torch.count_nonzero(grown["hidden.weight"][16, 8 * T_P :]) == 0
    assert torch.equal(grown["hidden.bias"][16], src["hidden.bias"][5])
    assert torch.equal(grown["out.weight"][:, 16], src["out.weight"][:, 5])


def test_append_units_function_preserving_keeps_logits() -> None:
    state, src = random_state(SPEC, 0), random_state(SPEC, 1)
    grown, spec2 = append_units(state, SPEC, conv=[(src, 1)], dense=[(src, 2), (src, 15)], mode="function_preserving")
    x = torch.randn(5, 6, 128, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(spec2, grown, x), logits(SPEC, state, x), rtol=0, atol=1e-5)
    assert torch.count_nonzero(grown["hidden.weight"][:16, 8 * T_P :]) == 0
    assert torch.count_nonzero(grown["out.weight"][:, 16:]) == 0


def test_append_units_nothing_returns_same_spec() -> None:
    state = random_state(SPEC, 0)
    grown, spec2 = append_units(state, SPEC)
    assert spec2 == SPEC
    assert all(torch.equal(grown[n], state[n]) for n in state)


def test_append_units_validates_arguments() -> None:
    state, src = random_state(SPEC, 0), random_state(SPEC, 1)
    with pytest.raises(ValueError, match="mode must be one of"):
        append_units(state, SPEC, conv=[(src, 0)], mode="zeros")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out of range"):
        append_units(state, SPEC, conv=[(src, 8)])
    with pytest.raises(ValueError, match=r"expects|do not match"):
        append_units(random_state(SPEC.grown(conv_filters=9), 0), SPEC, conv=[(src, 0)])
