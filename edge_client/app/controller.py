"""What the app does, without the UI: sensing, recording, live prediction, taking part in the federation.

The Kivy screens only call :class:`DeviceController` and show the views it reports. The sensor
thread (source -> recorder + live pipeline -> predictor), the federation supervisor and the agent
run in the background; their reports reach the UI through the callbacks given (the app wraps them
with ``Clock.schedule_once``). No Kivy or PyTorch at module level: the same controller runs in the
Android service, on a Pi and in tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from edge_client.app.config import (  # noqa: F401  (re-exported: the app's settings are imported from here too)
    APP_BACKENDS,
    CREDENTIALS_DIR,
    ENROLLED_MARK,
    MIN_TRAIN_WINDOWS,
    PASSWORD_FILE,
    TRAIN_FRACTION,
    AppConfig,
    default_data_dir,
)
from edge_client.app.federation_words import (  # noqa: F401  (re-exported)
    connection_cause,
    describe_refusal,
    missing_backend,
    not_enough_data,
    taking_part_words,
)
from edge_client.app.history_edits import HistoryEdits, HistoryView  # noqa: F401  (re-exported)
from edge_client.app.joining import enrol, enrolled, enrolment_fields, federation_fields, parse_broker, store_password  # noqa: F401
from edge_client.app.predictor import Predictor, load_predictor
from edge_client.app.round_notes import trained_accuracy as _trained_accuracy  # noqa: F401  (re-exported)
from edge_client.app.taking_part import (  # noqa: F401  (re-exported)
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    BATTERY_READ_S,
    EXIT_BROKER_REFUSED,
    EXIT_DUPLICATE_ID,
    TakingPart,
)
from edge_client.app.views import FederationView, LiveView, settings_view
from edge_client.cost import ROUND_COST_KEY, CostMeter
from edge_client.freshness import SensingFreshness, SensingHealthMeter
from edge_client.power import battery_percent, is_charging
from edge_client.recorder import RECORDED_LOG, Recorder, sync_to_store
from edge_client.sensors.base import SensorSource
from edge_client.sensors.replay import SensorChunk
from edge_client.store import ClientStore
from edge_client.timeline import guidance
from edge_client.timeline_store import TIMELINE_FILE, TimelineStore
from edge_client.window_log import WindowLog
from har_io.threads import join_started
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack

log = logging.getLogger("fedhar.app")


class DeviceController(TakingPart, HistoryEdits):
    """The device's app logic.

    ``on_live``, ``on_counts`` and ``on_federation`` are called from background threads with a
    :class:`LiveView`, the counts per activity and a :class:`FederationView`; ``supervise_s`` is how
    often the federation supervisor looks; ``battery`` gives the level in percent (None: not
    reported), read at most every :data:`BATTERY_READ_S`.
    """

    def __init__(
        self,
        cfg: AppConfig,
        source: SensorSource,
        on_live: Callable[[LiveView], None] | None = None,
        on_counts: Callable[[dict[str, int]], None] | None = None,
        on_federation: Callable[[FederationView], None] | None = None,
        predictor_loader: Callable[[ClientStore], Predictor | None] = load_predictor,
        charging: Callable[[], bool] = is_charging,
        supervise_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        battery: Callable[[], float | None] = battery_percent,
    ):
        self.cfg = cfg
        self.source = source
        self.store = ClientStore(cfg.state_dir, cfg.labels)
        self.window_log = WindowLog(cfg.state_dir / RECORDED_LOG, cfg.labels, max_windows=cfg.max_windows)
        self.recorder = Recorder(self.window_log)
        self.timeline = TimelineStore(cfg.state_dir / TIMELINE_FILE, cfg.labels, cfg.timeline_days, cfg.raw_days)
        kept = self.store.get_meta(ROUND_COST_KEY, [])
        self.cost = CostMeter(rounds=kept if isinstance(kept, list) else [])  # shared with the agent, which measures rounds
        self._battery = battery
        self._wall_offset_ns: int | None = None  # wall clock minus sensor clock, fixed at the first window
        self._last_wall_ns = -(2**62)
        self._on_live = on_live or (lambda v: None)
        self._on_counts = on_counts or (lambda c: None)
        self._on_federation = on_federation or (lambda v: None)
        self._predictor_loader = predictor_loader
        self._charging = charging
        self._live_pipe = SensorPipeline(cfg.labels, LabelTrack.constant(0))  # every window kept, label unused
        # A live source says which clock stamps its events (``clock_ns``); then a silent one (Doze) is "sensing paused".
        clock_ns = getattr(source, "clock_ns", None)
        self.freshness = SensingFreshness(clock_ns=clock_ns) if callable(clock_ns) else None
        # Rates, window age, gaps and late samples of the live pipeline, for the client's status (a replay: on its own stamps).
        self.health = SensingHealthMeter(clock_ns=clock_ns if callable(clock_ns) else None)
        self._predictor: Predictor | None = None
        self._model_mtime: float | None = None
        self.live = LiveView()
        self.federation = settings_view(cfg)
        self._init_taking_part(clock, supervise_s)

    # -- sensing ---------------------------------------------------------------------------
    def start_sensing(self) -> None:
        """Start the sensor thread (no-op if it runs)."""
        if not self.source.running:
            self._live_pipe = SensorPipeline(self.cfg.labels, LabelTrack.constant(0))
            self.health.watch(self._live_pipe)
            self.source.start(self._on_chunk, on_end=self._on_source_end)

    def stop_sensing(self) -> None:
        """Stop the sensor thread."""
        self.source.stop()

    def _on_source_end(self) -> None:
        self.recorder.flush()
        self._on_counts(self.recorder.counts())

    def _on_chunk(self, chunk: SensorChunk) -> None:
        with self.cost.sensing(chunk[1]):
            self._handle_chunk(chunk)

    def _handle_chunk(self, chunk: SensorChunk) -> None:
        recorded = self.recorder.push(chunk)
        if len(recorded):
            assert recorded.t_start_ns is not None
            for label in np.unique(recorded.y).tolist():  # when each recording was made, for the History screen's list
                self.note_recorded(int(label), recorded.t_start_ns[recorded.y == label], time.time_ns())
            self._on_counts(self.recorder.counts())
        live = self._live_pipe.push(*chunk)
        if self.freshness is not None:
            self.freshness.note(live, self._live_pipe.clock_shift_ns)  # windows are re-based after a backward clock step
        self.health.note(live)
        if len(live):
            self._predict(live.x, live.t_start_ns if live.t_start_ns is not None else np.zeros(len(live), np.int64))

    def _current_predictor(self) -> Predictor | None:
        path = self.store.folder / "local_model.safetensors"
        mtime = path.stat().st_mtime if path.exists() else None
        if mtime != self._model_mtime:  # a round finished (or the first model arrived): reload
            self._model_mtime = mtime
            self._predictor = self._predictor_loader(self.store) if mtime is not None else None
        return self._predictor

    def _predict(self, x: np.ndarray, t_start_ns: np.ndarray) -> None:
        """Classify new windows (N, 6, T) with the current local model: the Live view shows the newest, the timeline keeps all."""
        pred = self._current_predictor()
        view = replace(self.live, windows=self.live.windows + len(x), t_start_ns=int(t_start_ns[-1]))
        if pred is None:
            view.activity, view.confidence = None, 0.0
            view.note = "no model yet: take part in a federation round first"
        else:
            p = pred.predict(x)
            k = np.argmax(p, axis=1)
            view.activity, view.confidence, view.note = self.cfg.labels.names[int(k[-1])], float(p[-1, k[-1]]), ""
            try:
                self.timeline.add(self._wall_ns(t_start_ns), k, p[np.arange(len(k)), k], x)
            except Exception as exc:  # a full or read-only folder: the timeline pauses, sensing and the Live view go on
                log.error("timeline: cannot store %d windows: %s", len(k), exc)
        self.live = view
        self._on_live(view)

    def _wall_ns(self, t_sensor_ns: np.ndarray) -> np.ndarray:
        """Window starts on the wall clock: the sensor's stamps plus one offset, fixed at the first window (the
        timeline keeps the sensor clock's spacing) and taken again when a time would lie before the newest stored."""
        t = np.asarray(t_sensor_ns, np.int64)
        if self._wall_offset_ns is None or int(t[0]) + self._wall_offset_ns <= self._last_wall_ns:
            self._wall_offset_ns = time.time_ns() - int(t[-1]) - 2_560_000_000  # the newest window ended just now
            self._wall_offset_ns = max(self._wall_offset_ns, self._last_wall_ns + 1 - int(t[0]))
        wall = t + self._wall_offset_ns
        self._last_wall_ns = int(wall[-1])
        return wall

    # -- timeline ------------------------------------------------------------------------
    def guidance(self) -> list[str]:
        """What to record next, in words (:func:`~edge_client.timeline.guidance`)."""
        return guidance(self.counts())

    # -- recording -------------------------------------------------------------------------
    def start_recording(self, activity: str) -> None:
        """Label what follows as ``activity`` (starts sensing if needed); KeyError outside the label set."""
        self.recorder.start(activity)
        self.start_sensing()

    def stop_recording(self) -> None:
        """Stop labelling; the recorded windows become training data in the background."""
        self.recorder.stop()
        threading.Thread(target=self._sync, name="sync-store", daemon=True).start()

    def _sync(self) -> None:
        n_train, n_test = sync_to_store(self.window_log, self.store, self.cfg.split_seed)
        log.info("recorded windows in the store: %d training, %d test", n_train, n_test)
        self._on_counts(self.recorder.counts())

    def close(self) -> None:
        """Stop every thread and close the store."""
        self._closing.set()
        self._wake_event.set()
        self.stop_sensing()
        self._stop_agent()
        join_started(self._supervisor, 10)
        self.store.close()
        self.timeline.close()
