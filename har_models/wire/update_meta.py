"""The metadata an update envelope carries (``meta`` of :func:`har_models.wire.codec.encode` with ``kind="update"``).

:class:`UpdateMeta` is written by :class:`edge_client.trainer.ClientTrainer`;
:meth:`UpdateMeta.to_wire` keeps the key order of the bytes clients always wrote:

``run_id, stage, n_train, n_test, label_set, train_loss, train_seconds, steps, init_mode, ala,
[backend], confusion, [encoding]``

``backend`` only when not ``"torch"``, ``encoding`` only when not ``"float32"``; missing, they
read as those. ``ala`` is ``{}`` when FedALA did not run. :meth:`UpdateMeta.from_wire` reads
strictly (tests, tools) or leniently (the coordinator's intake, docs/protocol.md "Update
metadata"). No PyTorch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from har_models.wire.messages import DEFAULT_UPDATE_ENCODING, MAX_WINDOW_COUNT

__all__ = ["INTAKE_DEFAULTS", "AlaNote", "Confusions", "UpdateMeta", "UpdateMetaError"]

Matrix = tuple[tuple[int, ...], ...]


INTAKE_DEFAULTS: dict[str, Any] = {
    "stage": 0,
    "label_set": "unnamed",
    "train_loss": [],
    "train_seconds": 0.0,
    "steps": 0,
    "init_mode": "received",
}
"""What a missing key reads as in the lenient reading; the coordinator never needed these keys to aggregate."""


class UpdateMetaError(ValueError):
    """Update metadata that cannot be read; ``key`` names the top-level key at fault (None: several or the object)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def _count(value: object, what: str) -> int:
    # Bounded where it enters: 10**30 or 2**63-1 would overflow numpy, or outweigh every other
    # device in a weighted average (har_models.wire.messages.MAX_WINDOW_COUNT).
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WINDOW_COUNT:
        raise ValueError(f"update metadata: {what} must be an integer in [0, {MAX_WINDOW_COUNT}], got {value!r:.40}")
    return value


def _text(value: object, what: str, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise ValueError(f"update metadata: {what} must be a non-empty string, got {value!r}")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"update metadata: {what} must be a number, got {value!r}")
    return float(value)


def _matrix(value: object, what: str) -> Matrix | None:
    if value is None:
        return None
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(
        isinstance(row, Sequence) and not isinstance(row, str) and len(row) == len(value) for row in value
    ):
        raise ValueError(f"update metadata: confusion matrix {what!r} must be a square list of lists of counts or null")
    return tuple(tuple(_count(c, f"confusion matrix {what!r} entry") for c in row) for row in value)


@dataclass(frozen=True)
class AlaNote:
    """What FedALA's initialisation did in this round (:class:`edge_client.ala.AlaResult`, in short).

    ``passes``: over the sample learning W (0: not learned); ``n_sample``: windows in the s%
    sample; ``converged``: the stop test passed; ``fallback``: why the received model was used
    unchanged, or None. ValueError naming the field on a negative count or a wrong type.
    """

    passes: int = 0
    n_sample: int = 0
    converged: bool = False
    fallback: str | None = None

    def __post_init__(self) -> None:
        _count(self.passes, "ala.passes")
        _count(self.n_sample, "ala.n_sample")
        if not isinstance(self.converged, bool):
            raise ValueError(f"update metadata: ala.converged must be a bool, got {self.converged!r}")
        if self.fallback is not None:
            _text(self.fallback, "ala.fallback")

    def to_wire(self) -> dict[str, Any]:
        """``{"passes", "n_sample", "converged", "fallback"}`` in that order."""
        return {"passes": self.passes, "n_sample": self.n_sample, "converged": self.converged, "fallback": self.fallback}


@dataclass(frozen=True)
class Confusions:
    """Confusion matrices ``(C, C)`` (rows truth, columns prediction) on the test windows of the model received.

    Initialised and trained; None without any.
    """

    received: Matrix | None = None
    initial: Matrix | None = None
    trained: Matrix | None = None

    @classmethod
    def of(cls, received: Any, initial: Any, trained: Any) -> Confusions:
        """From int arrays or nested lists (None stays None); ValueError if a matrix is not square or holds a bad count."""

        def conv(m: Any, what: str) -> Matrix | None:
            return None if m is None else _matrix([[int(c) for c in row] for row in m], what)

        return cls(conv(received, "received"), conv(initial, "initial"), conv(trained, "trained"))

    def to_wire(self) -> dict[str, list[list[int]] | None]:
        """``{"received", "initial", "trained"}``, each a list of lists or None."""
        pairs = (("received", self.received), ("initial", self.initial), ("trained", self.trained))
        return {k: None if m is None else [list(r) for r in m] for k, m in pairs}


