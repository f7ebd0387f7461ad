"""A small reader and writer of the safetensors format in numpy, for devices without the Rust wheel (no python-for-android recipe).

Writes the bytes ``safetensors.numpy.save`` writes (tests compare them) and reads anything it
writes. Format (huggingface/safetensors README, "Format"): 8 bytes header size N (u64 LE); N
bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` with optional
``"__metadata__"``, space-padded to a multiple of 8; then the tensors' LE C-order bytes,
without holes or overlaps.

Like the reference writer: tensors by dtype, widest alignment first (U64, I64, F64, F32, U32,
I32, F16, U16, I16, I8, U8, BOOL), then by name; ``__metadata__`` first; compact UTF-8 JSON.
The reference orders several metadata keys by hash, so bytes match for at most one key.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np


class SafetensorError(ValueError):
    """Bytes that are not a valid safetensors serialisation (the message says what is wrong)."""


# Ascending rank of the reference implementation's dtype enum (only the dtypes numpy has).
_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
}
_RANK = {name: i for i, name in enumerate(_DTYPES)}
_NAME_OF = {(dt.kind, dt.itemsize): name for name, dt in _DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000
"""Largest header accepted (the reference implementation's limit)."""


def _dtype_name(a: np.ndarray) -> str:
    name = _NAME_OF.get((a.dtype.kind, a.dtype.itemsize))
    if name is None:
        raise ValueError(f"safetensors: dtype {a.dtype} has no safetensors equivalent; use one of {', '.join(_DTYPES)}")
    return name


def save(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise ``tensors`` to safetensors bytes identical to ``safetensors.numpy.save(tensors, metadata)``.

    Non-contiguous and big-endian arrays are copied to little-endian C order. ValueError on an
    unsupported dtype, a name ``"__metadata__"``, or non-string metadata.
    """
    head, arrays = layout(tensors, metadata)
    return b"".join([head, *arrays])


def layout(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[memoryview]]:
    """The pieces of :func:`save`'s output, not yet joined: ``b"".join([head, *arrays])`` is that output.

    ``head`` is the size and padded JSON header; ``arrays`` the tensors' data in file order (views
    of the caller's arrays where already LE C order). ValueError as :func:`save`.
    """
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("safetensors: metadata must map strings to strings")
    items = []
    for name, arr in tensors.items():
        if name == "__metadata__":
            raise ValueError("safetensors: a tensor cannot be named '__metadata__'")
        a = np.asarray(arr)
        dname = _dtype_name(a)
        items.append((name, dname, np.asarray(a, dtype=_DTYPES[dname], order="C")))  # keeps 0-d arrays 0-d
    items.sort(key=lambda it: it[0])
    items.sort(key=lambda it: _RANK[it[1]], reverse=True)  # stable: names stay sorted within a dtype
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for name, dname, a in items:
        header[name] = {"dtype": dname, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    hbytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)
    # reshape(-1): a 1-D view of every array (0-d and empty ones included), never a copy in C order.
    return struct.pack("<Q", len(hbytes)) + hbytes, [a.reshape(-1).data for _, _, a in items]


def load_with_metadata(data: bytes | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Parse safetensors bytes into ``(tensors, metadata)``: writeable copies in the file's dtype and shape, and ``__metadata__``.

    SafetensorError on a short buffer, a non-object header, an unknown dtype, or offsets that do
    not match the shape, overlap, leave holes or run past the end.
    """
    buf = memoryview(data)
    if len(buf) < 8:
        raise SafetensorError(f"safetensors: {len(buf)} bytes is shorter than the 8-byte header size")
    (n,) = struct.unpack_from("<Q", buf)
    if n > MAX_HEADER_BYTES or 8 + n > len(buf):
        raise SafetensorError(f"safetensors: header of {n} bytes does not fit in a buffer of {len(buf)} bytes")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorError(f"safetensors: header is not UTF-8 JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorError("safetensors: header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorError("safetensors: __metadata__ must map strings to strings")
    body = buf[8 + n :]
    spans, out = [], {}
    for name, info in header.items():
        try:
            dt = _DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorError(f"safetensors: tensor {name!r} has a malformed entry {info!r} ({exc})") from None
        if any(s < 0 for s in shape) or not 0 <= begin <= end <= len(body):
            raise SafetensorError(f"safetensors: tensor {name!r} offsets [{begin}, {end}] outside the {len(body)}-byte data")
        if end - begin != math.prod(shape) * dt.itemsize:  # Python ints: a huge shape cannot wrap around
            raise SafetensorError(f"safetensors: tensor {name!r} of shape {shape} {info['dtype']} does not fill [{begin}, {end}]")
        spans.append((begin, end))
        out[name] = np.frombuffer(body[begin:end], dtype=dt).reshape(shape).copy()
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise SafetensorError(f"safetensors: tensor data overlaps or leaves a hole at byte {pos}")
        pos = end
    if pos != len(body):
        raise SafetensorError(f"safetensors: {len(body) - pos} bytes after the last tensor")
    return out, dict(meta)


def load(data: bytes | memoryview) -> dict[str, np.ndarray]:
    """Tensors of safetensors bytes (see :func:`load_with_metadata`)."""
    return load_with_metadata(data)[0]


def save_file(tensors: Mapping[str, np.ndarray], filename: str | os.PathLike[str], metadata: Mapping[str, str] | None = None) -> None:
    """Write :func:`save` output to ``filename``."""
    Path(filename).write_bytes(save(tensors, metadata))


def load_file(filename: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Tensors of the safetensors file ``filename``."""
    return load(Path(filename).read_bytes())


def read_metadata(filename: str | os.PathLike[str]) -> dict[str, str]:
    """``__metadata__`` of the safetensors file ``filename`` (reads the header only); SafetensorError if malformed."""
    with open(filename, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorError(f"safetensors: {filename} is shorter than 8 bytes")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise SafetensorError(f"safetensors: {filename} announces a header of {n} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorError(f"safetensors: header of {filename} is not UTF-8 JSON ({exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return dict(meta) if isinstance(meta, dict) else {}
