"""The per-client train/test split and the federation's partition, defined once.

Splits (``SplitSpec.kind``):

* ``"paper"``: 80/20 per class with a fixed seed (FedDist protocol: Ek et al., PerCom 2021,
  section V-A). Windows overlap by 50 %, so the split leaks.
* ``"blocks"``: leak-free contiguous test blocks per segment, with a gap (:func:`block_split`).

Partitions (``SplitSpec.partition``):

* ``"subject"``: each client keeps all its windows.
* ``"label_skew"``: each client keeps 2 or 3 of its classes (pathological label skew of FedALA,
  Zhang et al., AAAI 2023, section 5, and FedDWA, Liu et al., IJCAI 2023, section 5.1).
* ``"label_skew2"``: exactly 2 classes per client.

The edge client's store and the coordinator's evaluation both call :meth:`SplitSpec.assign`
with the same spec, so they agree on every window.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from har_models.data.windowing import WINDOW, WindowSet, stratified_split

DEFAULT_TEST_FRACTION = 0.2
"""Share of each class's windows in the local test part (FedDist: 1 of 5 folds)."""

DEFAULT_SPLIT_SEED = 1
"""Seed of the split (FedDist's notebooks: ``randomSeed = 1``)."""

DEFAULT_SPLIT = "blocks"
"""The ``--split`` every program uses unless told otherwise: leak-free (no test sample in any training window)."""

SPLITS = ("paper", "blocks")
"""Train/test splits: the FedDist paper's random (leaky) one and the leak-free blocks."""

PARTITIONS = ("subject", "label_skew", "label_skew2")
"""Federation partitions: by subject (all classes), label-skewed (2-3 classes per client) or 2 classes per client."""

SKEWED_CLASSES = {"label_skew": None, "label_skew2": 2}
"""Label-skewed partitions -> the number of classes each client keeps (None: 2 or 3, drawn per client)."""

PERIOD_NS = 20_000_000
"""Grid period of every fedhar window (50 Hz), ns."""

WINDOW_NS = WINDOW * PERIOD_NS
"""Time one window covers (128 samples at 50 Hz = 2.56 s), ns."""


def window_segments(y: np.ndarray, t_start_ns: np.ndarray, window_ns: int = WINDOW_NS) -> np.ndarray:
    """Segment number (N,) int64, non-decreasing, of each window: runs of consecutive overlapping windows of one class.

    Windows ``i`` and ``i + 1`` (recording order) share a segment when they have the same label and
    ``0 < t[i+1] - t[i] < window_ns`` (one stretch of one activity in one session).
    """
    y = np.asarray(y, np.int64)
    t = np.asarray(t_start_ns, np.int64)
    if y.shape != t.shape or y.ndim != 1:
        raise ValueError(f"window_segments: y {y.shape} and t_start_ns {t.shape} must be equal 1-d shapes")
    if y.size == 0:
        return np.empty(0, np.int64)
    dt = np.diff(t)
    joined = (np.diff(y) == 0) & (dt > 0) & (dt < window_ns)
    return np.concatenate([[0], np.cumsum(~joined)]).astype(np.int64)


def block_split(
    y: np.ndarray, t_start_ns: np.ndarray, test_fraction: float = DEFAULT_TEST_FRACTION, seed: int = DEFAULT_SPLIT_SEED,
    window_ns: int = WINDOW_NS,
) -> tuple[np.ndarray, np.ndarray]:
    """Leak-free train/test split by contiguous blocks, with a gap.

    For each segment (:func:`window_segments`) of L windows, ``default_rng(seed)`` draws 0 (block
    at the start) or 1 (at the end) and the block takes ``min(round(test_fraction * L), L - 2)``
    windows (none below 1). Windows whose ``[t, t + window_ns)`` meets a test window's are
    dropped; the rest is training. Returns sorted, disjoint ``(train_idx, test_idx)`` int64.
    """
    seg = window_segments(y, t_start_ns, window_ns)
    t = np.asarray(t_start_ns, np.int64)
    rng = np.random.default_rng(seed)
    is_test = np.zeros(seg.size, bool)
    if seg.size:
        bounds = np.flatnonzero(np.diff(seg)) + 1
        for idx in np.split(np.arange(seg.size), bounds):
            at_end = int(rng.integers(2))
            k = min(round(test_fraction * idx.size), idx.size - 2)
            if k >= 1:
                is_test[idx[-k:] if at_end else idx[:k]] = True
    # Gap: any non-test window sharing a raw sample with a test window of its session. Sessions are
    # the maximal runs in which t never decreases, so equal clock values of two sessions never count.
    session = np.concatenate([[0], np.cumsum(np.diff(t) < 0)]) if t.size else np.empty(0, np.int64)
    drop = np.zeros(seg.size, bool)
    for i in np.flatnonzero(is_test):
        near = (session == session[i]) & (np.abs(t - t[i]) < window_ns) & ~is_test
        drop |= near
    train = np.flatnonzero(~is_test & ~drop).astype(np.int64)
    return train, np.flatnonzero(is_test).astype(np.int64)


