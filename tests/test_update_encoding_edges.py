"""int8_delta at the edges of its range: zero and subnormal deltas, empty tensors, and scales or
codes a fedhar encoder never writes (pytorch/ao #4713 and PR #4762, ml-explore/mlx PR #1028 and
microsoft/onnxruntime PR #12470 are the same fault in other quantisers: a zero range divides by 0)."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.updates import UpdateRejected, validate_update
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.update_encoding import SCALE_PREFIX, BadEncoding, decode_update, encode_update, quantise

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=2)
RECEIVED = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}


def test_an_all_zero_delta_codes_as_zeros_with_scale_one():
    r = {"w": np.array([0.5, -2.0, 3.25], np.float32)}
    arrays, meta, residual = encode_update(r, r, "int8_delta")
    assert arrays["w"].dtype == np.int8 and arrays["w"].tolist() == [0, 0, 0]
    assert arrays[SCALE_PREFIX + "w"].tolist() == [1.0]
    assert residual["w"].tolist() == [0.0, 0.0, 0.0]
    assert decode_update(arrays, meta, r)["w"].tolist() == [0.5, -2.0, 3.25]


def test_a_subnormal_delta_stays_in_the_residual():
    # max|d| / 127 underflows to 0 in float32, so the scale falls back to 1 and the delta,
    # too small to code, is carried to the next upload instead of being lost.
    r = {"w": np.zeros(3, np.float32)}
    t = {"w": np.array([1e-44, 0.0, -1e-44], np.float32)}
    arrays, meta, residual = encode_update(t, r, "int8_delta")
    assert arrays["w"].tolist() == [0, 0, 0]
    assert arrays[SCALE_PREFIX + "w"].tolist() == [1.0]
    np.testing.assert_array_equal(residual["w"], t["w"])
    assert residual["w"][0] > 0 and residual["w"][2] < 0
    assert decode_update(arrays, meta, r)["w"].tolist() == [0.0, 0.0, 0.0]


def test_an_empty_tensor_and_an_all_zero_row_round_trip():
    r = {"empty": np.zeros((0,), np.float32), "m": np.zeros((2, 3), np.float32)}
    t = {"empty": np.zeros((0,), np.float32), "m": np.array([[0.0, 0.0, 0.0], [1.27, -0.635, 0.0]], np.float32)}
    arrays, meta, residual = encode_update(t, r, "int8_delta")
    assert arrays["empty"].shape == (0,) and arrays[SCALE_PREFIX + "empty"].tolist() == [1.0]
    # s = 1.27 / 127 = 0.01: row 1 codes to 127, -64 (round half to even of -63.5), 0.
    assert arrays["m"].tolist() == [[0, 0, 0], [127, -64, 0]]
    back = decode_update(arrays, meta, r)
    assert back["empty"].shape == (0,)
    np.testing.assert_allclose(back["m"], [[0, 0, 0], [1.27, -0.64, 0]], atol=1e-6)
    np.testing.assert_allclose(residual["m"], t["m"] - back["m"], atol=1e-7)
    q, s = quantise(np.zeros((0,), np.float32))
    assert q.shape == (0,) and s == 1.0


def _envelope(arrays) -> bytes:
    meta = {"run_id": "r", "stage": 0, "n_train": 40, "n_test": 0, "encoding": "int8_delta"}
    return codec.encode(arrays, kind="update", round=3, arch_version=2, client_id="c1", meta=meta)


def _trained() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in RECEIVED.items()}


@pytest.mark.parametrize("scale", [0.0, -0.01, float("nan"), float("inf"), -float("inf")])
def test_a_scale_that_is_not_finite_and_positive_is_rejected(scale):
    arrays, _, _ = encode_update(_trained(), RECEIVED, "int8_delta")
    arrays[SCALE_PREFIX + "out.bias"] = np.array([scale], np.float32)
    with pytest.raises(UpdateRejected) as e:
        validate_update(_envelope(arrays), topic_client="c1", run_id="r", round_=3, stage=0, spec=SPEC,
                        selected={"c1"}, want_guidance=False, reference=RECEIVED)  # fmt: skip
    assert e.value.reason == "bad_encoding"


def test_a_code_of_minus_128_is_rejected():
    arrays, meta, _ = encode_update(_trained(), RECEIVED, "int8_delta")
    q = arrays["out.bias"].copy()
    q[0] = -128
    arrays["out.bias"] = q
    with pytest.raises(BadEncoding, match="-128"):
        decode_update(arrays, meta, RECEIVED)
    with pytest.raises(UpdateRejected) as e:
        validate_update(_envelope(arrays), topic_client="c1", run_id="r", round_=3, stage=0, spec=SPEC,
                        selected={"c1"}, want_guidance=False, reference=RECEIVED)  # fmt: skip
    assert e.value.reason == "bad_encoding"


def test_every_accepted_int8_update_is_finite():
    arrays, _, _ = encode_update(_trained(), RECEIVED, "int8_delta")
    accepted = validate_update(_envelope(arrays), topic_client="c1", run_id="r", round_=3, stage=0, spec=SPEC,
                               selected={"c1"}, want_guidance=False, reference=RECEIVED)  # fmt: skip
    assert set(accepted.state) == set(RECEIVED)
    assert all(np.isfinite(v.numpy()).all() for v in accepted.state.values())


def test_a_float32_update_with_nan_is_still_non_finite():
    t = _trained()
    t["out.bias"][0] = np.nan
    meta = {"run_id": "r", "stage": 0, "n_train": 40, "n_test": 0}
    data = codec.encode(t, kind="update", round=3, arch_version=2, client_id="c1", meta=meta)
    with pytest.raises(UpdateRejected) as e:
        validate_update(data, topic_client="c1", run_id="r", round_=3, stage=0, spec=SPEC,
                        selected={"c1"}, want_guidance=False, reference=RECEIVED)  # fmt: skip
    assert e.value.reason == "non_finite"
