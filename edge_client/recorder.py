"""Recording labelled activity on the device: the owner picks an activity, starts and stops.

Samples go through the shared :class:`~har_models.data.pipeline.SensorPipeline`; windows wholly
inside a recording come out labelled and are appended durably to the device's
:class:`~edge_client.window_log.WindowLog` (windows across a start or stop are not kept). The label
switches just after the newest sample taken (:attr:`~har_models.data.pipeline.SensorPipeline.clock_ns`
+ 1 ns) in the sensor's own, re-based time base: no mapping to the wall clock, and a backward clock
step or a dropped outlier stamp does not misplace it. Each :meth:`Recorder.flush` starts a fresh
pipeline, so a session after a reboot (boot clock near 0) is labelled too.
"""

from __future__ import annotations

import logging
import threading
import zlib

from edge_client.sensors.replay import SensorChunk
from edge_client.store import ClientStore
from edge_client.window_log import WindowLog
from har_models.data.labels import LabelSet
from har_models.data.pipeline import SensorPipeline
from har_models.data.windowing import WindowSet

log = logging.getLogger("fedhar.client.recorder")

RECORDED_LOG = "recorded_windows.log"
"""File name of the recorded-window log inside a device's state folder."""


def recorded_labels(spec: str) -> LabelSet:
    """The label set of a ``recorded:LABELSET`` source (``recorded:hapt6``); ValueError for another text."""
    from har_models.data.labels import LABEL_SETS

    kind, _, name = spec.partition(":")
    if kind != "recorded" or name not in LABEL_SETS:
        raise ValueError(f"source {spec!r}: expected recorded:LABELSET with LABELSET one of {', '.join(sorted(LABEL_SETS))}")
    return LABEL_SETS[name]


class Recorder:
    """Labels windows with the activity the owner chose and keeps them in ``window_log`` (whose label set it takes).

    :meth:`push` runs in the sensor thread, :meth:`start` and :meth:`stop` in the UI thread; a lock orders them.
    """

    def __init__(self, window_log: WindowLog, **pipeline_kwargs: int):
        self.log = window_log
        self.labels: LabelSet = window_log.labels
        self._pipeline_kwargs = dict(pipeline_kwargs)
        self._pipeline = SensorPipeline(self.labels, None, **pipeline_kwargs)
        self._lock = threading.Lock()
        self._last_change = -(2**62)
        self.activity: str | None = None
        self.session_windows = 0

    @property
    def recording(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self.activity is not None

    def _change(self, label: int) -> None:
        clock = self._pipeline.clock_ns
        t = self._last_change + 1 if clock is None else max(clock + 1, self._last_change + 1)
        self._pipeline.set_label(t, label)
        self._last_change = t

    def start(self, activity: str) -> None:
        """Label everything from the next sample on as ``activity`` (switching if one is running); KeyError if unknown."""
        label = self.labels.index(activity)
        with self._lock:
            self._change(label)
            self.activity = activity
            self.session_windows = 0
        log.info("recording %s", activity)

    def stop(self) -> None:
        """Stop labelling; windows still in the pipeline that end before now are kept when they come out."""
        with self._lock:
            if self.activity is None:
                return
            self._change(-1)
            log.info("stopped recording %s: %d windows", self.activity, self.session_windows)
            self.activity = None

    def push(self, chunk: SensorChunk) -> WindowSet:
        """Feed one sensor chunk; labelled windows it completes are appended to the log and returned."""
        sensor, t, xyz = chunk
        with self._lock:
            return self._keep(self._pipeline.push(sensor, t, xyz))

    def _keep(self, ws: WindowSet) -> WindowSet:
        if len(ws):
            self.log.append(ws)
            self.session_windows += len(ws)
        return ws

    def flush(self) -> WindowSet:
        """End of the sensor stream: close the pipeline (keeping its last windows) and start a fresh one."""
        with self._lock:
            ws = self._keep(self._pipeline.close())
            label = self.labels.index(self.activity) if self.activity is not None else -1
            self._pipeline = SensorPipeline(self.labels, None, **self._pipeline_kwargs)
            self._last_change = -(2**62)
            self._change(label)
        return ws

    def counts(self) -> dict[str, int]:
        """Windows recorded per activity (all sessions, as kept in the log)."""
        return {name: int(n) for name, n in zip(self.labels.names, self.log.counts(), strict=True)}


def sync_to_store(
    window_log: WindowLog, store: ClientStore, split_seed: int = 1, test_fraction: float = 0.2, *, emptied: bool = False
) -> tuple[int, int]:
    """Make the store's training and test windows those of the log (stratified 80/20 split); returns (n_train, n_test).

    Nothing is rewritten when the log has not changed since the last sync. An empty log leaves the
    store as it is, unless ``emptied`` (the person deleted the log's last windows).
    """
    data = window_log.read()
    assert data.t_start_ns is not None
    fp = f"recorded:{len(data)}:{zlib.crc32(data.t_start_ns.tobytes() + data.y.tobytes()):08x}|seed={split_seed}"
    if store.has_source(fp) or (len(data) == 0 and not emptied):
        return len(store.windows("train")), len(store.windows("test"))
    return store.replace_windows(fp, data, test_fraction=test_fraction, seed=split_seed)
