"""Training backends (edge_client/backends): every backend computes what PyTorch eager computes.

PyTorch eager (``har_models.nn.training``) is the baseline; the numpy reference is an independent
implementation (its own forward and backward), and ExecuTorch runs exported programs. A small
CNN (8 filters, 16 hidden units) keeps the tests fast; 71 windows with batch 32 give batches of
32, 32 and 7.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_client.backends import ArchitectureMismatch, BackendOptions, draw_dropout_masks, epoch_orders, make_backend, train
from edge_client.backends.base import TorchRandperm, batch_sizes
from edge_client.backends.numpy_ref import NumpyBackend, weighted_cross_entropy
from edge_client.backends.torch_eager import TorchBackend
from har_models.data.labels import LabelSet
from har_models.data.windowing import WindowSet
from har_models.nn.growth import append_units
from har_models.nn.model import PARAM_NAMES, ArchSpec, build_model, init_state
from har_models.nn.training import TrainConfig, balanced_class_weights, make_loss, train_local

ROOT = Path(__file__).resolve().parents[1]
SPEC = ArchSpec(
    n_classes=4, conv_filters=8, dense_units=16, input_mean=(0.5, -0.2, 9.0, 0.0, 0.1, -0.1), input_std=(2.0, 1.5, 3.0, 0.5, 0.4, 0.6)
)
N = 71
TOP = ("out.weight", "out.bias")


def _data(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 6, SPEC.window)) * 3).astype(np.float32)
    y = rng.integers(0, SPEC.n_classes, n).astype(np.int64)
    return x, y


def _weights(spec: ArchSpec = SPEC, seed: int = 1) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in init_state(spec, seed).items()}


def _assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rel: float) -> None:
    """Every tensor within ``rel`` of the reference, relative to the reference tensor's largest magnitude."""
    assert set(got) == set(want)
    for k in want:
        scale = float(np.abs(want[k]).max())
        err = float(np.abs(got[k] - want[k]).max())
        assert err <= rel * scale, f"{k}: max error {err:.3g} > {rel} * {scale:.3g}"


@pytest.fixture(scope="module")
def et_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("executorch")
    return tmp_path_factory.mktemp("programs")


def _backend(name: str, weights: dict[str, np.ndarray], cache: Path | None, spec: ArchSpec = SPEC):
    if name == "executorch":
        return make_backend(name, spec, weights, BackendOptions(program_cache=cache))
    return make_backend(name, spec, weights)


@pytest.fixture(params=["numpy", "executorch"])
def other(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path | None]:
    if request.param == "executorch":
        return "executorch", request.getfixturevalue("et_cache")
    return "numpy", None


