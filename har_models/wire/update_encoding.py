"""Encodings of what clients upload: float32 (as trained), float16, or 8-bit deltas with error feedback.

The plan names the encoding (``TrainingPlan.update_encoding``); the client writes it into
``meta["encoding"]`` (absent = float32, so a float32 envelope is byte for byte the old one).
For a trained tensor t and the received tensor r:

``float32``
    t unchanged (4 bytes per parameter).
``float16``
    t as IEEE half (2 bytes): relative error <= 2^-11 for |t| >= 2^-14, absolute <= 2^-25
    below; |t| > 65504 is refused.
``int8_delta``
    1 byte per parameter plus a float32 scale per tensor (``scale/<name>``, shape (1,)), with
    the residual e kept from the previous upload (zeros at first or after a shape change)::

        d  = t - r + e
        s  = max|d| / 127            (1 where d is all zero)
        q  = clip(round(d / s), -127, 127)        as int8
        e' = d - q s                 kept by the client for its next upload

    The receiver rebuilds r + q s (|error| <= s / 2); with error feedback the error of a sum
    of R uploads is one step's, not R (Seide et al., Interspeech 2014; Karimireddy et al.,
    ICML 2019, algorithm 2). FedDWA ``guidance/<name>`` tensors are coded against ``<name>``
    without feedback.

Pure numpy, no I/O.
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
    """``encoding`` if it is one of :data:`ENCODINGS`; UnknownEncoding naming it otherwise."""
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
    """Symmetric 8-bit quantisation of one finite float32 tensor with one scale.

    Returns ``(q, s)``: int8 ``clip(round(d / s), -127, 127)`` (half to even) and float32
    ``s = max|d| / 127``, 1.0 where that is 0 or underflows. ValueError for NaN or inf.
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

    ``received`` (the model received this exchange) is needed for ``int8_delta`` only;
    ``residual`` is its error feedback e (a missing or reshaped entry counts as zeros).

    Returns
    -------
    arrays : dict name -> array
        What :func:`har_models.wire.codec.encode` serialises (``tensors`` itself for float32).
    meta : dict
        ``{}`` for float32, else ``{"encoding": encoding}``.
    new_residual : dict name -> float32 array
        e' of every non-guidance tensor for int8_delta; ``{}`` otherwise.

    Raises
    ------
    UnknownEncoding
        For an encoding not in :data:`ENCODINGS`.
    ValueError
        int8_delta without ``received`` or a tensor missing or reshaped in it; float16 beyond
        +-65504; a name with the reserved prefix ``scale/``; a non-finite delta.
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
    """Decode an update's tensors to float32 according to ``meta["encoding"]`` (absent: float32).

    ``reference``: the model published to this client this exchange (int8_delta only). Returns
    the tensors as trained up to the encoding's error, ``scale/`` entries consumed.

    Raises
    ------
    UnknownEncoding
        An encoding this build does not know (``unknown_encoding``).
    BadEncoding
        A wrong dtype, a code of -128, a missing, misshaped, non-finite or non-positive scale, a
        scale without its tensor, or int8_delta without a reference.
    codec.WrongTensors
        An int8_delta tensor missing from ``reference`` or shaped differently.
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
