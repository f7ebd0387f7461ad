"""Reassemblers of one worker share what they receive: one copy of each chunk and of each payload.

Each virtual client gets the global model over its own connection, as separate byte objects.
With a :class:`SharedTransfers` the second client holds the first one's chunk objects and is
handed the very payload object the first one verified. What each delivers is the same as
without sharing, and a chunk that differs from the held one (CRC-valid, forged) never makes a
reassembler deliver bytes that do not match the transfer id.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from har_models.wire.chunking import CHUNK_HEADER_BYTES, ChunkError, Reassembler, SharedTransfers, split_payload, transfer_id

PAYLOAD = np.random.default_rng(7).integers(0, 256, 10_000, dtype=np.uint8).tobytes()


def fresh(chunks: list[bytes]) -> list[bytes]:
    """New byte objects with the same contents: what a second MQTT connection delivers."""
    return [bytes(bytearray(c)) for c in chunks]


def feed(r: Reassembler, chunks: list[bytes]) -> tuple[str, bytes] | None:
    done = None
    for c in chunks:
        done = r.add("global", c) or done
    return done


def forged(chunk: bytes) -> bytes:
    """The same chunk with its data changed and its CRC-32 recomputed: passes the chunk check."""
    body = bytearray(chunk[CHUNK_HEADER_BYTES:])
    body[0] ^= 0xFF
    header = bytearray(chunk[:CHUNK_HEADER_BYTES])
    struct.pack_into("<I", header, CHUNK_HEADER_BYTES - 4, zlib.crc32(bytes(body)))
    return bytes(header) + bytes(body)


def test_clients_share_chunks_and_the_verified_payload() -> None:
    chunks = split_payload(PAYLOAD, 1_000)  # 11 chunks
    shared = SharedTransfers()
    a, b = Reassembler(shared=shared), Reassembler(shared=shared)
    half = len(chunks) // 2
    feed(a, fresh(chunks[:half]))
    feed(b, fresh(chunks[:half]))
    tid = transfer_id(PAYLOAD)
    held_a = a._partial[("global", tid)].parts
    held_b = b._partial[("global", tid)].parts
    assert all(held_a[i] is held_b[i] for i in range(half))  # one copy of each chunk
    done_a = feed(a, fresh(chunks[half:]))
    done_b = feed(b, fresh(chunks[half:]))
    assert done_a is not None and done_b is not None
    assert done_a[0] == done_b[0] == tid
    assert done_a[1] == PAYLOAD and done_b[1] is done_a[1]  # one copy of the payload
    assert a.buffered_bytes == b.buffered_bytes == 0


def test_without_sharing_each_reassembler_has_its_own_copy() -> None:
    chunks = split_payload(PAYLOAD, 1_000)
    done_a, done_b = feed(Reassembler(), fresh(chunks)), feed(Reassembler(), fresh(chunks))
    assert done_a is not None and done_b is not None
    assert done_a[1] == done_b[1] == PAYLOAD and done_a[1] is not done_b[1]


def test_a_forged_chunk_held_first_does_not_reach_another_client() -> None:
    chunks = split_payload(PAYLOAD, 1_000)
    shared = SharedTransfers()
    bad, good = Reassembler(shared=shared), Reassembler(shared=shared)
    with pytest.raises(ChunkError) as exc:
        feed(bad, [forged(chunks[0]), *fresh(chunks[1:])])  # the forged chunk is the one held for index 0
    assert exc.value.reason == "transfer_sha256_mismatch"
    done = feed(good, fresh(chunks))
    assert done is not None and done[1] == PAYLOAD


def test_a_forged_chunk_after_verification_still_gets_the_verified_payload() -> None:
    chunks = split_payload(PAYLOAD, 1_000)
    shared = SharedTransfers()
    first = feed(Reassembler(shared=shared), fresh(chunks))
    later = feed(Reassembler(shared=shared), [forged(chunks[0]), *fresh(chunks[1:])])
    assert first is not None and later is not None and later[1] is first[1] and later[1] == PAYLOAD


def test_only_the_most_recent_transfers_are_held() -> None:
    shared = SharedTransfers(max_transfers=2)
    payloads = [bytes([k]) * 3_000 for k in range(3)]
    for p in payloads:
        assert feed(Reassembler(shared=shared), split_payload(p, 1_000)) is not None
    assert shared.whole(transfer_id(payloads[0]), 3_000) is None
    assert shared.whole(transfer_id(payloads[2]), 3_000) == payloads[2]
    assert shared.whole(transfer_id(payloads[2]), 2_999) is None  # a length that does not match is no hit
    with pytest.raises(ValueError, match="max_transfers"):
        SharedTransfers(max_transfers=0)


def test_equal_chunk_messages_are_held_once_and_others_pass_through() -> None:
    chunks = split_payload(PAYLOAD, 1_000)
    shared = SharedTransfers()
    first = [shared.message(c) for c in fresh(chunks)]
    second = [shared.message(c) for c in fresh(chunks)]
    assert all(a is b for a, b in zip(first, second, strict=True))  # the second client's copies are dropped
    assert first == chunks
    status = b'{"state": "online"}'
    assert shared.message(status) is status  # not a chunk message
    changed = forged(chunks[0])  # the same place with other bytes (and CRC): held apart, the reassembler judges it
    assert shared.message(changed) is changed and shared.message(bytes(bytearray(chunks[0]))) is first[0]
    # A reassembler fed the held messages delivers the payload as before.
    done = feed(Reassembler(shared=shared), second)
    assert done is not None and done[1] == PAYLOAD


def test_a_worker_holding_one_transfer_lets_the_last_round_go_when_the_next_model_arrives() -> None:
    from simulation.worker import HELD_TRANSFERS

    shared = SharedTransfers(max_transfers=HELD_TRANSFERS)
    old, new = bytes([1]) * 3_000, bytes([2]) * 3_000
    old_chunks, new_chunks = split_payload(old, 1_000), split_payload(new, 1_000)
    held_messages = [shared.message(c) for c in fresh(old_chunks)]
    done = feed(Reassembler(shared=shared), held_messages)
    assert done is not None and shared.whole(transfer_id(old), 3_000) is done[1]
    late = Reassembler(shared=shared)
    feed(late, [held_messages[0]])  # a client still reassembling the old model when the new one starts
    shared.message(fresh(new_chunks)[0])  # the next round's first chunk message
    assert shared.message(fresh(old_chunks)[0]) is not held_messages[0]  # the old messages are no longer held
    done_new = feed(Reassembler(shared=shared), fresh(new_chunks))
    assert done_new is not None and done_new[1] == new
    assert shared.whole(transfer_id(old), 3_000) is None  # nor its payload
    assert shared.whole(transfer_id(new), 3_000) is done_new[1]
    finished = feed(late, fresh(old_chunks[1:]))  # the late client still completes and verifies its model
    assert finished is not None and finished[1] == old