# -- batch order ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "seed"), [(0, 1), (1, 5), (2, 3), (7, 0), (71, 123), (1000, 2**31 + 7), (4000, 2**32 + 9)])
def test_epoch_orders_equal_torch_randperm(n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    want = [torch.randperm(n, generator=gen).numpy() for _ in range(3)]
    got = epoch_orders(n, 3, seed)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_torch_randperm_continues_the_stream_across_sizes() -> None:
    # FedALA draws randperm(N) and then randperm(n) per pass from one generator.
    gen = torch.Generator().manual_seed(77)
    want = [torch.randperm(n, generator=gen).numpy() for n in (50, 40, 40, 1, 3)]
    perm = TorchRandperm(77)
    assert all(np.array_equal(perm(n), w) for n, w in zip((50, 40, 40, 1, 3), want, strict=True))


def test_batch_sizes_keep_the_partial_last_batch() -> None:
    assert batch_sizes(71, 32) == [32, 32, 7]
    assert batch_sizes(32, 32) == [32]
    assert batch_sizes(0, 32) == []


# -- the torch backend is today's path -----------------------------------------------------------


@pytest.mark.parametrize(("prox_mu", "frozen"), [(0.0, ()), (0.1, ("conv.weight", "conv.bias"))])
def test_torch_backend_reproduces_train_local_bit_for_bit(prox_mu: float, frozen: tuple[str, ...]) -> None:
    x, y = _data()
    cw = balanced_class_weights(y, SPEC.n_classes)
    w0, ref = _weights(), _weights(seed=2)
    cfg = TrainConfig(epochs=2, lr=0.05, batch_size=32, prox_mu=prox_mu, frozen=frozen, seed=11)
    state = {k: torch.from_numpy(v) for k, v in w0.items()}
    want = train_local(SPEC, state, WindowSet(x, y, LabelSet("t", ("a", "b", "c", "d"))), cfg, make_loss(cw),
                       prox_ref={k: torch.from_numpy(v) for k, v in ref.items()} if prox_mu else None)
    backend = TorchBackend(SPEC, w0)
    got = train(backend, x, y, epochs=2, lr=0.05, batch_size=32, seed=11, class_weights=cw, prox_mu=prox_mu,
                prox_ref=ref if prox_mu else None, frozen=frozen)
    w = backend.get_weights()
    for k in PARAM_NAMES:  # dropout active: the same torch RNG stream, so exactly equal
        assert np.array_equal(w[k], want.state[k].numpy()), k
    assert got.epoch_losses == want.epoch_losses
    assert got.steps == want.steps == 6
    for k in frozen:
        assert np.array_equal(w[k], w0[k])


# -- numpy reference ------------------------------------------------------------------------------


def test_weighted_cross_entropy_known_answer() -> None:
    # Equal logits: CE = log C for every window; mean of w_y * log 4 over labels (0, 1) with w = (2, 0.5).
    loss, d = weighted_cross_entropy(np.zeros((2, 4), np.float32), np.array([0, 1]), np.array([2.0, 0.5, 1, 1], np.float32))
    assert loss == pytest.approx((2.0 + 0.5) / 2 * np.log(4), rel=1e-6)
    # d = w_y (1/4 - onehot) / B
    np.testing.assert_allclose(d[0], 2.0 * (np.array([0.25, 0.25, 0.25, 0.25]) - [1, 0, 0, 0]) / 2, rtol=1e-6)
    np.testing.assert_allclose(d[1], 0.5 * (np.array([0.25, 0.25, 0.25, 0.25]) - [0, 1, 0, 0]) / 2, rtol=1e-6)


def test_numpy_backend_runs_with_torch_blocked(tmp_path: Path) -> None:
    x, y = _data(20)
    np.savez(tmp_path / "d.npz", allow_pickle=False, x=x, y=y, **{k.replace(".", "_"): v for k, v in _weights().items()})
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any "import torch" now raises ImportError
        import numpy as np
        from har_models.nn.arch import ArchSpec, PARAM_NAMES
        from edge_client.backends import make_backend, train
        d = np.load({str(tmp_path / "d.npz")!r})
        spec = ArchSpec.from_json({SPEC.to_json()!r})
        b = make_backend("numpy", spec, {{n: d[n.replace(".", "_")] for n in PARAM_NAMES}})
        s = train(b, d["x"], d["y"], epochs=1, lr=0.05, batch_size=8, seed=3)
        p = b.predict(d["x"][:3])
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules if sys.modules[m] is not None)
        w = {{n.replace(".", "_"): v for n, v in b.get_weights().items()}}
        np.savez({str(tmp_path / "out.npz")!r}, p=p, losses=np.array(s.batch_losses), **w)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    # The same computation in this process (torch importable) gives the same numbers.
    b = NumpyBackend(SPEC, _weights())
    s = train(b, x, y, epochs=1, lr=0.05, batch_size=8, seed=3)
    assert np.array_equal(out["losses"], np.array(s.batch_losses))
    assert np.array_equal(out["p"], b.predict(x[:3]))
    assert np.array_equal(out["hidden_weight"], b.get_weights()["hidden.weight"])


