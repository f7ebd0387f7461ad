"""The one client round (edge_client.trainer.ClientTrainer): the torch backend's numbers are PyTorch eager's, bit for bit;
the numpy reference agrees to float32 rounding; the update's metadata record and the backend choice."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_client.backends import BackendOptions, available_backends, choose_backend
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer, derive_seed
from har_models.data.labels import HAPT_LABELS, balanced_class_weights
from har_models.data.windowing import WindowSet
from har_models.nn.model import ArchSpec, init_state
from har_models.nn.training import TrainConfig, evaluate, make_loss, train_local
from har_models.wire import codec
from har_models.wire.messages import GUIDANCE_PREFIX, RoundAnnouncement, TrainingPlan
from har_models.wire.update_meta import AlaNote, Confusions, UpdateMeta

ROOT = Path(__file__).resolve().parents[1]
SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=0)
RECEIVED = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}


def _store(folder: Path, n: int = 60) -> ClientStore:
    rng = np.random.default_rng(0)
    store = ClientStore(folder, HAPT_LABELS)
    x = (rng.normal(size=(n, 6, 128)) * 2).astype(np.float32)
    store.replace_windows("src", WindowSet(x, np.arange(n) % 6, HAPT_LABELS), 0.2, seed=1)
    return store


def _ann(plan: TrainingPlan, spec: ArchSpec = SPEC, round_: int = 1) -> RoundAnnouncement:
    return RoundAnnouncement(run_id="r", round=round_, state="training", arch=spec.to_dict(), label_set="hapt6", selected=("c",), plan=plan)


def test_torch_round_is_pytorch_eager_bit_for_bit(tmp_path: Path) -> None:
    """FedProx, balanced class weights, FedDWA's guidance pass: every number as ``train_local`` and ``evaluate`` give it."""
    store = _store(tmp_path)
    plan = TrainingPlan(local_epochs=2, lr=0.05, batch_size=8, prox_mu=0.01, guidance=True, class_weights="balanced", seed=3)
    out = ClientTrainer(store, "c", "torch").run_round(_ann(plan), RECEIVED)
    env = codec.decode(out.envelope)
    train, test = store.windows("train"), store.windows("test")
    loss = make_loss(balanced_class_weights(train.y, SPEC.n_classes))
    ref = {k: torch.from_numpy(v) for k, v in RECEIVED.items()}
    cfg = TrainConfig(2, 0.05, 8, 0.01, (), derive_seed(3, "c", 1, 0))
    want = train_local(SPEC, ref, train, cfg, loss, prox_ref=ref)
    guided = train_local(SPEC, want.state, train, dataclasses.replace(cfg, seed=derive_seed(3, "c", 1, 0, "guidance")), loss, prox_ref=ref)
    for k in RECEIVED:
        assert np.array_equal(env.tensors[k], want.state[k].numpy()), k
        assert np.array_equal(env.tensors[GUIDANCE_PREFIX + k], guided.state[k].numpy()), k
    assert env.meta["train_loss"] == list(want.epoch_losses) and env.meta["steps"] == want.steps == 12
    assert env.meta["confusion"]["trained"] == evaluate(SPEC, want.state, test).astype(int).tolist()
    assert env.meta["confusion"]["received"] == evaluate(SPEC, ref, test).astype(int).tolist()
    assert "backend" not in env.meta  # the torch path's bytes are those before the record existed
    assert UpdateMeta.from_wire(env.meta) == out.meta
    loaded = store.load_local_model()
    assert loaded is not None
    _, stored = loaded
    assert all(np.array_equal(stored[k], want.state[k].numpy()) for k in RECEIVED)


def test_torch_and_numpy_rounds_agree_through_fedper_and_fedala(tmp_path: Path) -> None:
    """Two rounds (FedALA's first participation, then W learned; FedPer's kept layers) on both backends, dropout off."""
    spec = dataclasses.replace(SPEC, dropout=0.0)
    rng = np.random.default_rng(2)
    second = {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in RECEIVED.items()}
    ala = {"max_passes": 3, "mode": "eval"}
    plans = [TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, client_init="ala", ala=ala, seed=5),
             TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, client_init="ala", ala=ala, seed=5, keep_local=("out.bias",))]  # fmt: skip
    outs: dict[str, list] = {}
    for backend in ("torch", "numpy"):
        store = _store(tmp_path / backend)
        trainer = ClientTrainer(store, "c", backend)
        outs[backend] = [trainer.run_round(_ann(plans[0], spec, 1), RECEIVED), trainer.run_round(_ann(plans[1], spec, 2), second)]
    for t, n in zip(outs["torch"], outs["numpy"], strict=True):
        et, en = codec.decode(t.envelope), codec.decode(n.envelope)
        for k in RECEIVED:
            np.testing.assert_allclose(en.tensors[k], et.tensors[k], rtol=1e-4, atol=1e-5, err_msg=k)
        np.testing.assert_allclose(n.meta.train_loss, t.meta.train_loss, rtol=1e-5)
        assert dataclasses.replace(n.meta, train_loss=t.meta.train_loss, train_seconds=t.meta.train_seconds, backend="torch") == t.meta
        assert en.meta["backend"] == "numpy" and n.summary["backend"] == "numpy" and t.summary["backend"] == "torch"
    assert outs["torch"][0].meta.init_mode == "received (first participation)"
    second_round = outs["torch"][1].meta
    assert second_round.init_mode == "ala" and second_round.ala is not None and second_round.ala.passes >= 1
    assert second_round.ala == outs["numpy"][1].meta.ala


