"""Corrections that teach: a stretch of the timeline relabelled on the device becomes labelled training windows, and the
next round trains on exactly those windows with the corrected label (no Kivy window: the controller the screens call)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from support.replay_day import hapt_day

from edge_client.app.controller import AppConfig, DeviceController
from edge_client.backends.numpy_ref import init_weights
from edge_client.recorder import RECORDED_LOG
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore
from edge_client.timeline import STEP_NS
from edge_client.trainer import ClientTrainer, derive_seed
from edge_client.window_log import WindowLog
from har_models.data.labels import HAPT_LABELS, balanced_class_weights
from har_models.data.windowing import WindowSet
from har_models.nn.arch import ArchSpec
from har_models.nn.model import init_state
from har_models.nn.training import TrainConfig, make_loss, train_local
from har_models.wire import codec
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=0)
WALKING = HAPT_LABELS.index("walking")
RECORDED = 20  # walking windows recorded before the day is sensed


@pytest.mark.slow
def test_a_relabelled_stretch_becomes_training_windows_and_the_next_round_trains_on_them(tmp_path: Path) -> None:
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.save_local_model(SPEC.to_json(), init_weights(SPEC, 3))  # any model: the timeline holds what it says
    store.close()
    x = np.random.default_rng(0).normal(size=(RECORDED, 6, 128)).astype(np.float32)
    WindowLog(tmp_path / RECORDED_LOG, HAPT_LABELS).append(
        WindowSet(x, np.full(RECORDED, WALKING), HAPT_LABELS, np.arange(RECORDED, dtype=np.int64) * STEP_NS)
    )
    day = hapt_day(90.0)
    source = ReplaySensor(day, speed=None, loop=False)
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    ctl = DeviceController(cfg, source, charging=lambda: False, battery=lambda: None)
    try:
        ctl.start_sensing()
        end = time.monotonic() + 120
        while source.running and time.monotonic() < end:
            time.sleep(0.05)
        assert not source.running, "the 90 s replay did not end within 2 minutes"
        stretches = ctl.timeline.stretches(0, time.time_ns() + 86_400 * 10**9)
        st = max(stretches, key=lambda s: s.end_ns - s.start_ns)
        k = next(c for c in range(6) if c not in (st.label, WALKING))  # what the stretch really was
        made = ctl.relabel(st.start_ns, st.end_ns, HAPT_LABELS.names[k]).windows

        # The stretch's windows, one per 1.28 s, labelled k, in the store the trainer reads (80 % train, 20 % test).
        assert made == round((st.end_ns - st.start_ns) / STEP_NS) and made >= 20
        train, test = ctl.store.windows("train"), ctl.store.windows("test")
        counts = np.bincount(train.y, minlength=6) + np.bincount(test.y, minlength=6)
        assert counts.tolist() == [RECORDED if c == WALKING else made if c == k else 0 for c in range(6)]
        corrected = train.y == k
        assert 0 < corrected.sum() < made
        assert train.t_start_ns is not None
        t = train.t_start_ns[corrected]
        assert ((t >= st.start_ns) & (t < st.end_ns)).all()  # windows of that stretch
        assert ctl.counts()[HAPT_LABELS.names[k]] == made  # the count the Today screen shows

        # The next round: its training windows are these, labels included.
        received = {n: v.numpy() for n, v in init_state(SPEC, 0).items()}
        plan = TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, prox_mu=0.01, class_weights="balanced", seed=3)
        ann = RoundAnnouncement(run_id="r", round=1, state="training", arch=SPEC.to_dict(), label_set="hapt6",
                                selected=("phone-1",), plan=plan)  # fmt: skip
        out = ClientTrainer(ctl.store, "phone-1", "torch").run_round(ann, received)
        assert (out.meta.n_train, out.meta.n_test) == (len(train), len(test))
        trained_cm = np.asarray(out.meta.confusion.trained)
        assert trained_cm.sum(axis=1).tolist() == np.bincount(test.y, minlength=6).tolist()  # corrected test windows too
        env = codec.decode(out.envelope)
        ref = {n: torch.from_numpy(v) for n, v in received.items()}
        tc = TrainConfig(1, 0.05, 8, 0.01, (), derive_seed(3, "phone-1", 1, 0))

        def trained_on(labels: np.ndarray) -> dict[str, np.ndarray]:
            ws = WindowSet(train.x, labels, HAPT_LABELS, train.t_start_ns)
            res = train_local(SPEC, ref, ws, tc, make_loss(balanced_class_weights(labels, 6)), prox_ref=ref)
            return {n: t.numpy() for n, t in res.state.items()}

        want = trained_on(train.y)
        assert all(np.array_equal(env.tensors[n], want[n]) for n in received)
        # ...and not the model the same windows give under the label the model had recognised
        as_recognised = trained_on(np.where(corrected, st.label, train.y))
        assert not all(np.array_equal(env.tensors[n], as_recognised[n]) for n in received)
    finally:
        ctl.close()
