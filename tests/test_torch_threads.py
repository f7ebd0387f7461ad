"""Background classification on one PyTorch thread: the same probabilities, and the count a round trains with untouched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_client.app.predictor import TorchPredictor, load_predictor
from edge_client.backends.numpy_ref import init_weights
from edge_client.store import ClientStore
from edge_client.torch_threads import inference_threads, trainings
from edge_client.trainer import ClientTrainer
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from har_models.nn.arch import ArchSpec
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

SPEC = ArchSpec(n_classes=6, conv_filters=8, dense_units=32, version=0)
TRAINING_THREADS = 3  # the process's count in these tests: neither 1 nor this 2-core machine's default


@pytest.fixture(autouse=True)
def process_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(TRAINING_THREADS)
    yield
    torch.set_num_threads(before)


def _windows(n: int) -> np.ndarray:
    return (np.random.default_rng(1).normal(size=(n, 6, 128)) * 3).astype(np.float32)


def _watched(p: TorchPredictor) -> list[int]:
    """The intra-op count each forward pass of ``p`` ran at, as PyTorch reports it inside the pass."""
    seen: list[int] = []
    p._model.register_forward_pre_hook(lambda _m, _a: seen.append(torch.get_num_threads()))
    return seen


def test_one_thread_gives_the_probabilities_of_the_process_count_and_puts_the_count_back() -> None:
    weights = init_weights(SPEC, 3)
    one, as_is = TorchPredictor(SPEC.to_json(), weights), TorchPredictor(SPEC.to_json(), weights, threads=None)
    seen = _watched(one)
    x = _windows(40)
    for batch in (x, x[:1], x[7:9]):
        got, want = one.predict(batch), as_is.predict(batch)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert got.dtype == np.float32 and np.allclose(got.sum(axis=1), 1.0, atol=1e-5)
        assert torch.get_num_threads() == TRAINING_THREADS
    assert seen == [1, 1, 1]


def test_while_a_training_holds_the_count_a_prediction_leaves_it_alone() -> None:
    weights = init_weights(SPEC, 4)
    p, ref = TorchPredictor(SPEC.to_json(), weights), TorchPredictor(SPEC.to_json(), weights, threads=None)
    seen = _watched(p)
    x = _windows(5)
    held, done = threading.Event(), threading.Event()
    in_training: list[int] = []

    def training() -> None:
        from edge_client.torch_threads import training_threads

        with training_threads():
            held.set()
            done.wait(10)
            in_training.append(torch.get_num_threads())

    t = threading.Thread(target=training)
    t.start()
    try:
        assert held.wait(10) and trainings() == 1
        np.testing.assert_allclose(p.predict(x), ref.predict(x), rtol=0, atol=1e-6)
        assert seen == [TRAINING_THREADS] and torch.get_num_threads() == TRAINING_THREADS
    finally:
        done.set()
        t.join(10)
    assert in_training == [TRAINING_THREADS] and trainings() == 0
    p.predict(x)  # the training ended: one thread again
    assert seen == [TRAINING_THREADS, 1] and torch.get_num_threads() == TRAINING_THREADS


class _WatchedStore(ClientStore):
    """A real store that notes, when a round saves its local model, how many trainings hold PyTorch's count."""

    holding: list[int]

    def save_local_model(self, arch_json: str, state: dict[str, np.ndarray]) -> None:
        self.holding.append(trainings())
        super().save_local_model(arch_json, state)


def test_a_round_holds_the_count_and_a_prediction_after_it_changes_nothing_it_uses(tmp_path: Path) -> None:
    store = _WatchedStore(tmp_path, HAPT_LABELS)
    store.holding = []
    x = _windows(30)
    store.replace_windows("src", WindowSet(x, np.arange(30) % 6, HAPT_LABELS), 0.2, seed=1)
    ann = RoundAnnouncement(run_id="r", round=1, state="training", arch=SPEC.to_dict(), label_set="hapt6", selected=("c",),
                            plan=TrainingPlan(local_epochs=1, lr=0.05, batch_size=8))  # fmt: skip
    try:
        ClientTrainer(store, "c", "torch").run_round(ann, init_weights(SPEC, 0))
        assert store.holding == [1] and trainings() == 0
        p = load_predictor(store)  # the model the round left, as the sensing thread loads it
        assert isinstance(p, TorchPredictor) and p.threads == 1
        seen = _watched(p)
        p.predict(x[:3])
        assert seen == [1] and torch.get_num_threads() == TRAINING_THREADS
    finally:
        store.close()


def test_a_thread_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="n must be at least 1"), inference_threads(0):
        pass
    with pytest.raises(ValueError, match="threads must be at least 1"):
        TorchPredictor(SPEC.to_json(), init_weights(SPEC, 0), threads=0)
    assert torch.get_num_threads() == TRAINING_THREADS
