"""The per-client train/test split and the federation's partition, defined once.

Two splits of one client's windows into train and test (``SplitSpec.kind``):

* ``"paper"``: every client keeps 80 % of its windows for training and 20 % for its local
  test, per class, drawn with a fixed seed (FedDist protocol: Ek et al., PerCom 2021,
  section V-A; the authors' notebooks use a stratified 5-fold split with
  ``random_state=1`` and take one fold as the test part). Windows overlap by 50 %, so
  most test windows share raw samples with training windows: the split leaks.
* ``"blocks"``: leak-free. Each contiguous segment (one session's stretch of one
  activity) gives a contiguous block of ``round(test_fraction * L)`` windows at its start
  or its end (a seeded coin per segment) to test; every other window of the client that
  shares a raw sample with a test window (the gap: one window at 50 % overlap) is dropped,
  the rest is training. No test sample lies in any training window.

And two partitions of the federation (``SplitSpec.partition``):

* ``"subject"``: each client keeps all its windows (HAPT by subject: every class on every
  client).
* ``"label_skew"``: each client keeps only the windows of 2 or 3 of the classes it has
  (the pathological label skew of FedALA, Zhang et al., AAAI 2023, section 5, and FedDWA,
  Liu et al., IJCAI 2023, section 5.1), drawn per client from the seed and the client's
  subject name; the other windows are dropped from train and test alike.
* ``"label_skew2"``: the same, with exactly 2 classes per client (a stronger skew, the
  2-classes-per-client case of FedALA's pathological setting), drawn by the same generator.

The edge client's store and the coordinator's evaluation harness both go through
:meth:`SplitSpec.assign` with the same spec, the windows in recording order, their start
times and the subject name, so the two sides agree on every window.
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
    """Segment number of each window: runs of consecutive overlapping windows of one class.

    Windows ``i`` and ``i + 1`` (in the given order, recording order) belong to one segment
    when they have the same label and ``0 < t[i+1] - t[i] < window_ns`` (they share raw
    samples). A segment is thus one contiguous stretch of one activity in one session.

    Parameters
    ----------
    y : array of shape (N,), int
    t_start_ns : array of shape (N,), int64
        Grid time of each window's first sample, ns.
    window_ns : int
        Time a window covers, ns (2.56 s).

    Returns
    -------
    ndarray of shape (N,), int64
        0, 0, ..., 1, 1, ...: non-decreasing segment numbers.
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

    For each segment s (:func:`window_segments`, in order) of L_s windows, a generator
    ``numpy.random.default_rng(seed)`` draws one integer in {0, 1} (0: block at the start,
    1: at the end) and the block takes ``k_s = min(round(test_fraction * L_s), L_s - 2)``
    windows (none when that is below 1). Every window not in a block whose sample interval
    ``[t, t + window_ns)`` meets a test window's (same session: the windows between them
    are in time order, no decrease of ``t``) is dropped; the rest is training.

    Parameters
    ----------
    y : array of shape (N,), int
    t_start_ns : array of shape (N,), int64
        Window start times, ns, in recording order (as the pipeline gives them).
    test_fraction : float in [0, 1)
    seed : int >= 0
    window_ns : int
        Time a window covers, ns.

    Returns
    -------
    train_idx, test_idx : int64 arrays, sorted, disjoint; the windows in neither are the gap.
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
    """The classes a client keeps under a label-skewed partition.

    A generator ``numpy.random.default_rng([seed, crc32(subject)])`` draws the number kept,
    ``2 + integers(2)`` (2 or 3), then that many of the ``present`` classes without
    replacement (at most the number present). With ``n_keep`` (partition ``label_skew2``: 2)
    the generator still draws the number first but keeps ``n_keep`` classes, so both
    partitions use one stream and the result depends on the seed and the subject alone.

    Parameters
    ----------
    present : array of int
        Classes the client has windows of.
    subject : str
        The client's subject name (``user01``, ``proband3``): the same on every side.
    seed : int
        Split seed.
    n_keep : int >= 1, optional
        Classes to keep; None draws 2 or 3.

    Returns
    -------
    ndarray of int64, sorted

    Raises
    ------
    ValueError
        If ``n_keep`` is below 1.
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

    ``kind`` "paper": per class c (in increasing order) the indices of its n_c windows are
    permuted by a ``numpy.random.default_rng(seed)`` generator shared across classes, and
    the first ``round(test_fraction * n_c)`` go to test
    (:func:`~har_models.data.windowing.stratified_split`); it leaks (50 % overlap). ``kind``
    "blocks": :func:`block_split`, leak-free. ``partition`` "label_skew" first keeps only
    the windows of :func:`skewed_classes` (2-3 classes), "label_skew2" those of exactly 2
    classes; "subject" keeps all.

    Parameters
    ----------
    test_fraction : float in [0, 1)
        Test share per class (0.2).
    seed : int >= 0
        Generator seed (1).
    kind : {"paper", "blocks"}
    partition : {"subject", "label_skew", "label_skew2"}

    Raises
    ------
    ValueError
        If ``test_fraction`` is outside [0, 1), ``seed`` is negative or not an integer, or
        ``kind``/``partition`` is unknown.
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
        """Spec from ``KIND[+PARTITION]`` (``paper``, ``blocks``, ``blocks+label_skew``, ``blocks+label_skew2``), the ``--split`` text.

        Raises
        ------
        ValueError
            If the text names an unknown split or partition.
        """
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
        """``(train_idx, test_idx)`` for labels ``y`` of shape (N,) under the plain paper split.

        Raises
        ------
        ValueError
            For any other spec, which needs window times and the subject (:meth:`assign`).
        """
        if not self.plain:
            raise ValueError(f"SplitSpec.indices: split {self.text!r} needs window times and the subject; use assign()")
        return stratified_split(y, self.test_fraction, self.seed)

    def assign(self, y: np.ndarray, t_start_ns: np.ndarray, subject: str = "") -> tuple[np.ndarray, np.ndarray]:
        """``(train_idx, test_idx)`` of a client's windows; indices in neither are dropped.

        Parameters
        ----------
        y : array of shape (N,), int
        t_start_ns : array of shape (N,), int64
            Window start times, ns, windows in recording order.
        subject : str
            Subject name, only used by the label-skewed partitions.

        Raises
        ------
        ValueError
            If a label-skewed partition is given no subject name.

        Returns
        -------
        train_idx, test_idx : int64 arrays, sorted, disjoint
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
    """A split already decided for one exact list of labels: what a store needs after windows were dropped.

    A store splits with ``indices(y)``; for specs that need window times and the subject
    (:meth:`SplitSpec.assign`) the caller keeps the assigned windows and hands the store
    this object, which returns the precomputed indices for exactly those labels.

    Parameters
    ----------
    spec : SplitSpec
        The split that decided it (for the store's metadata).
    y : ndarray of shape (M,), int64
        Labels of the kept windows, in the order given to the store.
    train_idx, test_idx : ndarray of int64
        Disjoint, together ``0 .. M-1``.
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
    """The windows a client keeps under ``spec`` (recording order) and their split, for a store.

    Returns
    -------
    kept : WindowSet
        Train and test windows (gap and skew-dropped windows removed), original order.
    split : FixedSplit
        Indices into ``kept``.
    """
    assert data.t_start_ns is not None
    tr, te = spec.assign(data.y, data.t_start_ns, subject)
    idx = np.union1d(tr, te).astype(np.int64)
    kept = data.subset(idx)
    pos = np.searchsorted(idx, tr), np.searchsorted(idx, te)
    return kept, FixedSplit(spec, kept.y.copy(), pos[0].astype(np.int64), pos[1].astype(np.int64))

