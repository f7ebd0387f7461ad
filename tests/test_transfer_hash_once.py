"""Each side hashes a model once, and the bytes on the wire are those of the previous release.

The sender remembers the transfer id of the bytes objects it cut last, so it hashes each one once;
the receiver hashes chunks in index order as they arrive, whatever order
and how many copies arrive; :func:`codec.decode` skips the body's digest only when its caller
vouches for the whole envelope's. A previous release's chunks and envelopes (built here as it
built them) are read, and ours are byte for byte what it sent.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save as reference_save

from har_models.wire import chunking, codec
from har_models.wire.chunking import CHUNK_HEADER_BYTES, ChunkError, Reassembler, iter_chunks, split_payload, transfer_id

RNG = np.random.default_rng(3)
SMALL = RNG.integers(0, 256, 10_000, dtype=np.uint8).tobytes()  # 11 chunks of at most 1,000 bytes (944 of data)
LARGE = RNG.integers(0, 256, 5_000_000, dtype=np.uint8).tobytes()  # 5 chunks of a model-sized message


def previous_chunks(payload: bytes, max_message_bytes: int) -> list[bytes]:
    """The chunks the previous release cut (its iter_chunks, written out)."""
    room = max_message_bytes - 56
    digest = hashlib.sha256(payload).digest()
    count = max(1, -(-len(payload) // room))
    out = []
    for i in range(count):
        part = payload[i * room : (i + 1) * room]
        out.append(struct.pack("<4s32sIIQI", b"FHC1", digest, i, count, len(payload), zlib.crc32(part)) + part)
    return out


def previous_envelope(tensors: dict[str, np.ndarray], **fields: Any) -> bytes:
    """An envelope as the previous release encoded it: the safetensors library's body, then the envelope."""
    body = reference_save(tensors)
    header = {**fields, "body_len": len(body), "sha256": hashlib.sha256(body).hexdigest(), "meta": fields.get("meta", {})}
    hbytes = json.dumps(header, sort_keys=True, allow_nan=False).encode()
    return struct.pack("<4sHI", b"FHAR", 1, len(hbytes)) + hbytes + body


def model() -> dict[str, np.ndarray]:
    return {
        "conv.weight": RNG.standard_normal((8, 6, 5)).astype(np.float32),
        "conv.bias": np.zeros(8, np.float32),
        "steps": np.array([7, 9], np.int64),
        "half": RNG.standard_normal(4).astype(np.float16),
    }


@pytest.mark.parametrize(("payload", "size"), [(b"", 1_000), (SMALL, 1_000), (SMALL, 10_056), (LARGE, 1_000_000), (LARGE, 999_999)])
def test_chunks_are_byte_for_byte_those_of_the_previous_release(payload: bytes, size: int) -> None:
    assert list(iter_chunks(payload, size)) == previous_chunks(payload, size)


def test_a_previous_release_s_chunks_reassemble_and_its_envelope_decodes() -> None:
    tensors = model()
    env = previous_envelope(tensors, kind="model", round=4, arch_version=1, client_id="c1", meta={"arch": {"n_classes": 6}})
    r = Reassembler()
    done = None
    for c in previous_chunks(env, 300):
        done = r.add("personal", c) or done
    assert done is not None and done == (hashlib.sha256(env).hexdigest(), env)
    for verified in (None, done[0]):
        got = codec.decode(done[1], verified=verified)
        assert (got.kind, got.round, got.client_id, got.meta) == ("model", 4, "c1", {"arch": {"n_classes": 6}})
        assert set(got.tensors) == set(tensors)
        for k, v in tensors.items():
            assert got.tensors[k].dtype == v.dtype and np.array_equal(got.tensors[k], v)


def test_encode_writes_the_bytes_the_previous_release_wrote() -> None:
    tensors = model()
    fields: dict[str, Any] = {"kind": "update", "round": 2, "arch_version": 3, "client_id": "c9", "meta": {"n_train": 12}}
    assert codec.encode(tensors, **fields) == previous_envelope(tensors, **fields)
    transposed = {"w": np.arange(12, dtype=np.float32).reshape(3, 4).T}  # not C order: copied, same bytes as a C-order copy
    assert codec.encode(transposed, **fields) == previous_envelope({"w": np.ascontiguousarray(transposed["w"])}, **fields)