# -- every backend against PyTorch eager -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("prox_mu", [0.0, 0.1])
def test_one_epoch_equals_torch(other: tuple[str, Path | None], prox_mu: float) -> None:
    name, cache = other
    x, y = _data()
    cw = balanced_class_weights(y, SPEC.n_classes)
    w0, ref = _weights(), _weights(seed=2)
    order = epoch_orders(N, 1, 7)[0]
    masks = draw_dropout_masks(np.random.default_rng(5), batch_sizes(N, 32), SPEC.dense_units, SPEC.dropout)
    kw = dict(lr=0.05, batch_size=32, class_weights=cw, prox_mu=prox_mu, prox_ref=ref, dropout_masks=masks)
    want_losses = TorchBackend(SPEC, w0).train_epoch(x, y, order, **kw)  # type: ignore[arg-type]
    tb = TorchBackend(SPEC, w0)
    tb.train_epoch(x, y, order, **kw)  # type: ignore[arg-type]
    backend = _backend(name, w0, cache)
    got_losses = backend.train_epoch(x, y, order, **kw)
    assert len(got_losses) == 3  # batches of 32, 32 and 7
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    w = backend.get_weights()
    _assert_close(w, tb.get_weights(), 1e-5)
    moved = min(float(np.abs(w[k] - w0[k]).max()) for k in PARAM_NAMES)
    assert moved > 1e-4  # the comparison is not between two untouched models