def test_a_grown_architecture_pads_the_local_model(tmp_path: Path) -> None:
    """FedPer after a growth: the kept layer is the old local one in its leading slice, the received values in the new slots."""
    store = _store(tmp_path)
    local = {k: v + 1.0 for k, v in RECEIVED.items()}
    store.set_meta("run_id", "r")
    store.save_local_model(SPEC.to_json(), local)
    wide = dataclasses.replace(SPEC, dense_units=10, version=1)
    received = {k: v.numpy() for k, v in init_state(wide, 4).items()}
    plan = TrainingPlan(local_epochs=0, keep_local=("out.weight",))
    out = ClientTrainer(store, "c", "numpy").run_round(_ann(plan, wide), received)
    sent = codec.decode(out.envelope).tensors["out.weight"]
    assert np.array_equal(sent[:, :8], local["out.weight"]) and np.array_equal(sent[:, 8:], received["out.weight"][:, 8:])
    assert out.meta.init_mode == "fedper"


def test_update_meta_keys_order_and_validation() -> None:
    meta = UpdateMeta(run_id="r", stage=0, n_train=40, n_test=10, label_set="hapt6", train_loss=(1.5, 1.25), train_seconds=0.5,
                      steps=10, init_mode="ala", ala=AlaNote(2, 32, False, None), backend="numpy",
                      confusion=Confusions.of(np.eye(2, dtype=np.int64) * 5, None, [[3, 2], [0, 5]]), encoding="int8_delta")  # fmt: skip
    wire = meta.to_wire()
    assert list(wire) == ["run_id", "stage", "n_train", "n_test", "label_set", "train_loss", "train_seconds", "steps", "init_mode",
                          "ala", "backend", "confusion", "encoding"]  # fmt: skip
    assert wire["ala"] == {"passes": 2, "n_sample": 32, "converged": False, "fallback": None}
    assert wire["confusion"] == {"received": [[5, 0], [0, 5]], "initial": None, "trained": [[3, 2], [0, 5]]}
    assert UpdateMeta.from_wire(json.loads(json.dumps(wire))) == meta
    plain = dataclasses.replace(meta, ala=None, backend="torch", encoding="float32")
    assert list(plain.to_wire()) == ["run_id", "stage", "n_train", "n_test", "label_set", "train_loss", "train_seconds", "steps",
                                     "init_mode", "ala", "confusion"]  # fmt: skip
    assert plain.to_wire()["ala"] == {} and UpdateMeta.from_wire(plain.to_wire()) == plain
    with pytest.raises(ValueError, match="n_train"):
        dataclasses.replace(meta, n_train=-1)
    with pytest.raises(ValueError, match="unknown keys \\['extra'\\]"):
        UpdateMeta.from_wire({**wire, "extra": 1})
    with pytest.raises(ValueError, match="missing keys \\['steps'\\]"):
        UpdateMeta.from_wire({k: v for k, v in wire.items() if k != "steps"})
    with pytest.raises(ValueError, match="confusion matrix 'trained'"):
        UpdateMeta.from_wire({**wire, "confusion": {"trained": [[1, 2]]}})


def test_backend_options_and_choice() -> None:
    assert available_backends()[-1] == "numpy" and "torch" in available_backends()
    assert choose_backend() == ("torch", "best installed")
    assert choose_backend("numpy") == ("numpy", "requested")
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        choose_backend("jax")
    with pytest.raises(ValueError, match="train_batch"):
        BackendOptions(train_batch=0)
    with pytest.raises(ValueError, match="unknown backend"):
        ClientTrainer(None, "c", "jax")  # type: ignore[arg-type]


def test_without_torch_the_choice_is_numpy_and_nothing_imports_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from edge_client.backends.factory import choose_backend\n"
        "import edge_client.cli, edge_client.trainer, edge_client.app.controller\n"
        "print(choose_backend())\n"
        "try:\n    choose_backend('torch')\nexcept ModuleNotFoundError as exc:\n    print(exc.name, exc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()[:2]
    assert first.startswith("('numpy', 'best installed; torch: torch not installed")
    assert second.startswith("torch backend 'torch' needs torch, which is not installed here") and "'numpy'" in second
