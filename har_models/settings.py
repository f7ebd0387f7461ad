"""Typed settings shared by the coordinator and the edge client: each default written once.

Each setting is a dataclass field whose ``metadata`` (:func:`doc`) carries its help and unit,
from which :mod:`har_io.cli` generates options and TOML; mappings go through
:func:`from_mapping`, which refuses an unknown key or a wrong type with the key and value.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def doc(
    help: str, unit: str = "", flag: str = "", choices: tuple[str, ...] = (), cli: bool = True, kind: str = ""
) -> dict[str, Any]:
    """Field metadata read by the CLI and TOML generators.

    Parameters
    ----------
    unit : str
        ``"s"``, ``"bytes"``, ``"rounds"``, appended to the help.
    flag : str
        Command-line flag when it differs from ``--field-name``.
    cli : bool
        False for settings a program fills in itself (run folder, broker).
    kind : str
        ``"json"``: a nested settings object given as a JSON object; ``"table"``: a nested object
        whose fields are options of their own and a TOML table named after the field.
    """
    return {"help": help, "unit": unit, "flag": flag, "choices": choices, "cli": cli, "kind": kind}


def _check_type(cls: type, name: str, tp: Any, value: Any) -> Any:
    """Return ``value`` converted to the annotated type ``tp``, or raise ValueError naming the key."""
    where = f"{cls.__name__}.{name}"
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"{where} = {value!r}: must be one of {list(allowed)}")
        return value
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(cls, name, a, value)
            except ValueError:
                continue
        raise ValueError(f"{where} = {value!r}: expected {tp}")
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} = {value!r}: expected a list")
        (inner, *_) = typing.get_args(tp) or (Any,)
        return tuple(_check_type(cls, name, inner, v) for v in value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} = {value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} = {value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{where} = {value!r}: expected a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} = {value!r}: expected a string")
        return value
    return value


def from_mapping(cls: type[T], data: Mapping[str, Any], what: str = "", **given: Any) -> T:
    """Build the settings dataclass ``cls`` from a mapping (nested dataclasses from nested mappings), refusing anything unexpected.

    ``what`` names the source for messages (``"run.toml [ala]"``); ``given`` are fields the
    program sets itself (typed already), which win over ``data``.

    Raises
    ------
    ValueError
        For an unknown key (naming the closest known one), a wrong type, or a value the dataclass rejects.
    """
    prefix = f"{what}: " if what else ""
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix}expected a table/object of {cls.__name__} settings, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{prefix}unknown setting {key!r}{hint}; {cls.__name__} knows {sorted(known)}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            kwargs[key] = value if isinstance(value, tp) else from_mapping(tp, value, f"{what} [{key}]" if what else key)
        else:
            try:
                kwargs[key] = _check_type(cls, key, tp, value)
            except ValueError as exc:
                raise ValueError(f"{prefix}{exc}") from None
    kwargs.update(given)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{prefix}{exc}") from None


def to_mapping(obj: Any) -> dict[str, Any]:
    """Plain dict of a settings dataclass (tuples as lists), for JSON and TOML."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = to_mapping(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


@dataclass(frozen=True)
class LocalTraining:
    """Local training of one round: E = 1, lr 0.1, batch 32, balanced class weights (the one place these defaults are written).

    FedDist used E = 5 and lr 0.01; lr 0.1 had the best validation macro-F1 (docs/results.md).
    """

    local_epochs: int = field(default=1, metadata=doc("local epochs E per round", "passes over the training windows"))
    lr: float = field(default=0.1, metadata=doc("local SGD learning rate eta"))
    batch_size: int = field(default=32, metadata=doc("windows per SGD step B", "windows"))
    class_weights: str = field(
        default="balanced",
        metadata=doc("per-client class weights in the loss (FedDist used sklearn's 'balanced')", choices=("balanced", "none")),
    )


@dataclass(frozen=True)
class AlaConfig:
    """Settings of Adaptive Local Aggregation (FedALA; Zhang et al., AAAI 2023, section 4).

    Parameters
    ----------
    eta : float
        Learning rate of the weights W (1.0, as the paper and official code).
    rand_percent : float
        s, percent of the local training windows sampled each round for learning W (80).
    layer_idx : int
        p counted in parameter *tensors* from the end (2 = ``out.*``, the paper's p = 1; 0 = all).
    threshold : float
        tau: the first ALA round stops when the std of the last ``num_pre_loss`` pass losses is
        below it. 0.1, the official code's effective value (the paper's 0.01 is under the
        pass-to-pass noise of a last-mini-batch loss with dropout, so would run to ``max_passes``).
    num_pre_loss : int
        M, the window of pass losses for the stop test (10).
    max_passes : int
        Cap on the passes of the first ALA round (20; not in the reference); reaching it is logged.
    mode : {"train", "eval"}
        Mode of the temporary model while learning W.

    ValueError naming the field and range for a value out of range.
    """

    eta: float = 1.0
    rand_percent: float = 80.0
    layer_idx: int = 2
    threshold: float = 0.1
    num_pre_loss: int = 10
    max_passes: int = 20
    mode: Literal["train", "eval"] = "train"

    def __post_init__(self) -> None:
        if not (isinstance(self.eta, int | float) and math.isfinite(self.eta) and self.eta >= 0):
            raise ValueError(f"AlaConfig.eta must be finite and >= 0, got {self.eta!r}")
        if not (isinstance(self.rand_percent, int | float) and 0 < self.rand_percent <= 100):
            raise ValueError(f"AlaConfig.rand_percent must be in (0, 100], got {self.rand_percent!r}")
        if not isinstance(self.layer_idx, int) or self.layer_idx < 0:
            raise ValueError(f"AlaConfig.layer_idx must be an integer >= 0 (0 = all tensors), got {self.layer_idx!r}")
        if not (isinstance(self.threshold, int | float) and math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"AlaConfig.threshold must be finite and >= 0, got {self.threshold!r}")
        if not isinstance(self.num_pre_loss, int) or self.num_pre_loss < 1:
            raise ValueError(f"AlaConfig.num_pre_loss must be an integer >= 1, got {self.num_pre_loss!r}")
        if not isinstance(self.max_passes, int) or self.max_passes < 1:
            raise ValueError(f"AlaConfig.max_passes must be an integer >= 1, got {self.max_passes!r}")
        if self.mode not in ("train", "eval"):
            raise ValueError(f"AlaConfig.mode must be 'train' or 'eval', got {self.mode!r}")


