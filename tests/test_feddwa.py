"""FedDWA distances, weights and personalised mixes (coordinator.feddwa), with hand-computed values."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from coordinator.feddwa import aggregate, distances, finite_clients, personalise, weights

SHAPES = {"a.weight": (3, 4), "a.bias": (3,), "b.weight": (2, 3, 5), "b.bias": (2,)}


def random_state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in SHAPES.items()}


def with_bias(value: float) -> dict[str, torch.Tensor]:
    """A state that is zero except a.bias[0] = value: its squared distance to the zero state is value^2."""
    st = {n: torch.zeros(s) for n, s in SHAPES.items()}
    st["a.bias"][0] = value
    return st


def direct_distances(guidance: list[dict[str, torch.Tensor]], trained: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    n = len(trained)
    d = torch.zeros(n, n, dtype=torch.float64)
    for j in range(n):
        for i in range(n):
            d[j, i] = sum(float(((guidance[i][k].double() - trained[j][k].double()) ** 2).sum()) for k in SHAPES)
    return d


def test_distances_1_2_4_give_weights_4_7_2_7_1_7() -> None:
    trained = [with_bias(1.0), with_bias(math.sqrt(2.0)), with_bias(2.0)]
    guidance = [with_bias(0.0), with_bias(1.0), with_bias(2.0)]
    d = distances(guidance, trained)
    torch.testing.assert_close(d[:, 0], torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64))
    p = weights(d, top_k=5)
    torch.testing.assert_close(p[:, 0], torch.tensor([4 / 7, 2 / 7, 1 / 7], dtype=torch.float64))
    p2 = weights(d, top_k=2)
    torch.testing.assert_close(p2[:, 0], torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))
    assert p2[2, 0] == 0.0


def test_zero_distance_gives_finite_weights() -> None:
    d = torch.tensor([[0.0, 1.0], [1.0, 0.5]], dtype=torch.float64)
    p = weights(d)
    assert torch.isfinite(p).all()
    assert p[0, 0] == pytest.approx(1.0, abs=1e-11)
    torch.testing.assert_close(p[:, 1], torch.tensor([1 / 3, 2 / 3], dtype=torch.float64))


def test_every_column_sums_to_one_with_at_most_k_nonzeros() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 9):
        d = rng.exponential(1.0, size=(n, n))
        for k in (1, 2, 5, 20):
            p = weights(d, top_k=k)
            torch.testing.assert_close(p.sum(0), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
            assert ((p > 0).sum(0) == min(k, n)).all()
            assert (p >= 0).all()


def test_k_at_least_n_keeps_every_model() -> None:
    d = np.array([[1.0, 3.0, 2.0], [2.0, 1.0, 5.0], [4.0, 0.5, 1.0]])
    inv = 1.0 / d
    want = inv / inv.sum(0, keepdims=True)
    for k in (3, 4, 100):
        torch.testing.assert_close(weights(d, top_k=k), torch.from_numpy(want))


def test_single_client_keeps_its_own_model() -> None:
    assert weights(np.array([[0.3]]), top_k=5).tolist() == [[1.0]]


def test_top_k_ties_keep_the_lower_index() -> None:
    d = np.array([[2.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    p = weights(d, top_k=2)
    assert p[:, 0].tolist() == [0.0, 0.5, 0.5]
    assert p[:, 1].tolist() == [0.5, 0.5, 0.0]
    assert p[:, 2].tolist() == [0.5, 0.5, 0.0]


def test_degenerate_columns_fall_back_to_own_model(caplog: pytest.LogCaptureFixture) -> None:
    d = np.array([[0.0, 1.0, math.inf], [1.0, 1.0, math.inf], [1.0, 1.0, math.inf]])
    with caplog.at_level(logging.WARNING, logger="coordinator.feddwa"):
        p = weights(d, top_k=2, eps=0.0)  # column 0: 1/0 = inf; column 2: all weights 0
    assert p[:, 0].tolist() == [1.0, 0.0, 0.0]
    assert p[:, 2].tolist() == [0.0, 0.0, 1.0]
    assert p[:, 1].tolist() == [0.5, 0.5, 0.0]
    assert "keep their own model" in caplog.text


def test_weights_validates_input() -> None:
    with pytest.raises(ValueError, match="square"):
        weights(np.ones((2, 3)))
    with pytest.raises(ValueError, match="NaN or negative"):
        weights(np.array([[1.0, -1.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="top_k"):
        weights(np.ones((2, 2)), top_k=0)
    with pytest.raises(ValueError, match="eps"):
        weights(np.ones((2, 2)), eps=-1.0)


@pytest.mark.parametrize("block_size", [None, 1, 7, 1000])
def test_gram_path_equals_direct_computation(block_size: int | None) -> None:
    trained = [random_state(10 + j) for j in range(6)]
    guidance = [{k: v + 0.01 * random_state(50 + i)[k] for k, v in trained[i].items()} for i in range(6)]
    got = distances(guidance, trained, block_size=block_size, gram="float64")  # the exact product
    want = direct_distances(guidance, trained)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # The self distances (one extra local pass) are the smallest, as in FedDWA.
    assert (got.argmin(0) == torch.arange(6)).all()
    # The default float32 product: own distances 5e-5 of the others are the hardest case for its cancellation,
    # yet the weights stay within the tolerance of tests/test_feddwa_gram.py.
    fast = distances(guidance, trained, block_size=block_size)
    assert (fast.argmin(0) == torch.arange(6)).all()
    assert float((weights(fast) - weights(want)).abs().max()) < 1e-6


@pytest.mark.parametrize("block_size", [None, 1, 4])
def test_personalise_mixes_trained_models_by_column(block_size: int | None) -> None:
    w = [with_bias(1.0), with_bias(2.0), with_bias(4.0)]
    w[2]["b.weight"][1, 2, 3] = 8.0
    p = torch.tensor([[0.5, 0.0, 0.25], [0.5, 1.0, 0.0], [0.0, 0.0, 0.75]], dtype=torch.float64)
    out = personalise(w, p, block_size=block_size)
    assert [float(s["a.bias"][0]) for s in out] == [1.5, 2.0, 3.25]
    assert [float(s["b.weight"][1, 2, 3]) for s in out] == [0.0, 0.0, 6.0]
    assert all(torch.count_nonzero(s["b.weight"]) == (i == 2) for i, s in enumerate(out))
    assert all(s[k].dtype == torch.float32 and s[k].shape == SHAPES[k] for s in out for k in SHAPES)
    with pytest.raises(ValueError, match="all zero"):
        personalise(w, torch.zeros(3, 3))


def test_aggregate_end_to_end() -> None:
    trained = [random_state(j) for j in range(7)]
    guidance = [{k: v * 1.01 for k, v in s.items()} for s in trained]
    res = aggregate(trained, guidance, top_k=3)
    torch.testing.assert_close(res.weights.sum(0), torch.ones(7, dtype=torch.float64))
    for i, st in enumerate(res.states):
        want = torch.stack([float(res.weights[j, i]) * trained[j]["b.weight"].double() for j in range(7)]).sum(0)
        torch.testing.assert_close(st["b.weight"], want.float())


def test_non_finite_uploads_are_refused_and_can_be_filtered() -> None:
    trained = [random_state(j) for j in range(4)]
    guidance = [random_state(20 + j) for j in range(4)]
    trained[2]["a.weight"][0, 0] = float("nan")
    guidance[1]["b.bias"][0] = float("inf")
    with pytest.raises(ValueError, match=r"trained models \[2\] / guidance models \[1\]"):
        distances(guidance, trained)
    keep = finite_clients(trained, guidance)
    assert keep == [0, 3]
    d = distances([guidance[i] for i in keep], [trained[i] for i in keep])
    assert torch.isfinite(d).all()


def test_distances_refuse_mismatched_architectures() -> None:
    a = random_state(0)
    b = random_state(1)
    b["a.weight"] = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="architecture version"):
        distances([a, a], [a, b])


def reference_mix(trained: list[dict[str, torch.Tensor]], p: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """sum_j p_ij w_j for every column i, in float64 by an independent einsum, rounded to float32."""
    p = p / p.sum(0, keepdim=True)
    return [
        {k: torch.einsum("j,j...->...", p[:, i], torch.stack([s[k].double() for s in trained])).float() for k in SHAPES}
        for i in range(p.shape[1])
    ]


@pytest.mark.parametrize("block_size", [None, 1, 5])
@pytest.mark.parametrize("top_k", [2, 12])
def test_sparse_and_dense_mixes_equal_the_float64_sum(block_size: int | None, top_k: int) -> None:
    # 12 clients: top-2 columns keep 24 of 144 weights (the sparse path), top-12 all of them (the dense one).
    trained = [random_state(100 + j) for j in range(12)]
    d = torch.from_numpy(np.random.default_rng(3).exponential(1.0, size=(12, 12)))
    p = weights(d, top_k=top_k)
    got = personalise(trained, p, block_size=block_size)
    want = reference_mix(trained, p)
    for g, w in zip(got, want, strict=True):
        for k in SHAPES:
            torch.testing.assert_close(g[k], w[k], rtol=2e-7, atol=1e-7)  # float32 rounding of equal float64 sums
    # Each personalised model uses only its top_k sources: moving a source it does not use changes nothing.
    unused = int((p[:, 0] == 0).nonzero()[0]) if top_k < 12 else None
    if unused is not None:
        moved = [dict(s) for s in trained]
        moved[unused] = {k: v + 100.0 for k, v in trained[unused].items()}
        again = personalise(moved, p, block_size=block_size)
        assert all(torch.equal(again[0][k], got[0][k]) for k in SHAPES)


def test_sparse_mixes_sum_in_float64_in_ascending_order() -> None:
    """The sparse path reads float32 sources but multiplies and adds in float64: each mix is the float64 sum,
    term by term in ascending j, rounded once to float32. Products or sums in float32 would differ here."""
    trained = [random_state(300 + j, scale=1000.0) for j in range(12)]
    d = torch.from_numpy(np.random.default_rng(8).exponential(1.0, size=(12, 12)))
    p = weights(d, top_k=3)
    got = personalise(trained, p)
    for i, g in enumerate(got):
        src = p[:, i].nonzero().flatten().tolist()
        for k in SHAPES:
            acc = trained[src[0]][k].double() * float(p[src[0], i])
            for j in src[1:]:
                acc = acc + trained[j][k].double() * float(p[j, i])
            assert torch.equal(g[k], acc.float()), (i, k)
    assert any(not torch.equal(g[k], sum(trained[j][k] * float(p[j, i]) for j in p[:, i].nonzero().flatten().tolist()))
               for i, g in enumerate(got) for k in SHAPES)  # the float32 sums do differ somewhere


def test_personalise_takes_more_columns_than_sources() -> None:
    trained = [with_bias(1.0), with_bias(2.0), with_bias(4.0)]
    p = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    out = personalise(trained, p)
    assert [float(s["a.bias"][0]) for s in out] == [1.0, 2.0, 4.0, 2.25]  # (1 + 2*2 + 4) / 4
    with pytest.raises(ValueError, match=r"shape \(3, m\)"):
        personalise(trained, torch.ones(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("n", [5, 20])
def test_aggregate_mixes_the_fedavg_average_in_the_same_pass(n: int) -> None:
    from coordinator.aggregation import weighted_average

    trained = [random_state(200 + j) for j in range(n)]
    guidance = [{k: v + 0.01 * random_state(300 + i)[k] for k, v in trained[i].items()} for i in range(n)]
    n_train = [10.0 + 7 * j for j in range(n)]
    res = aggregate(trained, guidance, top_k=3, average_weights=n_train)
    plain = aggregate(trained, guidance, top_k=3)
    assert plain.average is None and res.average is not None
    want = weighted_average(trained, n_train)
    for k in SHAPES:
        torch.testing.assert_close(res.average[k], want[k], rtol=2e-7, atol=1e-7)
    # The personalised models are those of the plain step (the extra column is mixed on its own).
    for a, b in zip(res.states, plain.states, strict=True):
        for k in SHAPES:
            torch.testing.assert_close(a[k], b[k], rtol=2e-7, atol=1e-7)
    with pytest.raises(ValueError, match="average_weights"):
        aggregate(trained, guidance, average_weights=[0.0] * n)
    with pytest.raises(ValueError, match="average_weights"):
        aggregate(trained, guidance, average_weights=[1.0] * (n + 1))
