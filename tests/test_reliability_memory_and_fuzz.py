"""Fault kinds at the receiving end, without a broker: memory of chunked transfers (issue 9
item 6), presence expiry and duplicate identities (items 15, 16), and a fuzz test of every
parser that takes bytes from the network (envelopes, chunks, JSON messages).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.presence import Presence
from coordinator.updates import ClientUpdate, UpdateRejected, validate_update
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import CHUNK_HEADER_BYTES, CHUNK_MAGIC, ChunkError, Reassembler, split_payload
from har_models.wire.messages import (
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    Receipt,
    RoundAnnouncement,
)

MB = 1_000_000
_HEADER = struct.Struct("<4s32sIIQI")


def _chunk(digest: bytes, index: int, count: int, total: int, part: bytes, crc: int | None = None) -> bytes:
    return _HEADER.pack(CHUNK_MAGIC, digest, index, count, total, zlib.crc32(part) if crc is None else crc) + part


# ------------------------------------------------------------------------------------- item 6: memory
def test_600_chunks_of_1_mb_announcing_10_mb_are_refused_after_10_mb():
    r = Reassembler()  # the defaults: 512 MiB per transfer, 2 GiB in all
    part = bytes(range(256)) * (MB // 256) + bytes(MB % 256)
    assert len(part) == MB
    crc = zlib.crc32(part)
    digest = hashlib.sha256(b"a transfer that lies about its size").digest()
    peak, refused = 0, 0
    for i in range(600):
        try:
            assert r.add("update/mallory", _chunk(digest, i, 600, 10 * MB, part, crc)) is None
        except ChunkError as exc:
            assert exc.reason == "oversized"
            refused += 1
        peak = max(peak, r.buffered_bytes)
    assert peak == 10 * MB  # exactly the declared total, never a byte more
    assert refused == 590  # chunk 10 would pass 10 MB; it and every later one are refused
    assert r.buffered_bytes == 0


def test_all_transfers_together_stay_under_the_cap_and_an_honest_one_still_completes():
    cap = 3_000
    r = Reassembler(max_buffer_bytes=cap, max_partial_per_stream=4)
    peak = 0
    for s in range(5):  # five clients each start a 2,000-byte transfer and stop after 1,000 bytes
        data = bytes([s]) * 2_000
        for ch in split_payload(data, 500 + CHUNK_HEADER_BYTES)[:2]:
            r.add(f"update/c{s}", ch)
            peak = max(peak, r.buffered_bytes)
    assert peak <= cap
    assert r.buffered_bytes == 3_000  # the three newest partial transfers, 1,000 bytes each
    honest = np.arange(500, dtype=np.float32).tobytes()  # 2,000 bytes
    out = None
    for ch in split_payload(honest, 700):
        out = r.add("update/honest", ch) or out
        peak = max(peak, r.buffered_bytes)
    assert out is not None and out[1] == honest
    assert peak <= cap


def test_a_transfer_cut_again_with_smaller_chunks_restarts_and_completes():
    data = bytes(range(256)) * 40  # 10,240 bytes
    r = Reassembler()
    big = split_payload(data, 4_000)
    assert r.add("s", big[0]) is None
    small = split_payload(data, 1_000)
    assert len(small) == 11 and len(big) == 3
    outs = [r.add("s", ch) for ch in small]
    assert outs[-1] == (hashlib.sha256(data).hexdigest(), data)
    assert r.buffered_bytes == 0


def test_stalled_transfers_name_their_missing_chunks():
    data = bytes(5_000)
    chunks = split_payload(data, 1_000 + CHUNK_HEADER_BYTES)
    r = Reassembler()
    for i in (0, 2, 4):
        r.add("update/a", chunks[i])
    (s,) = r.stalled(idle_s=0.0)
    assert (s.stream, s.count, s.missing) == ("update/a", 5, (1, 3))
    assert r.stalled(idle_s=3600.0) == []


def test_a_completed_transfer_can_be_received_again_once_forgotten():
    data = b"the same model in two runs"
    r = Reassembler()
    (ch,) = split_payload(data)
    tid = hashlib.sha256(data).hexdigest()
    assert r.add("global", ch) == (tid, data)
    assert r.add("global", ch) is None  # a QoS 1 duplicate
    r.forget("global", tid)
    assert r.add("global", ch) == (tid, data)


# ------------------------------------------------------------------------------------- item 16: presence
def _status(state: str = "online", instance: str = "i1", sent: float = 0.0, refresh: float = 10.0) -> ClientStatus:
    return ClientStatus("dev-a", state, n_train=5, instance=instance, sent_unix=sent, refresh_s=refresh)


def test_presence_expires_after_three_refresh_periods():
    p = Presence()
    p.note(_status(refresh=10.0), retained=False, now=100.0, now_unix=5_000.0)
    assert p.fresh("dev-a", now=129.9) and not p.fresh("dev-a", now=130.0)
    # A retained status is aged by the time it carries: sent 25 s ago, 5 s of its 30 are left.
    p.note(_status(sent=4_975.0), retained=True, now=200.0, now_unix=5_000.0)
    assert p.fresh("dev-a", now=204.9) and not p.fresh("dev-a", now=205.0)
    # A revoked device's status, retained an hour ago, is not fresh at all.
    p.note(_status(sent=1_400.0), retained=True, now=300.0, now_unix=5_000.0)
    assert not p.fresh("dev-a", now=300.0)
    # A status without a refresh period (refresh 0) never expires: it has no promise to keep.
    p.note(_status(refresh=0.0), retained=True, now=400.0, now_unix=5_000.0)
    assert p.fresh("dev-a", now=1e9)


def test_two_processes_under_one_id_are_detected_but_a_restart_is_not():
    restart = Presence()
    for s in (_status(instance="old"), _status("offline", "old"), _status(instance="new"), _status("offline", "old")):
        restart.note(s, retained=False, now=0.0, now_unix=0.0)
    assert restart.conflicts == {} and restart.fresh("dev-a", now=1.0)

    dup = Presence()
    # A connects; B takes the session over (A's will, B online); A takes it back.
    for s in (_status(instance="A"), _status("offline", "A"), _status(instance="B"), _status("offline", "B"), _status(instance="A")):
        dup.note(s, retained=False, now=0.0, now_unix=0.0)
    assert dup.conflicts == {"dev-a": ("B", "A")}
    assert not dup.fresh("dev-a", now=1.0)


# ------------------------------------------------------------------------------------- fuzz
SPEC = ArchSpec(n_classes=3, conv_filters=2, dense_units=4)


def _valid_update() -> bytes:
    state = {k: v.numpy() for k, v in init_state(SPEC, 1).items()}
    meta = {"run_id": "r", "stage": 0, "n_train": 4, "n_test": 2, "confusion": {"trained": [[1, 0, 0], [0, 1, 0], [0, 0, 0]]}}
    return codec.encode(state, kind="update", round=0, arch_version=SPEC.version, client_id="c1", meta=meta)


VALID = _valid_update()


def _validate(data: bytes) -> ClientUpdate:
    return validate_update(data, topic_client="c1", run_id="r", round_=0, stage=0, spec=SPEC, selected={"c1"}, want_guidance=False,
                    max_bytes=1 << 20, reported_n_train=4)  # fmt: skip


def test_the_fuzz_baseline_is_accepted():
    _validate(VALID)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_envelopes_raise_only_update_rejected(data):
    blob = bytearray(VALID)
    how = data.draw(st.sampled_from(["flip", "cut", "splice", "random"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    elif how == "splice":
        i = data.draw(st.integers(0, 200))
        blob[i:i] = data.draw(st.binary(max_size=64))
    else:
        blob = bytearray(data.draw(st.binary(max_size=512)))
    try:
        _validate(bytes(blob))
    except UpdateRejected as exc:
        assert exc.reason  # every refusal names its reason


def _header_json(meta_patch: dict) -> bytes:
    """A well-formed envelope whose metadata carries ``meta_patch`` (numbers and shapes from the fuzzer)."""
    state = {k: v.numpy() for k, v in init_state(SPEC, 1).items()}
    meta = {"run_id": "r", "stage": 0, "n_train": 4, "n_test": 2, **meta_patch}
    return codec.encode(state, kind="update", round=0, arch_version=SPEC.version, client_id="c1", meta=meta)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=16,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["n_train", "n_test", "stage", "run_id", "confusion", "loss"]), json_values, max_size=4))
def test_hostile_metadata_raises_only_update_rejected(patch):
    try:
        blob = _header_json(patch)
    except (TypeError, ValueError):
        return  # not encodable as JSON: cannot travel
    try:
        upd = _validate(blob)
    except UpdateRejected:
        return
    # Accepted only within the bounds: no more windows than the status reported, counts that fit int64.
    assert 0 <= upd.n_train <= 4 and upd.n_test >= 0
    for m in upd.confusion.values():
        assert m.dtype == np.int64 and m.shape == (3, 3) and int(m.sum()) <= upd.n_test


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20), st.data())
def test_chunk_streams_raise_only_chunk_error_and_never_grow_past_their_bounds(junk, data):
    r = Reassembler(max_payload_bytes=10_000, max_buffer_bytes=4_000)
    honest = split_payload(b"x" * 3_000, 1_000)
    msgs = list(junk)
    for ch in honest:  # honest chunks, some with forged headers, mixed into the junk
        m = bytearray(ch)
        if data.draw(st.booleans()):
            i = data.draw(st.integers(0, CHUNK_HEADER_BYTES - 1))
            m[i] ^= data.draw(st.integers(1, 255))
        msgs.insert(data.draw(st.integers(0, len(msgs))), bytes(m))
    for m in msgs:
        before = r.buffered_bytes
        try:
            out = r.add("s", m)
        except ChunkError as exc:
            assert exc.reason in {"bad_chunk", "chunk_crc_mismatch", "inconsistent_chunk", "oversized", "transfer_sha256_mismatch"}
            assert r.buffered_bytes <= before  # a refused chunk never adds to what is held
            continue
        assert r.buffered_bytes <= 4_000
        if out is not None:
            assert hashlib.sha256(out[1]).hexdigest() == out[0]


PARSERS = [
    (ClientStatus.from_bytes, {"protocol": 1, "client_id": "a", "state": "online"}),
    (CoordinatorStatus.from_bytes, {"protocol": 1, "state": "online", "run_id": "r", "attempt": "x"}),
    (Receipt.from_bytes, {"protocol": 1, "run_id": "r", "round": 0, "stage": 0, "transfer": "0" * 64, "state": "accepted"}),
    (RoundAnnouncement.from_bytes, {"protocol": 1, "run_id": "r", "round": 0, "state": "training", "arch": {}, "label_set": "x"}),
]


@pytest.mark.parametrize("parse,base", PARSERS, ids=lambda p: getattr(p, "__qualname__", ""))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patch=st.dictionaries(st.text(max_size=12), json_values, max_size=4), raw=st.binary(max_size=64))
def test_json_messages_raise_only_message_error(parse, base, patch, raw):
    parse(json.dumps(base).encode())  # the baseline parses
    for payload in (raw, json.dumps({**base, **patch}).encode()):
        with contextlib.suppress(MessageError):
            parse(payload)
    field = next(iter(patch), None)
    if field is not None:  # the same fuzz value in a known field
        with contextlib.suppress(MessageError):
            parse(json.dumps({**base, sorted(base.keys() - {"protocol"})[0]: patch[field]}).encode())
