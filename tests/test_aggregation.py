"""FedAvg arithmetic."""

import pytest
import torch

from coordinator.aggregation import weighted_average


def test_zero_window_client_contributes_nothing_and_makes_no_nan():
    s4 = {"w": torch.full((3, 2), 4.0), "b": torch.full((2,), 4.0)}
    s5 = {"w": torch.full((3, 2), 5.0), "b": torch.full((2,), 5.0)}
    s100 = {"w": torch.full((3, 2), 100.0), "b": torch.full((2,), float("nan"))}
    out = weighted_average([s4, s5, s100], [10, 10, 0])
    assert torch.equal(out["w"], torch.full((3, 2), 4.5)) and torch.equal(out["b"], torch.full((2,), 4.5))
    assert out["w"].dtype == torch.float32


def test_weights_follow_window_counts():
    out = weighted_average([{"w": torch.tensor([0.0])}, {"w": torch.tensor([1.0])}], [1, 3])
    assert out["w"].item() == 0.75


def test_errors():
    s = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match="total weight is 0"):
        weighted_average([s, s], [0, 0])
    with pytest.raises(ValueError, match=">= 0"):
        weighted_average([s], [-1])
    with pytest.raises(ValueError, match="another shape"):
        weighted_average([s, {"w": torch.zeros(3)}], [1, 1])
    with pytest.raises(ValueError, match="2 states but 1 weights"):
        weighted_average([s, s], [1])