@pytest.mark.slow
def test_max_pool_ties_send_the_gradient_to_the_first_maximum(other: tuple[str, Path | None]) -> None:
    """Every pool window ties, with different patches under the taps that the weights ignore.

    Only tap 8 of the convolution has weights, and the input is constant over the four samples that
    tap 8 reads in each pool window, so the four candidates of every window are equal. The other
    taps read different samples, so their weight gradient depends on which candidate gets the
    window's gradient: PyTorch's ``max_pool2d`` gives it to the first (an ``amax`` backward would
    split it, a careless mask would count it four times).
    """
    name, cache = other
    rng = np.random.default_rng(11)
    n, t = 40, SPEC.window
    blocks = rng.normal(size=(n, 6, t // SPEC.pool + 1)) * 2
    x = blocks[:, :, (np.arange(t) + SPEC.pool - 1) // SPEC.pool].astype(np.float32)  # constant on t = 4m+1 .. 4m+4
    y = rng.integers(0, SPEC.n_classes, n).astype(np.int64)
    w0 = _weights()
    tap = np.zeros_like(w0["conv.weight"])
    tap[:, :, 8, :] = w0["conv.weight"][:, :, 8, :] * 4  # x_pad[t + 8] = x[t + 1]
    w0["conv.weight"] = tap
    order = epoch_orders(n, 1, 3)[0]
    masks = draw_dropout_masks(np.random.default_rng(2), batch_sizes(n, 32), SPEC.dense_units, SPEC.dropout)
    kw = dict(lr=0.1, batch_size=32, dropout_masks=masks)
    tb, backend = TorchBackend(SPEC, w0), _backend(name, w0, cache)
    np.testing.assert_allclose(backend.train_epoch(x, y, order, **kw), tb.train_epoch(x, y, order, **kw), rtol=1e-5)  # type: ignore[arg-type]
    got, want = backend.get_weights(), tb.get_weights()
    _assert_close(got, want, 1e-5)
    assert float(np.abs(want["conv.weight"][:, :, 0, :]).max()) > 1e-3  # the ignored taps did learn from the ties


@pytest.mark.parametrize("n", [1, 7, 32])
def test_any_batch_size_trains_and_infers(other: tuple[str, Path | None], n: int) -> None:
    name, cache = other
    x, y = _data(n, seed=n)
    w0 = _weights()
    order = np.arange(n)
    masks = draw_dropout_masks(np.random.default_rng(n), [n], SPEC.dense_units, SPEC.dropout)
    tb, backend = TorchBackend(SPEC, w0), _backend(name, w0, cache)
    want = tb.train_epoch(x, y, order, lr=0.1, batch_size=32, dropout_masks=masks)
    got = backend.train_epoch(x, y, order, lr=0.1, batch_size=32, dropout_masks=masks)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    _assert_close(backend.get_weights(), tb.get_weights(), 1e-5)
    p = backend.predict(x)
    assert p.shape == (n, SPEC.n_classes)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(p, tb.predict(x), atol=1e-4)


def test_top_layer_grads_equal_torch(other: tuple[str, Path | None]) -> None:
    name, cache = other
    x, y = _data(32)
    cw = balanced_class_weights(y, SPEC.n_classes)
    w0 = _weights()
    mask = draw_dropout_masks(np.random.default_rng(9), [32], SPEC.dense_units, SPEC.dropout)[0]
    names = ("hidden.weight", "hidden.bias", *TOP)
    backend = _backend(name, w0, cache)
    for m in (None, mask):
        want_loss, want = TorchBackend(SPEC, w0).top_layer_grads(x, y, names, class_weights=cw, dropout_mask=m)
        got_loss, got = backend.top_layer_grads(x, y, names, class_weights=cw, dropout_mask=m)
        _assert_close(got, want, 1e-5)
        assert got_loss == pytest.approx(want_loss, rel=1e-5)
    # Independent check of the out.bias gradient: mean_b w_y (softmax - onehot) from eager logits.
    with torch.no_grad():
        z = build_model(SPEC, {k: torch.from_numpy(v) for k, v in w0.items()}).eval()(torch.from_numpy(x))
    p = torch.softmax(z, 1).numpy()
    p[np.arange(32), y] -= 1
    np.testing.assert_allclose(got_plain := backend.top_layer_grads(x, y, TOP, class_weights=cw)[1]["out.bias"],
                               (p * cw[y][:, None]).mean(axis=0), atol=1e-6)
    assert np.abs(got_plain).max() > 1e-3
    assert backend.get_weights()["out.bias"].tolist() == w0["out.bias"].tolist()  # gradients do not train


def _grown() -> tuple[ArchSpec, dict[str, np.ndarray]]:
    base = {k: torch.from_numpy(v) for k, v in _weights().items()}
    donor = init_state(SPEC, 5)
    state, spec = append_units(base, SPEC, conv=[(donor, 1), (donor, 3)], dense=[(donor, 0)], mode="paper")
    return spec, {k: v.numpy() for k, v in state.items()}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["base", "grown"])
def test_inference_equals_eager(other: tuple[str, Path | None], arch: str) -> None:
    name, cache = other
    spec, w = (SPEC, _weights()) if arch == "base" else _grown()
    assert spec.version == (0 if arch == "base" else 1)
    x, _ = _data(70, seed=3)  # chunks of 64 and 6 windows
    with torch.no_grad():
        logits = build_model(spec, {k: torch.from_numpy(v) for k, v in w.items()}).eval()(torch.from_numpy(x))
    want = torch.softmax(logits, 1).numpy()
    got = _backend(name, w, cache, spec).predict(x)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_evaluate_counts_and_loss(other: tuple[str, Path | None]) -> None:
    name, cache = other
    x, y = _data()
    cw = balanced_class_weights(y, SPEC.n_classes)
    got, want = _backend(name, _weights(), cache).evaluate(x, y, cw), TorchBackend(SPEC, _weights()).evaluate(x, y, cw)
    assert got.confusion.sum() == N and np.array_equal(got.confusion.sum(axis=1), np.bincount(y, minlength=4))
    assert np.array_equal(got.confusion, want.confusion)
    assert got.loss == pytest.approx(want.loss, rel=1e-5)


def test_same_dropout_seed_same_trajectory_numpy_and_executorch(et_cache: Path) -> None:
    # Both draw masks from numpy's default_rng(dropout_seed) in the same way.
    x, y = _data()
    w0 = _weights()
    nb, eb = NumpyBackend(SPEC, w0), _backend("executorch", w0, et_cache)
    a = train(nb, x, y, epochs=2, lr=0.05, batch_size=32, seed=4)
    b = train(eb, x, y, epochs=2, lr=0.05, batch_size=32, seed=4)
    np.testing.assert_allclose(a.batch_losses, b.batch_losses, rtol=1e-5)
    _assert_close(eb.get_weights(), nb.get_weights(), 1e-5)


# -- the ExecuTorch runtime's own state ------------------------------------------------------------


def test_executorch_trains_its_own_parameters(et_cache: Path) -> None:
    x, y = _data(32)
    w0 = _weights()
    eb = _backend("executorch", w0, et_cache)
    live = eb.runtime_parameters()
    before = {k: v.numpy().copy() for k, v in live.items()}
    eb.train_epoch(x, y, np.arange(32), lr=0.1, batch_size=32, dropout_masks=[np.ones((32, SPEC.dense_units), np.float32)])
    # The tensors the runtime computes with changed in place ...
    assert all(not np.array_equal(live[k].numpy(), before[k]) for k in PARAM_NAMES)
    # ... and the training program now computes with them: its gradients equal eager's at the new weights.
    new = eb.get_weights()
    _assert_close(eb.top_layer_grads(x, y, TOP)[1], TorchBackend(SPEC, new).top_layer_grads(x, y, TOP)[1], 1e-5)


def test_loading_weights_changes_what_programs_compute(other: tuple[str, Path | None]) -> None:
    name, cache = other
    x, y = _data(16)
    backend = _backend(name, _weights(seed=1), cache)
    p1, g1 = backend.predict(x), backend.top_layer_grads(x, y, TOP)[1]
    w2 = _weights(seed=2)
    backend.set_weights(w2, arch_version=SPEC.version)
    p2, g2 = backend.predict(x), backend.top_layer_grads(x, y, TOP)[1]
    assert np.abs(p2 - p1).max() > 1e-3
    assert np.abs(g2["out.weight"] - g1["out.weight"]).max() > 1e-4
    ref = TorchBackend(SPEC, w2)
    np.testing.assert_allclose(p2, ref.predict(x), atol=1e-4)
    _assert_close(g2, ref.top_layer_grads(x, y, TOP)[1], 1e-5)


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch", "numpy", "executorch"])
def test_weights_of_another_version_are_refused(name: str, request: pytest.FixtureRequest) -> None:
    cache = request.getfixturevalue("et_cache") if name == "executorch" else None
    backend = _backend(name, _weights(), cache)
    with pytest.raises(ArchitectureMismatch, match=r"version 1.*version 0"):
        backend.set_weights(_weights(), arch_version=SPEC.version + 1)
    _, grown_w = _grown()
    with pytest.raises(ValueError, match=r"conv\.weight"):
        backend.set_weights(grown_w)  # v1 shapes into a v0 model


def test_program_of_another_version_is_refused(et_cache: Path) -> None:
    from har_models.nn.export import ensure_programs

    files_v0 = ensure_programs(SPEC, et_cache)
    grown_spec, _ = _grown()
    with pytest.raises(ArchitectureMismatch, match="version 0"):
        make_backend("executorch", grown_spec, options=BackendOptions(programs=files_v0))
    again = ensure_programs(SPEC, et_cache)  # cached: the same files, not re-exported
    assert again == files_v0 and again.train.stat().st_mtime_ns == files_v0.train.stat().st_mtime_ns


@pytest.mark.parametrize("name", ["torch", "numpy", "executorch"])
def test_partial_weights_replace_only_the_named_tensors(name: str, request: pytest.FixtureRequest) -> None:
    cache = request.getfixturevalue("et_cache") if name == "executorch" else None
    w1, w2 = _weights(seed=1), _weights(seed=2)
    backend = _backend(name, w1, cache)
    backend.set_weights({"out.weight": w2["out.weight"]}, partial=True)
    got = backend.get_weights()
    assert np.array_equal(got["out.weight"], w2["out.weight"])
    assert all(np.array_equal(got[k], w1[k]) for k in PARAM_NAMES if k != "out.weight")
    np.testing.assert_allclose(backend.predict(_data(3)[0]), TorchBackend(SPEC, got).predict(_data(3)[0]), atol=1e-4)
    with pytest.raises(ValueError, match=r"out\.weight"):
        backend.set_weights({"out.weight": w2["out.bias"]}, partial=True)
    with pytest.raises(ValueError, match="missing"):
        backend.set_weights({"out.weight": w2["out.weight"]})  # a full load needs every tensor


@pytest.mark.parametrize("name", ["torch", "numpy"])
def test_bad_inputs_are_named(name: str) -> None:
    backend = make_backend(name, SPEC, _weights())
    x, y = _data(8)
    with pytest.raises(ValueError, match=r"x has shape \(8, 128, 6\)"):
        backend.predict(x.transpose(0, 2, 1))
    with pytest.raises(ValueError, match="permutation"):
        backend.train_epoch(x, y, np.zeros(8, np.int64), lr=0.1, batch_size=4)
    with pytest.raises(ValueError, match="prox_ref"):
        backend.train_epoch(x, y, np.arange(8), lr=0.1, batch_size=4, prox_mu=0.1)
    with pytest.raises(ValueError, match="dropout_masks"):
        backend.train_epoch(x, y, np.arange(8), lr=0.1, batch_size=4, dropout_masks=[np.ones((4, 16), np.float32)])
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        make_backend("jax", SPEC)


# -- the Android adapter, against a stand-in of ExecuTorch's Java API --------------------------------


def _android(weights: dict[str, np.ndarray], cache: Path):
    from support import java_executorch_standin

    from edge_client.backends.android_executorch import AndroidExecuTorchBackend
    from har_models.nn.export import ensure_programs

    files = ensure_programs(SPEC, cache)
    return AndroidExecuTorchBackend(SPEC, files.train, files.infer, files.meta, weights, autoclass=java_executorch_standin.autoclass)


@pytest.mark.slow
@pytest.mark.parametrize(("prox_mu", "frozen"), [(0.0, ()), (0.1, ()), (0.0, ("conv.weight", "conv.bias"))])
def test_android_adapter_trains_like_torch(et_cache: Path, prox_mu: float, frozen: tuple[str, ...]) -> None:
    x, y = _data()
    cw = balanced_class_weights(y, SPEC.n_classes)
    w0, ref = _weights(), _weights(seed=2)
    order = epoch_orders(N, 1, 7)[0]
    masks = draw_dropout_masks(np.random.default_rng(5), batch_sizes(N, 32), SPEC.dense_units, SPEC.dropout)
    kw = dict(lr=0.05, batch_size=32, class_weights=cw, prox_mu=prox_mu, prox_ref=ref, frozen=frozen, dropout_masks=masks)
    tb, ab = TorchBackend(SPEC, w0), _android(w0, et_cache)
    assert np.array_equal(ab.get_weights()["hidden.weight"], w0["hidden.weight"])  # loaded through the raw buffer
    want = tb.train_epoch(x, y, order, **kw)  # type: ignore[arg-type]
    got = ab.train_epoch(x, y, order, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    _assert_close(ab.get_weights(), tb.get_weights(), 1e-5)
    for k in frozen:
        assert np.array_equal(ab.get_weights()[k], w0[k])
    np.testing.assert_allclose(ab.predict(x), tb.predict(x), atol=1e-4)
    _assert_close(ab.top_layer_grads(x[:32], y[:32], TOP)[1], tb.top_layer_grads(x[:32], y[:32], TOP)[1], 1e-5)


def test_android_adapter_imports_no_torch() -> None:
    code = "import sys; sys.modules['torch'] = None; import edge_client.backends.android_executorch"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["base", "grown"])
def test_weights_as_inputs_program_equals_eager(et_cache: Path, arch: str) -> None:
    spec, w = (SPEC, _weights()) if arch == "base" else _grown()
    x, _ = _data(9, seed=4)
    with torch.no_grad():
        want = torch.softmax(build_model(spec, {k: torch.from_numpy(v) for k, v in w.items()}).eval()(torch.from_numpy(x)), 1).numpy()
    backend = make_backend("executorch", spec, w, BackendOptions(program_cache=et_cache, inference="inputs"))
    np.testing.assert_allclose(backend.predict(x), want, atol=1e-4)


def test_patch_weights_writes_each_tensor_in_its_slot() -> None:
    from edge_client.backends.executorch_rt import patch_weights

    template = bytes(range(40))
    offsets = {"a": [4, 16, 1, 0], "b": [20, 4, 0]}  # "a" stored transposed
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    out = patch_weights(template, offsets, {"a": a, "b": np.array([5.0], np.float32)})
    assert np.frombuffer(out[4:20], "<f4").tolist() == [1.0, 3.0, 2.0, 4.0]
    assert np.frombuffer(out[20:24], "<f4").tolist() == [5.0]
    assert out[:4] == template[:4] and out[24:] == template[24:]
    with pytest.raises(ValueError, match="slot"):
        patch_weights(template, offsets, {"a": np.zeros((3, 2), np.float32), "b": np.zeros(1, np.float32)})


# -- FedALA over a backend ---------------------------------------------------------------------------


ETA = 1.0


@pytest.mark.parametrize(
    ("name", "mode", "start_phase"),
    [("torch", "train", True), ("torch", "eval", False), ("numpy", "eval", True), ("executorch", "eval", True)],
)
@pytest.mark.slow
def test_ala_over_a_backend_learns_the_w_of_the_pytorch_ala(
    name: str, mode: str, start_phase: bool, request: pytest.FixtureRequest
) -> None:
    """The generic ALA kernel over each backend against the torch backend's autograd kernel (the client round's fast path)."""
    from edge_client.ala import AlaConfig, learn_ala_weights

    x, y = _data(40, seed=8)
    x /= 3  # windows of unit scale: moderate losses, so float32 rounding is not amplified over the passes
    cw = balanced_class_weights(y, SPEC.n_classes)
    received, local = _weights(seed=3), _weights(seed=4)
    shapes = SPEC.shapes()
    w_in = {"out.weight": np.full(shapes["out.weight"], 0.7, np.float32), "out.bias": np.full(shapes["out.bias"], 0.3, np.float32)}
    cfg = AlaConfig(eta=ETA, rand_percent=80, layer_idx=2, threshold=0.1, num_pre_loss=3, max_passes=5, mode=mode)  # type: ignore[arg-type]
    kw = {"config": cfg, "batch_size": 8, "seed": 1234, "start_phase": start_phase, "class_weights": cw}
    want = TorchBackend(SPEC, received).learn_ala(received, local, w_in, x, y, **kw)  # type: ignore[arg-type]
    backend = _backend(name, received, request.getfixturevalue("et_cache") if name == "executorch" else None)
    with torch.random.fork_rng(devices=[]):
        got = learn_ala_weights(backend, received, local, w_in, x, y, **kw)  # type: ignore[arg-type]
    assert got.n_sample == want.n_sample == 32 and len(got.losses) == len(want.losses)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-5)
    _assert_close(got.weights, want.weights, 1e-5)
    _assert_close(got.state, want.state, 1e-5)
    moved = float(np.abs(got.weights["out.weight"] - w_in["out.weight"]).max())
    assert moved > 1e-3  # W was really learned
