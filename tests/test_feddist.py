"""FedDist divergence detection and growth (coordinator.feddist), with known answers."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from coordinator.aggregation import weighted_average
from coordinator.feddist import (
    FedDistConfig,
    GrowthDecision,
    NewUnit,
    apply_growth,
    detect_growth,
    flag_diverging,
    frozen_tensors,
    neuron_distances,
    neuron_rows,
    samuelson_bound,
    threshold_k,
)
from har_models.nn.model import ArchSpec, build_model

SPEC = ArchSpec(n_classes=4, conv_filters=8, dense_units=16)
T_P = SPEC.pooled_len


def zero_state(spec: ArchSpec = SPEC) -> dict[str, torch.Tensor]:
    return {n: torch.zeros(s) for n, s in spec.shapes().items()}


def random_state(spec: ArchSpec, seed: int, scale: float = 0.1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in spec.shapes().items()}


def sample_with_z(n: int, z: float) -> np.ndarray:
    """n >= 3 non-negative values whose last one sits exactly z population stds above the mean.

    The others are +b and -b (half each, shifted by 1); solving (1 - 1/n) / sd = z for b.
    """
    sd = (1.0 - 1.0 / n) / z
    b2 = (n * (sd**2 + 1.0 / n**2) - 1.0) / (n - 1)
    b = math.sqrt(b2)
    half = (n - 1) // 2
    values = np.array([b] * half + [-b] * half + [1.0]) + 1.0
    assert len(values) == n
    return values


def test_schedule_and_samuelson_bound() -> None:
    assert [threshold_k(r) for r in (0, 4, 5, 9, 10, 14, 15)] == [3.0, 3.0, 3.25, 3.25, 3.5, 3.5, 3.75]
    assert FedDistConfig(k0=2.0, delta=0.5, period=2).k_at(5) == 3.0
    assert samuelson_bound(5) == 2.0
    assert samuelson_bound(10) == 3.0
    assert samuelson_bound(15) == pytest.approx(3.741657, abs=1e-6)


def test_fifteen_clients_outlier_at_z_3_6_is_flagged_at_3_5_not_at_3_75() -> None:
    d = sample_with_z(15, 3.6)
    # Independent check of the construction with numpy (population std).
    assert (d[-1] - d.mean()) / d.std() == pytest.approx(3.6, abs=1e-9)
    dist = torch.zeros(15, 3, dtype=torch.float64)
    dist[:, 1] = torch.from_numpy(d)
    dist[:, 2] = torch.linspace(0.0, 1.0, 15, dtype=torch.float64)  # a uniform spread is never flagged at k = 3.5
    flags = flag_diverging(dist, 3.5)
    assert flags.nonzero().tolist() == [[14, 1]]
    assert not flag_diverging(dist, 3.75).any()


def test_detect_growth_finds_the_outlier_neuron_through_the_schedule() -> None:
    d = sample_with_z(15, 3.6)
    clients = []
    for c in range(15):
        st = zero_state()
        st["conv.weight"][5].view(-1)[0] = float(d[c])  # distance of neuron 5 to the zero average = d[c]
        clients.append(st)
    g = zero_state()
    cfg = FedDistConfig()
    at_3_5 = detect_growth(g, clients, SPEC, round_idx=10, config=cfg)  # k_10 = 3.5
    assert at_3_5.k_r == 3.5 and at_3_5.growth_possible
    assert at_3_5.units == (NewUnit("conv", 14, 5),)
    assert at_3_5.per_client() == {"conv": {14: 1}}
    at_3_75 = detect_growth(g, clients, SPEC, round_idx=15, config=cfg)  # k_15 = 3.75 > sqrt(14)
    assert not at_3_75.growth_possible and at_3_75.units == ()


def test_five_clients_never_flag_at_k_3() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        kind = trial % 3
        if kind == 0:
            d = rng.exponential(1.0, size=(5, 64))
        elif kind == 1:
            d = np.abs(rng.standard_cauchy(size=(5, 64)))
        else:
            d = np.zeros((5, 64))
            d[rng.integers(0, 5), :] = rng.uniform(1, 1e6, size=64)  # one extreme client per neuron
        assert not flag_diverging(torch.from_numpy(d), 3.0).any()
    # The bound is sqrt(4) = 2: just below it, the lone outlier is flagged (the property is not vacuous).
    d = np.zeros((5, 1))
    d[4] = 1.0
    assert flag_diverging(torch.from_numpy(d), 1.99).nonzero().tolist() == [[4, 0]]


def test_growth_impossible_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    clients = [random_state(SPEC, c) for c in range(5)]
    g = weighted_average(clients, [1.0] * 5)
    with caplog.at_level(logging.WARNING, logger="coordinator.feddist"):
        dec = detect_growth(g, clients, SPEC, round_idx=0)
    assert not dec.growth_possible and not dec.grew
    assert "growth impossible with 5 clients" in caplog.text and "needs >= 11 clients" in caplog.text


def test_neuron_rows_and_distances_match_definition() -> None:
    a, b = random_state(SPEC, 1), random_state(SPEC, 2)
    rows = neuron_rows(a, "conv")
    assert rows.shape == (8, 6 * 16 + 1)
    assert torch.equal(rows[3, :-1], a["conv.weight"][3].reshape(-1)) and rows[3, -1] == a["conv.bias"][3]
    d = neuron_distances(a, [b], "hidden")
    want = torch.linalg.norm(neuron_rows(b, "hidden").double() - neuron_rows(a, "hidden").double(), dim=1)
    torch.testing.assert_close(d[0], want)
    with pytest.raises(ValueError, match="output layer never grows"):
        neuron_rows(a, "out")


def diverging_round(n: int = 12) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """n clients near a common model; client 3's filter 5 and client 7's hidden unit 2 diverge."""
    base = random_state(SPEC, 100)
    clients = []
    for c in range(n):
        noise = random_state(SPEC, c, scale=0.01)
        clients.append({k: base[k] + noise[k] for k in base})
    clients[3]["conv.weight"][5] += 1.0
    clients[3]["conv.bias"][5] += 1.0
    clients[7]["hidden.weight"][2] += 0.5
    g = weighted_average(clients, [float(10 + c) for c in range(n)])
    return clients, g


def test_detection_order_layers_then_clients_then_neurons() -> None:
    clients, g = diverging_round()
    clients[1]["conv.weight"][6] += 1.0
    clients[1]["conv.weight"][0] += 1.0
    dec = detect_growth(g, clients, SPEC, round_idx=0)
    assert dec.units == (
        NewUnit("conv", 1, 0),
        NewUnit("conv", 1, 6),
        NewUnit("conv", 3, 5),
        NewUnit("hidden", 7, 2),
    )
    assert dec.for_layer("hidden") == (NewUnit("hidden", 7, 2),)


def test_width_cap_drops_extra_units(caplog: pytest.LogCaptureFixture) -> None:
    clients, g = diverging_round()
    clients[1]["conv.weight"][6] += 1.0
    cfg = FedDistConfig(max_conv_filters=9, max_dense_units=16)
    with caplog.at_level(logging.WARNING, logger="coordinator.feddist"):
        dec = detect_growth(g, clients, SPEC, round_idx=0, config=cfg)
    assert dec.for_layer("conv") == (NewUnit("conv", 1, 6),)
    assert dec.dropped == (NewUnit("conv", 3, 5), NewUnit("hidden", 7, 2))
    assert "dropped" in caplog.text
    # The default cap is 2x the initial width; a grown spec needs the initial one.
    assert FedDistConfig().caps(SPEC) == {"conv": 16, "hidden": 32}
    with pytest.raises(ValueError, match="initial_spec"):
        detect_growth(g, clients, SPEC.grown(), round_idx=0)


def test_function_preserving_growth_keeps_every_clients_logits() -> None:
    clients, g = diverging_round()
    dec = detect_growth(g, clients, SPEC, round_idx=0)
    assert dec.grew
    personalised = [random_state(SPEC, 50 + i) for i in range(4)]
    targets = [g, *clients, *personalised]
    grown, spec2 = apply_growth(dec, SPEC, targets, clients, mode="function_preserving")
    assert (spec2.conv_filters, spec2.dense_units, spec2.version) == (9, 17, 1)
    x = torch.randn(7, 6, 128, generator=torch.Generator().manual_seed(9))
    for before, after in zip(targets, grown, strict=True):
        m0 = build_model(SPEC, before).eval()
        m1 = build_model(spec2, after).eval()
        with torch.no_grad():
            torch.testing.assert_close(m1(x), m0(x), rtol=0, atol=1e-5)


def test_paper_mode_new_filter_reproduces_the_source_filter() -> None:
    clients, g = diverging_round()
    dec = detect_growth(g, clients, SPEC, round_idx=0, layers=("conv",))
    assert dec.units == (NewUnit("conv", 3, 5),)
    (grown_g,), spec2 = apply_growth(dec, SPEC, [g], clients, mode="paper")
    x = torch.randn(4, 6, 128, generator=torch.Generator().manual_seed(1))

    def conv_output(spec: ArchSpec, state: dict[str, torch.Tensor]) -> torch.Tensor:
        out: list[torch.Tensor] = []
        model = build_model(spec, state).eval()
        model.conv.register_forward_hook(lambda _m, _i, o: out.append(o))
        with torch.no_grad():
            model(x)
        return out[0]

    new = conv_output(spec2, grown_g)[:, 8]
    src = conv_output(SPEC, clients[3])[:, 5]
    torch.testing.assert_close(new, src, rtol=0, atol=1e-6)
    # Its dense columns are the source's block [j*T', (j+1)*T').
    assert torch.equal(grown_g["hidden.weight"][:, 8 * T_P : 9 * T_P], clients[3]["hidden.weight"][:, 5 * T_P : 6 * T_P])
    # Old filters keep the averaged values.
    assert torch.equal(grown_g["conv.weight"][:8], g["conv.weight"])


def test_paper_mode_hidden_unit_copies_outgoing_column() -> None:
    clients, g = diverging_round()
    dec = detect_growth(g, clients, SPEC, round_idx=0, layers=("hidden",))
    assert dec.units == (NewUnit("hidden", 7, 2),)
    (grown_g,), spec2 = apply_growth(dec, SPEC, [g], clients, mode="paper")
    assert spec2.dense_units == 17
    assert torch.equal(grown_g["hidden.weight"][16], clients[7]["hidden.weight"][2])
    assert torch.equal(grown_g["out.weight"][:, 16], clients[7]["out.weight"][:, 2])
    assert torch.equal(grown_g["out.bias"], g["out.bias"])


def test_frozen_tensors_for_intermediate_rounds() -> None:
    assert frozen_tensors("conv") == ("conv.weight", "conv.bias")
    assert frozen_tensors("hidden") == ("conv.weight", "conv.bias", "hidden.weight", "hidden.bias")
    with pytest.raises(ValueError, match="layer must be one of"):
        frozen_tensors("out")


def test_apply_growth_validates() -> None:
    clients, g = diverging_round()
    dec = GrowthDecision(0, 3.0, 1, True, ("conv",), (NewUnit("conv", 5, 0),))
    with pytest.raises(ValueError, match="outside client_states"):
        apply_growth(dec, SPEC, [g], clients[:2], mode="paper")
    with pytest.raises(ValueError, match="mode must be one of"):
        apply_growth(dec, SPEC, [g], clients, mode="copy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="period"):
        FedDistConfig(period=0)


def test_decision_is_json_able() -> None:
    import json

    clients, g = diverging_round()
    dec = detect_growth(g, clients, SPEC, round_idx=2)
    text = json.dumps(dec.to_dict())
    assert json.loads(text)["units"] == [["conv", 3, 5], ["hidden", 7, 2]]
