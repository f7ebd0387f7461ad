"""FedDWA's server step (blocked Gram distances, top-K weights, sparse mixes over spilled files) against a
straightforward implementation of the paper's formulas, on random models.

The reference computes every d_ij^2 = ||ŵ_i - w_j||^2 as a float64 sum of squared differences, the weights by
Liu et al., IJCAI 2023, Eq. (17) with top-K (algorithms.md 2.2-2.3) in plain Python, and each personalised
model and the shadow FedAvg average as float64 sums of ``p_ij w_j`` rounded once to float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator import feddwa
from coordinator.spill import spill_update
from coordinator.strategies import Federation
from coordinator.strategies.feddwa import FedDWA, FedDWASettings
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state

SPEC = ArchSpec(n_classes=6, conv_filters=5, dense_units=12)


def _updates(n: int, seed: int) -> list[ClientUpdate]:
    base = init_state(SPEC, seed)
    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for j in range(n):
        w = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items()}
        guid = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        out.append(ClientUpdate(f"c{j:02d}", 1, 0, 20 + 7 * j, 5, w, guid, size=1))
    return out


def _reference(ups: list[ClientUpdate], top_k: int) -> tuple[np.ndarray, np.ndarray, list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    names = list(ups[0].state)
    flat = [np.concatenate([u.state[k].double().numpy().ravel() for k in names]) for u in ups]
    gflat = [np.concatenate([u.guidance[k].double().numpy().ravel() for k in names]) for u in ups]  # type: ignore[index]
    n = len(ups)
    d = np.array([[float(((gflat[i] - flat[j]) ** 2).sum()) for i in range(n)] for j in range(n)])
    p = np.zeros((n, n))
    for i in range(n):
        a = [1.0 / (d[j, i] + 1e-12) for j in range(n)]
        total = sum(a)
        a = [x / total for x in a]
        keep = sorted(range(n), key=lambda j: (-a[j], j))[:top_k]
        kept = sum(a[j] for j in keep)
        for j in keep:
            p[j, i] = a[j] / kept
    def mix(col: np.ndarray) -> dict[str, np.ndarray]:
        acc = sum(col[j] * flat[j] for j in range(n))
        out, lo = {}, 0
        for k in names:
            size = ups[0].state[k].numel()
            out[k] = acc[lo : lo + size].astype(np.float32).reshape(tuple(ups[0].state[k].shape))
            lo += size
        return out
    sizes = np.array([u.n_train for u in ups], float)
    return d, p, [mix(p[:, i]) for i in range(n)], mix(sizes / sizes.sum())


@pytest.mark.parametrize("n, top_k, spilled", [(6, 3, False), (12, 2, True), (25, 5, True)])
def test_feddwa_step_equals_the_straightforward_formulas(tmp_path: Path, n: int, top_k: int, spilled: bool) -> None:
    ups = _updates(n, seed=n)
    used = [spill_update(u, tmp_path) for u in ups] if spilled else ups  # 25 clients: the sparse mixes (nnz <= nm/4)
    res = feddwa.aggregate([u.state for u in used], [u.guidance for u in used], top_k=top_k,  # type: ignore[misc]
                           average_weights=[u.n_train for u in used], gram="float64")  # fmt: skip  # the exact product
    d, p, states, avg = _reference(ups, top_k)
    np.testing.assert_allclose(res.distances.numpy(), d, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.weights.numpy(), p, rtol=1e-9, atol=1e-15)
    assert ((res.weights > 0).sum(0) == min(top_k, n)).all()
    for got, want in zip(res.states, states, strict=True):
        for k in want:
            np.testing.assert_allclose(got[k].numpy(), want[k], rtol=1e-6, atol=1e-7, err_msg=k)
    assert res.average is not None
    for k in avg:
        np.testing.assert_allclose(res.average[k].numpy(), avg[k], rtol=1e-6, atol=1e-7, err_msg=k)
    # The strategy hands out the same models and P with the exact product ...
    fed = Federation(SPEC, SPEC, init_state(SPEC, 0))
    agg = FedDWA(FedDWASettings(top_k=top_k, gram="float64")).aggregate_fit(1, fed, used)
    assert agg.mixing is not None and torch.equal(agg.mixing, res.weights)
    assert all(torch.equal(agg.personal[u.client_id][k], res.states[i][k]) for i, u in enumerate(used) for k in res.states[i])
    # ... and, by default (float32 product), the same top-K sets and weights within tests/test_feddwa_gram.py's tolerance.
    fast = FedDWA(FedDWASettings(top_k=top_k)).aggregate_fit(1, fed, used)
    assert fast.mixing is not None and torch.equal(fast.mixing > 0, res.weights > 0)
    assert float((fast.mixing - res.weights).abs().max()) < 1e-6
