"""The HAR CNN of the FedDist paper, with its widths as data.

Ek, Portet, Lalanda, Vega, "A Federated Learning Aggregation Algorithm for Pervasive
Computing: Evaluation and Comparison", PerCom 2021 (arXiv 2110.10223), REALWORLD
configuration: Conv(196 filters, kernel 16 along time, 'same' padding, ReLU) ->
MaxPool(4) -> Flatten (channel-first) -> Dense(1024, ReLU) -> Dropout(0.5) -> Dense(C).

The convolution is a ``Conv2d`` with a (16, 1) kernel over input laid out
``(B, 6, T, 1)``: ExecuTorch's portable backward kernel only handles 2-D convolutions.
Flattening ``(B, F, T', 1)`` channel-first puts filter ``j``'s features at columns
``j*T' .. (j+1)*T' - 1`` of the dense layer, so FedDist growth appends whole blocks.

Input normalisation (per-channel mean and std, from training windows only) is part of
the architecture: the model takes raw m/s^2 and rad/s, so the same model serves any
device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import skip_init

from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.tensor_check import check_tensors

State = dict[str, torch.Tensor]
"""A model state: parameter name -> float32 tensor (shapes from :meth:`ArchSpec.shapes`). The one such type in fedhar."""

__all__ = ["PARAM_NAMES", "ArchSpec", "HarCNN", "State", "build_model", "check_state", "get_state", "init_state"]


class HarCNN(nn.Module):
    """The FedDist HAR CNN built from an :class:`ArchSpec`.

    Input ``(B, 6, T)`` or ``(B, 6, T, 1)`` raw windows (acc m/s^2, gyro rad/s); output
    logits ``(B, C)``.

    Parameters
    ----------
    spec : ArchSpec
    state : mapping name -> tensor, optional
        Parameters to load (checked against ``spec``); default :func:`init_state` with seed 0.
    copy : bool
        True (default): the parameters are copies of ``state``. False: each parameter is the
        float32 tensor of ``state`` itself (shared memory, nothing copied; a tensor of another
        dtype is converted), so a caller that only reads them saves a copy of the model (25.8 MB
        for the paper CNN). The caller then must not change those tensors while the model is in
        use, and whatever writes a parameter in place writes ``state``'s tensor: pass copies of
        the tensors it writes.

    Raises
    ------
    ValueError
        If ``state`` does not match ``spec``.
    """

    def __init__(self, spec: ArchSpec, state: Mapping[str, torch.Tensor] | None = None, *, copy: bool = True):
        super().__init__()
        self.spec = spec
        # Declared in forward order: FedALA's "higher layers" are the last registered tensors.
        # skip_init: the parameters are overwritten below, so PyTorch's own random init is wasted work.
        self.conv = skip_init(nn.Conv2d, spec.n_channels, spec.conv_filters, (spec.kernel, 1))
        self.hidden = skip_init(nn.Linear, spec.conv_filters * spec.pooled_len, spec.dense_units)
        self.out = skip_init(nn.Linear, spec.dense_units, spec.n_classes)
        self.register_buffer("input_mean", torch.tensor(spec.input_mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("input_std", torch.tensor(spec.input_std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self._pad = spec.same_padding  # 'same' padding for an even kernel: (k-1)//2 before, the rest after, as Keras does
        if state is None:
            state = init_state(spec, 0)
        else:
            check_state(spec, state)
        with torch.no_grad():
            for name, p in list(self.named_parameters()):
                value = torch.as_tensor(state[name], dtype=torch.float32)
                if copy:
                    p.copy_(value)
                else:  # the unused empty parameter made above is dropped (never written, so never paged in)
                    layer, attr = name.rsplit(".", 1)
                    setattr(getattr(self, layer), attr, nn.Parameter(value))

    HEAD_PARAMS = ("out.weight", "out.bias")
    """The parameters :meth:`head` uses; :meth:`features` uses none of them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Raw windows ``(B, 6, T)`` or ``(B, 6, T, 1)`` -> hidden activations ``(B, H)`` (after ReLU, before dropout).

        Deterministic (no dropout, no random draw) and independent of :attr:`HEAD_PARAMS`, so
        FedALA can compute it once per window when only the output layer is blended.
        """
        if x.dim() == 3:
            x = x.unsqueeze(-1)
        x = (x - self.get_buffer("input_mean")) / self.get_buffer("input_std")
        x = F.pad(x, (0, 0, self._pad[0], self._pad[1]))
        x = F.relu(self.conv(x))
        x = F.max_pool2d(x, (self.spec.pool, 1))
        x = torch.flatten(x, 1)  # (B, F, T', 1) -> (B, F*T'): filter j owns columns j*T' .. (j+1)*T'-1
        return F.relu(self.hidden(x))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden activations ``(B, H)`` -> logits ``(B, C)``: dropout (training mode only; one draw) and the output layer."""
        return self.out(F.dropout(h, self.spec.dropout, self.training))


def init_state(spec: ArchSpec, seed: int) -> dict[str, torch.Tensor]:
    """Initial parameters: Glorot-uniform weights and zero biases (the Keras defaults the paper used).

    Returns
    -------
    dict of name -> float32 tensor with the shapes of :meth:`ArchSpec.shapes`.
    """
    g = torch.Generator().manual_seed(int(seed))
    out = {}
    for name, shape in spec.shapes().items():
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        else:
            fan_out, fan_in = shape[0] * int(np.prod(shape[2:])), int(np.prod(shape[1:]))
            bound = float(np.sqrt(6.0 / (fan_in + fan_out)))
            out[name] = (torch.rand(shape, generator=g) * 2 - 1) * bound
    return out


def build_model(spec: ArchSpec, state: Mapping[str, torch.Tensor] | None = None, *, copy: bool = True) -> HarCNN:
    """A :class:`HarCNN` for ``spec``, loaded with ``state`` if given (``copy=False``: over ``state``'s tensors, see :class:`HarCNN`).

    Raises
    ------
    ValueError
        If ``state`` does not match ``spec`` (see :func:`check_state`).
    """
    return HarCNN(spec, state, copy=copy)


def get_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached float32 copies of the trainable parameters, by name."""
    return {n: p.detach().clone().float() for n, p in model.named_parameters()}


def check_state(spec: ArchSpec, state: Mapping[str, object], what: str = "", finite: bool = True) -> None:
    """Check that ``state`` has exactly the tensors of ``spec``, with the right shapes (and all finite).

    Raises
    ------
    har_models.tensor_check.WrongTensors
        Naming the missing, unexpected or mis-shaped tensor and the expected shape of
        architecture v``spec.version``.
    har_models.tensor_check.NonFinite
        Naming the tensor that holds NaN or inf.
    """
    arrays = {n: t.detach().numpy() if isinstance(t, torch.Tensor) else t for n, t in state.items()}
    check_tensors(spec.shapes(), arrays, what=f"{what} (architecture v{spec.version})" if what else "", finite=finite)
