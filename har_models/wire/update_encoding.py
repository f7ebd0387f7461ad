"""Encodings of what clients upload: float32 (as trained), float16, or 8-bit deltas with error feedback.

The training plan names the encoding (``TrainingPlan.update_encoding``); the client encodes
its update just before :func:`har_models.wire.codec.encode` and writes the encoding's name into
the envelope's metadata (``meta["encoding"]``; absent means float32, so a float32 envelope
is byte for byte what it was before encodings existed). The receiver decodes with
:func:`decode_update` and rejects an encoding it does not know (reason ``unknown_encoding``).

Encodings, for a trained tensor t and the tensor r of the model the client received in
this exchange:

``float32``
    t unchanged (4 bytes per parameter).
``float16``
    t cast to IEEE half precision (2 bytes); relative error at most 2^-11 for
    |t| >= 2^-14 (half's normal range), absolute error at most 2^-25 below it.
    |t| > 65504 cannot be represented and is refused by the encoder.
``int8_delta``
    8-bit quantised delta with one scale per tensor and error feedback (1 byte plus 4 bytes
    per tensor). With e the residual the client kept from its previous upload (zeros at
    first, and for a tensor whose shape changed, e.g. after a FedDist growth)::

        d  = t - r + e
        s  = max|d| / 127            (1 where d is all zero)
        q  = clip(round(d / s), -127, 127)        as int8
        e' = d - q s                 kept by the client for its next upload

    The receiver rebuilds r + q s, so |error| <= s / 2 per element; and because e' goes
    back into the next delta, the error of the sum of uploads over R rounds is one
    step's e'_R, not R of them (error feedback: Seide et al., "1-bit stochastic gradient
    descent", Interspeech 2014; Karimireddy et al., "Error feedback fixes SignSGD", ICML
    2019, algorithm 2). The scale of tensor ``name`` travels as the float32 tensor
    ``scale/<name>`` of shape (1,). FedDWA guidance tensors (``guidance/<name>``) are
    coded against the same received tensor ``<name>`` without error feedback (the
    guidance model is a one-off each round).

Pure numpy: no PyTorch, no I/O; both trainers and the coordinator call these functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from har_models.wire import codec
from har_models.wire.messages import DEFAULT_UPDATE_ENCODING, GUIDANCE_PREFIX, UPDATE_ENCODINGS

ENCODINGS = UPDATE_ENCODINGS
"""The encodings this build reads and writes: ``("float32", "float16", "int8_delta")``."""

SCALE_PREFIX = "scale/"
"""Reserved name prefix of int8_delta's per-tensor scales inside an update envelope."""

FLOAT16_MAX = float(np.finfo(np.float16).max)
"""Largest magnitude float16 holds (65504); larger values are refused, not sent as inf."""

_QMAX = 127

Arrays = dict[str, np.ndarray]


class UnknownEncoding(codec.EnvelopeError):
    """The envelope names an update encoding this build does not know."""

    reason = "unknown_encoding"


class BadEncoding(codec.EnvelopeError):
    """The tensors do not fit the encoding the envelope names (dtype, missing scale, no reference)."""

    reason = "bad_encoding"


def check_encoding(encoding: Any) -> str:
    """``encoding`` if it is one of :data:`ENCODINGS`.

    Raises
    ------
    UnknownEncoding
        Naming the value and the encodings this build knows.
    """
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise UnknownEncoding(f"update encoding {str(encoding)[:40]!r} is unknown to this receiver; it reads {list(ENCODINGS)}")
    return encoding


def _f32(t: Any) -> np.ndarray:
    """float32 view or copy of an array-like (a torch tensor is read without importing torch)."""
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    return np.asarray(t, dtype=np.float32)


def _base_name(name: str) -> str:
    return name[len(GUIDANCE_PREFIX) :] if name.startswith(GUIDANCE_PREFIX) else name


