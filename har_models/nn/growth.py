"""Shape operations on model states: padding to a grown architecture and FedDist unit appending.

FedDist (Ek et al., PerCom 2021, arXiv 2110.10223; reference/algorithms.md 3.4) widens the
hidden layers by appending units at the end of a layer's output and the next layer's input,
so the tensors stay the same and only their shapes grow: :func:`append_units` (server) and
:func:`pad_state_like` (client, reference/algorithms.md 5.2 step 2; exact, growth only appends).

Index mapping (channel-first flatten, :mod:`har_models.nn.model`): with T' = T / pool, conv
filter ``j`` owns columns ``j*T' .. (j+1)*T' - 1`` of ``hidden.weight``; hidden unit ``j`` owns
column ``j`` of ``out.weight``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from har_models.nn.model import ArchSpec, State, check_state

log = logging.getLogger(__name__)


GrowthMode = Literal["paper", "function_preserving"]
"""How a new unit's outgoing weights are set: copied from the source client, or zero."""

GROWTH_MODES: tuple[str, ...] = ("paper", "function_preserving")

NewUnitSource = tuple[Mapping[str, torch.Tensor], int]
"""``(source_state, j)``: the new unit copies neuron ``j`` of ``source_state``."""


def pad_tensor(tensor: torch.Tensor, shape: Sequence[int], fill: torch.Tensor | float) -> torch.Tensor:
    """A new tensor of ``shape``: ``tensor``'s values in the leading slice, ``fill`` (a constant or a tensor of ``shape``) elsewhere.

    ValueError if the number of dimensions differs, ``tensor`` is wider than ``shape`` somewhere,
    or a tensor ``fill`` is not of ``shape``.
    """
    target = tuple(int(s) for s in shape)
    got = tuple(tensor.shape)
    if len(got) != len(target):
        raise ValueError(f"pad_tensor: tensor has {len(got)} dimensions {got}, target shape {target} has {len(target)}")
    if any(g > t for g, t in zip(got, target, strict=True)):
        raise ValueError(
            f"pad_tensor: tensor of shape {got} is wider than the target {target}; "
            "architectures only grow, so pad the narrower model to the wider one"
        )
    if isinstance(fill, torch.Tensor):
        if tuple(fill.shape) != target:
            raise ValueError(f"pad_tensor: fill has shape {tuple(fill.shape)}, expected the target shape {target}")
        out = fill.detach().to(dtype=tensor.dtype).clone()
    else:
        out = torch.full(target, float(fill), dtype=tensor.dtype)
    out[tuple(slice(0, g) for g in got)] = tensor.detach()
    return out


def pad_state_like(
    local: Mapping[str, torch.Tensor],
    like: Mapping[str, torch.Tensor],
    fill: float | None = None,
) -> State:
    """Pad every tensor of ``local`` to the shape of the same-named tensor of ``like``.

    Local values go into the leading slice; new slots take ``like``'s values (``fill=None``, so
    ``like - padded`` is zero there) or a constant (``fill=1.0`` for the ALA weights). ``like`` may
    have more names. Matching tensors are cloned. ValueError (naming the tensor) if a name is
    missing from ``like`` or a tensor cannot be padded.
    """
    missing = sorted(set(local) - set(like))
    if missing:
        raise ValueError(f"pad_state_like: tensors {missing} of the local state are not in the target state ({sorted(like)})")
    out: State = {}
    for name, t in local.items():
        ref = like[name]
        try:
            out[name] = pad_tensor(t, tuple(ref.shape), ref if fill is None else fill)
        except ValueError as exc:
            raise ValueError(f"pad_state_like: tensor {name!r}: {exc}") from None
    return out