def test_the_receiver_hashes_chunks_in_order_as_they_arrive() -> None:
    chunks = split_payload(SMALL, 1_000)
    tid = transfer_id(SMALL)
    r = Reassembler()
    for c in chunks[:3]:
        assert r.add("s", c) is None
    part = r._partial[("s", tid)]
    assert part.hashed == 3  # hashed on arrival, not at the end
    for i in (5, 4, 5, 7):  # ahead of a gap (and a duplicate): held, not hashed yet
        assert r.add("s", chunks[i]) is None
    assert part.hashed == 3
    assert r.add("s", chunks[3]) is None  # fills the gap: 3, 4 and 5 are hashed now
    assert part.hashed == 6
    for i in (6, 8, 1):
        assert r.add("s", chunks[i]) is None
    assert part.hashed == 9
    assert len(chunks) == 11 and r.add("s", chunks[10]) is None and part.hashed == 9
    assert r.add("s", chunks[9]) == (tid, SMALL)
    assert r.buffered_bytes == 0


@pytest.mark.parametrize("seed", range(12))
def test_any_order_with_duplicates_delivers_the_payload_and_a_forged_chunk_never_does(seed: int) -> None:
    rnd = random.Random(seed)
    chunks = split_payload(SMALL, 1_000)
    arrivals = chunks + rnd.sample(chunks, 4)  # QoS 1 redeliveries
    rnd.shuffle(arrivals)
    r = Reassembler()
    delivered = [d for c in arrivals if (d := r.add("s", c)) is not None]
    assert delivered == [(transfer_id(SMALL), SMALL)]  # once, whole, although the duplicates arrive after it too

    i = rnd.randrange(len(chunks))  # a chunk whose data changed and whose CRC-32 was recomputed: passes the chunk check
    data = bytearray(chunks[i][CHUNK_HEADER_BYTES:])
    data[rnd.randrange(len(data))] ^= 0x01
    header = bytearray(chunks[i][:CHUNK_HEADER_BYTES])
    struct.pack_into("<I", header, CHUNK_HEADER_BYTES - 4, zlib.crc32(bytes(data)))
    bad = [bytes(header) + bytes(data) if j == i else c for j, c in enumerate(chunks)]
    rnd.shuffle(bad)
    r = Reassembler()
    with pytest.raises(ChunkError) as exc:
        for c in bad:
            r.add("s", c)
    assert exc.value.reason == "transfer_sha256_mismatch"
    assert r.buffered_bytes == 0 and not r.completed("s", transfer_id(SMALL))


def test_a_transfer_cut_again_in_smaller_chunks_restarts_its_hash() -> None:
    first, again = split_payload(SMALL, 2_000), split_payload(SMALL, 1_000)
    r = Reassembler()
    for c in first[:3]:
        assert r.add("s", c) is None
    done = None
    for c in again[::-1]:  # the new cut, last chunk first
        done = r.add("s", c) or done
    assert done == (transfer_id(SMALL), SMALL)


def test_the_receiver_holds_views_of_the_messages_and_copies_a_mutable_one() -> None:
    chunks = split_payload(SMALL, 1_000)
    r = Reassembler()
    r.add("s", chunks[0])
    held = r._partial[("s", transfer_id(SMALL))].parts[0]
    assert isinstance(held, memoryview) and held.obj is chunks[0]  # no copy of the data
    mutable = bytearray(chunks[1])
    r.add("s", mutable)
    mutable[-1] ^= 0xFF  # the caller reuses its buffer: what was received stays as received
    done = None
    for c in chunks[2:]:
        done = r.add("s", c) or done
    assert done == (transfer_id(SMALL), SMALL)


class CountingSha256:
    """hashlib with its sha256 calls counted (the module the chunker hashes with)."""

    def __init__(self) -> None:
        self.calls = 0

    def sha256(self, data: bytes = b"") -> Any:
        self.calls += 1
        return hashlib.sha256(data)


