"""Classification metrics from confusion matrices.

Everything is computed from a confusion matrix so that metrics of a union of test sets
are exact: the union's matrix is the sum of the parts' matrices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """Counts ``cm[t, p]`` of windows of true class t predicted as p.

    Parameters
    ----------
    y_true, y_pred : arrays of shape (N,), int in [0, n_classes)
    n_classes : int

    Returns
    -------
    ndarray of shape (n_classes, n_classes), int64

    Raises
    ------
    ValueError
        If the shapes differ or a label is out of range.
    """
    t = np.asarray(y_true, dtype=np.int64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"confusion_matrix: y_true {t.shape} and y_pred {p.shape} differ")
    if t.size and (min(t.min(), p.min()) < 0 or max(t.max(), p.max()) >= n_classes):
        raise ValueError(f"confusion_matrix: labels must lie in [0, {n_classes})")
    return np.bincount(t * n_classes + p, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def _check(cm: np.ndarray) -> np.ndarray:
    m = np.asarray(cm, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"expected a square confusion matrix, got shape {m.shape}")
    if (m < 0).any():
        raise ValueError("confusion matrix counts must be >= 0")
    return m


def accuracy(cm: np.ndarray) -> float:
    """Fraction of correct predictions, trace / total (NaN for an empty matrix)."""
    m = _check(cm)
    total = m.sum()
    return float(np.trace(m) / total) if total > 0 else float("nan")


def per_class_f1(cm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F1 of each class and a mask of the classes that occur (as truth or prediction).

    F1_c = 2 TP / (2 TP + FP + FN); a class that occurs neither in the truth nor in the
    predictions is excluded (mask False), as scikit-learn does when ``labels`` is not given.

    Returns
    -------
    f1 : ndarray of shape (C,)
    present : ndarray of shape (C,), bool
    """
    m = _check(cm)
    tp = np.diag(m)
    fp = m.sum(axis=0) - tp
    fn = m.sum(axis=1) - tp
    denom = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return f1, denom > 0


def macro_f1(cm: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes present (NaN if none)."""
    f1, present = per_class_f1(cm)
    return float(f1[present].mean()) if present.any() else float("nan")


def weighted_f1(cm: np.ndarray) -> float:
    """Per-class F1 weighted by true-class support (scikit-learn ``average='weighted'``)."""
    f1, _ = per_class_f1(cm)
    support = _check(cm).sum(axis=1)
    return float((f1 * support).sum() / support.sum()) if support.sum() > 0 else float("nan")


def summarise(cm: np.ndarray) -> dict[str, float]:
    """``{"accuracy", "macro_f1", "weighted_f1", "n"}`` of one confusion matrix."""
    m = _check(cm)
    return {"accuracy": accuracy(m), "macro_f1": macro_f1(m), "weighted_f1": weighted_f1(m), "n": int(m.sum())}


def mean_over_clients(cms: Sequence[np.ndarray]) -> dict[str, float]:
    """Unweighted mean over clients of each client's accuracy and F1 (FedDist protocol).

    Clients with an empty matrix are left out. Also gives the sample-weighted accuracy
    (``accuracy_weighted``), since the two differ when clients hold different amounts of
    test data.

    Returns
    -------
    dict with ``accuracy``, ``macro_f1``, ``weighted_f1``, ``accuracy_weighted``, ``clients``
    """
    rows = [summarise(c) for c in cms if np.asarray(c).sum() > 0]
    if not rows:
        return {
            "accuracy": float("nan"),
            "macro_f1": float("nan"),
            "weighted_f1": float("nan"),
            "accuracy_weighted": float("nan"),
            "clients": 0,
        }
    total = np.sum([np.asarray(c, dtype=np.float64) for c in cms], axis=0)
    return {
        "accuracy": float(np.mean([r["accuracy"] for r in rows])),
        "macro_f1": float(np.mean([r["macro_f1"] for r in rows])),
        "weighted_f1": float(np.mean([r["weighted_f1"] for r in rows])),
        "accuracy_weighted": accuracy(total),
        "clients": len(rows),
    }


def pct(x: float | None, *, missing: str = "n/a", sign: str = "%") -> str:
    """A fraction in [0, 1] as a percentage with one decimal (``0.9125`` -> ``"91.2%"``); ``missing`` for None or NaN.

    The one formatter of the logs' round line, ``fedhar-compare``'s table and the status page
    (``missing="—"``); ``sign=""`` leaves the percent sign out (a table whose header says %).
    """
    if x is None or (isinstance(x, float) and x != x):  # NaN: a measure without windows
        return missing
    return f"{100 * x:.1f}{sign}"
