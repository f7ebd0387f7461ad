"""Chunked binary transfers: envelopes larger than a broker's packet limit travel in pieces.

Large envelopes travel in chunks of at most ``max_message_bytes`` so brokers with a 1 MB
packet limit work. Each chunk carries the sha256 of the whole envelope (the transfer id),
its index, the chunk count, the total length and a CRC-32 of its own payload; the
receiver drops a chunk whose CRC fails and checks the sha256 of the reassembled
envelope, so a corrupted or mixed-up chunk can never produce a wrong envelope.
"""

from __future__ import annotations

import hashlib
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

DEFAULT_MAX_MESSAGE_BYTES = 1_000_000
"""Default largest MQTT payload we publish (EMQX's default packet limit is 1 MB)."""

_CHUNK = struct.Struct("<4s32sIIQI")  # magic, transfer sha256, index, count, total_len, CRC-32 of the chunk payload
CHUNK_MAGIC = b"FHC1"
CHUNK_HEADER_BYTES = _CHUNK.size


class ChunkError(ValueError):
    """A chunk that must be dropped; ``reason`` is a short code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Chunk:
    """One parsed chunk. ``transfer`` is the hex sha256 of the whole payload."""

    transfer: str
    index: int
    count: int
    total_len: int
    payload: bytes


def transfer_id(payload: bytes) -> str:
    """The id under which ``payload`` travels: its sha256, hex (what :class:`Chunk` carries)."""
    return hashlib.sha256(payload).hexdigest()


def iter_chunks(payload: bytes, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """Cut ``payload`` into chunk messages of at most ``max_message_bytes`` bytes each, lazily.

    Parameters
    ----------
    payload : bytes
        The envelope.
    max_message_bytes : int
        Largest MQTT payload allowed (bytes); must exceed the 56-byte chunk header.

    Yields
    ------
    bytes
        ``ceil(len(payload) / (max_message_bytes - 56))`` messages (at least one), each a
        56-byte header and a slice of the payload.

    Raises
    ------
    ValueError
        If ``max_message_bytes`` leaves no room for data.
    """
    room = int(max_message_bytes) - CHUNK_HEADER_BYTES
    if room <= 0:
        raise ValueError(f"max_message_bytes={max_message_bytes} must exceed the {CHUNK_HEADER_BYTES}-byte chunk header")
    digest = hashlib.sha256(payload).digest()
    count = max(1, -(-len(payload) // room))
    view = memoryview(payload)
    for i in range(count):
        part = view[i * room : (i + 1) * room]
        yield _CHUNK.pack(CHUNK_MAGIC, digest, i, count, len(payload), zlib.crc32(part)) + part


def split_payload(payload: bytes, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[bytes]:
    """All chunk messages of ``payload`` as a list (see :func:`iter_chunks`)."""
    return list(iter_chunks(payload, max_message_bytes))


def parse_chunk(message: bytes) -> Chunk:
    """Parse and verify one chunk message.

    Raises
    ------
    ChunkError
        reason ``"bad_chunk"`` for a short message, wrong magic or inconsistent counters,
        ``"chunk_crc_mismatch"`` when the payload does not match its CRC-32.
    """
    if len(message) < CHUNK_HEADER_BYTES:
        raise ChunkError("bad_chunk", f"chunk of {len(message)} bytes is shorter than its {CHUNK_HEADER_BYTES}-byte header")
    magic, transfer, index, count, total, crc = _CHUNK.unpack_from(message)
    if magic != CHUNK_MAGIC:
        raise ChunkError("bad_chunk", f"chunk starts with {magic!r}, expected {CHUNK_MAGIC!r}")
    if count == 0 or index >= count:
        raise ChunkError("bad_chunk", f"chunk index {index} out of range for count {count}")
    payload = bytes(message[CHUNK_HEADER_BYTES:])
    if zlib.crc32(payload) != crc:
        raise ChunkError("chunk_crc_mismatch", f"chunk {index}/{count} of transfer {transfer.hex()[:12]} is corrupted (CRC-32)")
    return Chunk(transfer.hex(), index, count, total, payload)


@dataclass
class _Partial:
    count: int
    total_len: int
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0
    started: float = field(default_factory=time.monotonic)


class Reassembler:
    """Collects chunks into whole payloads, per stream (e.g. one client's update topic).

    Duplicated chunks (QoS 1 redelivery) are harmless; chunks of a transfer that already
    completed are ignored; a stream keeps at most ``max_partial_per_stream`` unfinished
    transfers (the oldest is dropped), and all unfinished data is capped at
    ``max_buffer_bytes``; transfers older than ``ttl_s`` are dropped.

    Parameters
    ----------
    max_payload_bytes : int
        Largest payload accepted (bytes); bigger announced totals are rejected.
    max_buffer_bytes : int
        Cap on bytes held in unfinished transfers (bytes).
    ttl_s : float
        Seconds an unfinished transfer may wait for its remaining chunks.
    max_partial_per_stream : int
        Unfinished transfers kept per stream.
    """

    def __init__(
        self,
        max_payload_bytes: int = 512 * 1024 * 1024,
        max_buffer_bytes: int = 2 * 1024 * 1024 * 1024,
        ttl_s: float = 600.0,
        max_partial_per_stream: int = 2,
    ):
        self.max_payload_bytes = max_payload_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.ttl_s = ttl_s
        self.max_partial_per_stream = max_partial_per_stream
        self._partial: OrderedDict[tuple[str, str], _Partial] = OrderedDict()
        self._done: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._buffered = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes currently held in unfinished transfers."""
        return self._buffered

    def add(self, stream: str, message: bytes) -> tuple[str, bytes] | None:
        """Add one chunk message; return ``(transfer, payload)`` when a transfer completes.

        Raises
        ------
        ChunkError
            For a malformed or corrupted chunk (``bad_chunk``, ``chunk_crc_mismatch``),
            a chunk that contradicts earlier chunks of its transfer (``inconsistent_chunk``),
            a payload over the limit (``oversized``) or a reassembled payload whose digest is
            wrong (``transfer_sha256_mismatch``). Nothing is delivered in these cases.
        """
        chunk = parse_chunk(message)
        key = (stream, chunk.transfer)
        if key in self._done:
            return None
        if chunk.total_len > self.max_payload_bytes:
            raise ChunkError("oversized", f"transfer of {chunk.total_len} bytes exceeds the limit of {self.max_payload_bytes}")
        self._expire()
        part = self._partial.get(key)
        if part is None:
            part = _Partial(chunk.count, chunk.total_len)
            self._partial[key] = part
            same_stream = [k for k in self._partial if k[0] == stream]
            for k in same_stream[: max(0, len(same_stream) - self.max_partial_per_stream)]:
                self._drop(k)
        elif (part.count, part.total_len) != (chunk.count, chunk.total_len):
            self._drop(key)
            raise ChunkError(
                "inconsistent_chunk", f"chunk {chunk.index} of transfer {chunk.transfer[:12]} disagrees on count/length"
            )
        if chunk.index not in part.parts:
            part.parts[chunk.index] = chunk.payload
            part.size += len(chunk.payload)
            self._buffered += len(chunk.payload)
        while self._buffered > self.max_buffer_bytes and self._partial:
            self._drop(next(iter(self._partial)))
        if key not in self._partial or len(part.parts) < part.count:
            return None
        payload = b"".join(part.parts[i] for i in range(part.count))
        self._drop(key)
        self._done[key] = None
        while len(self._done) > 256:
            self._done.popitem(last=False)
        if len(payload) != part.total_len or hashlib.sha256(payload).hexdigest() != chunk.transfer:
            raise ChunkError("transfer_sha256_mismatch", f"reassembled transfer {chunk.transfer[:12]} does not match its digest")
        return chunk.transfer, payload

    def _drop(self, key: tuple[str, str]) -> None:
        part = self._partial.pop(key, None)
        if part is not None:
            self._buffered -= part.size

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._partial.items() if now - p.started > self.ttl_s]:
            self._drop(key)
