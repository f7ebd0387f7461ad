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
