"""``python -m simulation.step_candidates``: the probe with candidate server steps for small federations (docs/tuning/server-step.md).

The default server step (:mod:`coordinator.strategies.fedexp`: FedExP's eta_t capped by
eta_max(M), momentum beta = 0.5) still fell more than 10 points of global macro-F1 from its
best round on some 2-5 client federations. Each candidate here changes the step only when
fewer than :data:`SMALL_FEDERATION` clients contributed, so from 15 clients on it is the
default's arithmetic to the last bit (:func:`small_federation_step` returns its inputs
unchanged there). With eta_t the default's step size, beta its momentum, Delta_t the
pseudo-gradient, m_{t-1} the momentum and sum_i p_i ||Delta_i||^2 the clients' mean squared
update norm, below 15 clients:

===========  =====================================================================================
candidate    change, then m_t = beta' m' + eta' Delta_t and x_{t+1} = x_t - m_t
===========  =====================================================================================
xbscale      beta' = beta * M / 15 (momentum scaled with the contributing clients)
xb0          beta' = 0 (FedExP without momentum; FedAvg while eta_t = 1)
xhalf        eta' = eta_t / 2 (an effective step eta' / (1 - beta) of 1 instead of 2)
xagree       eta' = eta_t ||Delta_t||^2 / sum_i p_i ||Delta_i||^2 (in (0, 1]: the step shrinks as updates disagree)
xflip        m' = 0 when cos(Delta_t, m_{t-1}) < 0 (momentum reset when the direction flips)
xdamp        beta' = beta * max(0, cos(Delta_t, m_{t-1})) (momentum damped by the direction's agreement)
xsmooth      beta' = 0.75, eta' = eta_t / 2 (the same effective step of 2, averaged over more rounds)
xheavy       beta' = 0.75, eta' = eta_t / 4 (effective step 1)
xsmooth9     beta' = 0.9, eta' = eta_t / 5 (effective step 2, averaged over about 10 rounds)
===========  =====================================================================================

``xsame`` is the default through the same code (a check of the harness). A "+" joins two
changes (``xhalfflip``, ``xsmoothflip``, ``xemaflip`` = ``xhalfflip``). The arguments are
:mod:`simulation.probe`'s; the candidates are registered as strategies only while this
program runs, so ``--servers xsmooth`` names one. Tuning only: none of them is the
coordinator's default (why: docs/tuning/server-step.md).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import torch

from coordinator.server_opt import fedavgm_step, fedexp_eta, fit_to_shape, mean_sq_update_norm, pseudo_gradient
from coordinator.strategies.base import Aggregate, Federation, contributors, fedavg_of
from coordinator.strategies.fedexp import FedExP
from coordinator.updates import ClientUpdate, Failure

SMALL_FEDERATION = 15
"""Below this many contributing clients a candidate changes the step; from it on the default's arithmetic is kept
(eta_max(M) reaches 1 at 15 clients, docs/tuning/server-step.md)."""

CANDIDATES: dict[str, str] = {
    "xsame": "", "xbscale": "bscale", "xb0": "b0", "xhalf": "half", "xema": "half", "xagree": "agree",
    "xflip": "flip", "xdamp": "damp", "xhalfflip": "half+flip", "xemaflip": "half+flip", "xsmooth": "smooth",
    "xsmoothflip": "smooth+flip", "xheavy": "heavy", "xsmooth9": "smooth9",
}
"""Candidate name -> its changes ("+"-joined; module docstring)."""

_CHANGES = ("bscale", "b0", "half", "agree", "flip", "damp", "smooth", "heavy", "smooth9")


def _dot(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return sum(float((a[k].double() * b[k].double()).sum()) for k in a)


def small_federation_step(
    mode: str, n_clients: int, eta_t: float, beta: float, delta: Mapping[str, torch.Tensor],
    m_prev: Mapping[str, torch.Tensor] | None, mean_sq_norm: float,
) -> tuple[float, float, Mapping[str, torch.Tensor] | None]:
    """The candidate's (eta', beta', m') for one round; ``(eta_t, beta, m_prev)`` unchanged from 15 clients on.

    Parameters
    ----------
    mode : str
        "+"-joined changes of :data:`CANDIDATES` ("" for none).
    n_clients : int >= 1
        M, the clients that contributed.
    eta_t : float >= 1
        The default's FedExP step size (:func:`coordinator.server_opt.fedexp_eta`).
    beta : float in [0, 1)
        The default's momentum.
    delta : dict name -> tensor
        Delta_t.
    m_prev : dict name -> tensor, the shapes of ``delta``, or None
        m_{t-1} (None before the first step).
    mean_sq_norm : float >= 0
        sum_i p_i ||Delta_i||^2 (:func:`coordinator.server_opt.mean_sq_update_norm`).

    Raises
    ------
    ValueError
        For an unknown change or ``n_clients`` < 1.
    """
    parts = [p for p in mode.split("+") if p]
    unknown = [p for p in parts if p not in _CHANGES]
    if unknown or n_clients < 1:
        raise ValueError(f"small_federation_step: unknown change(s) {unknown} (choose {', '.join(_CHANGES)}) "
                         f"or n_clients {n_clients} < 1")
    if n_clients >= SMALL_FEDERATION:
        return eta_t, beta, m_prev
    d2 = _dot(delta, delta)
    for part in parts:
        if part == "bscale":
            beta = beta * min(1.0, n_clients / SMALL_FEDERATION)
        elif part == "b0":
            beta = 0.0
        elif part == "half":
            eta_t = eta_t * 0.5
        elif part == "agree":
            eta_t = eta_t * min(1.0, d2 / max(mean_sq_norm, 1e-30))
        elif part in ("smooth", "heavy", "smooth9"):
            beta, factor = {"smooth": (0.75, 0.5), "heavy": (0.75, 0.25), "smooth9": (0.9, 0.2)}[part]
            eta_t = eta_t * factor
        elif m_prev is not None:  # flip, damp: both read the angle between Delta_t and m_{t-1}
            cos = _dot(delta, m_prev) / max((d2 * _dot(m_prev, m_prev)) ** 0.5, 1e-30)
            if part == "flip" and cos < 0:
                m_prev = None
            elif part == "damp":
                beta = beta * max(0.0, cos)
    return eta_t, beta, m_prev


class _Candidate(FedExP):
    """The default FedExP step with :func:`small_federation_step` applied before the momentum step."""

    mode = ""

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        avg = fedavg_of(results)
        x_t = fed.global_state
        delta = pseudo_gradient(x_t, avg.global_state)
        if self.m is not None:
            self.m = {k: fit_to_shape(self.m[k], x_t[k].shape, 0.0) for k in x_t}
        used = contributors(results)
        msq = mean_sq_update_norm(x_t, (u.state for u in used), [u.n_train for u in used])
        eta_t = fedexp_eta(msq, delta, self.eps, self.eta_max(len(used)))
        eta_t, beta, m_prev = small_federation_step(self.mode, len(used), eta_t, self.beta, delta, self.m, msq)
        x_new, m_new = fedavgm_step(x_t, {k: eta_t * d for k, d in delta.items()}, m_prev, 1.0, beta)
        if not all(bool(torch.isfinite(t).all()) for t in x_new.values()):
            raise ValueError(f"{self.name}: the server step gave non-finite values")
        self.last_eta = eta_t
        self.m = m_new
        return Aggregate(x_new, {}, None, avg.participants)


def register() -> None:
    """Register every candidate of :data:`CANDIDATES` as a strategy (for this program's probe run only)."""
    for name, mode in CANDIDATES.items():
        type(name, (_Candidate,), {"name": name, "mode": mode})


def main(argv: list[str] | None = None) -> int:
    """:func:`simulation.probe.main` with the candidates registered; its exit status."""
    register()
    from simulation import probe

    return probe.main(argv)


if __name__ == "__main__":
    sys.exit(main())
