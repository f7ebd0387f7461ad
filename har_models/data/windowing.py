"""Labelled windows: the one window format, the streaming windower, splits and statistics.

Window format everywhere in fedhar: float32 ``(N, 6, T)`` ordered acc x, y, z (m/s^2)
then gyro x, y, z (rad/s), ``T = 128`` samples at 50 Hz (2.56 s), step 64; labels int64
class indices of a :class:`~har_models.data.labels.LabelSet`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from har_models.data.labels import LabelSet

N_CHANNELS = 6
WINDOW = 128
STEP = 64
RATE_HZ = 50


@dataclass(frozen=True)
class WindowSet:
    """A set of labelled windows: ``x`` (N, 6, T) float32, ``y`` (N,) int64 into ``labels``, ``t_start_ns`` (N,) int64.

    ``t_start_ns``: each window's first grid time (zeros by default).

    ValueError on mis-shaped arrays or labels outside ``[0, len(labels))``.
    """

    x: np.ndarray
    y: np.ndarray
    labels: LabelSet
    t_start_ns: np.ndarray | None = None

    def __post_init__(self) -> None:
        x = np.ascontiguousarray(self.x, dtype=np.float32)
        y = np.asarray(self.y, dtype=np.int64)
        if x.ndim != 3 or x.shape[1] != N_CHANNELS or x.shape[0] != y.shape[0] or y.ndim != 1:
            raise ValueError(f"WindowSet: expected x (N, {N_CHANNELS}, T) and y (N,), got {x.shape} and {y.shape}")
        if y.size and (y.min() < 0 or y.max() >= len(self.labels)):
            raise ValueError(
                f"WindowSet: labels must lie in [0, {len(self.labels)}) for label set {self.labels.name!r}, "
                f"got range [{y.min()}, {y.max()}]"
            )
        t = np.zeros(y.shape, np.int64) if self.t_start_ns is None else np.asarray(self.t_start_ns, np.int64)
        if t.shape != y.shape:
            raise ValueError(f"WindowSet: t_start_ns {t.shape} must match y {y.shape}")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "t_start_ns", t)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx: np.ndarray) -> WindowSet:
        """Windows at integer or boolean index ``idx``, in that order."""
        assert self.t_start_ns is not None
        return WindowSet(self.x[idx], self.y[idx], self.labels, self.t_start_ns[idx])

    def class_counts(self) -> np.ndarray:
        """Windows per class, shape (C,)."""
        return np.bincount(self.y, minlength=len(self.labels))

    @staticmethod
    def concat(parts: list[WindowSet], labels: LabelSet) -> WindowSet:
        """Concatenate window sets of one label set (an empty list gives an empty set)."""
        for p in parts:
            if p.labels != labels:
                raise ValueError(f"WindowSet.concat: label set {p.labels.name!r} differs from {labels.name!r}")
        if not parts:
            return WindowSet(np.empty((0, N_CHANNELS, WINDOW), np.float32), np.empty(0, np.int64), labels)
        return WindowSet(
            np.concatenate([p.x for p in parts]),
            np.concatenate([p.y for p in parts]),
            labels,
            np.concatenate([p.t_start_ns for p in parts if p.t_start_ns is not None]),
        )


class Windower:
    """Streaming windower: grid samples in, labelled windows out.

    Every ``step`` samples (64) from the start of a contiguous run, the last ``window`` samples
    (128 = 2.56 s) are a window when all carry one non-negative label. A grid jump of more than
    ``period_ns`` (a gap) or :meth:`reset` starts a new run, so no window spans a gap, session or
    label change.
    """

    def __init__(self, window: int = WINDOW, step: int = STEP, period_ns: int = 20_000_000):
        if window <= 0 or step <= 0 or period_ns <= 0:
            raise ValueError(f"Windower: window ({window}), step ({step}) and period_ns ({period_ns}) must be > 0")
        self.window, self.step, self.period_ns = int(window), int(step), int(period_ns)
        self.reset()

    def reset(self) -> None:
        """Start a new contiguous run (new session or after a gap)."""
        self._v = np.empty((0, N_CHANNELS), np.float32)
        self._y = np.empty(0, np.int64)
        self._t = np.empty(0, np.int64)
        self._next = 0  # index in the buffer where the next window starts
        self._last_t: int | None = None  # grid time of the last sample of the run

    def push(self, t_ns: np.ndarray, values: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add grid samples; return the windows completed by them.

        ``t_ns`` (m,) int64 increasing, ``values`` (m, 6), ``labels`` (m,) int64 (-1 unlabelled) ->
        ``(x (k, 6, T) float32, y (k,) int64, t_start_ns (k,) int64)``.
        """
        t = np.asarray(t_ns, dtype=np.int64).reshape(-1)
        v = np.asarray(values, dtype=np.float32)
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
        if v.shape != (t.shape[0], N_CHANNELS) or y.shape != t.shape:
            raise ValueError(f"Windower.push: expected t (m,), values (m, 6), labels (m,); got {t.shape}, {v.shape}, {y.shape}")
        xs, ys, ts = [], [], []
        # Split the input at gaps (and at a gap between the buffer and the input).
        prev = self._last_t
        jumps = np.flatnonzero(np.diff(t) != self.period_ns) + 1
        bounds = [0, *jumps.tolist(), t.size]
        for a, b in itertools.pairwise(bounds):
            if a == b:
                continue
            if prev is not None and t[a] - prev != self.period_ns:
                self.reset()
            out = self._push_run(t[a:b], v[a:b], y[a:b])
            if out is not None:
                xs.append(out[0])
                ys.append(out[1])
                ts.append(out[2])
            prev = int(t[b - 1])
            self._last_t = prev
        if not xs:
            return np.empty((0, N_CHANNELS, self.window), np.float32), np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(ts)

    def _push_run(self, t: np.ndarray, v: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        bv = np.concatenate([self._v, v])
        by = np.concatenate([self._y, y])
        bt = np.concatenate([self._t, t])
        starts = np.arange(self._next, bv.shape[0] - self.window + 1, self.step)
        result = None
        if starts.size:
            yw = np.lib.stride_tricks.sliding_window_view(by, self.window)[starts]
            keep = (yw[:, 0] >= 0) & np.all(yw == yw[:, :1], axis=1)
            s = starts[keep]
            if s.size:
                idx = s[:, None] + np.arange(self.window)[None, :]
                result = (np.ascontiguousarray(bv[idx].transpose(0, 2, 1)), by[s], bt[s])
            nxt = int(starts[-1]) + self.step
        else:
            nxt = self._next
        drop = min(nxt, bv.shape[0])
        self._v, self._y, self._t = bv[drop:], by[drop:], bt[drop:]
        self._next = nxt - drop
        return result


def stratified_split(y: np.ndarray, test_fraction: float = 0.2, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per-class random train/test split (FedDist protocol: 80/20 per subject, fixed seed).

    Per class (increasing), its indices permuted by one ``default_rng(seed)``; the first
    ``round(test_fraction * n_c)`` go to test. Returns sorted, disjoint int64 ``(train_idx,
    test_idx)`` covering 0..N-1; ValueError if ``test_fraction`` is outside [0, 1).
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"stratified_split: test_fraction must be in [0, 1), got {test_fraction}")
    y = np.asarray(y)
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        n_test = round(test_fraction * idx.size)
        test.append(rng.permutation(idx)[:n_test])
    test_idx = np.sort(np.concatenate(test)) if test else np.empty(0, np.int64)
    mask = np.ones(y.shape[0], bool)
    mask[test_idx] = False
    return np.flatnonzero(mask).astype(np.int64), test_idx.astype(np.int64)


@dataclass(frozen=True)
class ChannelStats:
    """Per-channel count, sum and sum of squares of samples (6 channels; count = windows * T).

    Clients publish these for their training windows (no raw data); the coordinator sums them
    for the model's input normalisation.
    """

    count: int
    total: tuple[float, ...]
    total_sq: tuple[float, ...]

    @classmethod
    def of(cls, x: np.ndarray) -> ChannelStats:
        """Statistics of windows ``x`` of shape (N, 6, T)."""
        x64 = np.asarray(x, dtype=np.float64)
        if x64.ndim != 3 or x64.shape[1] != N_CHANNELS:
            raise ValueError(f"ChannelStats.of: expected (N, {N_CHANNELS}, T), got {x64.shape}")
        return cls(
            int(x64.shape[0] * x64.shape[2]),
            tuple(float(s) for s in x64.sum(axis=(0, 2))),
            tuple(float(s) for s in (x64**2).sum(axis=(0, 2))),
        )

    def __add__(self, other: ChannelStats) -> ChannelStats:
        return ChannelStats(
            self.count + other.count,
            tuple(a + b for a, b in zip(self.total, other.total, strict=True)),
            tuple(a + b for a, b in zip(self.total_sq, other.total_sq, strict=True)),
        )

    def mean_std(self, floor: float = 1e-6) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and population std (floored at ``floor``); ValueError if ``count`` is 0."""
        if self.count <= 0:
            raise ValueError("ChannelStats.mean_std: count is 0; no training windows were reported")
        mean = np.asarray(self.total) / self.count
        var = np.maximum(np.asarray(self.total_sq) / self.count - mean**2, 0.0)
        return tuple(float(m) for m in mean), tuple(float(max(s, floor)) for s in np.sqrt(var))

    def to_json(self) -> dict[str, object]:
        """Plain-JSON form for status messages."""
        return {"count": self.count, "sum": list(self.total), "sum_sq": list(self.total_sq)}

    @classmethod
    def from_json(cls, d: object) -> ChannelStats:
        """Parse :meth:`to_json` output; ValueError if fields are missing, of the wrong length or not finite."""
        if not isinstance(d, dict):
            raise ValueError(f"ChannelStats: expected an object, got {type(d).__name__}")
        try:
            count = int(d["count"])
            total = tuple(float(v) for v in d["sum"])
            total_sq = tuple(float(v) for v in d["sum_sq"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"ChannelStats: malformed statistics {d!r}: {exc}") from None
        if count < 0 or len(total) != N_CHANNELS or len(total_sq) != N_CHANNELS:
            raise ValueError(f"ChannelStats: need count >= 0 and {N_CHANNELS} sums, got {d!r}")
        if not np.all(np.isfinite(total + total_sq)):
            raise ValueError("ChannelStats: sums must be finite")
        return cls(count, total, total_sq)
