"""The metadata an update envelope carries (``meta`` of :func:`har_models.wire.codec.encode` with ``kind="update"``).

One typed record, :class:`UpdateMeta`, written by the client round
(:class:`edge_client.trainer.ClientTrainer`) and readable by anyone who receives an update.
:meth:`UpdateMeta.to_wire` gives the JSON object of the envelope, with the keys in this order
(the bytes of an update are those the client wrote before the record existed):

``run_id, stage, n_train, n_test, label_set, train_loss, train_seconds, steps, init_mode, ala,
[backend], confusion, [encoding]``

``backend`` is written only for a backend other than ``"torch"`` and ``encoding`` only for an
update encoding other than :data:`~har_models.wire.messages.DEFAULT_UPDATE_ENCODING` (``"float32"``,
:mod:`har_models.wire.update_encoding`); a missing key reads back as that default. ``ala`` is ``{}``
when FedALA did not run.

Two readings of the same object, one parser (:meth:`UpdateMeta.from_wire`): the strict one (tests,
tools) refuses unknown and missing keys; the coordinator's intake (``strict=False``, ``docs/protocol.md``,
"Update metadata") ignores keys it does not know, so a newer client's additions do not cost its update,
and needs only ``run_id``, ``n_train`` and ``n_test``; every key present is validated either way.

No PyTorch here (the phone decodes and writes these).
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
"""What a missing key reads as in the lenient reading (``UpdateMeta.from_wire(meta, strict=False)``).

Every client release has written these keys; the coordinator never needed them to aggregate, so
it has never refused an update without them, and it still does not."""


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

    Attributes
    ----------
    passes : int
        Passes over the sample spent learning W (0 when W was not learned).
    n_sample : int
        Windows in FedALA's s% sample.
    converged : bool
        Whether the first ALA round's stop test passed.
    fallback : str or None
        Why the received model was used unchanged ("first participation", "empty sample",
        "non-finite loss"), or None.

    Raises
    ------
    ValueError
        On a negative count or a wrong type (naming the field).
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
    """Confusion matrices ``(C, C)`` (rows: truth, columns: prediction) on the client's test windows, or None without any.

    Attributes
    ----------
    received : the model as received;  initial : after the initialisation (FedPer, FedALA);  trained : after training
    """

    received: Matrix | None = None
    initial: Matrix | None = None
    trained: Matrix | None = None

    @classmethod
    def of(cls, received: Any, initial: Any, trained: Any) -> Confusions:
        """From arrays (``numpy`` int matrices) or nested lists; None stays None.

        Raises
        ------
        ValueError
            If a matrix is not square or holds a negative or non-integer count.
        """

        def conv(m: Any, what: str) -> Matrix | None:
            return None if m is None else _matrix([[int(c) for c in row] for row in m], what)

        return cls(conv(received, "received"), conv(initial, "initial"), conv(trained, "trained"))

    def to_wire(self) -> dict[str, list[list[int]] | None]:
        """``{"received", "initial", "trained"}``, each a list of lists or None."""
        pairs = (("received", self.received), ("initial", self.initial), ("trained", self.trained))
        return {k: None if m is None else [list(r) for r in m] for k, m in pairs}


@dataclass(frozen=True)
class UpdateMeta:
    """The metadata of one client update (see the module docstring for the wire keys).

    Attributes
    ----------
    run_id : str
        The run the update belongs to.
    stage : int
        FedDist stage of the exchange (0 except in a growth's second stage).
    n_train, n_test : int
        The client's training and test windows (n_k of FedAvg; the test count for the metrics).
    label_set : str
        Name of the client's label set (``har_models.data.labels``).
    train_loss : tuple of float
        Mean training loss of each local epoch (cross-entropy, nats).
    train_seconds : float
        Seconds spent in local training (and the guidance pass).
    steps : int
        SGD steps of the local epochs.
    init_mode : str
        How the starting model was made: "received", "fedper", "ala", or "received (why)".
    ala : AlaNote or None
        FedALA's account when it ran.
    backend : str
        Training backend that produced the update ("torch", "numpy", "executorch").
    confusion : Confusions
    encoding : str
        Update encoding of the tensors ("float32", "float16", "int8_delta").

    Raises
    ------
    ValueError
        On a field of the wrong type or range (the message names the field).
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
        """Read an envelope's metadata (e.g. a received update's ``env.meta``), validating every key present.

        Parameters
        ----------
        meta : mapping
            The envelope's JSON object.
        strict : bool
            True: every key of the module docstring but the optional ones (``ala``, ``backend``,
            ``confusion``, ``encoding``) must be there, and no other. False (the coordinator's
            intake): keys this build does not know are ignored, at every level (``ala``,
            ``confusion``), and only ``run_id``, ``n_train`` and ``n_test`` are required; a
            missing key reads as :data:`INTAKE_DEFAULTS`.

        Raises
        ------
        UpdateMetaError
            If a key is missing, unknown (strict only) or of the wrong type or range; the message
            names it and ``key`` is the top-level key at fault.
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
