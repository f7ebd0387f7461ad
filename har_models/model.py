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

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import skip_init

from har_models.codec import check_tensors
from har_models.windowing import N_CHANNELS, WINDOW

State = dict[str, torch.Tensor]
"""A model state: parameter name -> float32 tensor (shapes from :meth:`ArchSpec.shapes`). The one such type in fedhar."""

PARAM_NAMES = ("conv.weight", "conv.bias", "hidden.weight", "hidden.bias", "out.weight", "out.bias")
"""Trainable tensors in registration (= forward) order; FedALA's "top p" counts from the end."""


@dataclass(frozen=True)
class ArchSpec:
    """Architecture of the HAR CNN, exchanged as JSON in every model envelope.

    Parameters
    ----------
    n_classes : int
        Output classes C.
    conv_filters : int
        Filters F of the convolution (196 in the paper; FedDist grows it).
    dense_units : int
        Units H of the hidden dense layer (1024; FedDist grows it).
    kernel : int
        Convolution kernel length along time (16).
    pool : int
        Max-pool size along time (4); T must be divisible by it.
    window : int
        Input samples T (128 = 2.56 s at 50 Hz).
    n_channels : int
        Input channels (6: acc xyz m/s^2, gyro xyz rad/s).
    dropout : float
        Dropout probability after the hidden dense layer (0.5).
    input_mean, input_std : tuple of ``n_channels`` floats
        Per-channel normalisation applied to the raw input (units of the channel).
    version : int
        Architecture version; bumped on every FedDist growth.

    Raises
    ------
    ValueError
        On non-positive sizes, ``window`` not divisible by ``pool``, a normalisation of the
        wrong length, or a non-positive std.
    """

    n_classes: int
    conv_filters: int = 196
    dense_units: int = 1024
    kernel: int = 16
    pool: int = 4
    window: int = WINDOW
    n_channels: int = N_CHANNELS
    dropout: float = 0.5
    input_mean: tuple[float, ...] = field(default=(0.0,) * N_CHANNELS)
    input_std: tuple[float, ...] = field(default=(1.0,) * N_CHANNELS)
    version: int = 0

    def __post_init__(self) -> None:
        for name in ("n_classes", "conv_filters", "dense_units", "kernel", "pool", "window", "n_channels"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ArchSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.window % self.pool:
            raise ValueError(f"ArchSpec: window {self.window} must be divisible by pool {self.pool}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ArchSpec.dropout must be in [0, 1), got {self.dropout}")
        object.__setattr__(self, "input_mean", tuple(float(v) for v in self.input_mean))
        object.__setattr__(self, "input_std", tuple(float(v) for v in self.input_std))
        if len(self.input_mean) != self.n_channels or len(self.input_std) != self.n_channels:
            raise ValueError(f"ArchSpec: input_mean/input_std need {self.n_channels} values each")
        if not all(np.isfinite(self.input_mean)) or not all(s > 0 and np.isfinite(s) for s in self.input_std):
            raise ValueError(f"ArchSpec: input normalisation must be finite with std > 0, got {self.input_std}")

    @property
    def pooled_len(self) -> int:
        """T' = T / pool, time steps per filter after pooling (32)."""
        return self.window // self.pool

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every trainable tensor, by name (see :data:`PARAM_NAMES`)."""
        f, h, c = self.conv_filters, self.dense_units, self.n_classes
        return {
            "conv.weight": (f, self.n_channels, self.kernel, 1),
            "conv.bias": (f,),
            "hidden.weight": (h, f * self.pooled_len),
            "hidden.bias": (h,),
            "out.weight": (c, h),
            "out.bias": (c,),
        }

    def n_parameters(self) -> int:
        """Number of trainable scalars (6,450,764 for the paper's CNN with 8 classes)."""
        return int(sum(np.prod(s) for s in self.shapes().values()))

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON object form (as carried in round announcements)."""
        d = asdict(self)
        d["input_mean"], d["input_std"] = list(self.input_mean), list(self.input_std)
        return d

    def to_json(self) -> str:
        """Canonical JSON (sorted keys), as carried in envelopes and stored in run folders."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, object]) -> ArchSpec:
        """Parse :meth:`to_json` output.

        Raises
        ------
        ValueError
            If the JSON is malformed, has unknown or missing fields, or fails validation.
        """
        try:
            d = json.loads(text) if isinstance(text, str) else dict(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"ArchSpec: not valid JSON ({exc})") from None
        if not isinstance(d, dict):
            raise ValueError(f"ArchSpec: expected a JSON object, got {type(d).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"ArchSpec: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        try:
            return cls(**d)
        except TypeError as exc:
            raise ValueError(f"ArchSpec: {exc}") from None

    def grown(self, conv_filters: int | None = None, dense_units: int | None = None) -> ArchSpec:
        """This spec with new widths and ``version + 1``."""
        return replace(
            self,
            conv_filters=self.conv_filters if conv_filters is None else conv_filters,
            dense_units=self.dense_units if dense_units is None else dense_units,
            version=self.version + 1,
        )


class HarCNN(nn.Module):
    """The FedDist HAR CNN built from an :class:`ArchSpec`.

    Input ``(B, 6, T)`` or ``(B, 6, T, 1)`` raw windows (acc m/s^2, gyro rad/s); output
    logits ``(B, C)``.

    Parameters
    ----------
    spec : ArchSpec
    state : mapping name -> tensor, optional
        Parameters to load (checked against ``spec``); default :func:`init_state` with seed 0.

    Raises
    ------
    ValueError
        If ``state`` does not match ``spec``.
    """

    def __init__(self, spec: ArchSpec, state: Mapping[str, torch.Tensor] | None = None):
        super().__init__()
        self.spec = spec
        # Declared in forward order: FedALA's "higher layers" are the last registered tensors.
        # skip_init: the parameters are overwritten below, so PyTorch's own random init is wasted work.
        self.conv = skip_init(nn.Conv2d, spec.n_channels, spec.conv_filters, (spec.kernel, 1))
        self.hidden = skip_init(nn.Linear, spec.conv_filters * spec.pooled_len, spec.dense_units)
        self.out = skip_init(nn.Linear, spec.dense_units, spec.n_classes)
        self.register_buffer("input_mean", torch.tensor(spec.input_mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("input_std", torch.tensor(spec.input_std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        # 'same' padding for an even kernel: (k-1)//2 before, the rest after (7 and 8 for k = 16), as Keras does.
        self._pad = ((spec.kernel - 1) // 2, spec.kernel - 1 - (spec.kernel - 1) // 2)
        if state is None:
            state = init_state(spec, 0)
        else:
            check_state(spec, state)
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(torch.as_tensor(state[name], dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = x.unsqueeze(-1)
        x = (x - self.get_buffer("input_mean")) / self.get_buffer("input_std")
        x = F.pad(x, (0, 0, self._pad[0], self._pad[1]))
        x = F.relu(self.conv(x))
        x = F.max_pool2d(x, (self.spec.pool, 1))
        x = torch.flatten(x, 1)  # (B, F, T', 1) -> (B, F*T'): filter j owns columns j*T' .. (j+1)*T'-1
        x = F.relu(self.hidden(x))
        x = F.dropout(x, self.spec.dropout, self.training)
        return self.out(x)


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


def build_model(spec: ArchSpec, state: Mapping[str, torch.Tensor] | None = None) -> HarCNN:
    """A :class:`HarCNN` for ``spec``, loaded with ``state`` if given.

    Raises
    ------
    ValueError
        If ``state`` does not match ``spec`` (see :func:`check_state`).
    """
    return HarCNN(spec, state)


def get_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached float32 copies of the trainable parameters, by name."""
    return {n: p.detach().clone().float() for n, p in model.named_parameters()}


def check_state(spec: ArchSpec, state: Mapping[str, object], what: str = "", finite: bool = True) -> None:
    """Check that ``state`` has exactly the tensors of ``spec``, with the right shapes (and all finite).

    Raises
    ------
    har_models.codec.WrongTensors
        Naming the missing, unexpected or mis-shaped tensor and the expected shape of
        architecture v``spec.version``.
    har_models.codec.NonFinite
        Naming the tensor that holds NaN or inf.
    """
    arrays = {n: t.detach().numpy() if isinstance(t, torch.Tensor) else t for n, t in state.items()}
    check_tensors(spec.shapes(), arrays, what=f"{what} (architecture v{spec.version})" if what else "", finite=finite)