@dataclass(frozen=True)
class UpdateMeta:
    """The metadata of one client update (wire keys in the module docstring); ValueError naming a field of wrong type or range.

    Attributes
    ----------
    stage : int
        FedDist stage of the exchange (0 except in a growth's second stage).
    n_train, n_test : int
        The client's training (FedAvg's n_k) and test windows.
    train_loss : tuple of float
        Mean cross-entropy of each local epoch, nats.
    train_seconds : float
        Local training (and guidance pass), s.
    init_mode : str
        "received", "fedper", "ala", or "received (why)".
    ala : AlaNote or None
        FedALA's account when it ran.
    """

    run_id: str
    stage: int
    n_train: int
    n_test: int
    label_set: str
    train_loss: tuple[float, ...]
    train_seconds: float
    steps: int
    init_mode: str
    ala: AlaNote | None = None
    backend: str = "torch"
    confusion: Confusions = Confusions()
    encoding: str = DEFAULT_UPDATE_ENCODING

    def __post_init__(self) -> None:
        _text(self.run_id, "run_id")
        _count(self.stage, "stage")
        _count(self.n_train, "n_train")
        _count(self.n_test, "n_test")
        _text(self.label_set, "label_set")
        if not isinstance(self.train_loss, tuple):
            raise ValueError(f"update metadata: train_loss must be a tuple of numbers, got {type(self.train_loss).__name__}")
        for v in self.train_loss:
            _number(v, "train_loss entry")
        if not math.isfinite(_number(self.train_seconds, "train_seconds")) or self.train_seconds < 0:
            raise ValueError(f"update metadata: train_seconds must be finite and >= 0, got {self.train_seconds!r}")
        _count(self.steps, "steps")
        _text(self.init_mode, "init_mode")
        if self.ala is not None and not isinstance(self.ala, AlaNote):
            raise ValueError(f"update metadata: ala must be an AlaNote or None, got {type(self.ala).__name__}")
        _text(self.backend, "backend")
        if not isinstance(self.confusion, Confusions):
            raise ValueError(f"update metadata: confusion must be Confusions, got {type(self.confusion).__name__}")
        _text(self.encoding, "encoding")

    def to_wire(self) -> dict[str, Any]:
        """The envelope's JSON object, keys in the order of the module docstring."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "stage": self.stage,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "label_set": self.label_set,
            "train_loss": list(self.train_loss),
            "train_seconds": self.train_seconds,
            "steps": self.steps,
            "init_mode": self.init_mode,
            "ala": {} if self.ala is None else self.ala.to_wire(),
        }
        if self.backend != "torch":
            out["backend"] = self.backend
        out["confusion"] = self.confusion.to_wire()
        if self.encoding != DEFAULT_UPDATE_ENCODING:
            out["encoding"] = self.encoding
        return out

    @classmethod
    def from_wire(cls, meta: Mapping[str, Any], *, strict: bool = True) -> UpdateMeta:
        """Read an envelope's metadata, validating every key present.

        ``strict``: every non-optional key (all but ``ala``, ``backend``, ``confusion``, ``encoding``)
        required and no other. Lenient (the coordinator's intake): unknown keys ignored at every
        level, only ``run_id``, ``n_train`` and ``n_test`` required, a missing key reads as
        :data:`INTAKE_DEFAULTS`. UpdateMetaError naming the key (``key``: the top-level one) otherwise.
        """
        if not isinstance(meta, Mapping):
            raise UpdateMetaError(f"update metadata must be a JSON object, got {type(meta).__name__}")
        required = {"run_id", "stage", "n_train", "n_test", "label_set", "train_loss", "train_seconds", "steps", "init_mode"}
        known = required | {"ala", "backend", "confusion", "encoding"}
        if strict:
            unknown = sorted(set(meta) - known)
            if unknown:
                raise UpdateMetaError(f"update metadata: unknown keys {unknown}; known {sorted(known)}", unknown[0])
        else:
            required = {"run_id", "n_train", "n_test"}
            meta = {**INTAKE_DEFAULTS, **{k: v for k, v in meta.items() if k in known}}
        missing = sorted(required - set(meta))
        if missing:
            raise UpdateMetaError(f"update metadata: missing keys {missing}", missing[0])

        def at(key: str | None, read: Any) -> Any:
            try:
                return read()
            except ValueError as exc:
                raise UpdateMetaError(str(exc), key) from None

        run_id = at("run_id", lambda: _text(meta["run_id"], "run_id"))
        stage = at("stage", lambda: _count(meta["stage"], "stage"))
        n_train = at("n_train", lambda: _count(meta["n_train"], "n_train"))
        n_test = at("n_test", lambda: _count(meta["n_test"], "n_test"))
        ala_raw = meta.get("ala", {})
        if not isinstance(ala_raw, Mapping):
            raise UpdateMetaError(f"update metadata: ala must be an object, got {ala_raw!r:.80}", "ala")
        ala = None
        if ala_raw:
            extra = sorted(set(ala_raw) - {"passes", "n_sample", "converged", "fallback"})
            if extra and strict:
                raise UpdateMetaError(f"update metadata: unknown ala keys {extra}", "ala")
            ala = at(
                "ala",
                lambda: AlaNote(
                    ala_raw.get("passes", 0), ala_raw.get("n_sample", 0), ala_raw.get("converged", False), ala_raw.get("fallback")
                ),
            )
        conf = meta.get("confusion", {})
        if not isinstance(conf, Mapping) or (strict and set(conf) - {"received", "initial", "trained"}):
            raise UpdateMetaError(
                f"update metadata: confusion must be an object with received, initial, trained, got {str(conf)[:80]}", "confusion"
            )
        confusion = at("confusion", lambda: Confusions(*(_matrix(conf.get(k), k) for k in ("received", "initial", "trained"))))
        loss = meta["train_loss"]
        if not isinstance(loss, list | tuple):
            raise UpdateMetaError(f"update metadata: train_loss must be a list of numbers, got {loss!r:.80}", "train_loss")
        return at(
            None,
            lambda: cls(
                run_id=run_id,
                stage=stage,
                n_train=n_train,
                n_test=n_test,
                label_set=meta["label_set"],
                train_loss=tuple(_number(v, "train_loss entry") for v in loss),
                train_seconds=_number(meta["train_seconds"], "train_seconds"),
                steps=meta["steps"],
                init_mode=meta["init_mode"],
                ala=ala,
                backend=meta.get("backend", "torch"),
                confusion=confusion,
                encoding=meta.get("encoding", DEFAULT_UPDATE_ENCODING),
            ),
        )
