"""Weighted parameter averaging (FedAvg), the arithmetic under every strategy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from har_models.nn.model import State


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> State:
    """Parameter-wise weighted mean theta = sum_k (n_k / sum_j n_j) theta_k (McMahan et al., AISTATS 2017, Algorithm 1).

    ``n_k`` is client k's training windows; weight-0 entries are skipped entirely (their values, even
    non-finite, never reach the result). Accumulates in float64, returns float32. Raises ValueError for
    unequal lengths, a negative or infinite weight, all weights 0, or positive-weight states that
    disagree in names or shapes.
    """
    if len(states) != len(weights):
        raise ValueError(f"weighted_average: {len(states)} states but {len(weights)} weights")
    w = [float(x) for x in weights]
    if any(not (x >= 0.0) or x == float("inf") for x in w):
        raise ValueError(f"weighted_average: weights must be finite and >= 0, got {w}")
    used = [(s, x) for s, x in zip(states, w, strict=True) if x > 0.0]
    if not used:
        raise ValueError("weighted_average: total weight is 0 (no client reported training windows); nothing to average")
    total = sum(x for _, x in used)
    ref = used[0][0]
    out: State = {}
    for name, t0 in ref.items():
        acc = torch.zeros(t0.shape, dtype=torch.float64)
        for s, x in used:
            if name not in s or tuple(s[name].shape) != tuple(t0.shape):
                raise ValueError(f"weighted_average: tensor {name!r} missing or of another shape in one of the states")
            acc.add_(s[name], alpha=x / total)  # accumulates in float64 without a float64 copy of the input
        out[name] = acc.float()
    for s, _ in used:
        if set(s) != set(ref):
            raise ValueError(f"weighted_average: tensor names differ: {sorted(set(s) ^ set(ref))}")
    return out