@pytest.mark.parametrize("payload", [SMALL, LARGE])
def test_the_sender_hashes_an_envelope_once(monkeypatch: pytest.MonkeyPatch, payload: bytes) -> None:
    payload = bytes(bytearray(payload))  # an object this test alone holds
    counting = CountingSha256()
    monkeypatch.setattr(chunking, "hashlib", counting)
    chunks = list(iter_chunks(payload, 1_000_000 if len(payload) > 100_000 else 1_000))
    assert transfer_id(payload) == hashlib.sha256(payload).hexdigest()  # what a sender names in its receipts
    assert list(iter_chunks(payload, 1_000_000 if len(payload) > 100_000 else 1_000)) == chunks
    assert counting.calls == 1


def test_a_mutable_buffer_is_hashed_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = bytearray(SMALL)
    first = transfer_id(buf)  # type: ignore[arg-type]
    buf[0] ^= 0xFF
    assert transfer_id(buf) == hashlib.sha256(buf).hexdigest() != first  # type: ignore[arg-type]
    counting = CountingSha256()
    monkeypatch.setattr(chunking, "hashlib", counting)
    transfer_id(buf)  # type: ignore[arg-type]
    transfer_id(buf)  # type: ignore[arg-type]
    assert counting.calls == 2


def test_remembered_digests_are_few_and_keep_no_payload_alive_that_nobody_holds() -> None:
    held = [bytes(bytearray(SMALL[: 100 + i])) for i in range(4)]
    for p in held:
        transfer_id(p)
    assert len(chunking._DIGESTS) <= chunking._DIGESTS_KEPT
    transfer_id(bytes(bytearray(SMALL[:50])))  # nobody holds this one after the call ...
    transfer_id(held[0])  # ... so the next call drops it
    assert all(obj is not None and any(obj is h for h in held) for obj, _ in chunking._DIGESTS.values())


def test_decode_told_the_envelope_is_verified_still_refuses_bad_tensors_and_bad_framing() -> None:
    good = codec.encode({"w": np.arange(6, dtype=np.float32)}, kind="update", round=1, arch_version=0, client_id="c")
    tid = transfer_id(good)
    env = codec.decode(good, verified=tid)
    assert env.sha256 == codec.decode(good).sha256 == hashlib.sha256(good[len(good) - codec.peek_header(good)["body_len"] :]).hexdigest()
    nan = codec.encode({"w": np.array([1.0, np.nan], np.float32)}, kind="update", round=1, arch_version=0)
    with pytest.raises(codec.NonFinite):
        codec.decode(nan, verified=transfer_id(nan))
    with pytest.raises(codec.Truncated):
        codec.decode(good[:-5], verified=transfer_id(good[:-5]))
    with pytest.raises(codec.BadBody):
        broken = bytearray(good)
        broken[-30:-24] = b"\xff" * 6  # inside the safetensors header of this tiny body: the JSON breaks
        codec.decode(bytes(broken), verified=transfer_id(bytes(broken)))
    with pytest.raises(codec.BadMagic):
        codec.decode(b"PK\x03\x04" + good[4:], verified=tid)
    with pytest.raises(ValueError, match="64 hex digits"):
        codec.decode(good, verified="not-a-digest")


def test_without_verified_the_body_digest_is_checked() -> None:
    good = codec.encode({"w": np.arange(6, dtype=np.float32)}, kind="update", round=1, arch_version=0)
    bad = bytearray(good)
    bad[-1] ^= 0x01  # the last tensor byte: the safetensors layout stays valid
    with pytest.raises(codec.ChecksumMismatch):
        codec.decode(bytes(bad))
    r = Reassembler()  # the same corruption in transit never reaches decode: the reassembler refuses it
    chunks = split_payload(good, 100)
    last = bytearray(chunks[-1])
    last[-1] ^= 0x01
    with pytest.raises(ChunkError) as exc:
        for c in [*chunks[:-1], bytes(last)]:
            r.add("s", c)
    assert exc.value.reason == "chunk_crc_mismatch"
