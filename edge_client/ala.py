"""FedALA's Adaptive Local Aggregation: the client's starting model for a round, over any training backend.

Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023
(arXiv 2212.01197), Algorithm 1 lines 6-16; reference/algorithms.md sections 1 and 5.2. Client i
blends the received model theta with its previous local model theta_i: lower tensors take theta,
the top p tensors ``thetahat = theta_i + (theta - theta_i) ⊙ W`` with learned W in [0, 1], and
``W <- clip(W - eta * grad_thetahat L ⊙ (theta - theta_i), 0, 1)`` (eq. 6) on an s% sample of the
training windows; passes until std(last M losses) < tau in the first round, then one per round.

:func:`adaptive_local_aggregation` does the bookkeeping once, in numpy; learning W is the
backend's kernel (``learn_ala`` of the torch backend, else the generic :func:`learn_ala_weights`),
both drawing the sample and pass orders alike.

Deliberate deviations from the reference code (algorithms.md 1.5, [PROPOSAL]): the sample is a
uniformly random subset redrawn every round and batches are reshuffled every pass (the reference's
contiguous slice is biased on windows in recording order); passes are capped (``max_passes``);
first participation is an explicit flag, not the "first tensor's difference sums to 0" heuristic;
the temporary model's mode is explicit (default train); a wider received model (FedDist growth)
pads theta_i with received values and W with 1 (:func:`pad_like`). Imports no PyTorch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edge_client.backends.ala_kernel import AlaKernel, AlaLearned, stop_after_pass
from edge_client.backends.base import TorchRandperm, TrainingBackend
from har_models.nn.arch import PARAM_NAMES
from har_models.settings import AlaConfig

__all__ = [
    "AlaConfig",
    "AlaKernel",
    "AlaLearned",
    "AlaResult",
    "AlaState",
    "adaptive_local_aggregation",
    "blend",
    "higher_tensors",
    "learn_ala_weights",
    "lerp",
    "pad_like",
]

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]


def pad_like(local: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray], fill: float | None = None) -> Arrays:
    """Pad each tensor of ``local`` to ``like``'s shape: local values in the leading slice, new slots from ``like`` (or ``fill``).

    For the local model (``fill=None``: ``like - padded`` is 0 in the new slots) and W (``fill=1.0``)
    after a FedDist growth (algorithms.md 5.2 step 2); ``like`` may hold more names. Returns new
    float32 arrays. Raises ValueError (naming the tensor) if one is missing from ``like``, of another
    rank, or wider than the target.
    """
    out: Arrays = {}
    for name, v in local.items():
        if name not in like:
            raise ValueError(f"pad_like: {name!r} of the local state is not in the received model ({sorted(like)})")
        target = np.asarray(like[name])
        va = np.asarray(v, dtype=np.float32)
        if va.ndim != target.ndim or any(a > b for a, b in zip(va.shape, target.shape, strict=True)):
            raise ValueError(f"pad_like: {name!r} of shape {va.shape} is wider than the target {target.shape} or of another rank")
        new = np.array(target, dtype=np.float32, copy=True) if fill is None else np.full(target.shape, fill, np.float32)
        new[tuple(slice(0, s) for s in va.shape)] = va
        out[name] = new
    return out


@dataclass(frozen=True)
class AlaState:
    """What a client keeps between rounds for ALA (stored next to the local model).

    ``weights``: W per blended tensor, values in [0, 1], None before the first participation;
    ``start_phase``: until the first ALA round that learned W; ``has_local_model``: False until the
    client has a local model.
    """

    weights: Arrays | None = None
    start_phase: bool = True
    has_local_model: bool = False

    def to_parts(self) -> tuple[Arrays, dict[str, bool]]:
        """Split into arrays (W, for the store's safetensors; empty if None) and JSON-able flags."""
        tensors = {} if self.weights is None else {k: np.array(v, np.float32, copy=True) for k, v in self.weights.items()}
        return tensors, {"start_phase": bool(self.start_phase), "has_local_model": bool(self.has_local_model)}

    @classmethod
    def from_parts(cls, tensors: Mapping[str, np.ndarray], flags: Mapping[str, object]) -> AlaState:
        """Rebuild from :meth:`to_parts` output; ValueError if a flag is missing or not a bool, or W is outside [0, 1]."""
        for key in ("start_phase", "has_local_model"):
            if not isinstance(flags.get(key), bool):
                raise ValueError(f"AlaState.from_parts: flag {key!r} must be a bool, got {flags.get(key)!r}")
        weights = None
        if tensors:
            weights = {k: np.array(v, np.float32, copy=True) for k, v in tensors.items()}
            for k, w in weights.items():
                if not np.isfinite(w).all() or (w < 0).any() or (w > 1).any():
                    raise ValueError(f"AlaState.from_parts: W[{k!r}] must be finite and in [0, 1]; the stored state is corrupt")
        return cls(weights, bool(flags["start_phase"]), bool(flags["has_local_model"]))


@dataclass(frozen=True)
class AlaResult:
    """Output of :func:`adaptive_local_aggregation`.

    ``state``: thetahat_i to train from; ``ala``: the state to store; ``higher``: the blended tensors;
    ``passes``, ``losses`` (last mini-batch of each pass), ``n_sample``, ``converged`` of W's learning;
    ``fallback``: why the received model was returned unchanged ("first participation", "empty
    sample", "non-finite loss"), or None.
    """

    state: Arrays
    ala: AlaState
    higher: tuple[str, ...]
    passes: int = 0
    losses: tuple[float, ...] = field(default=())
    n_sample: int = 0
    converged: bool = False
    fallback: str | None = None


def higher_tensors(names: Sequence[str], layer_idx: int) -> tuple[str, ...]:
    """The top-p tensor names: the last ``layer_idx`` of ``names`` (all if 0); ValueError if it exceeds their count."""
    if layer_idx > len(names):
        raise ValueError(f"higher_tensors: layer_idx={layer_idx} exceeds the model's {len(names)} parameter tensors")
    return tuple(names[len(names) - layer_idx :]) if layer_idx > 0 else tuple(names)


def lerp(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a + w (b - a)`` as ``torch.lerp`` computes it in float32 (``b - (b - a)(1 - w)`` for ``w >= 0.5``; exact at w = 0 and 1)."""
    a, b, w = (np.asarray(v, np.float32) for v in (a, b, w))
    d = b - a
    return np.where(np.abs(w) < 0.5, a + w * d, b - d * (np.float32(1) - w)).astype(np.float32)


def blend(local: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> Arrays:
    """thetahat = theta_i + (theta - theta_i) ⊙ W on the tensors of ``weights``; theta elsewhere (new float32 arrays)."""
    return {n: lerp(local[n], t, weights[n]) if n in weights else np.array(t, np.float32, copy=True) for n, t in received.items()}


def adaptive_local_aggregation(
    backend: TrainingBackend,
    received: Mapping[str, np.ndarray],
    local: Mapping[str, np.ndarray] | None,
    ala: AlaState,
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    config: AlaConfig | None = None,
    class_weights: np.ndarray | None = None,
    context: str = "",
) -> AlaResult:
    """Initialise the local model of a round by FedALA's Adaptive Local Aggregation (see the module docstring).

    1. First participation: return the received model; W = 1.
    2. A wider received model pads theta_i and W; a W of other tensors (``layer_idx`` changed) is reset to 1.
    3. Lower tensors <- theta; draw the s% sample (empty: return the received model).
    4. Learn W in batches of ``batch_size``: one pass, or in the start phase until the loss settles.
    5. Return thetahat_i.

    Steps 3-5 are the backend's kernel; randomness comes only from ``seed`` (vary it per round).
    ``backend``'s weights may be overwritten; ``local`` may be narrower than ``received``, never
    wider; ``context`` prefixes log lines.

    Raises
    ------
    ValueError
        If ``received`` is not the backend's set of tensors, ``received`` and ``local`` have
        different names, ``local`` is wider than ``received``, ``local`` is None while
        ``ala.has_local_model``, x/y lengths differ, or ``batch_size`` < 1.
    """
    cfg = config or AlaConfig()
    tag = f"ALA {context}: " if context else "ALA: "
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"adaptive_local_aggregation: batch_size must be an integer >= 1 (the local batch), got {batch_size}")
    if np.shape(x)[0] != np.shape(y)[0] or np.ndim(y) != 1:
        raise ValueError(
            f"adaptive_local_aggregation: x has {np.shape(x)[0]} windows but y is {np.shape(y)}, expected ({np.shape(x)[0]},)"
        )
    names = [n for n in PARAM_NAMES if n in backend.spec.shapes()]
    if set(names) != set(received):
        raise ValueError(f"adaptive_local_aggregation: the model has tensors {names}, the received state {sorted(received)}")
    higher = higher_tensors(names, int(cfg.layer_idx))
    theta = {n: np.asarray(received[n], np.float32) for n in names}
    ones = {h: np.ones_like(theta[h]) for h in higher}

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
    if any(np.shape(local[n]) != theta[n].shape for n in names):
        log.info("%sreceived model is wider than the local one; padding local model and W", tag)
        theta_i = pad_like({n: local[n] for n in names}, theta)
    else:  # same shapes: the kernels only read theta_i, so no copy (6.45 M floats for the paper CNN)
        theta_i = {n: np.asarray(local[n], np.float32) for n in names}
    w = ala.weights
    if w is not None and set(w) != set(higher):
        log.warning("%sstored W covers %s but the higher tensors are %s; resetting W to 1", tag, sorted(w), list(higher))
        w = None
    w = dict(ones) if w is None else pad_like(w, theta, fill=1.0)

    # 3-5. The backend's kernel learns W and blends.
    xa, ya = np.asarray(x), np.asarray(y)
    if isinstance(backend, AlaKernel):
        res = backend.learn_ala(theta, theta_i, w, xa, ya, config=cfg, batch_size=int(batch_size), seed=int(seed),
                                start_phase=ala.start_phase, class_weights=class_weights)  # fmt: skip
    else:
        res = learn_ala_weights(backend, theta, theta_i, w, xa, ya, config=cfg, batch_size=int(batch_size), seed=int(seed),
                                start_phase=ala.start_phase, class_weights=class_weights)  # fmt: skip

    n_total = int(np.shape(x)[0])
    if res.fallback == "empty sample":
        log.warning(
            "%s%d training windows give a 0-window sample at s=%g%%; using the received model, W unchanged",
            tag, n_total, cfg.rand_percent,
        )  # fmt: skip
        return AlaResult(res.state, AlaState(w, ala.start_phase, True), higher, fallback="empty sample")
    if cfg.eta == 0:
        log.info("%seta = 0: W cannot change; blending with the stored W", tag)
        return AlaResult(res.state, AlaState(w, ala.start_phase, True), higher, n_sample=res.n_sample)
    passes = len(res.losses)
    if res.fallback == "non-finite loss":
        log.warning("%snon-finite loss in pass %d; using the received model, W unchanged", tag, passes)
        return AlaResult(
            res.state, AlaState(w, ala.start_phase, True), higher, passes, res.losses, res.n_sample, False, "non-finite loss"
        )
    if ala.start_phase and not res.converged and passes >= cfg.max_passes:
        log.warning(
            "%sfirst ALA round stopped at the pass cap (%d passes; std of the last %d losses %.4g >= tau=%g)",
            tag, passes, cfg.num_pre_loss, float(np.std(res.losses[-cfg.num_pre_loss :])), cfg.threshold,
        )  # fmt: skip
    log.info(
        "%s%d pass(es) on %d of %d windows, last loss %.4f, mean W %s%s",
        tag, passes, res.n_sample, n_total, res.losses[-1],
        {h: round(float(res.weights[h].mean()), 4) for h in higher}, " (converged)" if res.converged else "",
    )  # fmt: skip
    return AlaResult(res.state, AlaState(res.weights, False, True), higher, passes, res.losses, res.n_sample, res.converged)


def learn_ala_weights(
    backend: TrainingBackend, received: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray, *, config: AlaConfig, batch_size: int, seed: int,
    start_phase: bool, class_weights: np.ndarray | None = None,
) -> AlaLearned:  # fmt: skip
    """The generic kernel: learn W through ``backend.top_layer_grads`` and return the blended model (ALA steps 3-5).

    For the tensors h of ``weights``, per batch of the sample: ``thetahat_h = lerp(theta_i,h, theta_h, W_h)``
    and ``W_h <- clip(W_h - eta * grad L ⊙ (theta_h - theta_i,h), 0, 1)`` (eq. 6). The sample is
    ``randperm(N)[:n]`` and each pass ``sample[randperm(n)]`` from one :class:`TorchRandperm` seeded
    with ``seed``, the torch kernel's draws; ``seed`` also seeds the dropout stream. ``local`` has
    the received shapes; ``backend``'s weights are overwritten. Raises ValueError if names or shapes
    disagree or ``batch_size`` < 1.
    """
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"learn_ala_weights: batch_size must be an integer >= 1, got {batch_size}")
    higher: Sequence[str] = tuple(weights)
    for n in received:
        if n not in local or np.shape(local[n]) != np.shape(received[n]):
            raise ValueError(f"learn_ala_weights: local {n!r} is missing or not of the received shape {np.shape(received[n])}; pad it")
    for h in higher:
        if h not in received or np.shape(weights[h]) != np.shape(received[h]):
            raise ValueError(f"learn_ala_weights: W[{h!r}] does not match a received tensor's shape")
    theta = {n: np.asarray(v, np.float32) for n, v in received.items()}
    theta_i = {n: np.asarray(v, np.float32) for n, v in local.items()}
    w = {h: np.array(weights[h], np.float32) for h in higher}
    w_stored = {h: v.copy() for h, v in w.items()}

    n_total = int(np.shape(x)[0])
    n_sample = int(n_total * config.rand_percent // 100)  # floor(s/100 * N), exact for whole percentages
    if n_sample == 0:
        return AlaLearned(blend(theta, theta, {}), w_stored, (), 0, False, "empty sample")
    if config.eta == 0:
        return AlaLearned(blend(theta_i, theta, w), w_stored, (), n_sample, False)

    diff = {h: theta[h] - theta_i[h] for h in higher}
    backend.set_weights(theta)
    backend.set_weights({h: lerp(theta_i[h], theta[h], w[h]) for h in higher}, partial=True)
    perm = TorchRandperm(int(seed))
    sample = perm(n_total)[:n_sample]
    losses: list[float] = []
    converged = False
    first = True
    eta32 = np.float32(config.eta)
    dropout = config.mode == "train"
    while True:
        order = sample[perm(n_sample)]
        loss = 0.0
        for lo in range(0, n_sample, batch_size):
            idx = order[lo : lo + batch_size]
            loss, grads = backend.top_layer_grads(
                x[idx], y[idx], higher, class_weights=class_weights, dropout=dropout, dropout_seed=int(seed) if first else None
            )
            first = False
            for h in higher:
                w[h] = np.clip(w[h] - eta32 * grads[h] * diff[h], 0.0, 1.0).astype(np.float32)
            backend.set_weights({h: lerp(theta_i[h], theta[h], w[h]) for h in higher}, partial=True)
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            return AlaLearned(blend(theta, theta, {}), w_stored, tuple(losses), n_sample, False, "non-finite loss")
        stop, converged = stop_after_pass(losses, config, start_phase)
        if stop:
            break
    return AlaLearned(blend(theta_i, theta, w), w, tuple(losses), n_sample, converged)
