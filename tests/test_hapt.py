"""The committed HAPT recordings through the device pipeline, checked against direct slicing."""

from pathlib import Path

import numpy as np
import pytest

from har_models.data.hapt import STANDARD_GRAVITY, hapt_subject_ids, load_hapt_subject, read_hapt_recordings

ROOT = Path(__file__).resolve().parents[1] / "datasets" / "hapt"


def _direct_windows(path):
    """Independent method: fixed 64-sample grid from each session start, uniform valid label."""
    d = np.load(path, allow_pickle=False)
    xs, ys = [], []
    for e in np.unique(d["exp"]):
        m = d["exp"] == e
        acc, gyr, lab = d["acc"][m] * STANDARD_GRAVITY, d["gyro"][m], d["label"][m]
        for s in range(0, m.sum() - 128 + 1, 64):
            w = lab[s : s + 128]
            if 1 <= w[0] <= 6 and (w == w[0]).all():
                xs.append(np.hstack([acc[s : s + 128], gyr[s : s + 128]]).T.astype(np.float32))
                ys.append(int(w[0]) - 1)
    return np.stack(xs), np.array(ys)


def test_subject_one_windows_equal_direct_slicing_bit_for_bit():
    ws = load_hapt_subject(ROOT / "user01.npz")
    x, y = _direct_windows(ROOT / "user01.npz")
    np.testing.assert_array_equal(ws.y, y)
    assert ws.x.tobytes() == x.tobytes()


@pytest.mark.slow
def test_all_subjects_give_10017_windows_269_to_404_each():
    counts = [len(load_hapt_subject(ROOT / f"user{s}.npz")) for s in hapt_subject_ids(ROOT)]
    assert len(counts) == 30
    assert sum(counts) == 10_017 and min(counts) == 269 and max(counts) == 404


def test_units_are_metres_per_second_squared_and_sessions_are_separate():
    recs = read_hapt_recordings(ROOT / "user10.npz")
    assert [r.session for r in recs] == ["exp0", "exp1", "exp2"]  # user 10 has three sessions
    mag = np.linalg.norm(recs[0].acc.xyz, axis=1).mean()
    assert 9.0 < mag < 10.6  # gravity, in m/s^2 (was ~1 g)


def test_missing_and_malformed_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"user99\.npz"):
        read_hapt_recordings(tmp_path / "user99.npz")
    bad = tmp_path / "user98.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"user98\.npz.*not a readable"):
        read_hapt_recordings(bad)
    partial = tmp_path / "user97.npz"
    np.savez(partial, acc=np.zeros((5, 3)), gyro=np.zeros((5, 3)), label=np.zeros(5))
    with pytest.raises(ValueError, match=r"user97.npz lacks keys \['exp', 'sample'\]"):
        read_hapt_recordings(partial)
    shaped = tmp_path / "user96.npz"
    np.savez(shaped, acc=np.zeros((5, 2)), gyro=np.zeros((5, 3)), label=np.zeros(5), exp=np.zeros(5), sample=np.arange(5))
    with pytest.raises(ValueError, match=r"'acc' has shape \(5, 2\)"):
        read_hapt_recordings(shaped)
    with pytest.raises(FileNotFoundError, match="no HAPT files"):
        hapt_subject_ids(tmp_path / "empty")