def skewed_classes(present: np.ndarray, subject: str, seed: int, n_keep: int | None = None) -> np.ndarray:
    """The classes (sorted int64) a client keeps under a label-skewed partition.

    ``default_rng([seed, crc32(subject)])`` draws the number kept (``2 + integers(2)``), then that
    many ``present`` classes without replacement. With ``n_keep`` the number is still drawn but
    ``n_keep`` kept, so both partitions use one stream. ValueError if ``n_keep`` < 1.
    """
    if n_keep is not None and n_keep < 1:
        raise ValueError(f"skewed_classes: n_keep must be at least 1, got {n_keep}")
    classes = np.unique(np.asarray(present, np.int64))
    rng = np.random.default_rng([int(seed), zlib.crc32(subject.encode())])
    drawn = 2 + int(rng.integers(2))
    n = min(drawn if n_keep is None else n_keep, classes.size)
    return np.sort(rng.choice(classes, size=n, replace=False)).astype(np.int64)


@dataclass(frozen=True)
class SplitSpec:
    """How one client's windows are split into train and test, and which it keeps.

    ``kind`` "paper": :func:`~har_models.data.windowing.stratified_split` (per class, one
    ``default_rng(seed)`` across classes); "blocks": :func:`block_split`. ``partition``
    "label_skew"/"label_skew2" first keeps the windows of :func:`skewed_classes`.

    Raises
    ------
    ValueError
        If ``test_fraction`` is outside [0, 1), ``seed`` is not an integer >= 0, or ``kind``/``partition`` is unknown.
    """

    test_fraction: float = DEFAULT_TEST_FRACTION
    seed: int = DEFAULT_SPLIT_SEED
    kind: str = "paper"
    partition: str = "subject"

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.test_fraction) < 1.0:
            raise ValueError(f"SplitSpec: test_fraction must be in [0, 1), got {self.test_fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer) or self.seed < 0:
            raise ValueError(f"SplitSpec: seed must be an integer >= 0, got {self.seed!r} (use --split-seed N)")
        if self.kind not in SPLITS:
            raise ValueError(f"SplitSpec: kind must be one of {SPLITS}, got {self.kind!r} (use --split paper|blocks)")
        if self.partition not in PARTITIONS:
            raise ValueError(f"SplitSpec: partition must be one of {PARTITIONS}, got {self.partition!r}")
        object.__setattr__(self, "test_fraction", float(self.test_fraction))
        object.__setattr__(self, "seed", int(self.seed))

    @classmethod
    def parse(cls, text: str, seed: int = DEFAULT_SPLIT_SEED) -> SplitSpec:
        """Spec from the ``--split`` text ``KIND[+PARTITION]`` (``paper``, ``blocks+label_skew``, ...); ValueError if unknown."""
        kind, _, partition = text.partition("+")
        return cls(seed=seed, kind=kind, partition=partition or "subject")

    @property
    def text(self) -> str:
        """The ``--split`` text of this spec (inverse of :meth:`parse`)."""
        return self.kind if self.partition == "subject" else f"{self.kind}+{self.partition}"

    @property
    def plain(self) -> bool:
        """True for the FedDist paper's split by subject (decided from labels alone, every window kept)."""
        return self.kind == "paper" and self.partition == "subject"

    def indices(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(train_idx, test_idx)`` for labels ``y`` (N,) under the plain paper split; ValueError for other specs (:meth:`assign`)."""
        if not self.plain:
            raise ValueError(f"SplitSpec.indices: split {self.text!r} needs window times and the subject; use assign()")
        return stratified_split(y, self.test_fraction, self.seed)

    def assign(self, y: np.ndarray, t_start_ns: np.ndarray, subject: str = "") -> tuple[np.ndarray, np.ndarray]:
        """``(train_idx, test_idx)`` (sorted, disjoint int64) of a client's windows in recording order; indices in neither are dropped.

        ``t_start_ns`` (N,) int64 ns; ``subject`` is needed (else ValueError) by the label-skewed partitions.
        """
        y = np.asarray(y, np.int64)
        keep = np.arange(y.size)
        if self.partition in SKEWED_CLASSES:
            if not subject:
                raise ValueError(f"SplitSpec.assign: the {self.partition} partition needs the subject name")
            classes = skewed_classes(y, subject, self.seed, SKEWED_CLASSES[self.partition])
            keep = np.flatnonzero(np.isin(y, classes))
        if self.kind == "paper":
            tr, te = stratified_split(y[keep], self.test_fraction, self.seed)
        else:
            tr, te = block_split(y[keep], np.asarray(t_start_ns, np.int64)[keep], self.test_fraction, self.seed)
        return keep[tr].astype(np.int64), keep[te].astype(np.int64)

    def apply(self, data: WindowSet, subject: str = "") -> tuple[WindowSet, WindowSet]:
        """``(train, test)`` windows of ``data`` (in recording order), each in the original order."""
        assert data.t_start_ns is not None
        train_idx, test_idx = self.assign(data.y, data.t_start_ns, subject)
        return data.subset(train_idx), data.subset(test_idx)

    def tag(self) -> str:
        """Short text naming the split, appended to a store's source key (``"|seed=1"``; the rest only when not the default)."""
        out = f"|seed={self.seed}"
        if self.test_fraction != DEFAULT_TEST_FRACTION:
            out += f"|test={self.test_fraction!r}"
        if not self.plain:
            out += f"|split={self.text}"
        return out

    def to_json(self) -> dict[str, object]:
        """Plain-JSON form (for stores and status messages); the paper split by subject keeps its old form."""
        if self.plain:
            return {"kind": "stratified", "test_fraction": self.test_fraction, "seed": self.seed}
        return {"kind": self.kind, "partition": self.partition, "test_fraction": self.test_fraction, "seed": self.seed}


@dataclass(frozen=True)
class FixedSplit:
    """A split already decided for one exact list of labels ``y`` (M,): what a store needs after windows were dropped.

    The store calls ``indices(y)``; this returns the precomputed, disjoint ``train_idx``/``test_idx``
    (together ``0 .. M-1``) decided by ``spec`` (:meth:`SplitSpec.assign`).
    """

    spec: SplitSpec
    y: np.ndarray
    train_idx: np.ndarray
    test_idx: np.ndarray

    def indices(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The precomputed ``(train_idx, test_idx)``; ValueError if ``y`` is not the labels it was decided for."""
        if not np.array_equal(np.asarray(y), self.y):
            raise ValueError("FixedSplit.indices: labels differ from those the split was decided for")
        return self.train_idx, self.test_idx

    def tag(self) -> str:
        """As :meth:`SplitSpec.tag`."""
        return self.spec.tag()

    def to_json(self) -> dict[str, object]:
        """As :meth:`SplitSpec.to_json`."""
        return self.spec.to_json()


def kept_and_split(data: WindowSet, spec: SplitSpec, subject: str = "") -> tuple[WindowSet, FixedSplit]:
    """The windows a client keeps under ``spec`` (gap and skew-dropped windows removed, original order) and their split into them."""
    assert data.t_start_ns is not None
    tr, te = spec.assign(data.y, data.t_start_ns, subject)
    idx = np.union1d(tr, te).astype(np.int64)
    kept = data.subset(idx)
    pos = np.searchsorted(idx, tr), np.searchsorted(idx, te)
    return kept, FixedSplit(spec, kept.y.copy(), pos[0].astype(np.int64), pos[1].astype(np.int64))

