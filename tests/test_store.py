"""The client's local store survives restarts and keeps its split."""

import numpy as np
import pytest

from edge_client.store import ClientStore
from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS
from har_models.data.windowing import WindowSet, stratified_split


def _windows(n=50):
    rng = np.random.default_rng(0)
    return WindowSet(rng.normal(size=(n, 6, 128)).astype(np.float32), np.arange(n) % 6, HAPT_LABELS, np.arange(n) * 10)


def test_windows_and_split_survive_a_restart(tmp_path):
    data = _windows()
    s = ClientStore(tmp_path, HAPT_LABELS)
    n_train, n_test = s.replace_windows("src", data, 0.2, seed=1)
    s.close()
    s = ClientStore(tmp_path, HAPT_LABELS)
    tr, te = stratified_split(data.y, 0.2, 1)
    assert (n_train, n_test) == (len(tr), len(te))
    test = s.windows("test")
    assert test.x.tobytes() == data.x[te].tobytes()
    np.testing.assert_array_equal(test.t_start_ns, data.t_start_ns[te])
    assert s.has_source("src") and not s.has_source("other")


def test_models_tensors_and_last_update_round_trip(tmp_path):
    s = ClientStore(tmp_path, HAPT_LABELS)
    state = {"a": np.arange(6, dtype=np.float32).reshape(2, 3)}
    s.save_local_model('{"x": 1}', state)
    arch, back = s.load_local_model()
    assert arch == '{"x": 1}' and np.array_equal(back["a"], state["a"])
    s.save_tensors("ala_state", {"w": np.ones(3, np.float32)}, {"start_phase": False})
    t, meta = s.load_tensors("ala_state")
    assert meta == {"start_phase": False} and t["w"].tolist() == [1, 1, 1]
    s.save_last_update("run", 4, 0, b"ENVELOPE")
    assert s.load_last_update() == ({"run_id": "run", "round": 4, "stage": 0}, b"ENVELOPE")
    s.forget_run_state()
    assert s.load_local_model() is None and s.load_last_update() is None


def test_a_damaged_model_file_is_reported_not_fatal(tmp_path, caplog):
    s = ClientStore(tmp_path, HAPT_LABELS)
    (tmp_path / "local_model.safetensors").write_bytes(b"garbage")
    assert s.load_local_model() is None
    assert "unreadable" in caplog.text


def test_a_store_of_another_label_set_is_refused(tmp_path):
    ClientStore(tmp_path, HAPT_LABELS).close()
    with pytest.raises(ValueError, match=r"realworld8.*--state-dir"):
        ClientStore(tmp_path, REALWORLD_LABELS)


def _constant_windows(values_by_class: dict[int, float], per_class: int = 5) -> WindowSet:
    """``per_class`` windows of each class, every sample of class c's windows equal to ``value * (channel + 1)``."""
    ys = [c for c in values_by_class for _ in range(per_class)]
    x = np.stack([np.repeat(values_by_class[c] * np.arange(1, 7, dtype=np.float32)[:, None], 128, axis=1) for c in ys])
    return WindowSet(x, np.array(ys), HAPT_LABELS, np.arange(len(ys)) * 10)


def test_window_counts_follow_every_write_and_match_a_reread(tmp_path):
    s = ClientStore(tmp_path, HAPT_LABELS)
    heard = []
    s.window_listeners.append(heard.append)
    empty = s.window_counts()
    assert (empty.n_train, empty.n_test, empty.class_counts, empty.train_stats) == (0, 0, (0,) * 6, {})

    # 5 windows of class 0 (every sample 1 * (channel + 1)) and 5 of class 2 (-2 * (channel + 1)):
    # round(0.2 * 5) = 1 test window per class, so 4 + 4 training windows of 128 samples.
    s.replace_windows("a", _constant_windows({0: 1.0, 2: -2.0}), 0.2, seed=1)
    got = s.window_counts()
    assert (got.n_train, got.n_test, got.class_counts) == (8, 2, (4, 0, 4, 0, 0, 0))
    assert got.train_stats == {
        "count": 8 * 128,
        "sum": [128 * (4 * 1.0 - 4 * 2.0) * (c + 1) for c in range(6)],  # -512 (c + 1)
        "sum_sq": [128 * (4 * 1.0 + 4 * 4.0) * (c + 1) ** 2 for c in range(6)],  # 2560 (c + 1)^2
    }
    assert heard == [got]

    # More windows (5 of class 4, all 3 * (channel + 1)) replace them: the counts are the new table's at once.
    s.replace_windows("b", _constant_windows({0: 1.0, 2: -2.0, 4: 3.0}), 0.2, seed=1)
    got = s.window_counts()
    assert (got.n_train, got.n_test, got.class_counts) == (12, 3, (4, 0, 4, 0, 4, 0))
    assert got.train_stats["sum"] == [128 * (4 - 8 + 12) * (c + 1) for c in range(6)]
    assert len(heard) == 2 and heard[-1] == got

    # Refused windows change nothing and tell nobody.
    other = _constant_windows({0: 1.0})
    with pytest.raises(ValueError, match="label set"):
        s.replace_windows("c", WindowSet(other.x, other.y, REALWORLD_LABELS, other.t_start_ns))
    assert s.window_counts() == got and len(heard) == 2
    s.close()

    # What was kept with the writes is what the table says when read again.
    s = ClientStore(tmp_path, HAPT_LABELS)
    assert s.window_counts() == got
    s.close()
