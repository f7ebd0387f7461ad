"""The backends' shared preamble (BackendBase): one spec, errors that name the backend and method, one evaluate."""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.backends.base import ArchitectureMismatch, BackendBase
from edge_client.backends.numpy_ref import NumpyBackend
from edge_client.backends.torch_eager import TorchBackend
from har_models.nn.model import ArchSpec, init_state

SPEC = ArchSpec(n_classes=3, conv_filters=4, dense_units=8)


def _pair() -> tuple[NumpyBackend, TorchBackend]:
    w = {k: v.numpy() for k, v in init_state(SPEC, 0).items()}
    return NumpyBackend(SPEC, w), TorchBackend(SPEC, w)


def test_both_backends_share_the_base_and_agree_on_evaluate() -> None:
    nb, tb = _pair()
    assert isinstance(nb, BackendBase) and isinstance(tb, BackendBase) and nb.spec == tb.spec == SPEC
    rng = np.random.default_rng(1)
    x = rng.normal(size=(10, 6, SPEC.window)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0], dtype=np.int64)
    a, b = nb.evaluate(x, y), tb.evaluate(x, y)
    assert a.confusion.sum() == 10 and (a.confusion == b.confusion).all()
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    assert np.allclose(nb.predict(x).sum(axis=1), 1.0, atol=1e-5)
    assert np.isnan(nb.evaluate(x[:0], y[:0]).loss) and nb.evaluate(x[:0], y[:0]).confusion.sum() == 0


def test_errors_name_the_backend_and_its_method() -> None:
    nb, tb = _pair()
    bad = np.zeros((2, 5, SPEC.window), np.float32)
    with pytest.raises(ValueError, match=r"NumpyBackend\.evaluate"):
        nb.evaluate(bad, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"TorchBackend\.train_epoch"):
        tb.train_epoch(bad, np.zeros(2, np.int64), np.arange(2), lr=0.1, batch_size=2)
    with pytest.raises(ArchitectureMismatch, match=r"NumpyBackend\.set_weights"):
        nb.set_weights(nb.get_weights(), arch_version=SPEC.version + 1)
