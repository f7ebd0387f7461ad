"""The timeline on disk: classified windows, their raw samples once, corrections into training windows, retention."""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.timeline_store import DAY_NS, PERIOD_NS, TimelineStore
from har_models.data.labels import HAPT_LABELS

T0 = 1_764_600_000 * 10**9  # a wall-clock instant, ns


def stream(n_windows: int, t0: int = T0) -> tuple[np.ndarray, np.ndarray]:
    """Windows (N, 6, 128) cut every 64 samples from one signal whose value is the sample's index, and their starts."""
    n = 64 * (n_windows + 1)
    sig = np.tile(np.arange(n, dtype=np.float32)[:, None], (1, 6)) + np.arange(6, dtype=np.float32) * 1e5
    x = np.stack([sig[64 * i : 64 * i + 128].T for i in range(n_windows)])
    return t0 + 64 * PERIOD_NS * np.arange(n_windows, dtype=np.int64), x


def test_windows_are_stored_with_their_samples_once_and_a_stretch_relabels_into_the_same_windows(tmp_path):
    tl = TimelineStore(tmp_path / "timeline.sqlite", HAPT_LABELS)
    t, x = stream(20)
    tl.add(t[:7], np.zeros(7), np.full(7, 0.9), x[:7], now_ns=T0)
    tl.add(t[7:], np.zeros(13), np.full(13, 0.9), x[7:], now_ns=T0)
    ts, v = tl.raw_samples(T0, T0 + DAY_NS)
    assert ts.size == 64 * 21  # 21 halves of windows, each sample once
    np.testing.assert_array_equal(np.diff(ts), PERIOD_NS)
    np.testing.assert_array_equal(v[:, 0], np.arange(64 * 21))
    (st,) = tl.stretches(T0, T0 + DAY_NS)
    assert (st.start_ns, st.label) == (T0, 0)
    ws = tl.relabel(st.start_ns, st.end_ns, "sitting")
    assert len(ws) == 20 and set(ws.y.tolist()) == {3}
    np.testing.assert_array_equal(ws.x, x)  # the windower cuts the very windows the model saw
    np.testing.assert_array_equal(ws.t_start_ns, t)
    assert tl.corrected_windows() == 20
    (fixed,) = tl.stretches(T0, T0 + DAY_NS)
    assert (fixed.label, fixed.corrected) == (3, True)
    with pytest.raises(KeyError):
        tl.relabel(T0, T0 + 10**9, "swimming")


def test_retention_drops_raw_samples_after_raw_days_and_predictions_after_retention_days(tmp_path):
    tl = TimelineStore(tmp_path / "t.sqlite", HAPT_LABELS, retention_days=5, raw_days=1)
    t, x = stream(4)
    tl.add(t, np.full(4, 2), np.ones(4), x, now_ns=T0)
    tl.prune(T0 + 2 * DAY_NS)
    assert tl.raw_samples(T0, T0 + DAY_NS)[0].size == 0
    assert tl.predictions(T0, T0 + DAY_NS)[0].size == 4
    assert len(tl.relabel(T0, T0 + 10 * 10**9, "walking")) == 0  # too old to teach, still corrected
    tl.prune(T0 + 6 * DAY_NS)
    assert tl.predictions(T0, T0 + DAY_NS)[0].size == 0 and tl.corrections(T0, T0 + DAY_NS) == []
    with pytest.raises(ValueError, match="raw_days"):
        TimelineStore(tmp_path / "u.sqlite", HAPT_LABELS, raw_days=0)
