"""The Today and History screens' data in Android's two processes: the service classifies into the timeline, the UI relabels,
undoes and deletes through the files."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.polling import poll

from edge_client.app.controller import AppConfig
from edge_client.app.service import STATUS_FILE, RemoteController, read_json, run_service
from edge_client.backends.numpy_ref import init_weights
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore
from edge_client.timeline import STEP_NS
from edge_client.window_log import WindowLog
from har_models.data.hapt import read_hapt_recordings
from har_models.data.labels import HAPT_LABELS
from har_models.nn.arch import ArchSpec

ROOT = Path(__file__).resolve().parents[1]




def _service(tmp_path: Path, stop: threading.Event) -> threading.Thread:
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    source = ReplaySensor(rec, speed=50.0, loop=False)
    kwargs = {"state_dir": tmp_path, "source": source, "stop": stop, "poll_s": 0.05, "charging": lambda: False}
    t = threading.Thread(target=run_service, kwargs=kwargs)
    t.start()
    return t


@pytest.mark.slow
def test_the_service_fills_the_timeline_and_a_relabel_from_the_ui_is_applied_once(tmp_path):
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.save_local_model(spec.to_json(), init_weights(spec, 3))  # any model: the timeline holds what it says
    store.close()
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    ui = RemoteController(cfg, poll_s=0.05)
    stop = threading.Event()
    service = _service(tmp_path, stop)
    try:
        assert poll(lambda: (tmp_path / STATUS_FILE).exists())
        far = time.time_ns() + 86_400 * 10**9
        assert poll(lambda: sum(s.minutes for s in ui.timeline.stretches(0, far)) >= 1.0)
        st = ui.timeline.stretches(0, far)[0]
        edit = ui.relabel(st.start_ns, st.end_ns, "standing")
        assert edit is not None and edit.what == "relabel"
        made = edit.windows
        assert made == round((st.end_ns - st.start_ns) / STEP_NS) and made > 0
        assert edit.after[0] - edit.before[0] + edit.after[1] - edit.before[1] == made  # training and test windows together
        assert poll(lambda: ui.counts()["standing"] == made)
        with pytest.raises(KeyError):
            ui.relabel(st.start_ns, st.end_ns, "swimming")
        # Undone through the service: the windows go, and a second undo finds nothing (the service's refusal, raised here).
        undone = ui.undo_relabel()
        assert undone is not None and undone.windows == made and undone.after == edit.before
        assert poll(lambda: ui.counts()["standing"] == 0)
        with pytest.raises(LookupError, match="nothing to undo"):
            ui.undo_relabel()
        edit = ui.relabel(st.start_ns, st.end_ns, "standing")
        assert edit is not None and edit.windows == made
        assert poll(lambda: ui.history().storage and ui.history().storage[-1].startswith("In all: "))
    finally:
        stop.set()
        service.join(60)
    # A restarted service finds the request in the settings and does not apply it again.
    stop2 = threading.Event()
    service = _service(tmp_path, stop2)
    try:
        assert poll(lambda: (read_json(tmp_path / STATUS_FILE) or {}).get("answers") and ui.counts()["standing"] == made)
        time.sleep(0.5)
    finally:
        stop2.set()
        service.join(60)
        ui.close()
    counts = WindowLog(tmp_path / "recorded_windows.log", HAPT_LABELS).counts()
    np.testing.assert_array_equal(counts, [0, 0, 0, 0, made, 0])
    if made < 40:  # the most complete activity comes last in the guidance
        assert ui.guidance()[-1] == f"standing: {40 - made} more windows (about {(40 - made) * 1.28 / 60:.1f} min of recording)"
