"""The server optimisers' shared class and settings (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

FedAvg clients; the server takes one optimiser step per round on Delta_t = x_t - avg(x_i)
(Algorithm 2; arithmetic in :mod:`coordinator.server_opt`). FedExP, FedAvgM, FedAdam and FedYogi are
one file each; the moments m_t, v_t are the strategy's persisted state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from coordinator.server_opt import BETA2, EXP_EPS, TAU, adaptive_step, fit_to_shape, pseudo_gradient
from coordinator.strategies.base import Aggregate, Federation, Strategy, fedavg_of
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.model import ArchSpec, State
from har_models.settings import doc


@dataclass(frozen=True)
class ServerOptSettings:
    """Settings of the server optimisers (fedexp, fedavgm, fedadam, fedyogi); the other strategies ignore them.

    ``lr`` (eta; FedExP's cap eta_max, >= 1) and ``momentum`` (beta, or beta1) default to the optimiser's
    own; ``beta2`` and ``tau`` are Reddi et al.'s section 5 values; ``eps`` is FedExP's. Raises ValueError
    naming the field for a value out of range.
    """

    lr: float | None = field(
        default=None,
        metadata=doc("server optimiser step size eta (fedavgm/fedadam/fedyogi), or the cap eta_max of FedExP's adaptive "
                     "step (>= 1); default: the optimiser's own (FedExP 1 up to 15 clients, 2 from 30; FedAvgM 3.0; "
                     "FedAdam/FedYogi 0.01)", flag="--server-lr"),
    )
    momentum: float | None = field(
        default=None,
        metadata=doc("server optimiser momentum beta (FedExP, FedAvgM) or beta1 (FedAdam/FedYogi), in [0, 1); default: "
                     "the optimiser's own (FedAvgM 0.5, tuned on HAPT, docs/results.md; FedAdam/FedYogi 0.9)",
                     flag="--server-momentum"),
    )
    beta2: float = field(default=BETA2, metadata=doc("FedAdam/FedYogi second-moment decay beta2, in [0, 1)",
                                                     flag="--server-beta2"))
    tau: float = field(default=TAU, metadata=doc("FedAdam/FedYogi adaptivity tau, > 0", flag="--server-tau"))
    eps: float = field(default=EXP_EPS, metadata=doc("FedExP's eps in its step size's denominator, > 0",
                                                     flag="--server-eps"))

    def __post_init__(self) -> None:
        if (self.lr is not None and not self.lr > 0) or (self.momentum is not None and not 0 <= self.momentum < 1):
            raise ValueError(
                f"ServerOptSettings: lr (--server-lr) must be > 0 and momentum (--server-momentum) in [0, 1) "
                f"(leave them out for the optimiser's defaults); got {self.lr}, {self.momentum}"
            )
        if not 0 <= self.beta2 < 1 or not self.tau > 0 or not self.eps > 0:
            raise ValueError(f"ServerOptSettings: need 0 <= beta2 < 1, tau > 0 and eps > 0 (--server-beta2, --server-tau, "
                             f"--server-eps), got beta2={self.beta2}, tau={self.tau}, eps={self.eps}")


class FedOpt(Strategy):
    """FedAvg clients, a server optimiser on the pseudo-gradient (Reddi et al. 2021, Algorithm 2); abstract.

    A subclass sets ``name``, :attr:`default_lr` and :attr:`default_momentum` (filling settings left out)
    and its :meth:`step`. ``eta`` is FedExP's cap; ``last_eta`` the last step size after ``step_scale``
    (which the quality guard halves at each rollback); ``m``, ``v`` the moments (None before the first step).
    """

    default_lr: ClassVar[float] = 0.0
    default_momentum: ClassVar[float] = 0.0
    rule: ClassVar[str] = ""
    """FedAdam's and FedYogi's second-moment rule ("adam", "yogi") for :meth:`step`; "" for the others."""
    sized_cap: ClassVar[bool] = False
    """True when, with ``lr`` left out, :meth:`eta_max` follows the number of clients (FedExP)."""
    settings_type = ServerOptSettings
    settings_table = "server_opt"
    settings: ServerOptSettings

    def __init__(self, settings: ServerOptSettings | None = None):
        super().__init__(settings)
        s = self.settings
        self.eta = float(self.default_lr if s.lr is None else s.lr)
        self.beta = float(self.default_momentum if s.momentum is None else s.momentum)
        self.beta2, self.tau, self.eps = float(s.beta2), float(s.tau), float(s.eps)
        self.last_eta: float | None = None
        self.step_scale = 1.0
        self.m: State | None = None
        self.v: State | None = None

    def aggregate_fit(
        self, round_: int, fed: Federation, results: Sequence[ClientUpdate], failures: Sequence[Failure] = ()
    ) -> Aggregate:
        """x_{t+1} from x_t = ``fed.global_state`` and the n_i-weighted mean of the results (one optimiser step).

        Moments of units FedDist added since the last step start at m 0, v tau^2. Raises ValueError if no
        result carries training windows, the tensors do not match, or the step is not finite (moments kept).
        """
        avg = fedavg_of(results)
        x_t = fed.global_state
        delta = pseudo_gradient(x_t, avg.global_state)
        if self.m is not None:
            self.m = {k: fit_to_shape(self.m[k], x_t[k].shape, 0.0) for k in x_t}
        if self.v is not None:
            self.v = {k: fit_to_shape(self.v[k], x_t[k].shape, self.tau * self.tau) for k in x_t}
        eta_t, x_new, m_new, v_new = self.step(round_, x_t, delta, results)
        bad = [k for k, t in x_new.items() if not bool(torch.isfinite(t).all())]
        if bad:  # a diverged step must not reach the clients; the round closes with the model unchanged
            raise ValueError(
                f"{self.name}: the server step gave non-finite values in {bad[:3]}; lower the client lr or the "
                f"server lr/momentum (eta={eta_t}, beta={self.beta})"
            )
        self.last_eta = eta_t
        self.m, self.v = m_new, v_new if v_new is not None else self.v
        return Aggregate(x_new, {}, None, avg.participants)

    def step(self, round_: int, x_t: State, delta: State, results: Sequence[ClientUpdate]) -> tuple[float, State, State, State | None]:
        """One optimiser step from x_t on the pseudo-gradient ``delta``: (eta_t, x_{t+1}, m_{t+1}, v_{t+1} or None).

        Reads ``m``, ``v`` and ``step_scale``; here Reddi et al.'s adaptive step with second-moment :attr:`rule`.
        """
        if not self.rule:
            raise NotImplementedError(f"{type(self).__name__} does not implement step")
        eta_t = self.eta * self.step_scale
        x_new, m_new, v_new = adaptive_step(x_t, delta, self.m, self.v, eta_t, self.rule, self.beta, self.beta2, self.tau)
        return eta_t, x_new, m_new, v_new

    def shrink_step(self, factor: float) -> bool:
        """Multiply every later step by ``factor`` in (0, 1] (``step_scale``) and reset the moments; ValueError otherwise."""
        super().shrink_step(factor)
        self.step_scale *= factor
        self.m = self.v = None
        return True

    def grow_step(self, factor: float) -> bool:
        """Multiply ``step_scale`` by ``factor`` >= 1, at most back to 1, keeping the moments; False when it is 1 already."""
        super().grow_step(factor)
        if self.step_scale >= 1.0:
            return False
        self.step_scale = min(1.0, self.step_scale * factor)
        return True

    def eta_max(self, n_clients: int) -> float:
        """FedExP's cap on eta_t in a round of ``n_clients`` contributors: the setting ``eta`` here (a subclass may size it)."""
        return self.eta

    def aggregate_intermediate(self, fed: Federation, first: Aggregate, results: Sequence[ClientUpdate]) -> Aggregate:
        """FedDist intermediate exchanges are plain averages: one optimiser step per round."""
        return fedavg_of(results)

    def state_dict(self) -> State:
        """The moments to persist (``m.<tensor>``, ``v.<tensor>``); empty before the first step."""
        out: State = {}
        for prefix, buf in (("m.", self.m), ("v.", self.v)):
            out.update({prefix + k: t.clone() for k, t in (buf or {}).items()})
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor], spec: ArchSpec | None = None) -> None:
        """Take back what :meth:`state_dict` gave (after a restart); moments may be smaller than ``spec`` (FedDist grew it).

        Raises ValueError if a key is neither ``m.*`` nor ``v.*``, a moment does not fit ``spec`` or holds NaN/inf (moments kept).
        """
        bad = [k for k in state if not k.startswith(("m.", "v."))]
        if bad:
            raise ValueError(f"{self.name}: unexpected state keys {bad[:3]} (expected m.<tensor>, v.<tensor>)")
        shapes = spec.shapes() if spec is not None else None
        for k, t in state.items():
            name = k[2:]
            if shapes is not None:
                if name not in shapes:
                    raise ValueError(f"{self.name}: {k!r} is not a moment of a model tensor (m.<name> or v.<name>)")
                if t.dim() != len(shapes[name]) or any(a > b for a, b in zip(t.shape, shapes[name], strict=True)):
                    raise ValueError(f"{self.name}: {k} has shape {tuple(t.shape)}, the model's {name} is {tuple(shapes[name])}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{self.name}: {k} holds NaN or inf")
        m = {k[2:]: t.clone() for k, t in state.items() if k.startswith("m.")}
        v = {k[2:]: t.clone() for k, t in state.items() if k.startswith("v.")}
        self.m, self.v = m or None, v or None
