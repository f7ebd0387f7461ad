"""Architecture of the HAR CNN as data (no PyTorch needed).

:class:`ArchSpec` travels as JSON in every model envelope and round announcement; it lives
apart from :mod:`har_models.nn.model` so that torch-free code (the numpy reference backend on a
phone, program caches keyed by architecture) can read and validate it. See
:mod:`har_models.nn.model` for the network the spec describes (Ek et al., PerCom 2021).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from har_models.data.windowing import N_CHANNELS, WINDOW

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

    @property
    def same_padding(self) -> tuple[int, int]:
        """Time steps padded (before, after) the window so the convolution keeps its length: (7, 8) for k = 16, as Keras does."""
        return (self.kernel - 1) // 2, self.kernel - 1 - (self.kernel - 1) // 2

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
