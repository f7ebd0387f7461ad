"""Server-side optimisers' arithmetic: the FedAvgM, FedAdam, FedYogi and FedExP steps as pure functions.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2, with the clients' mean as a
pseudo-gradient; x_t is the model sent, x_i the trained models weighted by n_i:

    Delta_t = x_t - sum_i (n_i / n) x_i                      (pseudo-gradient)
    FedAvgM:  m_t = beta * m_{t-1} + Delta_t
              x_{t+1} = x_t - eta * m_t                      (Hsu et al., arXiv 1909.06335)
    FedAdam:  m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
              v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2
              x_{t+1} = x_t - eta m_t / (sqrt(v_t) + tau)
    FedYogi:  as FedAdam but v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)
    FedExP:   eta_t = min(eta_max, max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_t||^2 + eps))))
              m_t = beta * m_{t-1} + eta_t Delta_t,  x_{t+1} = x_t - m_t
              (Jhunjhunwala, Wang, Joshi, ICLR 2023; :func:`fedexp_eta`)

m_0 = 0 and v_0 = tau^2, no bias correction (Algorithm 2; Reddi et al. add -Delta, the same update).
The strategies (:mod:`coordinator.strategies.fedopt`) keep the moments; :func:`fit_to_shape` pads
them where FedDist appends units.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from coordinator.aggregation import State

BETA1 = 0.9
"""First-moment decay beta1 (Reddi et al. 2021, section 5)."""
BETA2 = 0.99
"""Second-moment decay beta2 (Reddi et al. 2021, section 5)."""
TAU = 1e-3
"""Adaptivity tau (Reddi et al. 2021, section 5)."""


def _check(x: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor], what: str) -> None:
    if set(x) != set(other):
        raise ValueError(f"{what}: tensor names differ: {sorted(set(x) ^ set(other))}")
    for k, t in x.items():
        if tuple(t.shape) != tuple(other[k].shape):
            raise ValueError(f"{what}: tensor {k!r} has shape {tuple(other[k].shape)}, the model {tuple(t.shape)}")


def pseudo_gradient(x_t: Mapping[str, torch.Tensor], average: Mapping[str, torch.Tensor]) -> State:
    """Delta_t = x_t - avg(x_i), per tensor (float32); ValueError if names or shapes differ."""
    _check(x_t, average, "pseudo_gradient")
    return {k: (x_t[k].double() - average[k].double()).float() for k in x_t}


def fedavgm_step(
    x_t: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor], m: Mapping[str, torch.Tensor] | None,
    eta: float = 1.0, beta: float = 0.9,
) -> tuple[State, State]:
    """One FedAvgM server step: ``m = beta m + Delta``, ``x = x_t - eta m``; returns (x_{t+1}, m_t); m None is m_0 = 0.

    Raises ValueError on mismatched tensors, eta <= 0 or beta outside [0, 1).
    """
    if not eta > 0 or not 0 <= beta < 1:
        raise ValueError(f"fedavgm_step: need eta > 0 and 0 <= beta < 1, got eta={eta}, beta={beta}")
    _check(x_t, delta, "fedavgm_step")
    m_prev = {k: torch.zeros_like(v) for k, v in x_t.items()} if m is None else m
    _check(x_t, m_prev, "fedavgm_step (momentum)")
    m_new = {k: beta * m_prev[k].float() + delta[k].float() for k in x_t}
    return {k: x_t[k].float() - eta * m_new[k] for k in x_t}, m_new


def adaptive_step(
    x_t: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor],
    m: Mapping[str, torch.Tensor] | None, v: Mapping[str, torch.Tensor] | None,
    eta: float, rule: str = "adam", beta1: float = BETA1, beta2: float = BETA2, tau: float = TAU,
) -> tuple[State, State, State]:
    """One FedAdam or FedYogi (``rule``) server step (Reddi et al. 2021, Algorithm 2); returns (x_{t+1}, m_t, v_t).

    m, v None are m_0 = 0, v_0 = tau^2. Raises ValueError on mismatched tensors, an unknown rule, eta or
    tau <= 0, or betas outside [0, 1).
    """
    if rule not in ("adam", "yogi"):
        raise ValueError(f"adaptive_step: rule must be 'adam' or 'yogi', got {rule!r}")
    if not eta > 0 or not tau > 0 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1:
        raise ValueError(f"adaptive_step: need eta, tau > 0 and betas in [0, 1), got {eta}, {tau}, {beta1}, {beta2}")
    _check(x_t, delta, "adaptive_step")
    m_prev = {k: torch.zeros_like(t) for k, t in x_t.items()} if m is None else m
    v_prev = {k: torch.full_like(t, tau * tau) for k, t in x_t.items()} if v is None else v
    _check(x_t, m_prev, "adaptive_step (first moment)")
    _check(x_t, v_prev, "adaptive_step (second moment)")
    x_new: State = {}
    m_new: State = {}
    v_new: State = {}
    for k in x_t:
        d = delta[k].double()
        mk = beta1 * m_prev[k].double() + (1 - beta1) * d
        d2 = d * d
        vp = v_prev[k].double()
        vk = beta2 * vp + (1 - beta2) * d2 if rule == "adam" else vp - (1 - beta2) * d2 * torch.sign(vp - d2)
        x_new[k] = (x_t[k].double() - eta * mk / (vk.sqrt() + tau)).float()
        m_new[k], v_new[k] = mk.float(), vk.float()
    return x_new, m_new, v_new


EXP_EPS = 1e-3
"""FedExP's eps, keeping eta_t finite when the updates cancel (Algorithm 1's small constant; 1e-3 here)."""


def mean_sq_update_norm(
    x_t: Mapping[str, torch.Tensor], states: Iterable[Mapping[str, torch.Tensor]], weights: Sequence[float],
) -> float:
    """sum_i p_i ||x_t - x_i||^2 with p_i = n_i / sum_j n_j, over all tensors (float64): FedExP's numerator.

    A running sum, so ``states`` may be a generator; clients of weight 0 are skipped. Raises ValueError
    for a negative or infinite weight, all weights 0, unequal counts, or names or shapes unlike ``x_t``'s.
    """
    w = [float(x) for x in weights]
    if any(not (x >= 0.0) or x == float("inf") for x in w):
        raise ValueError(f"mean_sq_update_norm: weights must be finite and >= 0, got {w}")
    total = sum(w)
    if not total > 0:
        raise ValueError("mean_sq_update_norm: total weight is 0 (no client reported training windows)")
    acc, n = 0.0, 0
    for state, wi in zip(states, w, strict=False):
        n += 1
        if wi == 0.0:
            continue
        _check(x_t, state, "mean_sq_update_norm")
        acc += wi / total * sum(float((x_t[k].double() - state[k].double()).square().sum()) for k in x_t)
    if n != len(w):
        raise ValueError(f"mean_sq_update_norm: {n} states but {len(w)} weights")
    return acc


def fedexp_eta(mean_sq_norm: float, delta: Mapping[str, torch.Tensor], eps: float = EXP_EPS,
               eta_max: float = float("inf")) -> float:
    """FedExP's server step size for one round, in [1, eta_max] (Jhunjhunwala, Wang, Joshi, ICLR 2023, Algorithm 1).

        eta_t = min(eta_max, max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_t||^2 + eps)))),  Delta_t = sum_i p_i Delta_i

    With p_i = 1/M this is the paper's form. By Jensen the ratio is at least 1/2 (eta_t = 1, FedAvg, when
    all clients move alike), about K/2 for K orthogonal equal-norm updates, large when they cancel; the
    cap ``eta_max`` is this project's (a Delta_t near 0 must not become a long step). Raises ValueError
    if ``mean_sq_norm`` is negative or not finite, ``eps`` <= 0, ``eta_max`` < 1, or ``delta`` holds NaN or inf.
    """
    if not (0.0 <= mean_sq_norm < float("inf")):
        raise ValueError(f"fedexp_eta: mean_sq_norm must be finite and >= 0, got {mean_sq_norm}")
    if not eps > 0 or not eta_max >= 1:
        raise ValueError(f"fedexp_eta: need eps > 0 and eta_max >= 1, got eps={eps}, eta_max={eta_max}")
    d2 = sum(float(t.double().square().sum()) for t in delta.values())
    if not d2 < float("inf"):
        raise ValueError("fedexp_eta: the pseudo-gradient holds NaN or inf")
    return min(eta_max, max(1.0, mean_sq_norm / (2.0 * (d2 + eps))))


def fit_to_shape(buf: torch.Tensor, shape: torch.Size, fill: float) -> torch.Tensor:
    """``buf`` padded with ``fill`` at the end of each axis to ``shape``; ValueError for another rank or a larger axis."""
    if buf.shape == shape:
        return buf
    if buf.dim() != len(shape) or any(a > b for a, b in zip(buf.shape, shape, strict=True)):
        raise ValueError(f"server optimiser state of shape {tuple(buf.shape)} cannot grow to {tuple(shape)}")
    out = torch.full(shape, fill, dtype=buf.dtype)
    out[tuple(slice(0, n) for n in buf.shape)] = buf
    return out
