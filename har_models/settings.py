"""Typed settings shared by the coordinator and the edge client: each default written once.

Every setting is a dataclass field whose ``metadata`` carries its meaning (``help``) and
unit; command lines and TOML files are generated from these fields (:mod:`har_io.cli`),
and anything that arrives as a mapping (a TOML table, the ``ala`` object of a round
announcement) goes through :func:`from_mapping`, so an unknown key or a wrong type fails
at the entrance with the key, the value and what is allowed.
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
    help : str
        Meaning of the setting, shown by ``--help``.
    unit : str
        Unit (``"s"``, ``"bytes"``, ``"rounds"``), appended to the help.
    flag : str
        Command-line flag when it differs from ``--field-name``.
    choices : tuple of str
        Allowed values.
    cli : bool
        False for settings a program fills in itself (run folder, broker), not offered as options.
    kind : str
        ``"json"`` for a nested settings object given on the command line as a JSON object;
        ``"table"`` for a nested settings object whose own fields are options (each with its
        own flag) and which a TOML file holds as a table named after the field.
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
    """Build the settings dataclass ``cls`` from a mapping, refusing anything unexpected.

    Parameters
    ----------
    cls : dataclass type
    data : mapping of str to JSON/TOML values
        Keys are field names; nested dataclass fields take a nested mapping.
    what : str
        Where the mapping came from, for the message (``"--ala"``, ``"run.toml [ala]"``).
    **given
        Fields the program sets itself (already typed: paths, broker settings); they win
        over ``data`` and are not type-checked here.

    Raises
    ------
    ValueError
        For an unknown key (naming the closest known one and listing all), a value of the
        wrong type, or a value the dataclass itself rejects.
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
    """Local training of one round: E = 1, lr 0.1, batch 32, balanced class weights.

    The FedDist protocol used E = 5 and lr 0.01. lr 0.1 had the best validation macro-F1 of
    the search in docs/results.md (0.03 and 0.1, 15 rounds on the HAPT blocks split).

    The one place these defaults are written; the coordinator's configuration, the
    training plan on the wire, :class:`har_models.nn.training.TrainConfig` and the baselines
    read them from here.
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
        eta, learning rate of the weights W (1.0 in the paper and the official code).
    rand_percent : float
        s, percentage of the local training windows sampled each round for learning W (80).
    layer_idx : int
        p counted in parameter *tensors* from the end of the model's registration order
        (2 = ``out.weight`` and ``out.bias`` = the paper's p = 1 layer; 4 also blends
        ``hidden.*``; 0 blends every tensor, the reference's convention).
    threshold : float
        tau: the first ALA round stops when the population std of the last ``num_pre_loss``
        pass losses is below it. Default 0.1, the official code's effective value (the
        client never overrides the class default); the README says the paper used 0.01. We
        take 0.1 because the recorded loss is that of the last mini-batch of a pass, computed
        with dropout active and on a reshuffled random sample, so its pass-to-pass noise is
        typically above 0.01 and 0.01 would nearly always run to ``max_passes``.
    num_pre_loss : int
        M, the window of pass losses for the stop test (10); at least M + 1 passes are needed.
    max_passes : int
        Cap on the passes of the first ALA round (20, i.e. about twice the M + 1 minimum);
        reaching it is logged. Not in the reference, which has no cap.
    mode : {"train", "eval"}
        Mode of the temporary model while learning W: "train" (dropout active, the common
        path of the reference) or "eval".

    Raises
    ------
    ValueError
        If a value is out of range (the message names the field and the accepted range).
        Unknown keys and wrong types are refused by :func:`from_mapping`.
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

    The coordinator multiplies the base lr by :meth:`factor` of the round and sends the
    product as the training plan's ``lr``, so a client needs nothing new to follow it. The
    default (constant, no warm-up) leaves the lr as given in every round.

    Parameters
    ----------
    kind : {"constant", "cosine", "step"}
        After the warm-up: constant; half a cosine from 1 down towards ``min_factor`` over
        the remaining rounds (Loshchilov and Hutter, ICLR 2017, eq. 5, one period, with
        one round as the time unit and no restarts); or ``step_gamma`` times smaller every
        ``step_every`` rounds.
    warmup_rounds : int >= 0
        Rounds of linear warm-up: round r < W trains at (r + 1) / (W + 1) of the lr (Goyal
        et al. 2017, section 2.2, with a round as the step), so round W is the first at the
        full lr.
    min_factor : float in [0, 1]
        The cosine's floor, as a share of the lr. The last round is one step short of the
        floor, so it still trains (with the floor 0 and 15 rounds, 1.1 % of the lr).
    step_every : int >= 1
        Rounds between two steps of the step decay (counted after the warm-up).
    step_gamma : float in (0, 1]
        Factor of each step.

    Raises
    ------
    ValueError
        If a value is out of range (the message names the field and its flag).
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
        """The share of the base lr that round ``round_`` (0-based) of ``rounds`` trains at, in (0, 1].

        Raises
        ------
        ValueError
            If ``rounds < 1`` or ``round_ < 0``.
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