LR_SCHEDULES = ("constant", "cosine", "step")
"""The kinds of :class:`LrSchedule`."""


@dataclass(frozen=True)
class LrSchedule:
    """The client learning rate across rounds: a linear warm-up, then constant, cosine or step decay.

    The coordinator sends base lr times :meth:`factor` as the plan's ``lr``; clients need nothing new.

    Parameters
    ----------
    kind : {"constant", "cosine", "step"}
        Cosine: half a cosine from 1 towards ``min_factor`` over the remaining rounds (Loshchilov
        and Hutter, ICLR 2017, eq. 5, no restarts); step: ``step_gamma`` times smaller every ``step_every`` rounds.
    warmup_rounds : int >= 0
        Round r < W trains at (r + 1) / (W + 1) of the lr (Goyal et al. 2017, section 2.2).
    min_factor : float in [0, 1]
        The cosine's floor; the last round is one step short of it, so it still trains.

    ValueError naming the field and its flag for a value out of range.
    """

    kind: Literal["constant", "cosine", "step"] = field(
        default="constant", metadata=doc("client lr across rounds after the warm-up", choices=LR_SCHEDULES, flag="--lr-schedule")
    )
    warmup_rounds: int = field(
        default=0, metadata=doc("rounds of linear lr warm-up: round r < W trains at (r+1)/(W+1) of the lr", "rounds",
                                flag="--lr-warmup")
    )
    min_factor: float = field(
        default=0.0, metadata=doc("cosine schedule: the lr's floor, as a share of --lr, in [0, 1]", flag="--lr-min-factor")
    )
    step_every: int = field(default=5, metadata=doc("step schedule: rounds between lr steps", "rounds", flag="--lr-step-every"))
    step_gamma: float = field(
        default=0.5, metadata=doc("step schedule: factor of each lr step, in (0, 1]", flag="--lr-step-gamma")
    )

    def __post_init__(self) -> None:
        if self.kind not in LR_SCHEDULES:
            raise ValueError(f"LrSchedule.kind (--lr-schedule) must be one of {list(LR_SCHEDULES)}, got {self.kind!r}")
        if isinstance(self.warmup_rounds, bool) or not isinstance(self.warmup_rounds, int) or self.warmup_rounds < 0:
            raise ValueError(f"LrSchedule.warmup_rounds (--lr-warmup) must be an integer >= 0, got {self.warmup_rounds!r}")
        if not (isinstance(self.min_factor, int | float) and 0 <= self.min_factor <= 1):
            raise ValueError(f"LrSchedule.min_factor (--lr-min-factor) must be in [0, 1], got {self.min_factor!r}")
        if isinstance(self.step_every, bool) or not isinstance(self.step_every, int) or self.step_every < 1:
            raise ValueError(f"LrSchedule.step_every (--lr-step-every) must be an integer >= 1, got {self.step_every!r}")
        if not (isinstance(self.step_gamma, int | float) and 0 < self.step_gamma <= 1):
            raise ValueError(f"LrSchedule.step_gamma (--lr-step-gamma) must be in (0, 1], got {self.step_gamma!r}")

    @property
    def is_constant(self) -> bool:
        """True when every round trains at the full lr (the default)."""
        return self.warmup_rounds == 0 and (
            self.kind == "constant" or (self.kind == "step" and self.step_gamma == 1)
            or (self.kind == "cosine" and self.min_factor == 1)
        )

    def factor(self, round_: int, rounds: int) -> float:
        """The share, in (0, 1], of the base lr that round ``round_`` (0-based) of ``rounds`` trains at.

        ValueError if ``rounds < 1`` or ``round_ < 0``.
        """
        if rounds < 1 or round_ < 0:
            raise ValueError(f"LrSchedule.factor: need rounds >= 1 and round >= 0, got round {round_} of {rounds}")
        w = self.warmup_rounds
        if round_ < w:
            return (round_ + 1) / (w + 1)
        t = round_ - w
        if self.kind == "cosine":
            span = max(1, rounds - w)
            return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * min(t, span) / span))
        if self.kind == "step":
            return float(self.step_gamma ** (t // self.step_every))
        return 1.0

    def label(self) -> str:
        """Short text, e.g. ``cosine(warmup 1)``, ``constant``."""
        parts = []
        if self.warmup_rounds:
            parts.append(f"warmup {self.warmup_rounds}")
        if self.kind == "cosine" and self.min_factor:
            parts.append(f"floor {self.min_factor:g}")
        if self.kind == "step":
            parts.append(f"x{self.step_gamma:g} every {self.step_every}")
        return self.kind + (f"({', '.join(parts)})" if parts else "")
