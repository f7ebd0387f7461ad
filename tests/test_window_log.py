"""The append-only window log: durable appends, records cut off mid-append, the size bound."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edge_client.window_log import WindowLog, keep_mask_for_limit
from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS
from har_models.data.windowing import WindowSet

REC = 12 + 16 + 4 * 6 * 128  # record header + (t, label) + the window's float32 values


def _windows(n: int, seed: int = 0, labels: list[int] | None = None) -> WindowSet:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6, 128)).astype(np.float32)
    y = np.array(labels if labels is not None else rng.integers(0, 6, n), np.int64)
    return WindowSet(x, y, HAPT_LABELS, np.arange(n, dtype=np.int64) * 1_280_000_000 + seed)


def _same(a: WindowSet, b: WindowSet) -> None:
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.t_start_ns, b.t_start_ns)


def test_appended_windows_survive_reopening(tmp_path):
    w1, w2 = _windows(3, 1), _windows(4, 2)
    lg = WindowLog(tmp_path / "w.log", HAPT_LABELS)
    assert lg.append(w1) == 3 and lg.append(w2) == 4
    again = WindowLog(tmp_path / "w.log", HAPT_LABELS)
    _same(again.read(), WindowSet.concat([w1, w2], HAPT_LABELS))
    assert again.counts().tolist() == np.bincount(np.r_[w1.y, w2.y], minlength=6).tolist()
    assert again.dropped_on_open == 0


@pytest.mark.parametrize("cut", [1, 11, 12, 20, REC // 2, REC - 1])
def test_record_cut_off_mid_append_is_dropped_and_logged(tmp_path, caplog, cut):
    path = tmp_path / "w.log"
    lg = WindowLog(path, HAPT_LABELS)
    first = _windows(5, 3)
    lg.append(first)
    lg.append(_windows(1, 4))
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the power failed while the sixth record was being written
        f.truncate(size - REC + cut)
    with caplog.at_level(logging.WARNING):
        again = WindowLog(path, HAPT_LABELS)
    assert f"cut off after {cut} of {REC} bytes" in caplog.text
    assert again.dropped_on_open == 1
    _same(again.read(), first)
    assert path.stat().st_size == size - REC  # the partial record is gone from the file too
    late = _windows(2, 5)
    again.append(late)  # new records follow the good ones
    _same(WindowLog(path, HAPT_LABELS).read(), WindowSet.concat([first, late], HAPT_LABELS))


def test_damaged_record_in_the_middle_is_dropped_others_kept(tmp_path, caplog):
    path = tmp_path / "w.log"
    w = _windows(4, 6)
    WindowLog(path, HAPT_LABELS).append(w)
    data = bytearray(path.read_bytes())
    head = len(data) - 4 * REC
    data[head + REC + 100] ^= 0xFF  # a flipped bit inside the second window
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = WindowLog(path, HAPT_LABELS)
    assert "damaged record" in caplog.text
    _same(again.read(), w.subset(np.array([0, 2, 3])))


def test_header_cut_off_starts_empty_and_other_label_sets_are_refused(tmp_path):
    path = tmp_path / "w.log"
    WindowLog(path, HAPT_LABELS)
    path.write_bytes(path.read_bytes()[:5])
    assert len(WindowLog(path, HAPT_LABELS)) == 0
    with pytest.raises(ValueError, match=r"label set 'hapt6'.*not 'realworld8'"):
        WindowLog(path, REALWORLD_LABELS)
    (tmp_path / "junk").write_bytes(b"hello world, not a log")
    with pytest.raises(ValueError, match="not a fedhar window log"):
        WindowLog(tmp_path / "junk", HAPT_LABELS)


def test_append_rejects_foreign_windows(tmp_path):
    lg = WindowLog(tmp_path / "w.log", HAPT_LABELS)
    w = _windows(2)
    with pytest.raises(ValueError, match="label set 'realworld8', the log keeps 'hapt6'"):
        lg.append(WindowSet(w.x, w.y, REALWORLD_LABELS, w.t_start_ns))
    with pytest.raises(ValueError, match=r"shape \(6, 64\)"):
        lg.append(WindowSet(w.x[:, :, :64], w.y, HAPT_LABELS, w.t_start_ns))


def test_keep_policy_by_hand():
    # counts [5, 2, 1]; 3 too many: class 0 is the largest each time, its three oldest go.
    keep = keep_mask_for_limit(np.array([0, 0, 0, 1, 0, 2, 1, 0]), 5, 3)
    assert keep.tolist() == [False, False, False, True, True, True, True, True]
    # counts [2, 2, 1]; 3 too many: 0 (tie, lower index), then 1, then 0 again.
    keep = keep_mask_for_limit(np.array([0, 1, 0, 1, 2]), 2, 3)
    assert keep.tolist() == [False, False, False, True, True]
    assert keep_mask_for_limit(np.array([0, 1]), 5, 3).all()


def test_log_stays_bounded_by_the_policy(tmp_path):
    lg = WindowLog(tmp_path / "w.log", HAPT_LABELS, max_windows=6, slack=2)
    a = _windows(6, 7, labels=[3, 3, 3, 3, 0, 1])
    lg.append(a)
    b = _windows(2, 8, labels=[3, 5])
    lg.append(b)  # 8 windows: within max + slack
    assert len(lg) == 8
    c = _windows(1, 9, labels=[0])
    lg.append(c)  # 9 > 8: trim to 6, dropping the three oldest "sitting" (3) windows
    kept = WindowLog(tmp_path / "w.log", HAPT_LABELS, max_windows=6, slack=2).read()
    want = WindowSet.concat([a.subset(np.array([3, 4, 5])), b, c], HAPT_LABELS)
    _same(kept, want)
    assert lg.counts().tolist() == [2, 1, 0, 2, 0, 1]
