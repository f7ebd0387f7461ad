"""Replay of a recorded session as if it came from a live sensor driver.

:class:`ReplaySource` turns any :class:`~har_models.data.recording.Recording` into what a driver
delivers: small batches of ``(sensor, t_ns, xyz)`` events, acc and gyro interleaved as the phone
produced them, paced against the wall clock: real time (``speed=1.0``; every due time from the
start, so sleep overshoot never accumulates), accelerated, or as fast as possible (``speed=None``,
batches of ``fast_batch_s``). An event arrives at its sensor's running maximum stamp (lone clock
outliers left out, :func:`arrival_stamps`); each sensor keeps its file order, so every mode yields
the windows of :func:`~har_models.data.pipeline.windows_from_recording`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from har_models.data.clock import CLOCK_JUMP_NS, CONFIRM_SAMPLES
from har_models.data.labels import LabelSet
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import Recording
from har_models.data.windowing import WindowSet

log = logging.getLogger(__name__)

SensorChunk = tuple[str, np.ndarray, np.ndarray]
"""``(sensor, t_ns (n,) int64, xyz (n, 3) float64)``: one batch of one sensor's events."""

_SENSORS = ("acc", "gyro")


def arrival_stamps(t_ns: np.ndarray, jump_ns: int = CLOCK_JUMP_NS, confirm: int = CONFIRM_SAMPLES) -> np.ndarray:
    """Arrival stamp of each event of one sensor (``(n,)`` int64, file order): the running maximum of its stamps,
    outliers left out, backward steps bridged; non-decreasing.

    A stamp over ``jump_ns`` ahead counts only with the support of ``confirm - 1`` of the next
    stamps (a real clock step, as :mod:`har_models.data.clock` decides); otherwise it arrives with
    the running maximum. A supported step back passes no time: the events after it keep their own
    spacing. Input without jumps gives exactly the running maximum.
    """
    t = np.asarray(t_ns, np.int64)
    if t.size == 0:
        return t
    m = np.maximum.accumulate(t)
    need = confirm - 1

    def counts(k: int, x: int) -> bool:
        nxt = t[k + 1 : k + 1 + need]
        return nxt.size == 0 or int(np.sum(np.abs(nxt - x) <= jump_ns)) >= min(need, nxt.size)

    if t.size > 1 and not np.any(t[1:] - m[:-1] > jump_ns) and not np.any(m[:-1] - t[1:] > jump_ns) and counts(0, int(t[0])):
        return m
    out = np.empty_like(t)
    cur: int | None = None
    shift = 0  # arrival minus stamp since the last backward step
    for k, x in enumerate(t.tolist()):
        y = x + shift
        if cur is not None and y < cur - jump_ns and counts(k, x):
            shift += cur - y  # a backward step: time goes on from the running maximum
            y = cur
        elif (cur is None or y - cur > jump_ns) and not counts(k, x):
            out[k] = _INT64_MIN if cur is None else cur  # an outlier: no time passes
            continue
        cur = y if cur is None else max(cur, y)
        out[k] = cur
    first = out[out != _INT64_MIN]
    out[out == _INT64_MIN] = first[0] if first.size else t[0]
    return np.maximum.accumulate(out)


_INT64_MIN = int(np.iinfo(np.int64).min)


@dataclass
class ReplayProgress:
    """Counters of one replay, updated as it runs (readable from another thread).

    ``chunks_delivered``: one per sensor per batch; ``recording_s``: newest minus first arrival
    stamp delivered; ``lag_s``: paced modes only, wall clock at the latest batch minus its oldest
    event's due time (s, >= 0), with its max and mean; ``stopped``: ended early (stop event or
    ``max_wall_s``).
    """

    samples_delivered: int = 0
    chunks_delivered: int = 0
    batches_delivered: int = 0
    windows_emitted: int = 0
    recording_s: float = 0.0
    lag_s: float = 0.0
    max_lag_s: float = 0.0
    mean_lag_s: float = 0.0
    elapsed_s: float = 0.0
    finished: bool = False
    stopped: bool = False


