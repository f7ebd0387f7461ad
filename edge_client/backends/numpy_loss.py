"""The loss and the class probabilities of a logits batch in plain numpy: what the numpy backend trains with and
every backend's ``predict`` and ``evaluate`` share (:mod:`edge_client.backends.base`, :mod:`edge_client.backends.numpy_ref`).

Its own module so that the backend interface and the numpy reference both import it and neither imports the other.
"""

from __future__ import annotations

import numpy as np


def weighted_cross_entropy(logits: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None) -> tuple[float, np.ndarray]:
    """``mean_b(w_{y_b} * CE_b)`` and its gradient w.r.t. the logits.

    ``CE_b = logsumexp(z_b) - z_{b, y_b}``; the gradient is ``w_{y_b} (softmax(z_b) - onehot(y_b)) / B``.

    Returns
    -------
    (loss, dlogits (B, C) float32)
    """
    b = logits.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    ce = np.log(s[:, 0]) - z[np.arange(b), y]
    sw = np.ones(b, np.float32) if class_weights is None else np.asarray(class_weights, np.float32)[y]
    loss = float(np.mean(ce * sw, dtype=np.float32))
    d = e / s
    d[np.arange(b), y] -= 1.0
    d *= (sw / np.float32(b))[:, None]
    return loss, d.astype(np.float32, copy=False)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``(B, C)`` logits, float32."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
