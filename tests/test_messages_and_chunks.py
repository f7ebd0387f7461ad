"""Chunked transfers and JSON control messages."""

import dataclasses
import hashlib
import json
import random

import pytest

from har_models.wire.chunking import CHUNK_HEADER_BYTES, ChunkError, Reassembler, parse_chunk, split_payload, transfer_id
from har_models.wire.messages import ClientStatus, MessageError, RoundAnnouncement, TrainingPlan
from har_models.wire.topics import Topics


def test_chunks_respect_the_size_limit_and_reassemble_in_any_order_with_duplicates():
    payload = random.Random(0).randbytes(10_000)
    chunks = split_payload(payload, max_message_bytes=1_000)
    room = 1_000 - CHUNK_HEADER_BYTES
    assert len(chunks) == -(-10_000 // room) and all(len(c) <= 1_000 for c in chunks)
    shuffled = chunks + chunks[:3]  # QoS 1 may deliver some twice
    random.Random(1).shuffle(shuffled)
    r = Reassembler()
    results = [r.add("s", c) for c in shuffled]
    done = [x for x in results if x is not None]
    assert done == [(hashlib.sha256(payload).hexdigest(), payload)]
    assert r.buffered_bytes == 0
    assert r.add("s", chunks[0]) is None  # late duplicate of a finished transfer is ignored


def test_empty_payload_is_one_chunk():
    chunks = split_payload(b"", 100)
    assert len(chunks) == 1
    assert Reassembler().add("s", chunks[0]) == (transfer_id(b""), b"")


def test_a_corrupted_chunk_is_dropped_and_names_its_reason():
    chunks = split_payload(b"x" * 500, 200)
    bad = bytearray(chunks[1])
    bad[-1] ^= 1
    with pytest.raises(ChunkError) as e:
        Reassembler().add("s", bytes(bad))
    assert e.value.reason == "chunk_crc_mismatch"


def test_malformed_chunks():
    with pytest.raises(ChunkError, match="shorter"):
        parse_chunk(b"abc")
    with pytest.raises(ChunkError, match="expected b'FHC1'"):
        parse_chunk(b"XXXX" + split_payload(b"abc", 100)[0][4:])


def test_mixed_up_chunks_of_two_transfers_never_make_a_wrong_payload():
    a, b = b"A" * 300, b"B" * 300
    ca, cb = split_payload(a, 160), split_payload(b, 160)
    r = Reassembler(max_partial_per_stream=2)
    out = [r.add("s", c) for c in (ca[0], cb[0], cb[1], ca[1], ca[2], cb[2])]
    got = sorted(x[1] for x in out if x)
    assert got == [a, b]


def test_oversized_transfer_is_refused_before_buffering():
    chunks = split_payload(b"z" * 5_000, 1_000)
    with pytest.raises(ChunkError) as e:
        Reassembler(max_payload_bytes=1_000).add("s", chunks[0])
    assert e.value.reason == "oversized"


def test_old_partial_transfers_are_evicted_per_stream():
    r = Reassembler(max_partial_per_stream=1)
    first = split_payload(b"1" * 300, 160)
    second = split_payload(b"2" * 300, 160)
    r.add("s", first[0])
    r.add("s", second[0])  # evicts the unfinished first transfer
    assert r.add("s", first[1]) is None and r.add("s", first[2]) is None  # first restarts, still incomplete
    assert r.add("s", second[1]) is None  # second was evicted by the restart of the first
    assert r.buffered_bytes > 0


def test_topics_are_versioned_and_parse_back():
    t = Topics("home")
    assert t.round == "fedhar/v1/home/round"
    assert t.client_update("hapt-01", 3) == "fedhar/v1/home/client/hapt-01/update/3"
    assert t.parse_client_topic(t.client_update("hapt-01", 3)) == ("hapt-01", "update")
    assert t.parse_client_topic("fedhar/v1/other/client/x/status") is None
    with pytest.raises(ValueError, match="federation name"):
        Topics("a/b")


def test_announcement_round_trip_and_rejections():
    ann = RoundAnnouncement(
        run_id="r1",
        round=2,
        state="training",
        arch={"n_classes": 6},
        label_set="hapt6",
        selected=("a", "b"),
        plan=TrainingPlan(local_epochs=3, guidance=True),
        global_model="ab",
        personal_models={"b": "cd"},
        deadline_unix=1.5,
        stage=1,
        attempt="x",
    )
    back = RoundAnnouncement.from_bytes(ann.to_bytes())
    assert back == ann
    assert back.model_for("a") == ("global", "ab") and back.model_for("b") == ("personal", "cd")
    for bad in (
        b"{",
        b"[]",
        b'{"protocol": 2}',
        ann.to_bytes().replace(b'"training"', b'"dancing"'),
        ann.to_bytes().replace(b'"local_epochs": 3', b'"local_epochs": -1'),
        ann.to_bytes().replace(b'"selected": ["a", "b"]', b'"selected": ["a/../b"]'),
    ):
        with pytest.raises(MessageError):
            RoundAnnouncement.from_bytes(bad)


def test_client_status_round_trip_and_rejections():
    st = ClientStatus("hapt-01", "online", "hapt6", 10, 3, {"count": 1}, (5, 5), "r", 4)
    assert ClientStatus.from_bytes(st.to_bytes()) == st
    with pytest.raises(MessageError, match=r"n_train must be an integer in \[0, 1000000000\], got -1"):
        ClientStatus.from_bytes(st.to_bytes().replace(b'"n_train": 10', b'"n_train": -1'))
    with pytest.raises(MessageError):
        ClientStatus.from_bytes(b"\xff\xfe")


def test_the_timings_warm_up_and_refused_objects_of_a_status_are_optional_and_checked() -> None:
    """A device reports its last round's train/download/upload seconds, whether it is warming up and the objects it
    refused for their hash; a status without them (an older device) is the message it always was, and reads as before."""
    plain = ClientStatus("hapt-01", "online", n_train=4)
    assert not {b"train_s", b"upload_s", b"download_s", b"warming_up", b"bad_objects"} & set(plain.to_bytes().split(b'"'))
    full = dataclasses.replace(plain, train_s=47.25, download_s=0.5, upload_s=1.125, warming_up=True, bad_objects=("ab" * 32,))
    doc = json.loads(full.to_bytes())
    assert (doc["train_s"], doc["download_s"], doc["upload_s"], doc["warming_up"], doc["bad_objects"]) == (47.25, 0.5, 1.125, True,
                                                                                                           ["ab" * 32])  # fmt: skip
    assert ClientStatus.from_bytes(full.to_bytes()) == full
    older = {k: v for k, v in doc.items() if k not in ("train_s", "download_s", "upload_s", "warming_up", "bad_objects")}
    assert ClientStatus.from_bytes(json.dumps(older).encode()) == plain  # an older device's status
    for key, bad in (("train_s", -1), ("upload_s", "fast"), ("warming_up", 1), ("bad_objects", ["xyz"]), ("bad_objects", ["ab" * 32] * 9)):
        with pytest.raises(MessageError, match=key):
            ClientStatus.from_bytes(json.dumps(doc | {key: bad}).encode())


def test_a_status_from_a_newer_client_reads_without_its_new_keys_and_strict_refuses_them() -> None:
    """Forward compatibility: an unknown top-level key is dropped (docs/protocol.md), a nested one is not."""
    st = ClientStatus(client_id="phone-1", state="online", label_set="hapt6", n_train=12, n_test=3)
    doc = json.loads(st.to_bytes())
    doc["added_by_a_later_release"] = {"x": 1}
    newer = json.dumps(doc).encode()
    assert ClientStatus.from_bytes(newer) == st
    with pytest.raises(MessageError, match=r"unknown fields \['added_by_a_later_release'\]"):
        ClientStatus.from_bytes(newer, strict=True)
    doc.pop("added_by_a_later_release")
    doc["cost"] = {"sensing_cpu_s_per_h": 3.5, "not_a_cost_key": 1}
    with pytest.raises(MessageError):
        ClientStatus.from_bytes(json.dumps(doc).encode())
