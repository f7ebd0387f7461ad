"""Windowing, splits and channel statistics: hand-made sessions with known answers."""

import numpy as np
import pytest

from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import ChannelStats, Windower, WindowSet, stratified_split

P = 20_000_000  # 50 Hz grid period, ns


def _stream(n, labels, t0=0):
    t = t0 + np.arange(n, dtype=np.int64) * P
    v = np.arange(n * 6, dtype=np.float32).reshape(n, 6)
    return t, v, np.asarray(labels, dtype=np.int64)


def test_one_label_300_samples_gives_three_windows_at_0_64_128():
    t, v, y = _stream(300, [2] * 300)
    x, yy, ts = Windower().push(t, v, y)
    assert x.shape == (3, 6, 128)
    np.testing.assert_array_equal(ts, t[[0, 64, 128]])
    np.testing.assert_array_equal(yy, [2, 2, 2])
    np.testing.assert_array_equal(x[1], v[64:192].T)  # channel-first (6, T)


def test_no_window_crosses_a_label_change():
    t, v, y = _stream(300, [0] * 150 + [1] * 150)
    _, yy, ts = Windower().push(t, v, y)
    # starts 0, 64, 128 are tried; only [0, 128) lies inside one label.
    np.testing.assert_array_equal(ts, [t[0]])
    np.testing.assert_array_equal(yy, [0])


def test_unlabelled_samples_are_never_in_a_window():
    labels = [1] * 300
    labels[100] = -1
    t, v, y = _stream(300, labels)
    _, _, ts = Windower().push(t, v, y)
    np.testing.assert_array_equal(ts, t[[128]])  # windows at 0 and 64 hold sample 100; 128..255 does not
    labels = [1] * 300
    labels[10] = -1
    t, v, y = _stream(300, labels)
    _, _, ts = Windower().push(t, v, y)
    np.testing.assert_array_equal(ts, t[[64, 128]])


def test_a_gap_restarts_the_window_grid():
    t1, v1, y1 = _stream(200, [3] * 200)
    t2, v2, y2 = _stream(200, [3] * 200, t0=int(t1[-1]) + 5 * P)  # 4 missing samples
    w = Windower()
    _, _, ts = w.push(np.r_[t1, t2], np.r_[v1, v2], np.r_[y1, y2])
    # 2 windows per run of 200 (starts 0 and 64), none across the gap
    np.testing.assert_array_equal(ts, [t1[0], t1[64], t2[0], t2[64]])


def test_a_new_session_via_reset_and_a_backwards_time_jump():
    t, v, y = _stream(200, [0] * 200)
    w = Windower()
    a = w.push(t[:100], v[:100], y[:100])[2]
    b = w.push(t, v, y)[2]  # time goes back: a new run starts
    assert a.size == 0
    np.testing.assert_array_equal(b, t[[0, 64]])


def test_chunked_pushes_equal_one_push():
    rng = np.random.default_rng(3)
    labels = np.repeat(rng.integers(-1, 4, size=20), 90)
    t, v, y = _stream(labels.size, labels)
    whole = Windower().push(t, v, y)
    w = Windower()
    parts = []
    i = 0
    while i < t.size:
        k = int(rng.integers(1, 200))
        parts.append(w.push(t[i : i + k], v[i : i + k], y[i : i + k]))
        i += k
    for j in range(3):
        np.testing.assert_array_equal(np.concatenate([p[j] for p in parts]), whole[j])


def test_stratified_split_is_per_class_and_reproducible():
    y = np.array([0] * 50 + [1] * 30 + [2] * 7 + [3] * 1)
    tr, te = stratified_split(y, 0.2, seed=1)
    assert np.intersect1d(tr, te).size == 0 and np.union1d(tr, te).size == y.size
    np.testing.assert_array_equal(np.bincount(y[te], minlength=4), [10, 6, 1, 0])  # round(0.2 * n_c): 10, 6, 1.4->1, 0.2->0
    _, te2 = stratified_split(y, 0.2, seed=1)
    np.testing.assert_array_equal(te, te2)
    _, te3 = stratified_split(y, 0.2, seed=2)
    assert not np.array_equal(te, te3)


def test_stratified_split_rejects_a_bad_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        stratified_split(np.zeros(3), 1.0)


def test_channel_stats_match_numpy_and_add_up():
    rng = np.random.default_rng(0)
    a = rng.normal(3.0, 2.0, size=(10, 6, 128)).astype(np.float32)
    b = rng.normal(-1.0, 0.5, size=(4, 6, 128)).astype(np.float32)
    both = ChannelStats.of(a) + ChannelStats.of(b)
    mean, std = both.mean_std()
    cat = np.concatenate([a, b]).astype(np.float64)
    np.testing.assert_allclose(mean, cat.mean(axis=(0, 2)), rtol=1e-9)
    np.testing.assert_allclose(std, cat.std(axis=(0, 2)), rtol=1e-6)
    assert ChannelStats.from_json(both.to_json()) == both


def test_channel_stats_reject_malformed_json():
    with pytest.raises(ValueError, match="6 sums"):
        ChannelStats.from_json({"count": 1, "sum": [1.0], "sum_sq": [1.0]})
    with pytest.raises(ValueError, match="count is 0"):
        ChannelStats(0, (0.0,) * 6, (0.0,) * 6).mean_std()


def test_windowset_validates_shapes_and_labels():
    with pytest.raises(ValueError, match=r"\(N, 6, T\)"):
        WindowSet(np.zeros((2, 3, 128)), np.zeros(2), HAPT_LABELS)
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        WindowSet(np.zeros((1, 6, 128)), np.array([6]), HAPT_LABELS)
