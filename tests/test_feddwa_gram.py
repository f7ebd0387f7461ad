"""FedDWA's float32 Gram product against the exact float64 one (issue 31, item 5).

The tolerance the default is held to: on 30 clients of a mid-size CNN (64 filters, 256 units,
532,294 parameters) whose models spread like the aggregation benchmark's (5 % of each tensor's
standard deviation) and whose guidance models take a step a fifth of that, every p_ij of the
float32 path is within 1e-6 of the exact one (measured: 1e-7), every top-K set is the same, and
every squared distance is within 1e-5 of the exact one, relative (measured: 8e-7; a client's
own distance, about 2 % of the others, is the hardest).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coordinator import feddwa
from coordinator.spill import SpilledState, spill_update
from coordinator.strategies.feddwa import FedDWASettings
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state

P_TOLERANCE = 1e-6
"""Largest allowed |p_ij(float32) - p_ij(float64)|."""
D_TOLERANCE = 1e-5
"""Largest allowed relative difference of a squared distance D[j, i]."""

MID = ArchSpec(n_classes=6, conv_filters=64, dense_units=256)


def round_of_updates(
    n: int, spec: ArchSpec, spread: float = 0.05, step: float = 0.2, drift: float = 0.0, seed: int = 0
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """(trained, guidance) models of ``n`` clients, as bench_aggregation.py makes them.

    Each trained model is the Glorot-initialised model, moved by ``drift`` times each tensor's
    standard deviation in one direction shared by every client (a federation many rounds from
    its start), plus a per-client Gaussian perturbation of ``spread`` times that standard
    deviation (0.01 for the zero-initialised biases); the guidance model is one more
    perturbation of ``step`` times the client's.
    """
    base = init_state(spec, seed)
    scale = {k: spread * float(v.std()) if float(v.std()) > 0 else 0.01 for k, v in base.items()}
    g = torch.Generator().manual_seed(seed + 1)
    shared = {k: drift * (scale[k] / spread) * torch.randn(v.shape, generator=g) for k, v in base.items()}
    trained, guidance = [], []
    for _ in range(n):
        w = {k: v + shared[k] + scale[k] * torch.randn(v.shape, generator=g) for k, v in base.items()}
        trained.append(w)
        guidance.append({k: v + step * scale[k] * torch.randn(v.shape, generator=g) for k, v in w.items()})
    return trained, guidance


@pytest.mark.slow
@pytest.mark.parametrize("drift", [0.0, 3.0])
def test_float32_weights_are_within_the_stated_tolerance_of_the_exact_ones(drift: float) -> None:
    trained, guidance = round_of_updates(30, MID, drift=drift)
    d64 = feddwa.distances(guidance, trained, gram="float64")
    d32 = feddwa.distances(guidance, trained, gram="float32")
    assert d64.dtype == d32.dtype == torch.float64
    assert float(d64.diagonal().mean() / d64.mean()) < 0.05  # the own distances are the small ones, as in a real round
    assert float(((d32 - d64).abs() / d64).max()) < D_TOLERANCE
    p64, p32 = feddwa.weights(d64), feddwa.weights(d32)
    assert torch.equal(p32 > 0, p64 > 0)  # the same top-K sources for every client
    assert float((p32 - p64).abs().max()) < P_TOLERANCE
    assert torch.allclose(p32.sum(0), torch.ones(30, dtype=torch.float64), rtol=0, atol=1e-12)


def test_float32_is_the_default_and_float64_is_the_exact_product() -> None:
    trained, guidance = round_of_updates(6, ArchSpec(n_classes=6, conv_filters=8, dense_units=32))
    assert feddwa.DEFAULT_GRAM == "float32"
    assert torch.equal(feddwa.distances(guidance, trained), feddwa.distances(guidance, trained, gram="float32"))
    flat_w = torch.stack([torch.cat([t.double().reshape(-1) for t in s.values()]) for s in trained])
    flat_g = torch.stack([torch.cat([guidance[i][k].double().reshape(-1) for k in trained[0]]) for i in range(6)])
    direct = ((flat_g[None, :, :] - flat_w[:, None, :]) ** 2).sum(-1)  # direct[j, i] = ||ŵ_i - w_j||^2
    assert torch.allclose(feddwa.distances(guidance, trained, gram="float64"), direct, rtol=1e-10, atol=0)
    assert torch.allclose(feddwa.distances(guidance, trained, gram="float32"), direct, rtol=1e-5, atol=0)


def test_spilled_states_give_the_same_float32_distances_as_models_in_memory(tmp_path: Path) -> None:
    spec = ArchSpec(n_classes=6, conv_filters=8, dense_units=32)
    trained, guidance = round_of_updates(5, spec)
    names = list(trained[0])
    for k in range(5):
        spill_update(ClientUpdate(f"c{k}", 0, 0, 10, 2, trained[k], guidance[k], size=1), tmp_path)
    mapped_w = [SpilledState(tmp_path / f"c{k}.safetensors", "", names) for k in range(5)]
    mapped_g = [SpilledState(tmp_path / f"c{k}.safetensors", "guidance/", names) for k in range(5)]
    for block in (None, 1000, 5000):  # chunks of GRAM_CHUNK = 4096 and shorter tails
        assert torch.equal(feddwa.distances(mapped_g, mapped_w, gram="float32", block_size=block),
                           feddwa.distances(guidance, trained, gram="float32", block_size=block))  # fmt: skip


def test_the_setting_chooses_the_arithmetic_and_refuses_others() -> None:
    assert FedDWASettings().gram == "float32"
    assert FedDWASettings(gram="float64").gram == "float64"
    with pytest.raises(ValueError, match="gram must be one of"):
        FedDWASettings(gram="float16")
    trained, guidance = round_of_updates(3, ArchSpec(n_classes=6, conv_filters=8, dense_units=32))
    with pytest.raises(ValueError, match="gram must be one of"):
        feddwa.distances(guidance, trained, gram="bfloat16")


def test_float32_path_names_the_client_with_non_finite_values() -> None:
    trained, guidance = round_of_updates(4, ArchSpec(n_classes=6, conv_filters=8, dense_units=32))
    first = next(iter(trained[2]))
    trained[2][first] = trained[2][first].clone()
    trained[2][first].view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match=r"trained models \[2\]"):
        feddwa.distances(guidance, trained, gram="float32")
    trained, guidance = round_of_updates(4, ArchSpec(n_classes=6, conv_filters=8, dense_units=32))
    guidance[1][first] = guidance[1][first].clone()
    guidance[1][first].view(-1)[0] = float("inf")
    with pytest.raises(ValueError, match=r"guidance models \[1\]"):
        feddwa.distances(guidance, trained, gram="float32")
