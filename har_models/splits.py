"""The per-client train/test split, defined once.

Every client keeps 80 % of its windows for training and 20 % for its local test, per
class, drawn with a fixed seed (FedDist protocol: Ek et al., PerCom 2021, section V-A; the
authors' notebooks use a stratified 5-fold split with ``random_state=1`` and take one fold
as the test part). The edge client's store splits the windows it ingests with a
:class:`SplitSpec`, and the coordinator's evaluation harness rebuilds every client's test
windows with the same :class:`SplitSpec`, so the two sides agree on which windows are test
windows exactly when they use the same spec (the same seed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from har_models.windowing import WindowSet, stratified_split

DEFAULT_TEST_FRACTION = 0.2
"""Share of each class's windows in the local test part (FedDist: 1 of 5 folds)."""

DEFAULT_SPLIT_SEED = 1
"""Seed of the split (FedDist's notebooks: ``randomSeed = 1``)."""


@dataclass(frozen=True)
class SplitSpec:
    """How one client's windows are split into train and test.

    Per class c (in increasing order) the indices of its n_c windows are permuted by a
    ``numpy.random.default_rng(seed)`` generator shared across classes, and the first
    ``round(test_fraction * n_c)`` go to test (:func:`~har_models.windowing.stratified_split`).
    Windows overlap by 50 %, so test samples also occur in training windows (the FedDist
    paper's split does the same; kept for comparability).

    Parameters
    ----------
    test_fraction : float in [0, 1)
        Test share per class (0.2).
    seed : int >= 0
        Generator seed (1).

    Raises
    ------
    ValueError
        If ``test_fraction`` is outside [0, 1) or ``seed`` is negative or not an integer.
    """

    test_fraction: float = DEFAULT_TEST_FRACTION
    seed: int = DEFAULT_SPLIT_SEED

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.test_fraction) < 1.0:
            raise ValueError(f"SplitSpec: test_fraction must be in [0, 1), got {self.test_fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer) or self.seed < 0:
            raise ValueError(f"SplitSpec: seed must be an integer >= 0, got {self.seed!r} (use --split-seed N)")
        object.__setattr__(self, "test_fraction", float(self.test_fraction))
        object.__setattr__(self, "seed", int(self.seed))

    def indices(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(train_idx, test_idx)`` for labels ``y`` of shape (N,): int64, sorted, disjoint, together 0..N-1."""
        return stratified_split(y, self.test_fraction, self.seed)

    def apply(self, data: WindowSet) -> tuple[WindowSet, WindowSet]:
        """``(train, test)`` windows of ``data``, each in the original order."""
        train_idx, test_idx = self.indices(data.y)
        return data.subset(train_idx), data.subset(test_idx)

    def tag(self) -> str:
        """Short text naming the split, appended to a store's source key (``"|seed=1"``; the fraction only when not 0.2)."""
        if self.test_fraction == DEFAULT_TEST_FRACTION:
            return f"|seed={self.seed}"
        return f"|seed={self.seed}|test={self.test_fraction!r}"

    def to_json(self) -> dict[str, object]:
        """Plain-JSON form (for stores and status messages)."""
        return {"kind": "stratified", "test_fraction": self.test_fraction, "seed": self.seed}
