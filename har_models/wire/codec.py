"""Model codec: named tensors <-> safetensors bytes inside a small versioned envelope.

Wire layout of one envelope (all integers little-endian)::

    b"FHAR"            4 bytes  magic
    version            u16      envelope format version (ENVELOPE_VERSION)
    header_len         u32      length of the JSON header in bytes
    header             JSON     {"kind", "round", "arch_version", "client_id",
                                 "body_len", "sha256", "meta"}
    body               bytes    safetensors serialisation of the tensors

Nothing is unpickled; numpy only (:mod:`har_models.wire.safetensors_np` writes the bytes
``safetensors.numpy.save`` writes), so a device without PyTorch reads models. Each failure
raises its own :class:`EnvelopeError` subclass with a ``reason`` code.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from har_models.tensor_check import EnvelopeError as EnvelopeError  # the shape checks' errors, re-exported here
from har_models.tensor_check import NonFinite as NonFinite
from har_models.tensor_check import WrongTensors as WrongTensors
from har_models.tensor_check import check_tensors as check_tensors
from har_models.wire.safetensors_np import SafetensorError
from har_models.wire.safetensors_np import layout as st_layout
from har_models.wire.safetensors_np import load as st_load

MAGIC = b"FHAR"
ENVELOPE_VERSION = 1
_FIXED = struct.Struct("<4sHI")  # magic, version, header_len
MAX_HEADER_BYTES = 1 << 20
KINDS = ("model", "update", "program")
"""Envelope kinds: a model (coordinator), an update (client), ExecuTorch programs (coordinator, to a client that asked)."""


class BadMagic(EnvelopeError):
    """The bytes do not start with ``b"FHAR"``: not a fedhar envelope."""

    reason = "bad_magic"


class UnknownVersion(EnvelopeError):
    """Envelope format version this build cannot read."""

    reason = "unknown_version"


class Truncated(EnvelopeError):
    """Fewer (or more) bytes than the header announces."""

    reason = "truncated"


class BadHeader(EnvelopeError):
    """The JSON header is malformed or lacks a field."""

    reason = "bad_header"


class ChecksumMismatch(EnvelopeError):
    """The body's sha256 differs from the header's."""

    reason = "sha256_mismatch"


class BadBody(EnvelopeError):
    """The body is not a valid safetensors serialisation."""

    reason = "bad_body"


class Oversized(EnvelopeError):
    """The envelope is larger than the receiver accepts."""

    reason = "oversized"


@dataclass(frozen=True)
class Envelope:
    """A decoded envelope.

    ``client_id``: sender (updates) or addressee (personalised models), "" for a global model;
    ``meta``: free JSON metadata; ``sha256``: the body's hex digest (the header's when
    ``verified`` was given); ``size``: envelope bytes.
    """

    kind: str
    round: int
    arch_version: int
    client_id: str
    tensors: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""
    size: int = 0


def _as_numpy(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):  # torch.Tensor, without importing torch here
        t = t.detach().cpu().contiguous().numpy()
    a = np.asarray(t)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a)


def encode(
    tensors: Mapping[str, Any],
    *,
    kind: str,
    round: int,
    arch_version: int,
    client_id: str = "",
    meta: Mapping[str, Any] | None = None,
) -> bytes:
    """Serialise tensors (any shape; float and integer dtypes round-trip bit-exactly) into envelope bytes.

    ValueError on an unknown kind, a negative round or version, or non-JSON metadata.
    """
    if kind not in KINDS:
        raise ValueError(f"encode: kind must be one of {KINDS}, got {kind!r}")
    if round < 0 or arch_version < 0:
        raise ValueError(f"encode: round ({round}) and arch_version ({arch_version}) must be >= 0")
    # The body is hashed where its pieces lie, then every piece is copied once, into the envelope.
    st_head, arrays = st_layout({name: _as_numpy(t) for name, t in tensors.items()})
    digest = hashlib.sha256(st_head)
    for a in arrays:
        digest.update(a)
    header = {
        "kind": kind,
        "round": int(round),
        "arch_version": int(arch_version),
        "client_id": str(client_id),
        "body_len": len(st_head) + sum(a.nbytes for a in arrays),
        "sha256": digest.hexdigest(),
        "meta": dict(meta or {}),
    }
    try:
        hbytes = json.dumps(header, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"encode: metadata is not plain JSON ({exc})") from None
    return b"".join([_FIXED.pack(MAGIC, ENVELOPE_VERSION, len(hbytes)), hbytes, st_head, *arrays])


def peek_header(data: bytes) -> dict[str, Any]:
    """The JSON header of an envelope, without checking the body; BadMagic, UnknownVersion, Truncated or BadHeader."""
    if len(data) < _FIXED.size:
        raise Truncated(f"envelope of {len(data)} bytes is shorter than its {_FIXED.size}-byte fixed header")
    magic, version, hlen = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise BadMagic(f"envelope starts with {magic!r}, expected {MAGIC!r}")
    if version != ENVELOPE_VERSION:
        raise UnknownVersion(f"envelope format version {version}; this build reads version {ENVELOPE_VERSION}; upgrade fedhar")
    if hlen > MAX_HEADER_BYTES or _FIXED.size + hlen > len(data):
        raise Truncated(f"envelope header announces {hlen} bytes but only {len(data) - _FIXED.size} follow")
    try:
        header = json.loads(bytes(data[_FIXED.size : _FIXED.size + hlen]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadHeader(f"envelope header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise BadHeader("envelope header is not a JSON object")
    for key, typ in (
        ("kind", str),
        ("round", int),
        ("arch_version", int),
        ("client_id", str),
        ("body_len", int),
        ("sha256", str),
    ):
        if not isinstance(header.get(key), typ) or isinstance(header.get(key), bool):
            raise BadHeader(f"envelope header field {key!r} missing or not a {typ.__name__}: {header.get(key)!r}")
    if header["kind"] not in KINDS:
        raise BadHeader(f"envelope kind {header['kind']!r} unknown; expected one of {KINDS}")
    if not isinstance(header.get("meta", {}), dict):
        raise BadHeader("envelope header field 'meta' is not an object")
    header["_header_len"] = hlen
    return header


def decode(data: bytes, *, max_bytes: int | None = None, require_finite: bool = True, verified: str | None = None) -> Envelope:
    """Parse and verify an envelope.

    ``max_bytes`` rejects larger envelopes; ``require_finite`` rejects NaN or inf. ``verified``
    (64 hex digits) is the sha256 of the whole of ``data`` as checked by a caller against the
    sender's name for it (the transfer id :meth:`har_models.wire.chunking.Reassembler.add`
    delivered it under); the body digest is then not recomputed, since the whole digest covers it.
    Bytes from disk are decoded without it.

    Raises
    ------
    EnvelopeError
        :class:`Oversized`, :class:`BadMagic`, :class:`UnknownVersion`, :class:`Truncated`,
        :class:`BadHeader`, :class:`ChecksumMismatch`, :class:`BadBody`, :class:`NonFinite`.
    """
    if verified is not None and (len(verified) != 64 or not all(c in "0123456789abcdef" for c in verified)):
        raise ValueError(f"decode: verified must be the 64 hex digits of a sha256, got {verified!r}")
    if max_bytes is not None and len(data) > max_bytes:
        raise Oversized(f"envelope of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    header = peek_header(data)
    start = _FIXED.size + header["_header_len"]
    body = memoryview(data if isinstance(data, bytes) else bytes(data))[start:]  # a view: the body is not copied
    if len(body) != header["body_len"]:
        raise Truncated(f"envelope body is {len(body)} bytes, header announces {header['body_len']}")
    if verified is None:
        digest = hashlib.sha256(body).hexdigest()
        if digest != header["sha256"]:
            raise ChecksumMismatch(f"envelope body sha256 {digest[:16]}... differs from header {header['sha256'][:16]}...")
    else:
        digest = header["sha256"]  # the whole envelope, this digest included, matched what its sender named
    try:
        tensors = st_load(body)  # copies of the tensors: nothing decoded keeps ``data`` alive
    except (SafetensorError, ValueError, TypeError, OSError) as exc:
        raise BadBody(f"envelope body is not valid safetensors ({exc})") from None
    if require_finite:
        for name, arr in tensors.items():
            if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                raise NonFinite(f"tensor {name!r} holds NaN or inf")
    return Envelope(
        kind=header["kind"],
        round=header["round"],
        arch_version=header["arch_version"],
        client_id=header["client_id"],
        tensors=dict(tensors),
        meta=header.get("meta", {}),
        sha256=digest,
        size=len(data),
    )


