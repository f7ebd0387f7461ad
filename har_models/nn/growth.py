"""Shape operations on model states: padding to a grown architecture and FedDist unit appending.

FedDist (Ek, Portet, Lalanda, Vega, PerCom 2021, arXiv 2110.10223, section "FedDist";
reference/algorithms.md 3.4) widens the hidden layers of the HAR CNN by appending units at
the *end* of a layer's output dimension and of the next layer's input dimension. The number
of parameter tensors never changes, only their shapes, so two operations cover every case:

* :func:`append_units` (server side): add conv filters and/or hidden dense units, with the
  new units' incoming weights taken from a source client's neuron and the outgoing weights
  either copied from that client (``"paper"``) or zero (``"function_preserving"``).
* :func:`pad_state_like` (client side, reference/algorithms.md 5.2 step 2): bring an older,
  narrower local model (or the FedALA weights W) to the received shapes by copying it into the
  leading slice of every tensor and filling the new slots from the received model (or a
  constant). Because growth only appends, the leading-slice copy is exact.

Index mapping (channel-first flatten, see :mod:`har_models.nn.model`): with T' = T / pool time
steps after pooling, conv filter ``j`` owns the columns ``j*T' .. (j+1)*T' - 1`` of
``hidden.weight``, and hidden unit ``j`` owns column ``j`` of ``out.weight``.
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
    """Pad ``tensor`` to ``shape``: its values in the leading slice, ``fill`` everywhere else.

    Parameters
    ----------
    tensor : Tensor of shape ``(s_0, ..., s_{d-1})``
        The narrower tensor (e.g. a local model's ``hidden.weight`` before a growth).
    shape : sequence of d ints with ``shape[k] >= s_k``
        The target shape (e.g. the received model's shape).
    fill : Tensor of shape ``shape``, or float
        Values for the new slots: a tensor of the target shape (its values are used where
        ``tensor`` has none), or a constant.

    Returns
    -------
    Tensor of shape ``shape`` and dtype of ``tensor``; a new tensor (never a view of the input).

    Raises
    ------
    ValueError
        If the number of dimensions differs, ``tensor`` is wider than ``shape`` in some
        dimension (shrinking is not a growth), or a tensor ``fill`` does not have ``shape``.
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

    Client-side step before FedALA after a FedDist growth (reference/algorithms.md 5.2
    step 2, [PROPOSAL]): local values go into the leading slice; the new slots take the
    received values (``fill=None``), so ``like - padded`` is exactly zero there, or a
    constant (``fill=1.0`` for the ALA weights W, meaning "take the received value").

    Parameters
    ----------
    local : mapping name -> Tensor
        The narrower state (local model L_i, or the ALA weights W_i^p). Its names must all be
        in ``like``; ``like`` may have more (e.g. W only covers the top p tensors).
    like : mapping name -> Tensor
        The state with the target shapes (the received model P_i).
    fill : float, optional
        Constant for the new slots; ``None`` (default) copies them from ``like``.

    Returns
    -------
    dict name -> Tensor with the names of ``local`` and the shapes of ``like``. Tensors whose
    shape already matches are cloned.

    Raises
    ------
    ValueError
        If a name of ``local`` is missing from ``like``, or a tensor cannot be padded (see
        :func:`pad_tensor`; the message names the tensor).
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

    FedDist growth (Ek et al., PerCom 2021, section "FedDist"; reference/algorithms.md 3.4
    [CODE] and 5.2 step 6 [PROPOSAL]). For each ``(source, j)`` in ``conv``, in order, a filter
    is appended at index F, F+1, ...:

    * ``conv.weight[F] = source["conv.weight"][j]``, ``conv.bias[F] = source["conv.bias"][j]``;
    * ``hidden.weight[:, F*T' : (F+1)*T']`` = ``source["hidden.weight"][:, j*T' : (j+1)*T']``
      (``"paper"``) or 0 (``"function_preserving"``).

    Then, for each ``(source, j)`` in ``dense``, a hidden unit is appended at index H, H+1, ...:

    * ``hidden.weight[H] = source["hidden.weight"][j]``, ``hidden.bias[H] = source["hidden.bias"][j]``;
    * ``out.weight[:, H]`` = ``source["out.weight"][:, j]`` (``"paper"``) or 0
      (``"function_preserving"``).

    Biases of the next layer keep the values of ``state``. A source narrower than the state
    (it predates a growth of the layer below, e.g. a hidden unit's source row has no columns
    for filters appended in this call) contributes zeros where it has no values, so the new
    unit ignores inputs its source never saw. With ``"function_preserving"`` the model's output
    is unchanged on every input; with ``"paper"`` each new unit adds its source's contribution.

    Parameters
    ----------
    state : mapping name -> Tensor
        A state of ``spec`` (shapes of :meth:`ArchSpec.shapes`).
    spec : ArchSpec
        Architecture of ``state``.
    conv, dense : sequence of ``(source_state, j)``
        New conv filters / hidden units, each a copy of neuron ``j`` of ``source_state`` (a
        client's model of this round; same kernel, channels and classes as ``spec``, widths at
        most those of the state when its units are copied).
    mode : {"function_preserving", "paper"}
        Outgoing weights: zero, or copied from the source.

    Returns
    -------
    state : dict name -> float32 Tensor
        The grown state (new tensors; the input is not modified).
    spec : ArchSpec
        ``spec.grown(conv_filters=F + len(conv), dense_units=H + len(dense))`` (version + 1),
        or ``spec`` itself when both sequences are empty.

    Raises
    ------
    ValueError
        If ``mode`` is unknown, ``state`` does not match ``spec``, a source lacks a tensor, has
        another kernel/channel/class count, is wider than the state, or ``j`` is out of range
        for the source.
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
