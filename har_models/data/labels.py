"""Activity label sets: the names behind the int64 class indices of every window."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LabelSet:
    """An ordered set of activity names; class index ``i`` means ``names[i]``.

    Parameters
    ----------
    name : str
        Identifier of the label set (``"hapt6"``, ``"realworld8"``); it travels in
        round announcements so that a client and the coordinator can check they agree.
    names : tuple of str
        Activity names in class-index order. Must be non-empty and unique.

    Raises
    ------
    ValueError
        If ``names`` is empty or holds duplicates.
    """

    name: str
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError(f"LabelSet {self.name!r}: names must not be empty")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"LabelSet {self.name!r}: duplicate names in {self.names}")

    def __len__(self) -> int:
        return len(self.names)

    def index(self, activity: str) -> int:
        """Class index of ``activity``.

        Raises
        ------
        KeyError
            If the activity is not in this label set; the message lists the known names.
        """
        try:
            return self.names.index(activity)
        except ValueError:
            raise KeyError(f"activity {activity!r} is not in label set {self.name!r}; known: {', '.join(self.names)}") from None


HAPT_LABELS = LabelSet(
    "hapt6",
    ("walking", "walking_upstairs", "walking_downstairs", "sitting", "standing", "laying"),
)
"""The 6 basic HAPT activities (HAPT labels 1..6 map to indices 0..5)."""

REALWORLD_LABELS = LabelSet(
    "realworld8",
    ("climbingdown", "climbingup", "jumping", "lying", "running", "sitting", "standing", "walking"),
)
"""The 8 REALWORLD activities in the order of the FedDist preprocessing (Ek et al., PerCom 2021)."""

LABEL_SETS = {ls.name: ls for ls in (HAPT_LABELS, REALWORLD_LABELS)}
"""Known label sets by name."""


def balanced_class_weights(y: np.ndarray, n_classes: int) -> np.ndarray:
    """Class weights w_c = n / (k * n_c) over the k classes present, 0 for absent classes.

    This is scikit-learn's ``class_weight='balanced'``, which the FedDist authors apply
    per client (Ek et al., PerCom 2021; algorithms.md section 3.7).

    Parameters
    ----------
    y : array of shape (N,), int
    n_classes : int

    Returns
    -------
    ndarray of shape (n_classes,), float32
    """
    counts = np.bincount(np.asarray(y, dtype=np.int64), minlength=n_classes).astype(np.float64)
    present = counts > 0
    w = np.zeros(n_classes)
    if present.any():
        w[present] = counts.sum() / (present.sum() * counts[present])
    return w.astype(np.float32)
