"""Chunked binary transfers: envelopes larger than a broker's packet limit travel in pieces.

Each chunk (at most ``max_message_bytes``, so 1 MB brokers work) carries the sha256 of the whole
envelope (the transfer id), its index, the chunk count, the total length and a CRC-32 of its
payload; the receiver drops a chunk whose CRC fails and checks the sha256 of the reassembled
envelope, so a corrupted or mixed-up chunk never yields a wrong envelope.

Each side hashes an envelope once: the sender remembers the ids of the last ``bytes`` objects it
cut or named; the receiver hashes chunks in index order as they arrive.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_MESSAGE_BYTES = 1_000_000
"""Default largest MQTT payload we publish (EMQX's default packet limit is 1 MB)."""

_CHUNK = struct.Struct("<4s32sIIQI")  # magic, transfer sha256, index, count, total_len, CRC-32 of the chunk payload
CHUNK_MAGIC = b"FHC1"
CHUNK_HEADER_BYTES = _CHUNK.size
Buffer = bytes | memoryview
"""A chunk's data as a reassembler holds it: a read-only view of the received message, or bytes."""


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


_DIGESTS: OrderedDict[int, tuple[bytes, bytes]] = OrderedDict()
_DIGESTS_LOCK = threading.Lock()
_DIGESTS_KEPT = 2
"""Payloads whose digests are remembered (the most recent); each entry keeps its payload alive."""


def _remember(payload: bytes, digest: bytes) -> None:
    """Remember the sha256 of ``payload``, keyed by identity (the entry holds the object, so the id cannot be reused)."""
    if type(payload) is not bytes:
        return
    with _DIGESTS_LOCK:
        for key in [k for k, (obj, _) in _DIGESTS.items() if sys.getrefcount(obj) <= 3]:
            del _DIGESTS[key]  # 3: the entry's tuple, the loop's name, getrefcount's argument
        _DIGESTS[id(payload)] = (payload, digest)
        _DIGESTS.move_to_end(id(payload))
        while len(_DIGESTS) > _DIGESTS_KEPT:
            _DIGESTS.popitem(last=False)


def _remembered(payload: bytes) -> bytes | None:
    with _DIGESTS_LOCK:
        got = _DIGESTS.get(id(payload))
        return got[1] if got is not None and got[0] is payload else None


def _digest(payload: bytes) -> bytes:
    digest = _remembered(payload)
    if digest is None:
        digest = hashlib.sha256(payload).digest()
        _remember(payload, digest)
    return digest


def transfer_id(payload: bytes) -> str:
    """The id under which ``payload`` travels: its sha256, hex (not recomputed for the last two objects hashed)."""
    return _digest(payload).hex()


def iter_chunks(payload: bytes, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """Cut ``payload`` into chunk messages of at most ``max_message_bytes`` bytes each, lazily.

    Yields ``ceil(len(payload) / (max_message_bytes - 56))`` messages (at least one), each a
    56-byte header and a slice of the payload; ValueError if ``max_message_bytes`` leaves no room.
    """
    room = int(max_message_bytes) - CHUNK_HEADER_BYTES
    if room <= 0:
        raise ValueError(f"max_message_bytes={max_message_bytes} must exceed the {CHUNK_HEADER_BYTES}-byte chunk header")
    count = max(1, -(-len(payload) // room))
    digest = _digest(payload)
    view = memoryview(payload)
    for i in range(count):
        part = view[i * room : (i + 1) * room]
        yield _CHUNK.pack(CHUNK_MAGIC, digest, i, count, len(payload), zlib.crc32(part)) + part


def split_payload(payload: bytes, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[bytes]:
    """All chunk messages of ``payload`` as a list (see :func:`iter_chunks`)."""
    return list(iter_chunks(payload, max_message_bytes))


def peek_transfer(message: bytes) -> str | None:
    """The transfer id (hex sha256) a chunk message names, without verifying it; None if it is no chunk."""
    if len(message) < CHUNK_HEADER_BYTES or message[:4] != CHUNK_MAGIC:
        return None
    return bytes(message[4:36]).hex()


def parse_chunk(message: bytes) -> Chunk:
    """Parse and verify one chunk message.

    Raises
    ------
    ChunkError
        ``"bad_chunk"`` (short, wrong magic, inconsistent counters) or ``"chunk_crc_mismatch"``.
    """
    transfer, index, count, total, payload = _parse(message)
    return Chunk(transfer, index, count, total, bytes(payload))


def _parse(message: bytes | bytearray) -> tuple[str, int, int, int, memoryview]:
    """:func:`parse_chunk` without copying the payload: a read-only view of ``message`` (a reusable bytearray is copied)."""
    if len(message) < CHUNK_HEADER_BYTES:
        raise ChunkError("bad_chunk", f"chunk of {len(message)} bytes is shorter than its {CHUNK_HEADER_BYTES}-byte header")
    magic, transfer, index, count, total, crc = _CHUNK.unpack_from(message)
    if magic != CHUNK_MAGIC:
        raise ChunkError("bad_chunk", f"chunk starts with {magic!r}, expected {CHUNK_MAGIC!r}")
    if count == 0 or index >= count:
        raise ChunkError("bad_chunk", f"chunk index {index} out of range for count {count}")
    payload = memoryview(message if type(message) is bytes else bytes(message))[CHUNK_HEADER_BYTES:]
    if zlib.crc32(payload) != crc:
        raise ChunkError("chunk_crc_mismatch", f"chunk {index}/{count} of transfer {transfer.hex()[:12]} is corrupted (CRC-32)")
    return transfer.hex(), index, count, total, payload


class SharedTransfers:
    """Chunks and verified payloads of recent transfers, shared by the reassemblers of one process.

    Virtual clients of one worker each receive their own copy of the global model (150 clients
    held 150 copies of 25.8 MB); with this, each chunk and each reassembled payload is held once
    (the first reassembler to complete verifies it, the others deliver the same object). Keeps the
    ``max_transfers`` (>= 1, else ValueError) most recently used transfers.
    """

    def __init__(self, max_transfers: int = 2):
        if max_transfers < 1:
            raise ValueError(f"SharedTransfers: max_transfers must be >= 1, got {max_transfers}")
        self.max_transfers = max_transfers
        self._lock = threading.Lock()
        self._chunks: OrderedDict[str, dict[tuple[int, int], bytes]] = OrderedDict()
        self._whole: OrderedDict[str, bytes] = OrderedDict()
        self._messages: OrderedDict[bytes, dict[bytes, bytes]] = OrderedDict()

    def message(self, message: bytes) -> bytes:
        """The held copy of chunk message ``message`` if an equal one is held, else ``message`` (now held if none was).

        For a client's MQTT link: a chunk waiting in many inboxes is held once. Non-chunks pass as
        they are; nothing is verified here.
        """
        if len(message) < CHUNK_HEADER_BYTES or message[:4] != CHUNK_MAGIC:
            return message
        return self._hold(self._messages, bytes(message[4:36]), bytes(message[:CHUNK_HEADER_BYTES]), message)

    def chunk(self, transfer: str, count: int, index: int, payload: bytes) -> bytes:
        """The held copy of chunk ``index`` of ``count`` of ``transfer`` if it equals ``payload``, else ``payload`` (first seen is held)."""
        return self._hold(self._chunks, transfer, (count, index), payload)

    def _hold(self, table: OrderedDict[Any, dict[Any, bytes]], transfer: Any, place: Any, data: bytes) -> bytes:
        """What ``table`` holds for ``place`` of ``transfer`` if it equals ``data``, else ``data`` (held if the place was free)."""
        with self._lock:
            held = table.get(transfer)
            if held is None:
                held = table[transfer] = {}
                while len(table) > self.max_transfers:
                    table.popitem(last=False)
            else:
                table.move_to_end(transfer)
            same = held.setdefault(place, data)
            return same if same == data else data

    def whole(self, transfer: str, total_len: int) -> bytes | None:
        """The verified payload of ``transfer`` if one is held and has ``total_len`` bytes."""
        with self._lock:
            got = self._whole.get(transfer)
            return got if got is not None and len(got) == total_len else None

    def put_whole(self, transfer: str, payload: bytes) -> bytes:
        """Hold ``payload``, already verified against ``transfer``; return the held object (an earlier one if there is)."""
        with self._lock:
            held = self._whole.setdefault(transfer, payload)
            self._whole.move_to_end(transfer)
            while len(self._whole) > self.max_transfers:
                self._whole.popitem(last=False)
            return held


@dataclass
class _Partial:
    count: int
    total_len: int
    parts: dict[int, Buffer] = field(default_factory=dict)
    size: int = 0
    started: float = field(default_factory=time.monotonic)
    progressed: float = field(default_factory=time.monotonic)
    hasher: Any = None  # sha256 of parts[0 .. hashed - 1], fed in index order (None: hash at the end)
    hashed: int = 0

    def hash_ready(self) -> None:
        """Feed the hasher the chunks that now follow, without a gap, the ones it has seen."""
        if self.hasher is None:
            return
        while self.hashed in self.parts:
            self.hasher.update(self.parts[self.hashed])
            self.hashed += 1


@dataclass(frozen=True)
class Stalled:
    """An unfinished transfer that has received nothing for a while (:meth:`Reassembler.stalled`); ``missing`` ascending."""

    stream: str
    transfer: str
    count: int
    missing: tuple[int, ...]


class Reassembler:
    """Collects chunks into whole payloads, per stream (e.g. one client's update topic).

    Memory is bounded, never exceeded even for a moment: a transfer holds at most the total its
    chunks declare (beyond: ``oversized``, dropped), and unfinished transfers together at most
    ``max_buffer_bytes`` (the oldest are dropped to fit). Duplicates are harmless, chunks of a
    completed transfer ignored, at most ``max_partial_per_stream`` unfinished transfers per stream,
    none older than ``ttl_s`` s. Chunks announcing a new count restart a transfer (a sender that
    re-cut it smaller). ``shared``: see :class:`SharedTransfers` (the byte caps still count in full).
    """

    def __init__(
        self,
        max_payload_bytes: int = 512 * 1024 * 1024,
        max_buffer_bytes: int = 2 * 1024 * 1024 * 1024,
        ttl_s: float = 600.0,
        max_partial_per_stream: int = 2,
        shared: SharedTransfers | None = None,
    ):
        self.shared = shared
        self.max_payload_bytes = max_payload_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.ttl_s = ttl_s
        self.max_partial_per_stream = max_partial_per_stream
        self._partial: OrderedDict[tuple[str, str], _Partial] = OrderedDict()
        self._done: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._refused: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._buffered = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes currently held in unfinished transfers."""
        return self._buffered

    def completed(self, stream: str, transfer: str) -> bool:
        """True if ``transfer`` on ``stream`` was delivered whole (among the last 256 of all streams)."""
        return (stream, transfer) in self._done

    def forget(self, stream: str, transfer: str) -> None:
        """Forget that ``transfer`` completed on ``stream``, so byte-identical data can be delivered again."""
        self._done.pop((stream, transfer), None)

    def add(self, stream: str, message: bytes | bytearray) -> tuple[str, bytes] | None:
        """Add one chunk message; return ``(transfer, payload)`` when a transfer completes.

        A ``bytearray`` (which its owner may reuse) is copied first.

        Raises
        ------
        ChunkError
            ``bad_chunk``, ``chunk_crc_mismatch``, ``inconsistent_chunk`` (contradicts the declared
            total), ``oversized`` or ``transfer_sha256_mismatch``; nothing is delivered and nothing
            more held.
        """
        transfer, index, count, total_len, payload = _parse(message)
        key = (stream, transfer)
        if key in self._done:
            return None
        if key in self._refused:
            raise ChunkError("oversized", f"transfer {transfer[:12]} was refused earlier (it sent more than it declared)")
        if total_len > self.max_payload_bytes:
            raise ChunkError("oversized", f"transfer of {total_len} bytes exceeds the limit of {self.max_payload_bytes}")
        if len(payload) > total_len or count > max(1, total_len):
            raise ChunkError("bad_chunk", f"chunk {index}/{count} of {len(payload)} bytes cannot belong to {total_len} bytes")
        if len(payload) > self.max_buffer_bytes:
            raise ChunkError("oversized", f"chunk of {len(payload)} bytes exceeds the buffer cap of {self.max_buffer_bytes}")
        self._expire()
        part = self._partial.get(key)
        if part is not None and part.total_len != total_len:
            self._drop(key)
            raise ChunkError("inconsistent_chunk", f"chunk {index} of transfer {transfer[:12]} disagrees on the total length")
        if part is not None and part.count != count:
            self._drop(key)  # the sender cut the transfer again with another chunk size
            part = None
        if part is None:
            # Without a SharedTransfers the chunks are hashed as they arrive; with one, the first
            # reassembler of the process to complete the transfer hashes it once for all of them.
            part = _Partial(count, total_len, hasher=hashlib.sha256() if self.shared is None else None)
            self._partial[key] = part
            same_stream = [k for k in self._partial if k[0] == stream]
            for k in same_stream[: max(0, len(same_stream) - self.max_partial_per_stream)]:
                self._drop(k)
        if index not in part.parts:
            if part.size + len(payload) > part.total_len:
                self._drop(key)
                self._refused[key] = None
                while len(self._refused) > 256:
                    self._refused.popitem(last=False)
                raise ChunkError(
                    "oversized",
                    f"transfer {transfer[:12]} sent more than the {part.total_len} bytes it declared; refused",
                )
            # Make room first, so the cap holds at every moment (the oldest transfers go).
            while self._buffered + len(payload) > self.max_buffer_bytes:
                oldest = next(k for k in self._partial if k != key) if len(self._partial) > 1 else key
                if oldest == key:
                    self._drop(key)
                    raise ChunkError("oversized", f"transfer {transfer[:12]} does not fit in the buffer cap")
                self._drop(oldest)
            # Held as a view of the message (no copy); with a SharedTransfers as bytes, which it
            # compares with the copy it holds.
            part.parts[index] = self.shared.chunk(transfer, count, index, bytes(payload)) if self.shared else payload
            part.size += len(payload)
            part.progressed = time.monotonic()
            self._buffered += len(payload)
            part.hash_ready()
        if len(part.parts) < part.count:
            return None
        self._drop(key)  # complete: out of the buffer whatever the check below says (``part`` still holds the chunks)
        verified = self.shared.whole(transfer, part.total_len) if self.shared else None
        if verified is not None:
            whole = verified  # every chunk arrived; another reassembler here verified these bytes already
        else:
            whole = b"".join([part.parts[i] for i in range(part.count)])
            digest = part.hasher.hexdigest() if part.hasher is not None else hashlib.sha256(whole).hexdigest()
            if len(whole) != part.total_len or digest != transfer:
                raise ChunkError("transfer_sha256_mismatch", f"reassembled transfer {transfer[:12]} does not match its digest")
            if self.shared is not None:
                whole = self.shared.put_whole(transfer, whole)
        self._done[key] = None
        while len(self._done) > 256:
            self._done.popitem(last=False)
        return transfer, whole

    def stalled(self, idle_s: float, now: float | None = None) -> list[Stalled]:
        """Unfinished transfers without a new chunk for ``idle_s`` s, with their missing indices (at most the first 1024)."""
        now = time.monotonic() if now is None else now
        out = []
        for (stream, transfer), p in self._partial.items():
            if now - p.progressed >= idle_s:
                missing = tuple(i for i in range(p.count) if i not in p.parts)[:1024]
                out.append(Stalled(stream, transfer, p.count, missing))
        return out

    def touch(self, stream: str, transfer: str, now: float | None = None) -> None:
        """Restart the idle clock of an unfinished transfer (after asking its sender for the missing chunks)."""
        p = self._partial.get((stream, transfer))
        if p is not None:
            p.progressed = time.monotonic() if now is None else now

    def _drop(self, key: tuple[str, str]) -> None:
        part = self._partial.pop(key, None)
        if part is not None:
            self._buffered -= part.size

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._partial.items() if now - p.started > self.ttl_s]:
            self._drop(key)
