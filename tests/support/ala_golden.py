"""FedALA's figures on fixed seeds, as the code of b88bc3e computed them: the golden file for tests/test_ala_golden.py.

``python tests/support/ala_golden.py`` rewrites ``tests/fixtures/ala_golden.npz``; do that only when a change is meant to
alter FedALA's results (and say so in the commit). The cases: the ALA call itself (the torch kernel) in the start
phase and in a later round, dropout on; and three rounds of ``ClientTrainer`` with ``client_init = "ala"``
(first participation, first ALA round, a later one), whose updates, confusions and stored W are recorded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edge_client.ala import AlaConfig, AlaState, adaptive_local_aggregation
from edge_client.backends.torch_eager import TorchBackend
from edge_client.store import ClientStore
from edge_client.trainer import ClientTrainer
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "ala_golden.npz"
SPEC = ArchSpec(n_classes=6, conv_filters=6, dense_units=16)


def _state(seed: int, scale: float = 0.2) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(s, generator=g) * scale).numpy() for n, s in SPEC.shapes().items()}


def _windows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 6).astype(np.int64)
    x = rng.normal(size=(n, 6, 128)) * 2
    x[np.arange(n), y % 6, :] += 1.5  # a learnable class signal: one channel's offset
    return x.astype(np.float32), y


def kernel_cases() -> dict[str, np.ndarray]:
    """W, thetahat and the pass losses of the ALA call (torch backend) in the start phase and in a later round."""
    out: dict[str, np.ndarray] = {}
    received, local = _state(1), _state(2)
    x, y = _windows(70, 3)
    cw = np.linspace(0.5, 1.5, 6).astype(np.float32)
    w0 = {"out.weight": np.full(received["out.weight"].shape, 0.7, np.float32), "out.bias": np.full(6, 0.3, np.float32)}
    for tag, ala in (("start", AlaState(None, True, True)), ("later", AlaState(w0, False, True))):
        res = adaptive_local_aggregation(
            TorchBackend(SPEC, received), received, local, ala, x, y, batch_size=16, seed=5,
            config=AlaConfig(max_passes=6), class_weights=cw,
        )  # fmt: skip
        for k, v in res.state.items():
            out[f"kernel/{tag}/state/{k}"] = v
        for k, v in res.ala.weights.items():  # type: ignore[union-attr]
            out[f"kernel/{tag}/w/{k}"] = v
        out[f"kernel/{tag}/losses"] = np.asarray(res.losses, np.float64)
    return out


def trainer_cases(folder: Path) -> dict[str, np.ndarray]:
    """Three ALA rounds of ``ClientTrainer`` (torch backend): the trained tensors, the confusions and the stored W."""
    out: dict[str, np.ndarray] = {}
    store = ClientStore(folder, HAPT_LABELS)
    try:
        x, y = _windows(150, 4)
        store.replace_windows("src", WindowSet(x, y, HAPT_LABELS), 0.2, seed=1)
        trainer = ClientTrainer(store, "c", "torch")
        plan = TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, client_init="ala", ala={"max_passes": 4}, seed=9,
                            class_weights="balanced")  # fmt: skip
        received = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}
        for rnd in range(3):
            ann = RoundAnnouncement(run_id="r", round=rnd, state="training", arch=SPEC.to_dict(), label_set="hapt6",
                                    selected=("c",), plan=plan)  # fmt: skip
            res = trainer.run_round(ann, received)
            env = codec.decode(res.envelope)
            for k, v in env.tensors.items():
                out[f"trainer/{rnd}/update/{k}"] = np.asarray(v)
            for which in ("received", "initial", "trained"):
                out[f"trainer/{rnd}/confusion/{which}"] = np.asarray(env.meta["confusion"][which], np.int64)
            loaded = store.load_tensors("ala_state")
            assert loaded is not None
            for k, v in loaded[0].items():
                out[f"trainer/{rnd}/w/{k}"] = v
            # The next round receives another model: this one moved a little towards the update.
            received = {k: (0.5 * received[k] + 0.5 * np.asarray(env.tensors[k])).astype(np.float32) for k in received}
    finally:
        store.close()
    return out


def compute(folder: Path) -> dict[str, np.ndarray]:
    """Every golden array, by name."""
    return {**kernel_cases(), **trainer_cases(folder)}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        arrays = compute(Path(tmp))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(GOLDEN, **arrays)  # type: ignore[arg-type]  # numpy's stub reads ** as allow_pickle
    print(f"wrote {len(arrays)} arrays to {GOLDEN}")
