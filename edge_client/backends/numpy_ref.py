"""A numpy-only reference of the HAR CNN: forward, backward and SGD, with no PyTorch.

The network of :mod:`har_models.nn.model` (Ek et al., PerCom 2021) layer by layer in float32:
normalise per channel; zero-pad time 'same' (``(k - 1) // 2`` before); convolution as one matrix
product over the im2col matrix ``(B*T, C*k)``, ReLU; max-pool along time (gradient to the first
maximum, as PyTorch); flatten channel-first; dense + ReLU, dropout, dense; loss
``mean_b(w_{y_b} CE_b)`` plus FedProx's ``(mu/2) ||w - w_ref||^2`` (Li et al., MLSys 2020, eq. 2).
SGD without momentum. Dropout masks come from ``numpy.random.default_rng(dropout_seed)``, not
PyTorch's stream. Free of PyTorch (``tests/test_backends.py`` runs it with ``torch`` blocked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from har_models.nn.arch import ArchSpec

from .base import BackendBase, EpochArgs, batch_sizes, check_weights
from .numpy_loss import softmax, weighted_cross_entropy

Params = dict[str, np.ndarray]


def init_weights(spec: ArchSpec, seed: int) -> Params:
    """Glorot-uniform weights and zero biases (the Keras defaults) by name, drawn with numpy (not PyTorch's values)."""
    rng = np.random.default_rng(int(seed))
    out: Params = {}
    for name, shape in spec.shapes().items():
        if name.endswith(".bias"):
            out[name] = np.zeros(shape, np.float32)
        else:
            fan_out, fan_in = shape[0] * int(np.prod(shape[2:])), int(np.prod(shape[1:]))
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            out[name] = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return out


@dataclass
class _Cache:
    """Intermediate values of one forward pass, kept for the backward pass."""

    cols: np.ndarray  # (B*T, C*k) im2col matrix of the padded, normalised input
    relu_conv: np.ndarray  # (B, T', pool, F) ReLU(conv) grouped by pooling window
    pooled_arg: np.ndarray  # (B, T', 1, F) index of the max inside each window
    flat: np.ndarray  # (B, F*T') flattened pooled features
    hidden: np.ndarray  # (B, H) ReLU(dense) before dropout
    dropped: np.ndarray  # (B, H) after dropout
    mask: np.ndarray | None  # (B, H) dropout multipliers, or None


def forward(spec: ArchSpec, w: Mapping[str, np.ndarray], x: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, _Cache]:
    """Logits ``(B, C)`` float32 of raw windows ``x`` ``(B, 6, T)`` and the cache for :func:`backward`; ``mask`` ``(B, H)``."""
    b, c, t = x.shape
    f, k, pool = spec.conv_filters, spec.kernel, spec.pool
    mean = np.asarray(spec.input_mean, np.float32).reshape(1, c, 1)
    std = np.asarray(spec.input_std, np.float32).reshape(1, c, 1)
    xn = (x - mean) / std
    xp = np.pad(xn, ((0, 0), (0, 0), spec.same_padding))
    # (B, C, T, k) view -> (B, T, C, k) -> (B*T, C*k): row (b, t) holds the k samples under the kernel at t.
    cols = np.ascontiguousarray(sliding_window_view(xp, k, axis=2).transpose(0, 2, 1, 3)).reshape(b * t, c * k)
    conv = cols @ w["conv.weight"].reshape(f, c * k).T + w["conv.bias"]  # (B*T, F)
    relu_conv = np.maximum(conv, 0.0).reshape(b, t // pool, pool, f)
    arg = relu_conv.argmax(axis=2)[:, :, None, :]  # first maximum, as PyTorch's max_pool2d
    pooled = np.take_along_axis(relu_conv, arg, axis=2)[:, :, 0, :]  # (B, T', F)
    flat = np.ascontiguousarray(pooled.transpose(0, 2, 1)).reshape(b, f * (t // pool))  # channel-first
    hidden = np.maximum(flat @ w["hidden.weight"].T + w["hidden.bias"], 0.0)
    dropped = hidden * mask if mask is not None else hidden
    logits = dropped @ w["out.weight"].T + w["out.bias"]
    return logits.astype(np.float32, copy=False), _Cache(cols, relu_conv, arg, flat, hidden, dropped, mask)


def backward(spec: ArchSpec, w: Mapping[str, np.ndarray], cache: _Cache, dlogits: np.ndarray, names: Sequence[str] | None = None) -> Params:
    """Float32 gradients by name from ``dlogits`` ``(B, C)`` and a forward ``cache``; ``names`` limits them (stops early)."""
    want = set(spec.shapes()) if names is None else set(names)
    g: Params = {}
    g["out.weight"] = dlogits.T @ cache.dropped
    g["out.bias"] = dlogits.sum(axis=0)
    if want <= {"out.weight", "out.bias"}:
        return {n: g[n] for n in want}
    dh = dlogits @ w["out.weight"]
    if cache.mask is not None:
        dh = dh * cache.mask
    dh = dh * (cache.hidden > 0)
    g["hidden.weight"] = dh.T @ cache.flat
    g["hidden.bias"] = dh.sum(axis=0)
    if want <= {"out.weight", "out.bias", "hidden.weight", "hidden.bias"}:
        return {n: g[n] for n in want}
    b, tp, pool, f = cache.relu_conv.shape
    dflat = (dh @ w["hidden.weight"]).reshape(b, f, tp).transpose(0, 2, 1)  # (B, T', F)
    drelu = np.zeros_like(cache.relu_conv)
    np.put_along_axis(drelu, cache.pooled_arg, dflat[:, :, None, :], axis=2)
    dconv = (drelu * (cache.relu_conv > 0)).reshape(b * tp * pool, f)
    g["conv.weight"] = (dconv.T @ cache.cols).reshape(spec.shapes()["conv.weight"])
    g["conv.bias"] = dconv.sum(axis=0)
    return {n: g[n].astype(np.float32, copy=False) for n in want}


class NumpyBackend(BackendBase):
    """:class:`~edge_client.backends.base.TrainingBackend` in plain numpy; ``eval_batch`` bounds inference memory.

    Default weights: :func:`init_weights` with seed 0. Raises ValueError if ``weights`` do not match ``spec``.
    """

    def __init__(self, spec: ArchSpec, weights: Mapping[str, np.ndarray] | None = None, eval_batch: int = 512):
        self._spec = spec
        self._w = check_weights(spec, init_weights(spec, 0) if weights is None else weights, None, "NumpyBackend")
        self._rng = np.random.default_rng(0)
        self.eval_batch = int(eval_batch)

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Load parameters by name; see :meth:`TrainingBackend.set_weights`."""
        self._w.update(self._weights_in(weights, arch_version, partial))

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the parameters by name (float32)."""
        return {n: v.copy() for n, v in self._w.items()}

    def _epoch(self, xa: np.ndarray, ya: np.ndarray, o: np.ndarray, a: EpochArgs) -> list[float]:
        trained = [n for n in self._spec.shapes() if n not in a.frozen]
        ref = a.refs(trained)
        self._reseed(a.dropout_seed)
        lr32, mu32 = np.float32(a.lr), np.float32(a.prox_mu)
        losses = []
        for idx, mask in self._batches(o, a):
            logits, cache = forward(self._spec, self._w, xa[idx], mask)
            loss, dlogits = weighted_cross_entropy(logits, ya[idx], a.class_weights)
            grads = backward(self._spec, self._w, cache, dlogits, trained)
            if ref:
                loss = a.prox_loss(loss, sum(float(np.sum((self._w[n] - ref[n]) ** 2, dtype=np.float32)) for n in trained))
            for n in trained:
                gn = grads[n] + mu32 * (self._w[n] - ref[n]) if ref else grads[n]
                self._w[n] = self._w[n] - lr32 * gn
            losses.append(loss)
        return losses

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` float32 of windows ``(N, 6, T)`` with dropout off, in chunks of ``eval_batch``."""
        xa, _ = self._windows(x, None)
        out = [forward(self._spec, self._w, xa[s : s + self.eval_batch])[0] for s in range(0, len(xa), self.eval_batch)]
        return np.concatenate(out) if out else np.empty((0, self._spec.n_classes), np.float32)

    def _grads(
        self, xa: np.ndarray, ya: np.ndarray, names: Sequence[str], class_weights: np.ndarray | None,
        dropout: bool, dropout_seed: int | None, dropout_mask: np.ndarray | None,
    ) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
        mask = self._grads_mask(names, list(self._spec.shapes()), len(xa), dropout, dropout_seed, dropout_mask)
        logits, cache = forward(self._spec, self._w, xa, mask)
        loss, dlogits = weighted_cross_entropy(logits, ya, class_weights)
        return loss, backward(self._spec, self._w, cache, dlogits, list(names))


__all__ = ["NumpyBackend", "backward", "batch_sizes", "forward", "init_weights", "softmax", "weighted_cross_entropy"]