def quantise(d: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Symmetric 8-bit quantisation of one tensor with one scale.

    Parameters
    ----------
    d : ndarray of float32, any shape
        Finite values.

    Returns
    -------
    q : ndarray of int8, shape of ``d``
        ``clip(round(d / s), -127, 127)`` (round half to even).
    s : float32
        ``max|d| / 127``; 1.0 where that is 0 (an all-zero tensor, or one so small that the
        division underflows: it then quantises to zeros and stays in the residual).

    Raises
    ------
    ValueError
        If ``d`` holds NaN or inf.
    """
    if d.size and not np.isfinite(d).all():
        raise ValueError("quantise: the delta holds NaN or inf; the trained model diverged")
    m = np.float32(np.abs(d).max()) if d.size else np.float32(0.0)
    s = np.float32(m / np.float32(_QMAX))
    if not s > 0:
        s = np.float32(1.0)
    q = np.clip(np.rint(d / s), -_QMAX, _QMAX).astype(np.int8)
    return q, s


def encode_update(
    tensors: Mapping[str, Any],
    received: Mapping[str, Any] | None,
    encoding: str,
    residual: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Arrays]:
    """Encode an update's tensors for the envelope.

    Parameters
    ----------
    tensors : mapping name -> array-like
        The trained model (and ``guidance/<name>`` tensors for FedDWA), any shapes.
    received : mapping name -> array-like, or None
        The model the client received in this exchange (names without prefix, shapes of
        ``tensors``); needed for ``int8_delta`` only.
    encoding : {"float32", "float16", "int8_delta"}
    residual : mapping name -> float32 array, optional
        int8_delta's error-feedback residual e from the previous upload; a missing or
        differently shaped entry counts as zeros.

    Returns
    -------
    arrays : dict name -> array
        What :func:`har_models.wire.codec.encode` should serialise. For float32 it is
        ``tensors`` itself, object for object, so the envelope is unchanged.
    meta : dict
        Fields to merge into the envelope metadata: ``{}`` for float32, else
        ``{"encoding": encoding}``.
    new_residual : dict name -> float32 array
        e' of every non-guidance tensor for int8_delta; ``{}`` for the other encodings.

    Raises
    ------
    UnknownEncoding
        For an encoding not in :data:`ENCODINGS`.
    ValueError
        For int8_delta without ``received`` or with a tensor missing from it or shaped
        differently; for float16 with a value beyond +-65504; for a tensor name that uses
        the reserved prefix ``scale/``; for a non-finite delta.
    """
    check_encoding(encoding)
    if encoding == "float32":
        return dict(tensors), {}, {}
    for name in tensors:
        if name.startswith(SCALE_PREFIX):
            raise ValueError(f"encode_update: tensor name {name!r} uses the reserved prefix {SCALE_PREFIX!r}; rename the tensor")
    if encoding == "float16":
        out16: dict[str, Any] = {}
        for name, t in tensors.items():
            a = _f32(t)
            if a.size and np.abs(a).max() > FLOAT16_MAX:
                raise ValueError(
                    f"encode_update: tensor {name!r} holds |value| {float(np.abs(a).max()):.3g} > {FLOAT16_MAX:g}, "
                    "beyond float16; use update_encoding 'float32' or 'int8_delta'"
                )
            out16[name] = a.astype(np.float16)
        return out16, {"encoding": encoding}, {}
    if received is None:
        raise ValueError("encode_update: int8_delta needs the received model to code deltas against; pass received=")
    residual = residual or {}
    arrays: dict[str, Any] = {}
    new_residual: Arrays = {}
    for name, t in tensors.items():
        base = _base_name(name)
        if base not in received:
            raise ValueError(f"encode_update: tensor {name!r} has no counterpart {base!r} in the received model")
        a, r = _f32(t), _f32(received[base])
        if a.shape != r.shape:
            raise ValueError(f"encode_update: tensor {name!r} has shape {a.shape}, the received {base!r} has {r.shape}")
        d = a - r
        feedback = name == base
        if feedback:
            e = residual.get(name)
            if e is not None and np.shape(e) == d.shape:
                d = d + np.asarray(e, dtype=np.float32)
        q, s = quantise(d)
        arrays[name] = q
        arrays[SCALE_PREFIX + name] = np.array([s], dtype=np.float32)
        if feedback:
            new_residual[name] = d - q.astype(np.float32) * s
    return arrays, {"encoding": encoding}, new_residual


def decode_update(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], reference: Mapping[str, Any] | None) -> Arrays:
    """Decode an update's tensors to float32 according to ``meta["encoding"]``.

    Parameters
    ----------
    arrays : mapping name -> ndarray
        The envelope's tensors.
    meta : mapping
        The envelope's metadata; ``"encoding"`` absent means float32.
    reference : mapping name -> array-like, or None
        The model the receiver published to this client in this exchange (what the client
        coded its deltas against); needed for int8_delta only.

    Returns
    -------
    dict name -> float32 ndarray
        The tensors as trained, up to the encoding's error (see the module docstring);
        int8_delta's ``scale/`` entries are consumed.

    Raises
    ------
    UnknownEncoding
        ``meta["encoding"]`` is not one this build knows (reason ``unknown_encoding``).
    BadEncoding
        A tensor of the wrong dtype for the encoding, a code of -128 (outside the symmetric
        range the encoder writes), a missing, misshaped, non-finite or non-positive scale, a
        scale without its tensor, or int8_delta without a reference.
    codec.WrongTensors
        An int8_delta tensor without a counterpart in ``reference``, or shaped differently.
    codec.NonFinite
        A rebuilt tensor that overflowed to inf.
    """
    encoding = check_encoding(meta.get("encoding", DEFAULT_UPDATE_ENCODING))
    if encoding == "float32":
        return {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
    if encoding == "float16":
        out: Arrays = {}
        for name, v in arrays.items():
            if v.dtype != np.float16:
                raise BadEncoding(f"float16 update: tensor {name!r} is {v.dtype}, expected float16")
            out[name] = v.astype(np.float32)
        return out
    if reference is None:
        raise BadEncoding("int8_delta update: the receiver has no reference model for this client to add the deltas to")
    scales = {k[len(SCALE_PREFIX) :]: v for k, v in arrays.items() if k.startswith(SCALE_PREFIX)}
    deltas = {k: v for k, v in arrays.items() if not k.startswith(SCALE_PREFIX)}
    orphans = sorted(set(scales) - set(deltas))
    if orphans:
        raise BadEncoding(f"int8_delta update: scales without a tensor: {orphans[:5]}")
    out = {}
    for name, q in deltas.items():
        if q.dtype != np.int8:
            raise BadEncoding(f"int8_delta update: tensor {name!r} is {q.dtype}, expected int8")
        if q.size and int(q.min()) < -_QMAX:
            # The encoder clips to [-127, 127]; -128 is outside the symmetric code, so it was not
            # written by a fedhar encoder (a sender bug or a forged payload).
            raise BadEncoding(f"int8_delta update: tensor {name!r} holds -128; the code is symmetric in [-127, 127]")
        s = scales.get(name)
        if s is None or s.dtype != np.float32 or s.shape != (1,) or not (np.isfinite(s[0]) and s[0] > 0):
            got = "missing" if s is None else f"{s.dtype} of shape {s.shape}"
            raise BadEncoding(f"int8_delta update: scale of {name!r} must be a finite positive float32 of shape (1,), got {got}")
        base = _base_name(name)
        if base not in reference:
            raise codec.WrongTensors(f"int8_delta update: tensor {name!r} has no counterpart {base!r} in the published model")
        r = _f32(reference[base])
        if r.shape != q.shape:
            raise codec.WrongTensors(f"int8_delta update: tensor {name!r} has shape {q.shape}, the published {base!r} has {r.shape}")
        with np.errstate(over="ignore"):
            v = r + q.astype(np.float32) * s[0]
        if not np.isfinite(v).all():
            raise codec.NonFinite(f"int8_delta update: tensor {name!r} overflows float32 when rebuilt")
        out[name] = v
    return out
