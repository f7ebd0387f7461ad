"""FedALA's Adaptive Local Aggregation: the client's starting model for a round.

Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023 (arXiv 2212.01197), section "Adaptive Local Aggregation
(ALA)" and Algorithm 1 (lines 6-16); reference/algorithms.md section 1 and 5.2 steps 2-3.

Before local training, client i blends the received model theta (the global model, or its
FedDWA-personalised model) with its previous local model theta_i. The lower tensors take the
received values; the top p tensors are blended element-wise with learned weights
W_i^p in [0, 1] (same shapes as the tensors):

    thetahat_i = theta_i + (theta - theta_i) ⊙ [1^{|theta_i| - p} ; W_i^p]                   (paper, ALA)
    W_i^p <- clip(W_i^p - eta * grad_{thetahat^p} L(thetahat_i, D_i^s) ⊙ (theta^p - theta_i^p), 0, 1)

(the gradient with respect to W by the chain rule; the paper's Eq. (6), derived in arXiv v4).
L is the client's own training loss on an s% sample D_i^s of its training windows. In the
first ALA round (``start_phase``) W is learned for passes until the std of the last M pass
losses is below tau; afterwards one pass per round. W persists across rounds.

Deliberate deviations from the reference code (algorithms.md 1.5, [PROPOSAL]):

* D_i^s is a uniformly random subset without replacement, redrawn every round from ``seed``,
  and batches are reshuffled every pass. The reference takes a contiguous slice without
  shuffling, a biased sample when windows are stored in recording (activity) order, as HAR
  windows are.
* The number of passes is capped (``max_passes``); the reference can loop forever when the
  loss never settles.
* First participation is an explicit flag (:attr:`AlaState.has_local_model`), not the
  "sum of the first tensor's difference is 0" heuristic, which breaks on grown shapes.
* The temporary model's train/eval mode is explicit (default train: dropout active, as on
  the reference's usual path).
* A received model wider than the local one (FedDist growth) is handled by padding the local
  model and W first (:func:`har_models.nn.growth.pad_state_like`): new slots take the received
  values and W = 1 there, so (theta - theta_i) is exactly 0 in the new slots.

Not a deviation, only an order of computation: when only the output layer is blended (the
default p = 2), the lower layers' output on the sample is computed once per round instead of
once per pass (:func:`_head_on_cached_features`); the first ALA round's passes then cost a
fraction of a forward pass each.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from har_models.nn.growth import pad_state_like
from har_models.nn.model import HarCNN, State
from har_models.settings import AlaConfig

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ModelBuilder = Callable[[Mapping[str, torch.Tensor]], nn.Module]


@dataclass(frozen=True)
class AlaState:
    """What a client keeps between rounds for ALA (store it with the local model).

    Attributes
    ----------
    weights : dict name -> float32 Tensor, or None
        W_i^p, one tensor per blended ("higher") parameter tensor, same shapes, values in
        [0, 1]; None before the first participation.
    start_phase : bool
        True until the first ALA round that learned W (which runs to convergence or the cap).
    has_local_model : bool
        False until the client has a local model; the first participation just takes the
        received model.
    """

    weights: dict[str, torch.Tensor] | None = None
    start_phase: bool = True
    has_local_model: bool = False

    def to_parts(self) -> tuple[dict[str, torch.Tensor], dict[str, bool]]:
        """Split into tensors (W, e.g. for safetensors; empty if None) and JSON-able flags."""
        tensors = {} if self.weights is None else {k: v.detach().float().clone() for k, v in self.weights.items()}
        return tensors, {"start_phase": bool(self.start_phase), "has_local_model": bool(self.has_local_model)}

    @classmethod
    def from_parts(cls, tensors: Mapping[str, torch.Tensor], flags: Mapping[str, object]) -> AlaState:
        """Rebuild from :meth:`to_parts` output (empty ``tensors`` -> ``weights=None``).

        Raises
        ------
        ValueError
            If a flag is missing or not a bool, or a weight is outside [0, 1] or not finite.
        """
        for key in ("start_phase", "has_local_model"):
            if not isinstance(flags.get(key), bool):
                raise ValueError(f"AlaState.from_parts: flag {key!r} must be a bool, got {flags.get(key)!r}")
        weights = None
        if tensors:
            weights = {k: torch.as_tensor(v, dtype=torch.float32).clone() for k, v in tensors.items()}
            for k, w in weights.items():
                if not torch.isfinite(w).all() or (w < 0).any() or (w > 1).any():
                    raise ValueError(f"AlaState.from_parts: W[{k!r}] must be finite and in [0, 1]; the stored state is corrupt")
        return cls(weights, bool(flags["start_phase"]), bool(flags["has_local_model"]))


@dataclass(frozen=True)
class AlaResult:
    """Output of :func:`adaptive_local_aggregation`.

    Attributes
    ----------
    state : dict name -> float32 Tensor
        thetahat_i, the initialised local model to train from (shapes of the received model).
    ala : AlaState
        The state to store for the next round.
    higher : tuple of str
        The blended tensors (the top p), in registration order.
    passes : int
        Passes over the sample used to learn W (0 when W was not learned).
    losses : tuple of float
        Loss of the last mini-batch of each pass.
    n_sample : int
        Windows in the s% sample.
    converged : bool
        Whether the first-round stop test passed (False after the cap, and outside the start phase).
    fallback : str or None
        Why the received model was returned unchanged ("first participation", "empty sample",
        "non-finite loss"), or None.
    """

    state: State
    ala: AlaState
    higher: tuple[str, ...]
    passes: int = 0
    losses: tuple[float, ...] = field(default=())
    n_sample: int = 0
    converged: bool = False
    fallback: str | None = None


def higher_tensors(names: list[str] | tuple[str, ...], layer_idx: int) -> tuple[str, ...]:
    """The top-p tensor names: the last ``layer_idx`` of ``names`` (all of them if ``layer_idx`` is 0).

    Parameters
    ----------
    names : sequence of str
        Parameter names in registration order (``model.named_parameters()``).
    layer_idx : int
        p in tensors (see :class:`AlaConfig`).

    Raises
    ------
    ValueError
        If ``layer_idx`` exceeds the number of tensors.
    """
    if layer_idx > len(names):
        raise ValueError(f"higher_tensors: layer_idx={layer_idx} exceeds the model's {len(names)} parameter tensors")
    return tuple(names[len(names) - layer_idx :]) if layer_idx > 0 else tuple(names)


def blend(
    local: Mapping[str, torch.Tensor], received: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]
) -> State:
    """thetahat = theta_i + (theta - theta_i) ⊙ W on the tensors of ``weights``; theta elsewhere.

    Parameters
    ----------
    local, received : mappings name -> Tensor with the same names and shapes
        theta_i and theta.
    weights : mapping name -> Tensor
        W_i^p for the higher tensors (same shapes); other tensors take the received values.

    Returns
    -------
    dict name -> float32 Tensor (new tensors).
    """
    out: State = {}
    for name, theta in received.items():
        if name in weights:
            # lerp is exact at both ends: W = 1 gives theta bit for bit, W = 0 gives theta_i.
            out[name] = torch.lerp(local[name].detach().float(), theta.detach().float(), weights[name].float())
        else:
            out[name] = theta.detach().float().clone()
    return out


def adaptive_local_aggregation(
    received: Mapping[str, torch.Tensor],
    local: Mapping[str, torch.Tensor] | None,
    ala: AlaState,
    x: torch.Tensor | np.ndarray,
    y: torch.Tensor | np.ndarray,
    *,
    build: ModelBuilder,
    loss_fn: LossFn,
    batch_size: int,
    seed: int,
    config: AlaConfig | None = None,
    context: str = "",
) -> AlaResult:
    """Initialise the local model of a round by FedALA's Adaptive Local Aggregation.

    Zhang et al., AAAI 2023, Algorithm 1 lines 6-16 (algorithms.md 1.3, with the deviations in
    the module docstring). Steps:

    1. First participation (``not ala.has_local_model``): return the received model; W = 1.
    2. If the received model is wider (FedDist growth), pad theta_i with received values and W
       with 1.0. W tensors that do not match the higher tensors (``layer_idx`` changed) are
       reset to 1 (logged).
    3. Lower tensors <- theta. Draw the s% sample (floor(s/100 * N) windows); if it is empty,
       return the received model (logged).
    4. Learn W with batches of ``batch_size`` (last partial batch kept): per batch,
       W <- clip(W - eta * grad_thetahat L ⊙ (theta - theta_i), 0, 1); one pass per round, or
       in the start phase until std(last M pass losses) < tau or ``max_passes``.
    5. Return thetahat_i = theta_i + (theta - theta_i) ⊙ W on the higher tensors.

    Randomness (sample, batch order, dropout) comes only from ``seed``; the global torch RNG
    state is left as it was. Runs on CPU in float32, with gradients enabled internally.

    Parameters
    ----------
    received : mapping name -> Tensor
        theta, the model received this round (global or personalised).
    local : mapping name -> Tensor, or None
        theta_i, the client's previous local model (None only on first participation); may be
        narrower than ``received`` after a growth, never wider.
    ala : AlaState
        The stored ALA state (``AlaState()`` for a new client).
    x : Tensor or ndarray of shape ``(N, 6, T)`` (or the model's input layout), float32
        The client's training windows (raw units; the model normalises).
    y : Tensor or ndarray of shape ``(N,)``, int64
        Their class indices.
    build : callable state -> nn.Module
        Builds the model for a state, e.g. ``functools.partial(har_models.nn.model.build_model, spec)``.
        Its ``named_parameters()`` order defines the top p.
    loss_fn : callable (logits ``(B, C)``, y ``(B,)``) -> scalar Tensor
        The local training loss (the trainer's class-weighted cross-entropy).
    batch_size : int
        B, the local training batch size (also used here, as in the reference).
    seed : int
        Seed of this round's sample and shuffling; vary it per round (e.g. from client and
        round) so D_i^s is redrawn every round.
    config : AlaConfig, optional
        eta, s, p, tau, M, pass cap, mode (defaults of :class:`AlaConfig`).
    context : str
        Prefix for log lines, e.g. ``"client pi-3 round 7"``.

    Returns
    -------
    AlaResult

    Raises
    ------
    ValueError
        If ``received`` and ``local`` have different tensor names, ``local`` is wider than
        ``received``, ``local`` is None while ``ala.has_local_model``, the model's parameters
        do not match ``received``, x/y lengths differ, or ``batch_size`` < 1.
    """
    cfg = config or AlaConfig()
    tag = f"ALA {context}: " if context else "ALA: "
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"adaptive_local_aggregation: batch_size must be an integer >= 1 (the local batch), got {batch_size}")
    xs = torch.as_tensor(x, dtype=torch.float32)
    ys = torch.as_tensor(y, dtype=torch.long)
    if xs.shape[0] != ys.shape[0] or ys.dim() != 1:
        raise ValueError(
            f"adaptive_local_aggregation: x has {xs.shape[0]} windows but y is {tuple(ys.shape)}, expected ({xs.shape[0]},)"
        )

    # Every random draw (model construction, sample, batch order, dropout) is seeded here and
    # the caller's global RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return _ala(received, local, ala, xs, ys, build, loss_fn, int(batch_size), int(seed), cfg, tag)


def _ala(
    received: Mapping[str, torch.Tensor],
    local: Mapping[str, torch.Tensor] | None,
    ala: AlaState,
    xs: torch.Tensor,
    ys: torch.Tensor,
    build: ModelBuilder,
    loss_fn: LossFn,
    batch_size: int,
    seed: int,
    cfg: AlaConfig,
    tag: str,
) -> AlaResult:
    model = build(received)
    names = [n for n, _ in model.named_parameters()]
    if set(names) != set(received):
        raise ValueError(f"adaptive_local_aggregation: the model has tensors {names}, the received state {sorted(received)}")
    higher = higher_tensors(names, int(cfg.layer_idx))
    theta = {n: received[n].detach().float() for n in names}
    ones = {h: torch.ones_like(theta[h]) for h in higher}

    # 1. First participation: the received model as is.
    if not ala.has_local_model:
        log.info("%sfirst participation: starting from the received model, W = 1 on %s", tag, list(higher))
        return AlaResult(blend(theta, theta, {}), AlaState(ones, True, True), higher, fallback="first participation")
    if local is None:
        raise ValueError("adaptive_local_aggregation: ala.has_local_model is True but local is None; pass the stored local model")
    if set(local) != set(received):
        raise ValueError(
            f"adaptive_local_aggregation: local tensors {sorted(local)} differ from received {sorted(received)}; "
            "the number of tensors never changes under growth, so the stored model is of another architecture"
        )

    # 2. Padding for growth: new slots take the received values, W = 1 there.
    if any(tuple(local[n].shape) != tuple(theta[n].shape) for n in names):
        log.info("%sreceived model is wider than the local one; padding local model and W", tag)
    theta_i = pad_state_like({n: local[n].detach().float() for n in names}, theta)
    w = ala.weights
    if w is not None and set(w) != set(higher):
        log.warning("%sstored W covers %s but the higher tensors are %s; resetting W to 1", tag, sorted(w), list(higher))
        w = None
    w = dict(ones) if w is None else pad_state_like(w, theta, fill=1.0)
    w_stored = dict(w)  # entries are replaced, never modified in place, during learning

    # 3. Lower tensors <- theta; the s% sample.
    n_total = int(xs.shape[0])
    n_sample = int(n_total * cfg.rand_percent // 100)  # floor(s/100 * N), exact for whole percentages
    if n_sample == 0:
        log.warning(
            "%s%d training windows give a 0-window sample at s=%g%%; using the received model, W unchanged",
            tag, n_total, cfg.rand_percent,
        )
        return AlaResult(blend(theta, theta, {}), AlaState(w, ala.start_phase, True), higher, fallback="empty sample")
    if cfg.eta == 0:
        log.info("%seta = 0: W cannot change; blending with the stored W", tag)
        return AlaResult(blend(theta_i, theta, w), AlaState(w, ala.start_phase, True), higher, n_sample=n_sample)

    # 4. Learn W on the temporary model (lower tensors already hold theta).
    diff = {h: theta[h] - theta_i[h] for h in higher}
    params = dict(model.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in higher)
    model.train(cfg.mode == "train")
    losses: list[float] = []
    converged = False
    with torch.enable_grad():
        gen = torch.Generator().manual_seed(seed)
        sample = torch.randperm(n_total, generator=gen)[:n_sample]
        _write(params, theta_i, theta, w)
        head = _head_on_cached_features(model, higher, xs, sample, batch_size)
        while True:
            order = sample[torch.randperm(n_sample, generator=gen)]
            loss = torch.zeros(())
            for lo in range(0, n_sample, batch_size):
                idx = order[lo : lo + batch_size]
                for h in higher:
                    params[h].grad = None
                logits = head(idx) if head is not None else model(xs[idx])
                loss = loss_fn(logits, ys[idx])
                loss.backward()
                with torch.no_grad():
                    for h in higher:
                        g = params[h].grad
                        if g is not None:
                            w[h] = torch.clamp(w[h] - cfg.eta * g * diff[h], 0.0, 1.0)
                    _write(params, theta_i, theta, w)
            losses.append(float(loss.detach()))
            if not math.isfinite(losses[-1]):
                log.warning("%snon-finite loss in pass %d; using the received model, W unchanged", tag, len(losses))
                return AlaResult(
                    blend(theta, theta, {}), AlaState(w_stored, ala.start_phase, True), higher,
                    len(losses), tuple(losses), n_sample, False, "non-finite loss",
                )
            if not ala.start_phase:
                break
            if len(losses) > cfg.num_pre_loss and float(np.std(losses[-cfg.num_pre_loss :])) < cfg.threshold:
                converged = True
                break
            if len(losses) >= cfg.max_passes:
                log.warning(
                    "%sfirst ALA round stopped at the pass cap (%d passes; std of the last %d losses %.4g >= tau=%g)",
                    tag, len(losses), cfg.num_pre_loss, float(np.std(losses[-cfg.num_pre_loss :])), cfg.threshold,
                )
                break
    log.info(
        "%s%d pass(es) on %d of %d windows, last loss %.4f, mean W %s%s",
        tag, len(losses), n_sample, n_total, losses[-1],
        {h: round(float(w[h].mean()), 4) for h in higher}, " (converged)" if converged else "",
    )
    # 5. thetahat_i.
    return AlaResult(blend(theta_i, theta, w), AlaState(w, False, True), higher, len(losses), tuple(losses), n_sample, converged)


def _head_on_cached_features(
    model: nn.Module, higher: tuple[str, ...], xs: torch.Tensor, sample: torch.Tensor, batch_size: int
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """Window indices ``(b,)`` -> logits ``(b, C)`` from features computed once, or None where that does not apply.

    When only tensors of the model's head are blended (:attr:`HarCNN.HEAD_PARAMS`, the
    default p = 2), the layers below hold theta for the whole of W's learning, so their output
    on the sample never changes: it is computed once here (without gradients, in batches of
    ``batch_size``) and every pass runs only the head (dropout + output layer). The head draws
    the same dropout masks in the same order as the whole model would, so W, the losses and
    thetahat equal those of running the whole model each batch (to float rounding of the
    features, which are the same sums in another batch composition). Costs n_sample x H
    floats of memory; saves (passes - 1) forward passes of the lower layers in the first ALA
    round and the autograd bookkeeping of the one pass in later rounds.
    """
    if not isinstance(model, HarCNN) or not set(higher) <= set(HarCNN.HEAD_PARAMS):
        return None
    with torch.no_grad():
        feats = torch.cat([model.features(xs[sample[lo : lo + batch_size]]) for lo in range(0, int(sample.shape[0]), batch_size)])
    row = torch.full((int(xs.shape[0]),), -1, dtype=torch.long)
    row[sample] = torch.arange(int(sample.shape[0]))
    return lambda idx: model.head(feats[row[idx]])


def _write(params: dict[str, nn.Parameter], base: State, theta: State, w: State) -> None:
    """Load theta_i + (theta - theta_i) ⊙ W into the temporary model's higher tensors."""
    with torch.no_grad():
        for h, wh in w.items():
            params[h].copy_(torch.lerp(base[h], theta[h], wh))