class ReplaySource:
    """A recording replayed as a sensor driver: paced batches of :data:`SensorChunk` events.

    ``speed``: recording seconds per wall-clock second (None: as fast as possible); ``fast_batch_s``:
    recording seconds per unpaced batch; ``sleep`` is used without a stop event (else
    ``stop_event.wait``, so a stop is seen at once). Each batch holds the events due when the
    scheduler woke, one chunk per sensor, the earlier sensor first. Raises ValueError if ``speed``
    or ``fast_batch_s`` is not a positive finite number.
    """

    def __init__(
        self,
        recording: Recording,
        speed: float | None = 1.0,
        *,
        fast_batch_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if speed is not None and not (np.isfinite(speed) and speed > 0):
            raise ValueError(f"ReplaySource: speed must be a positive number or None (as fast as possible), got {speed!r}")
        if not (np.isfinite(fast_batch_s) and fast_batch_s > 0):
            raise ValueError(f"ReplaySource: fast_batch_s must be > 0 seconds, got {fast_batch_s!r}")
        self.recording = recording
        self.speed = speed
        self.fast_batch_s = float(fast_batch_s)
        self._clock = clock
        self._sleep = sleep
        self.progress = ReplayProgress()
        streams = (recording.acc, recording.gyro)
        # Arrival stamp: running maximum per sensor (lone clock outliers left out); merge keeps each sensor's file order.
        arrival = [arrival_stamps(s.t_ns) for s in streams]
        key = np.concatenate(arrival)
        sensor = np.concatenate([np.full(len(s), i, np.int8) for i, s in enumerate(streams)])
        index = np.concatenate([np.arange(len(s)) for s in streams])
        order = np.argsort(key, kind="stable")
        self._key = key[order]
        self._sensor = sensor[order]
        self._index = index[order]
        self._streams = streams

    def __len__(self) -> int:
        """Number of events (acc + gyro)."""
        return int(self._key.size)

    @property
    def span_s(self) -> float:
        """Recording time from the first to the last arrival stamp, seconds."""
        return float(self._key[-1] - self._key[0]) / 1e9 if self._key.size else 0.0

    def __iter__(self) -> Iterator[SensorChunk]:
        return self.chunks()

    def chunks(self, stop_event: threading.Event | None = None, max_wall_s: float | None = None) -> Iterator[SensorChunk]:
        """Yield the recording as :data:`SensorChunk` batches (m/s^2 or rad/s), paced by ``speed``; :attr:`progress` restarts.

        ``stop_event`` ends it at the next batch boundary; after ``max_wall_s`` wall-clock seconds the
        events due by then are still delivered.
        """
        self.progress = prog = ReplayProgress()
        key, n = self._key, self._key.size
        start = self._clock()
        deadline = None if max_wall_s is None else start + float(max_wall_s)
        i = 0
        lag_total, batches = 0.0, 0
        while i < n:
            if stop_event is not None and stop_event.is_set():
                break
            now = self._clock()
            if self.speed is None:
                if deadline is not None and now >= deadline:
                    break
                j = int(np.searchsorted(key, key[i] + round(self.fast_batch_s * 1e9), side="left"))
            else:
                limit = now if deadline is None else min(now, deadline)
                j = int(np.searchsorted(key, key[0] + round((limit - start) * self.speed * 1e9), side="right"))
                if j <= i:
                    due = self._due(start, i)
                    if due > limit:
                        if deadline is not None and now >= deadline:
                            break
                        target = due if deadline is None else min(due, deadline)
                        if self._wait(target - now, stop_event):
                            break
                        continue
                    j = int(np.searchsorted(key, key[i], side="right"))  # due by float rounding: deliver
                lag = max(0.0, now - self._due(start, i))
                lag_total, batches = lag_total + lag, batches + 1
                prog.lag_s, prog.max_lag_s, prog.mean_lag_s = lag, max(prog.max_lag_s, lag), lag_total / batches
            prog.batches_delivered += 1
            for chunk in self._batch(i, j):
                prog.chunks_delivered += 1
                prog.samples_delivered += int(chunk[1].size)
                yield chunk
            i = j
            prog.recording_s = float(key[i - 1] - key[0]) / 1e9
            prog.elapsed_s = self._clock() - start
        prog.elapsed_s = self._clock() - start
        prog.finished = i >= n
        prog.stopped = not prog.finished

    def run(
        self,
        pipeline: SensorPipeline,
        on_windows: Callable[[WindowSet], None] | None = None,
        stop_event: threading.Event | None = None,
        max_wall_s: float | None = None,
        close: bool = True,
    ) -> ReplayProgress:
        """Feed the replay into ``pipeline`` and hand every non-empty window batch ``(k, 6, T)`` to ``on_windows``.

        Returns a snapshot of the final counters when the recording ends, ``stop_event`` is set or
        ``max_wall_s`` pass; ``close`` flushes the pipeline's last windows.
        """
        for sensor, t, xyz in self.chunks(stop_event, max_wall_s):
            self._deliver(pipeline.push(sensor, t, xyz), on_windows)
        if close:
            self._deliver(pipeline.close(), on_windows)
        prog = self.progress
        log.info(
            "replay %s/%s: %d samples, %d windows, %.2f s recording in %.2f s wall (max lag %.1f ms)%s",
            self.recording.subject,
            self.recording.session,
            prog.samples_delivered,
            prog.windows_emitted,
            prog.recording_s,
            prog.elapsed_s,
            prog.max_lag_s * 1e3,
            ", stopped early" if prog.stopped else "",
        )
        return replace(prog)

    def _deliver(self, ws: WindowSet, on_windows: Callable[[WindowSet], None] | None) -> None:
        if len(ws):
            self.progress.windows_emitted += len(ws)
            if on_windows is not None:
                on_windows(ws)

    def _due(self, start: float, k: int) -> float:
        """Wall-clock time (clock units) at which event k is due, from the fixed start."""
        assert self.speed is not None
        return start + (int(self._key[k]) - int(self._key[0])) / 1e9 / self.speed

    def _wait(self, seconds: float, stop_event: threading.Event | None) -> bool:
        """Sleep up to ``seconds``; True if the stop event was set meanwhile."""
        if stop_event is not None:
            return stop_event.wait(seconds)
        self._sleep(seconds)
        return False

    def _batch(self, i: int, j: int) -> list[SensorChunk]:
        sensors, index = self._sensor[i:j], self._index[i:j]
        present, first = np.unique(sensors, return_index=True)
        out = []
        for s in present[np.argsort(first)].tolist():  # the sensor with the earlier event first
            idx = index[sensors == s]
            stream = self._streams[s]
            out.append((_SENSORS[s], stream.t_ns[idx], stream.xyz[idx]))
        return out


def replay_windows(recording: Recording, labels: LabelSet, speed: float | None = None, **pipeline_kwargs: int) -> WindowSet:
    """All windows of ``recording`` replayed through a fresh :class:`SensorPipeline`, equal bit for bit to
    :func:`~har_models.data.pipeline.windows_from_recording` in every mode (``pipeline_kwargs``: ``window``, ``step``,
    ``period_ns``, ``max_gap_ns``, ``reorder_ns``)."""
    parts: list[WindowSet] = []
    pipe = SensorPipeline(labels, recording.labels, **pipeline_kwargs)
    ReplaySource(recording, speed).run(pipe, parts.append)
    return WindowSet.concat(parts, labels)
