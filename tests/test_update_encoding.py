"""Update encodings: float16 and int8 deltas round-trip within their stated error, error feedback
keeps the sum of uploads on track, unknown encodings are refused, float32 is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.small_federation import simulate_args

from coordinator.config import CoordinatorConfig, TrainingSettings
from coordinator.exchange import published_models
from coordinator.round import base_plan
from coordinator.strategies import Federation
from coordinator.updates import UpdateRejected, validate_update
from edge_client.store import ClientStore
from edge_client.trainer import RESIDUAL_NAME, ClientTrainer
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.messages import GUIDANCE_PREFIX, MessageError, RoundAnnouncement, TrainingPlan
from har_models.wire.update_encoding import (
    SCALE_PREFIX,
    UnknownEncoding,
    decode_update,
    encode_update,
)
from simulation import simulate

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=2)
RECEIVED = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}


def _trained(seed: int = 1, step: float = 0.05) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (v + step * rng.standard_normal(v.shape)).astype(np.float32) for k, v in RECEIVED.items()}


def _meta(**extra):
    return {"run_id": "r", "stage": 0, "n_train": 40, "n_test": 0, **extra}


def _validate(data: bytes, reference=None, guidance=False):
    return validate_update(
        data, topic_client="c1", run_id="r", round_=3, stage=0, spec=SPEC, selected={"c1"}, want_guidance=guidance,
        reference=reference,
    )  # fmt: skip


# ------------------------------------------------------------------------------------ float16
def test_float16_round_trips_within_half_precision():
    rng = np.random.default_rng(0)
    normal = (rng.choice([-1, 1], 5000) * 10.0 ** rng.uniform(-4.2, 4.5, 5000)).astype(np.float32)  # half's normal range
    tiny = rng.uniform(-6e-5, 6e-5, 1000).astype(np.float32)  # half's subnormals
    arrays, meta, residual = encode_update({"a": normal, "b": tiny}, None, "float16")
    assert meta == {"encoding": "float16"} and residual == {}
    assert arrays["a"].dtype == np.float16 and arrays["a"].nbytes == normal.nbytes // 2
    back = decode_update(arrays, meta, None)
    assert back["a"].dtype == np.float32
    assert np.all(np.abs(back["a"] - normal) <= 2.0**-11 * np.abs(normal))
    assert np.all(np.abs(back["b"] - tiny) <= 2.0**-25)
    # The bound is tight: round-to-nearest does reach half an ulp somewhere in 5000 draws.
    assert np.max(np.abs(back["a"] - normal) / np.abs(normal)) > 0.9 * 2.0**-12


def test_float16_refuses_values_it_cannot_hold():
    with pytest.raises(ValueError, match="65504"):
        encode_update({"w": np.array([1.0, 7e4], np.float32)}, None, "float16")


# ------------------------------------------------------------------------------------ int8_delta
def test_int8_delta_known_answer():
    received = {"w": np.array([1.0, 2.0, 3.0, 4.0], np.float32)}
    t = {"w": np.array([1.5, 0.73, 3.0, 4.0049], np.float32)}  # d = [0.5, -1.27, 0, 0.0049]
    arrays, meta, e = encode_update(t, received, "int8_delta")
    s = np.float32(1.27) / np.float32(127)  # max|d| / 127 = 0.01
    assert meta == {"encoding": "int8_delta"}
    assert arrays["w"].dtype == np.int8 and arrays["w"].tolist() == [50, -127, 0, 0]
    assert arrays[SCALE_PREFIX + "w"].dtype == np.float32 and arrays[SCALE_PREFIX + "w"].shape == (1,)
    np.testing.assert_allclose(arrays[SCALE_PREFIX + "w"][0], s, rtol=1e-6)
    np.testing.assert_allclose(e["w"], [0.0, 0.0, 0.0, 0.0049], atol=2e-6)  # 0.49 steps round to 0 and stay
    back = decode_update(arrays, meta, received)
    np.testing.assert_allclose(back["w"], [1.5, 0.73, 3.0, 4.0], atol=2e-6)


def test_int8_delta_round_trips_within_half_a_step():
    t = _trained()
    arrays, meta, residual = encode_update(t, RECEIVED, "int8_delta")
    back = decode_update(arrays, meta, RECEIVED)
    for k in RECEIVED:
        s = arrays[SCALE_PREFIX + k][0]
        d = t[k] - RECEIVED[k]
        np.testing.assert_allclose(s, np.abs(d).max() / 127, rtol=1e-6)
        err = np.abs(back[k] - t[k])
        assert err.max() <= s / 2 * (1 + 1e-4) + 1e-6 * np.abs(t[k]).max(), k
        # The residual is exactly what the receiver is missing.
        np.testing.assert_allclose(residual[k], t[k] - back[k], atol=1e-6)
    assert set(residual) == set(RECEIVED)


def test_an_all_zero_delta_has_scale_one_and_no_residual():
    arrays, meta, residual = encode_update(RECEIVED, RECEIVED, "int8_delta")
    for k in RECEIVED:
        assert arrays[SCALE_PREFIX + k][0] == 1.0 and not arrays[k].any() and not residual[k].any()
        np.testing.assert_array_equal(decode_update(arrays, meta, RECEIVED)[k], RECEIVED[k])


def test_guidance_is_coded_against_the_received_model_without_feedback():
    t = _trained(1)
    g = _trained(2)
    tensors = {**t, **{GUIDANCE_PREFIX + k: v for k, v in g.items()}}
    poisoned = {k: np.full_like(v, 1.0) for k, v in RECEIVED.items()}  # a residual must not touch guidance
    arrays, meta, residual = encode_update(tensors, RECEIVED, "int8_delta", poisoned)
    assert set(residual) == set(RECEIVED)
    back = decode_update(arrays, meta, RECEIVED)
    for k in RECEIVED:
        s = arrays[SCALE_PREFIX + GUIDANCE_PREFIX + k][0]
        assert np.abs(back[GUIDANCE_PREFIX + k] - g[k]).max() <= s / 2 * (1 + 1e-4) + 1e-6, k


def _uploads(rounds: int, feedback: bool, seed: int = 5):
    """Sum of true and of decoded deltas over ``rounds`` uploads, each against a new received model."""
    rng = np.random.default_rng(seed)
    residual: dict[str, np.ndarray] | None = None
    true_sum = {k: np.zeros_like(v, dtype=np.float64) for k, v in RECEIVED.items()}
    got_sum = {k: np.zeros_like(v, dtype=np.float64) for k, v in RECEIVED.items()}
    last_scale = {}
    for _ in range(rounds):
        received = {k: (v + rng.standard_normal(v.shape)).astype(np.float32) for k, v in RECEIVED.items()}
        delta = {k: (0.01 * rng.standard_normal(v.shape) + 0.002).astype(np.float32) for k, v in RECEIVED.items()}
        t = {k: received[k] + delta[k] for k in received}
        arrays, meta, new = encode_update(t, received, "int8_delta", residual if feedback else None)
        residual = new
        back = decode_update(arrays, meta, received)
        for k in RECEIVED:
            true_sum[k] += t[k].astype(np.float64) - received[k]
            got_sum[k] += back[k].astype(np.float64) - received[k]
            last_scale[k] = float(arrays[SCALE_PREFIX + k][0])
    return true_sum, got_sum, last_scale


def test_error_feedback_keeps_the_sum_of_uploads_within_one_step():
    rounds = 40
    true_sum, got_sum, s = _uploads(rounds, feedback=True)
    for k in RECEIVED:
        # sum of decoded = sum of true - e_R, and |e_R| <= s_R / 2 (float32 arithmetic adds a little)
        assert np.abs(got_sum[k] - true_sum[k]).max() <= s[k] / 2 + 1e-4, k
    # Without feedback the rounding errors pile up: the same check fails by far.
    true_nf, got_nf, s_nf = _uploads(rounds, feedback=False)
    worst = max(np.abs(got_nf[k] - true_nf[k]).max() / (s_nf[k] / 2) for k in RECEIVED)
    assert worst > 3


def test_a_residual_of_another_shape_counts_as_zeros():
    t = _trained()
    fresh, _, _ = encode_update(t, RECEIVED, "int8_delta")
    stale = {k: np.ones(np.asarray(v.shape) + 1, np.float32) if v.ndim else v for k, v in RECEIVED.items()}  # pre-growth shapes
    again, _, _ = encode_update(t, RECEIVED, "int8_delta", stale)
    for k in RECEIVED:
        np.testing.assert_array_equal(fresh[k], again[k])


def test_encoder_refuses_what_it_cannot_code():
    with pytest.raises(UnknownEncoding):
        encode_update(RECEIVED, RECEIVED, "int4")
    with pytest.raises(ValueError, match="received"):
        encode_update(RECEIVED, None, "int8_delta")
    with pytest.raises(ValueError, match="shape"):
        encode_update({"conv.bias": np.zeros(3, np.float32)}, RECEIVED, "int8_delta")
    with pytest.raises(ValueError, match="reserved"):
        encode_update({SCALE_PREFIX + "x": np.zeros(1, np.float32)}, RECEIVED, "float16")


# ------------------------------------------------------------------------------------ receiver
def test_unknown_encoding_is_rejected_with_its_reason():
    t = _trained()
    with pytest.raises(UnknownEncoding) as e:
        decode_update(t, {"encoding": "zstd"}, RECEIVED)
    assert e.value.reason == "unknown_encoding"
    data = codec.encode(t, kind="update", round=3, arch_version=2, client_id="c1", meta=_meta(encoding="zstd"))
    with pytest.raises(UpdateRejected) as r:
        _validate(data, RECEIVED)
    assert r.value.reason == "unknown_encoding" and "zstd" in str(r.value)


def _envelope(arrays, meta_fields) -> bytes:
    return codec.encode(arrays, kind="update", round=3, arch_version=2, client_id="c1", meta=_meta(**meta_fields))


def test_malformed_encoded_updates_are_rejected_with_reasons():
    arrays, fields, _ = encode_update(_trained(), RECEIVED, "int8_delta")
    no_scale = {k: v for k, v in arrays.items() if k != SCALE_PREFIX + "out.bias"}
    zero_scale = {**arrays, SCALE_PREFIX + "out.bias": np.zeros(1, np.float32)}
    wide = {**arrays, "out.bias": arrays["out.bias"].astype(np.int16)}
    assert _reason(_envelope(arrays, fields), None) == "bad_encoding"  # the receiver has nothing to add deltas to
    assert _reason(_envelope(no_scale, fields), RECEIVED) == "bad_encoding"
    assert _reason(_envelope(zero_scale, fields), RECEIVED) == "bad_encoding"
    assert _reason(_envelope(wide, fields), RECEIVED) == "bad_encoding"
    other = {**RECEIVED, "out.bias": np.zeros(7, np.float32)}
    assert _reason(_envelope(arrays, fields), other) == "wrong_tensors"
    as_float32 = {k: v.astype(np.float32) for k, v in _trained().items()}
    assert _reason(_envelope(as_float32, {"encoding": "float16"}), RECEIVED) == "bad_encoding"


def _reason(data: bytes, reference) -> str:
    with pytest.raises(UpdateRejected) as e:
        _validate(data, reference)
    return e.value.reason


def test_the_coordinator_rebuilds_int8_and_float16_updates_with_guidance():
    t, g = _trained(1), _trained(2)
    tensors = {**t, **{GUIDANCE_PREFIX + k: v for k, v in g.items()}}
    for encoding, tol in (("float16", 2.0**-11), ("int8_delta", None)):
        arrays, fields, _ = encode_update(tensors, RECEIVED, encoding)
        u = _validate(_envelope(arrays, fields), RECEIVED, guidance=True)
        assert u.guidance is not None and u.meta["encoding"] == encoding
        for k in RECEIVED:
            for got, want, name in ((u.state[k].numpy(), t[k], k), (u.guidance[k].numpy(), g[k], GUIDANCE_PREFIX + k)):
                bound = tol * np.abs(want) + 1e-7 if tol else arrays[SCALE_PREFIX + name][0] / 2 * (1 + 1e-4) + 1e-6
                assert np.all(np.abs(got - want) <= bound), (encoding, name)


def test_published_models_give_each_client_its_own_reference():
    g = init_state(SPEC, 0)
    p = init_state(SPEC, 9)
    fed = Federation(SPEC, SPEC, g, {"c2": p})
    ref = published_models(fed)
    assert ref("c1") is g and ref("c2") is p
    grown = init_state(SPEC, 3)
    fed.global_state = grown  # a FedDist intermediate stage publishes the grown G
    assert ref("c1") is grown and ref("c2") is p


# ------------------------------------------------------------------------------------ settings
def test_the_setting_travels_from_config_to_plan_and_announcement():
    cfg = CoordinatorConfig(run_dir=Path("."), training=TrainingSettings(update_encoding="int8_delta"))
    plan = base_plan(cfg)
    assert plan.update_encoding == "int8_delta"
    ann = RoundAnnouncement(run_id="r", round=0, state="training", arch=SPEC.to_dict(), label_set="hapt6", plan=plan)
    assert RoundAnnouncement.from_bytes(ann.to_bytes()).plan.update_encoding == "int8_delta"
    # The default is left out of the announcement: a client built before encodings existed still reads it.
    plain = RoundAnnouncement(run_id="r", round=0, state="training", arch=SPEC.to_dict(), label_set="hapt6")
    assert "update_encoding" not in json.loads(plain.to_bytes())["plan"]
    assert RoundAnnouncement.from_bytes(plain.to_bytes()).plan.update_encoding == "float32"
    with pytest.raises(ValueError, match="update_encoding"):
        CoordinatorConfig(run_dir=Path("."), training=TrainingSettings(update_encoding="int4"))
    with pytest.raises(ValueError, match="update_encoding"):
        TrainingPlan(update_encoding="int4")
    with pytest.raises(MessageError, match="update_encoding"):
        TrainingPlan.from_json({"update_encoding": "int4"})


# ------------------------------------------------------------------------------------ clients
def _store(tmp_path: Path) -> ClientStore:
    rng = np.random.default_rng(0)
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.replace_windows("src", WindowSet(rng.normal(size=(50, 6, 128)).astype(np.float32), np.arange(50) % 6, HAPT_LABELS), 0.2, seed=1)
    return store


def _ann(encoding: str, run_id: str = "r", round_: int = 1) -> RoundAnnouncement:
    plan = TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, update_encoding=encoding)
    return RoundAnnouncement(
        run_id=run_id, round=round_, state="training", arch=SPEC.to_dict(), label_set="hapt6", selected=("c",), plan=plan
    )


PRE_ENCODING_META_KEYS = {"run_id", "stage", "n_train", "n_test", "label_set", "train_loss", "train_seconds", "steps", "init_mode",
                          "ala", "confusion"}  # fmt: skip


def test_a_float32_envelope_is_byte_identical_to_one_without_encodings(tmp_path):
    store = _store(tmp_path)
    out = ClientTrainer(store, "c").run_round(_ann("float32"), RECEIVED)
    header = codec.peek_header(out.envelope)
    assert set(header["meta"]) == PRE_ENCODING_META_KEYS  # nothing added, not even "encoding": "float32"
    # The envelope is exactly the trained model (as stored) with that metadata: re-encoding it gives the same bytes.
    _, trained = store.load_local_model()
    again = codec.encode(trained, kind="update", round=1, arch_version=SPEC.version, client_id="c", meta=header["meta"])
    assert again == out.envelope
    # And the encoder's float32 path hands the very same objects to the codec.
    arrays, fields, residual = encode_update(trained, RECEIVED, "float32")
    assert fields == {} and residual == {} and all(arrays[k] is trained[k] for k in trained)
    assert store.load_tensors(RESIDUAL_NAME) is None


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["torch", "numpy"])
def test_clients_upload_int8_deltas_and_keep_the_residual_per_run(tmp_path, trainer):
    store = _store(tmp_path)
    agent = ClientTrainer(store, "c", trainer)
    out = agent.run_round(_ann("int8_delta"), RECEIVED)
    env = codec.decode(out.envelope)
    assert env.meta["encoding"] == "int8_delta"
    assert all(env.tensors[k].dtype == np.int8 for k in RECEIVED)
    _, trained = store.load_local_model()
    back = decode_update(env.tensors, env.meta, RECEIVED)
    residual, info = store.load_tensors(RESIDUAL_NAME)
    assert info == {"run_id": "r", "round": 1, "stage": 0}
    for k in RECEIVED:
        s = env.tensors[SCALE_PREFIX + k][0]
        assert np.abs(back[k] - trained[k]).max() <= s / 2 * (1 + 1e-4) + 1e-6, k
        np.testing.assert_allclose(residual[k], trained[k] - back[k], atol=1e-6)
    # float32 is 4 bytes a parameter, int8 one, plus a 4-byte scale and its safetensors header entry (< 100 bytes) per tensor
    n_params, n_tensors = sum(v.size for v in RECEIVED.values()), len(RECEIVED)
    assert sum(v.nbytes for v in env.tensors.values()) == n_params + 4 * n_tensors
    as_float32 = codec.encode(trained, kind="update", round=1, arch_version=2, client_id="c", meta=env.meta)
    assert len(as_float32) - env.size > 3 * n_params - 100 * n_tensors
    # A new run starts without the old residual.
    agent.run_round(_ann("int8_delta", run_id="r2", round_=0), RECEIVED)
    _, info2 = store.load_tensors(RESIDUAL_NAME)
    assert info2["run_id"] == "r2"
    store.forget_run_state()
    assert store.load_tensors(RESIDUAL_NAME) is None


# ------------------------------------------------------------------------------------ end to end
# lr 0.01: the float32 and int8_delta runs' models are compared after 3 rounds, and a larger step lets the two
# trajectories drift apart by more than the codec's own error.
SMALL = [*simulate_args(conv_filters=16, dense_units=64, generalisation_every=0), "--rounds", "3", "--workers", "2", "--lr", "0.01"]


@pytest.mark.slow
def test_a_federation_in_int8_deltas_sends_a_quarter_of_the_bytes(tmp_path):
    docs = {}
    for encoding in ("float32", "int8_delta"):
        run = tmp_path / encoding
        assert simulate.main([*SMALL, "--update-encoding", encoding, "--run-dir", str(run), "--run-id", "enc"]) == 0
        docs[encoding] = json.loads((run / "report.json").read_text())
    for a, b in zip(docs["float32"]["rounds"], docs["int8_delta"]["rounds"], strict=True):
        assert b["updates"] == 3 and b["rejected"] == 0
        assert b["bytes_down"] == a["bytes_down"]  # models still travel in float32
        ratio = b["bytes_up"] / a["bytes_up"]
        assert 0.22 < ratio < 0.32, ratio  # 1/4 plus the metadata both carry
        assert b["bytes_up_by_encoding"] == {"int8_delta": b["bytes_up"]}  # the round record's traffic by encoding
        assert "bytes_up_by_encoding" not in a  # float32 only: the report's rows are as before encodings existed
    f1 = [d["final"]["global"]["macro_f1"] for d in (docs["float32"], docs["int8_delta"])]
    assert all(0.0 <= v <= 1.0 for v in f1)


@pytest.mark.slow
def test_feddwa_personal_models_and_guidance_travel_as_int8_deltas(tmp_path):
    # From round 1 on, each client starts from its personalised model P_i, and its deltas are
    # against P_i: rebuilt against anything else (G, say), the models would drift apart by P_i - G.
    models = {}
    for encoding in ("float32", "int8_delta"):
        run = tmp_path / encoding
        argv = [*SMALL, "--aggregation", "feddwa", "--update-encoding", encoding, "--run-dir", str(run), "--run-id", "dwa"]
        assert simulate.main(argv) == 0
        doc = json.loads((run / "report.json").read_text())
        assert [(r["updates"], r["rejected"], r["missing"]) for r in doc["rounds"]] == [(3, 0, [])] * 3
        models[encoding] = {p.relative_to(run): load_file(p) for p in sorted((run / "models").rglob("*.safetensors"))}
    assert set(models["float32"]) == set(models["int8_delta"]) and any("personal" in str(p) for p in models["float32"])
    # Measured at this size: at most 1.2 % of a tensor's largest value apart; with G as every
    # client's reference, 8.5 %.
    for path, a in models["float32"].items():
        b = models["int8_delta"][path]
        for k in a:
            assert np.abs(a[k] - b[k]).max() <= 0.03 * np.abs(a[k]).max(), (path, k)