def append_units(
    state: Mapping[str, torch.Tensor],
    spec: ArchSpec,
    *,
    conv: Sequence[NewUnitSource] = (),
    dense: Sequence[NewUnitSource] = (),
    mode: GrowthMode = "function_preserving",
) -> tuple[State, ArchSpec]:
    """Append FedDist units to a HAR CNN state: new conv filters first, then new hidden units.

    Ek et al., PerCom 2021; reference/algorithms.md 3.4 and 5.2 step 6. For each ``(source, j)``
    of ``conv`` a filter F, F+1, ... copies ``conv.weight[j]``/``conv.bias[j]`` of the source,
    and ``hidden.weight[:, F*T' : (F+1)*T']`` takes the source's columns of ``j`` (``"paper"``) or
    0 (``"function_preserving"``). Likewise each ``(source, j)`` of ``dense`` appends hidden unit
    H, H+1, ... with ``out.weight[:, H]`` copied or 0. Next-layer biases are kept; a source
    narrower than the state contributes zeros. ``"function_preserving"`` leaves the output unchanged.

    Returns the grown state (new float32 tensors) and ``spec.grown(...)`` (version + 1), or
    ``spec`` when both sequences are empty.

    Raises
    ------
    ValueError
        Unknown ``mode``, ``state`` not of ``spec``, a source lacking a tensor, with another
        kernel/channel/class count, wider than the state, or ``j`` out of range.
    """
    if mode not in GROWTH_MODES:
        raise ValueError(f"append_units: mode must be one of {GROWTH_MODES}, got {mode!r}")
    _check_shapes(state, spec, "state")
    out: State = {n: t.detach().float().clone() for n, t in state.items()}
    if not conv and not dense:
        return out, spec
    t_p = spec.pooled_len
    f0, h0, c = spec.conv_filters, spec.dense_units, spec.n_classes

    # Conv filters: rows of conv.weight/conv.bias, a block of T' columns of hidden.weight.
    if conv:
        w_rows, b_rows, blocks = [], [], []
        for k, (src, j_) in enumerate(conv):
            j = int(j_)
            f_s = _source_width(src, "conv.weight", j, f0, k, "conv")
            if tuple(src["conv.weight"].shape[1:]) != tuple(out["conv.weight"].shape[1:]):
                raise ValueError(
                    f"append_units: conv source #{k} has conv.weight of shape {tuple(src['conv.weight'].shape)}, "
                    f"expected (F, {', '.join(str(s) for s in out['conv.weight'].shape[1:])})"
                )
            w_rows.append(src["conv.weight"][j].detach().float())
            b_rows.append(src["conv.bias"][j].detach().float().reshape(1))
            if mode == "paper":
                src_h = src["hidden.weight"].detach().float()
                if src_h.shape[1] != f_s * t_p or src_h.shape[0] > h0:
                    raise ValueError(
                        f"append_units: conv source #{k} has hidden.weight of shape {tuple(src_h.shape)}, "
                        f"expected (<= {h0}, {f_s}*{t_p})"
                    )
                block = torch.zeros(h0, t_p)
                block[: src_h.shape[0]] = src_h[:, j * t_p : (j + 1) * t_p]
                blocks.append(block)
            else:
                blocks.append(torch.zeros(h0, t_p))
        out["conv.weight"] = torch.cat([out["conv.weight"], torch.stack(w_rows)], 0)
        out["conv.bias"] = torch.cat([out["conv.bias"], torch.cat(b_rows)], 0)
        out["hidden.weight"] = torch.cat([out["hidden.weight"], *blocks], 1)
    f1 = f0 + len(conv)

    # Hidden units: rows of hidden.weight/hidden.bias, one column of out.weight.
    if dense:
        w_rows, b_rows, cols = [], [], []
        for k, (src, j_) in enumerate(dense):
            j = int(j_)
            _source_width(src, "hidden.weight", j, h0, k, "dense")
            src_row = src["hidden.weight"][j].detach().float()
            if src_row.shape[0] % t_p or src_row.shape[0] > f1 * t_p:
                raise ValueError(
                    f"append_units: dense source #{k} has hidden.weight rows of length {src_row.shape[0]}, "
                    f"expected a multiple of T'={t_p} up to {f1 * t_p}"
                )
            row = torch.zeros(f1 * t_p)
            row[: src_row.shape[0]] = src_row
            w_rows.append(row)
            b_rows.append(src["hidden.bias"][j].detach().float().reshape(1))
            if mode == "paper":
                src_o = src["out.weight"].detach().float()
                if src_o.shape[0] != c:
                    raise ValueError(f"append_units: dense source #{k} has {src_o.shape[0]} classes in out.weight, expected {c}")
                cols.append(src_o[:, j : j + 1])
            else:
                cols.append(torch.zeros(c, 1))
        out["hidden.weight"] = torch.cat([out["hidden.weight"], torch.stack(w_rows)], 0)
        out["hidden.bias"] = torch.cat([out["hidden.bias"], torch.cat(b_rows)], 0)
        out["out.weight"] = torch.cat([out["out.weight"], *cols], 1)

    new_spec = spec.grown(conv_filters=f1, dense_units=h0 + len(dense))
    log.debug(
        "growth v%d -> v%d (%s): +%d conv filters (%d -> %d), +%d dense units (%d -> %d)",
        spec.version, new_spec.version, mode, len(conv), f0, f1, len(dense), h0, new_spec.dense_units,
    )
    _check_shapes(out, new_spec, "grown state")
    return out, new_spec


def _check_shapes(state: Mapping[str, torch.Tensor], spec: ArchSpec, what: str) -> None:
    check_state(spec, state, what, finite=False)


def _source_width(src: Mapping[str, torch.Tensor], weight: str, j: int, max_width: int, k: int, layer: str) -> int:
    """Validate a growth source and return its width (rows of ``weight``)."""
    bias = weight.replace(".weight", ".bias")
    for name in (weight, bias, "hidden.weight", "out.weight"):
        if name not in src:
            raise ValueError(f"append_units: {layer} source #{k} has no tensor {name!r}")
    width = int(src[weight].shape[0])
    if width > max_width:
        raise ValueError(f"append_units: {layer} source #{k} has {width} units in {weight}, wider than the state ({max_width})")
    if not 0 <= int(j) < width:
        raise ValueError(f"append_units: {layer} source #{k}: neuron index {j} out of range [0, {width})")
    return width
