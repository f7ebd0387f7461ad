"""The numpy safetensors reader/writer writes the real library's bytes and reads what it writes."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from har_models.wire import safetensors_np as stn

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32", "float64", "int64", "uint64"]


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i, d in enumerate(DTYPES):
        shape = tuple(int(s) for s in rng.integers(0, 4, size=int(rng.integers(0, 4))))
        a = (rng.standard_normal(shape) * 100).astype(d) if d != "bool" else rng.random(shape) > 0.5
        out[f"{'zyxw'[i % 4]}.{i}"] = np.asarray(a)
    out["conv.weight"] = rng.standard_normal((4, 6, 16, 1)).astype(np.float32)
    out["naïve ünïcode"] = np.arange(3, dtype=np.float32)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metadata", [None, {"arch": json.dumps({"n_classes": 6, "name": "ü\n"})}])
def test_bytes_identical_to_the_reference_library(seed, metadata):
    """No metadata (the codec's bodies) or one key (the store's files): byte for byte."""
    t = _tensors(seed)
    assert stn.save(t, metadata) == st_save(t, metadata)


def test_several_metadata_keys_same_content():
    """The reference writes several metadata keys in hash order (it varies between processes); ours sorts them."""
    t, meta = _tensors(3), {"b": "2", "a": 'x\n"q"', "ü": "é"}
    ours, ref = stn.save(t, meta), st_save(t, meta)
    nb = sum(v.nbytes for v in t.values())
    assert len(ours) == len(ref) and ours[-nb:] == ref[-nb:]  # same header size, same tensor bytes
    assert stn.load_with_metadata(ref)[1] == meta
    assert b'{"__metadata__":{"a":"x\\n\\"q\\"","b":"2","\xc3\xbc":"\xc3\xa9"}' in ours


def test_round_trip_both_ways():
    t = _tensors(5)
    for blob in (stn.save(t, {"k": "v"}), st_save(t, {"k": "v"})):
        back, meta = stn.load_with_metadata(blob)
        assert meta == {"k": "v"}
        assert back.keys() == t.keys()
        for k in t:
            assert back[k].dtype == t[k].dtype and back[k].shape == t[k].shape
            np.testing.assert_array_equal(back[k], t[k])
    ref = st_load(stn.save(t))
    for k in t:
        np.testing.assert_array_equal(ref[k], t[k])


def test_non_contiguous_and_big_endian_arrays_are_written_as_values():
    a = np.arange(12, dtype=">f4").reshape(3, 4).T
    assert stn.save({"a": a}) == st_save({"a": np.ascontiguousarray(a, dtype="<f4")})
    np.testing.assert_array_equal(stn.load(stn.save({"a": a}))["a"], a)


def test_empty_file():
    assert stn.save({}) == st_save({}) == b"\x08" + b"\x00" * 7 + b"{}      "
    assert stn.load(stn.save({})) == {}


def _blob(header: dict, body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"\x01\x02", "shorter than the 8-byte"),
        (struct.pack("<Q", 1000) + b"{}", "does not fit"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "not UTF-8 JSON"),
        (_blob({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "does not fill"),
        (_blob({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "malformed entry"),
        (_blob({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 4), "outside"),
        (_blob({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8), "after the last tensor"),
        (
            _blob(
                {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                b"\0" * 4,
            ),
            "overlaps",
        ),
        (_blob({"__metadata__": {"a": 1}}, b""), "strings to strings"),
    ],
)
def test_malformed_input_is_rejected_with_a_reason(blob, match):
    with pytest.raises(stn.SafetensorError, match=match):
        stn.load(blob)


def test_files_and_header_only_metadata(tmp_path):
    t = {"w": np.ones((2, 2), np.float32)}
    stn.save_file(t, tmp_path / "a.safetensors", {"arch": "{}"})
    assert (tmp_path / "a.safetensors").read_bytes() == st_save(t, {"arch": "{}"})
    assert stn.read_metadata(tmp_path / "a.safetensors") == {"arch": "{}"}
    np.testing.assert_array_equal(stn.load_file(tmp_path / "a.safetensors")["w"], t["w"])


def test_unsupported_dtype_names_the_fix():
    with pytest.raises(ValueError, match="complex128 has no safetensors equivalent"):
        stn.save({"c": np.zeros(2, np.complex128)})


def test_a_shape_whose_size_overflows_64_bits_is_refused():
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}}).encode()  # 2**64 floats: wraps to 0 in int64
    header += b" " * (-len(header) % 8)
    with pytest.raises(stn.SafetensorError, match="does not fill"):
        stn.load(struct.pack("<Q", len(header)) + header)


def test_layout_pieces_join_to_the_saved_bytes_and_view_the_callers_arrays():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensors = {"w": w, "b": np.zeros(4, np.float64), "t": w.T}
    head, arrays = stn.layout(tensors)
    assert b"".join([head, *arrays]) == stn.save(tensors) == st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()})
    assert [a.nbytes for a in arrays] == [32, 48, 48]  # F64 first, then the F32s by name ("t" before "w")
    assert np.shares_memory(np.frombuffer(arrays[2], np.float32), w)  # C-order input: viewed, not copied
    assert not np.shares_memory(np.frombuffer(arrays[1], np.float32), w)  # the transpose: a C-order copy
