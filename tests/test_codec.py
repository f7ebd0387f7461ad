"""Model codec: bit-exact round trips and one clear error per kind of corruption."""

import hashlib
import struct

import numpy as np
import pytest
import torch

from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec


def _roundtrip(tensors):
    return codec.decode(codec.encode(tensors, kind="model", round=3, arch_version=1, client_id="c1")).tensors


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_roundtrip_is_bit_exact_for_float_dtypes(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((5, 7)) * 1e3).astype(dtype)
    a[0, 0] = np.finfo(dtype).tiny  # smallest normal, survives only if bits are kept
    a[0, 1] = -0.0
    out = _roundtrip({"w": a})["w"]
    assert out.dtype == dtype and out.shape == a.shape
    assert out.tobytes() == a.tobytes()


def test_roundtrip_of_non_contiguous_and_transposed_arrays_keeps_values():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    tensors = {"t": base.T, "strided": base[:, ::2], "torch_t": torch.arange(12.0).reshape(3, 4).t()}
    assert not tensors["t"].flags["C_CONTIGUOUS"] and not tensors["strided"].flags["C_CONTIGUOUS"]
    out = _roundtrip(tensors)
    np.testing.assert_array_equal(out["t"], base.T)
    np.testing.assert_array_equal(out["strided"], base[:, ::2])
    np.testing.assert_array_equal(out["torch_t"], torch.arange(12.0).reshape(3, 4).t().numpy())


def test_header_fields_and_metadata_survive():
    data = codec.encode(
        {"a": np.ones(2, np.float32)},
        kind="update",
        round=7,
        arch_version=2,
        client_id="hapt-01",
        meta={"n_train": 12, "x": [1, 2]},
    )
    env = codec.decode(data)
    assert (env.kind, env.round, env.arch_version, env.client_id) == ("update", 7, 2, "hapt-01")
    assert env.meta == {"n_train": 12, "x": [1, 2]}
    body_len = codec.peek_header(data)["body_len"]
    assert env.sha256 == hashlib.sha256(data[-body_len:]).hexdigest()
    assert env.size == len(data)


def _good():
    return codec.encode({"w": np.arange(6, dtype=np.float32)}, kind="update", round=1, arch_version=0, client_id="c")


def test_wrong_sha256_is_rejected():
    data = bytearray(_good())
    data[-1] ^= 0xFF  # flip bits in the body
    with pytest.raises(codec.ChecksumMismatch) as e:
        codec.decode(bytes(data))
    assert e.value.reason == "sha256_mismatch"


def test_truncated_body_is_rejected():
    with pytest.raises(codec.Truncated, match="body is"):
        codec.decode(_good()[:-5])


def test_truncated_header_is_rejected():
    with pytest.raises(codec.Truncated):
        codec.decode(_good()[:12])


def test_unknown_version_is_rejected():
    data = bytearray(_good())
    struct.pack_into("<H", data, 4, 99)
    with pytest.raises(codec.UnknownVersion, match="version 99"):
        codec.decode(bytes(data))


def test_bad_magic_is_rejected():
    with pytest.raises(codec.BadMagic):
        codec.decode(b"PK\x03\x04" + _good()[4:])


def test_non_finite_values_are_rejected_by_name():
    bad = codec.encode(
        {"ok": np.zeros(2, np.float32), "bad": np.array([1.0, np.nan], np.float32)}, kind="update", round=0, arch_version=0
    )
    with pytest.raises(codec.NonFinite, match="'bad'"):
        codec.decode(bad)
    assert codec.decode(bad, require_finite=False).tensors["bad"].shape == (2,)


def test_oversized_envelope_is_rejected():
    with pytest.raises(codec.Oversized):
        codec.decode(_good(), max_bytes=10)


def test_wrong_tensor_names_and_shapes_are_named():
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    state = {k: v.numpy() for k, v in init_state(spec, 0).items()}
    codec.check_tensors(spec.shapes(), state)
    missing = dict(state)
    del missing["out.bias"]
    with pytest.raises(codec.WrongTensors, match=r"missing \['out.bias'\]"):
        codec.check_tensors(spec.shapes(), missing)
    extra = {**state, "evil": np.zeros(1)}
    with pytest.raises(codec.WrongTensors, match=r"unexpected \['evil'\]"):
        codec.check_tensors(spec.shapes(), extra)
    wrong = {**state, "hidden.bias": np.zeros(9, np.float32)}
    with pytest.raises(codec.WrongTensors, match=r"'hidden.bias' has shape \(9,\).*\(8,\)"):
        codec.check_tensors(spec.shapes(), wrong)


def test_body_that_is_not_safetensors_is_rejected():
    body = b"\x00" * 16
    header = {
        "kind": "model",
        "round": 0,
        "arch_version": 0,
        "client_id": "",
        "body_len": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "meta": {},
    }
    import json

    h = json.dumps(header).encode()
    with pytest.raises(codec.BadBody):
        codec.decode(struct.pack("<4sHI", b"FHAR", 1, len(h)) + h + body)


def test_a_pickle_is_never_loaded():
    import pickle

    with pytest.raises(codec.BadMagic):
        codec.decode(pickle.dumps({"w": np.zeros(3)}))
