"""Replay of a recorded session as if it came from a live sensor driver.

A :class:`ReplaySource` turns any :class:`~har_models.data.recording.Recording` (REALWORLD,
HAPT, a session the app recorded) back into what a sensor driver delivers: small batches
of ``(sensor, t_ns, xyz)`` events, accelerometer and gyroscope interleaved in the order the
phone produced them, paced against the wall clock. Three modes, one code path:

* real time (``speed=1.0``): event k is delivered at ``start + (a_k - a_0) / speed`` on
  :func:`time.monotonic`, where ``a_k`` is the event's arrival stamp (below). Every due
  time is computed from the start, never from the previous sleep, so sleep overshoot
  does not accumulate into drift;
* accelerated (``speed=10.0``): the same schedule, compressed;
* as fast as possible (``speed=None``): no sleeping; batches of ``fast_batch_s`` of
  recording time.

The arrival stamp of an event is the newest timestamp its sensor had produced up to and
including it (a running maximum): an out-of-order event arrives right after the newer
one it followed in the file, as it did on the phone. A lone stamp far in the future (the
resampler's clock outlier, :func:`arrival_stamps`) does not count, or a paced replay would
stall until the wall clock reached it. Each sensor's events keep their
file order, so the resampler sees exactly the sequence an offline pass sees, and every
mode yields the same windows as :func:`~har_models.data.pipeline.windows_from_recording`.
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
    """Arrival stamp of each event of one sensor: the running maximum of its stamps, outliers left out, backward steps bridged.

    A stamp more than ``jump_ns`` ahead of the running maximum counts only if at least
    ``confirm - 1`` of the next ``confirm - 1`` stamps lie within ``jump_ns`` of it (a real
    forward step of the clock, as :mod:`har_models.data.clock` decides it); otherwise it
    is a lone outlier and arrives with the running maximum before it (the first events, with
    the first stamp that counts). A stamp more than ``jump_ns`` behind it with the same
    support is a backward step: no time passes at the step, and the events after it arrive
    at their own spacing from there (a replay of a clock that stepped back 120 s does not
    hand out 120 s of recording at once). Other stamps behind arrive with the running
    maximum. Input without such jumps gives exactly the running maximum.

    Parameters
    ----------
    t_ns : ndarray of shape (n,), int64, file order
    jump_ns, confirm : int
        As :class:`~har_models.data.resample.Resampler`.

    Returns
    -------
    ndarray of shape (n,), int64, non-decreasing
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

    Attributes
    ----------
    samples_delivered : int
        Raw events (acc + gyro) handed out so far.
    chunks_delivered : int
        :data:`SensorChunk` tuples handed out (one per sensor per batch).
    batches_delivered : int
        Wake-ups that delivered events (paced) or recording slices (unpaced).
    windows_emitted : int
        Windows the pipeline produced (counted by :meth:`ReplaySource.run` only).
    recording_s : float
        Recording time reached: arrival stamp of the newest delivered event minus the
        first one, seconds.
    lag_s : float
        Paced modes: wall-clock time at delivery of the latest batch minus the due time of
        its oldest event, seconds (>= 0): how far behind schedule the replay is, from
        oversleeping or a slow consumer. 0 when unpaced.
    max_lag_s : float
        Largest ``lag_s`` so far.
    mean_lag_s : float
        Mean ``lag_s`` over the batches delivered.
    elapsed_s : float
        Wall-clock seconds since the replay started.
    finished : bool
        All events were delivered.
    stopped : bool
        The replay ended early (stop event or ``max_wall_s``).
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
    """A recording replayed as a sensor driver: paced batches of timestamped events.

    Parameters
    ----------
    recording : Recording
        Acc (m/s^2) and gyro (rad/s) streams with ns timestamps, in arrival order.
    speed : float or None
        Recording seconds per wall-clock second (1.0 = real time, 50 Hz stays 50 Hz);
        None = as fast as possible.
    fast_batch_s : float
        Unpaced mode only: recording seconds per batch (default 1.0 s, i.e. about 50 events
        per sensor at 50 Hz).
    clock : callable returning float seconds
        Monotonic clock (default :func:`time.monotonic`); replaceable in tests.
    sleep : callable taking float seconds, optional
        How to wait when no stop event is given (default :func:`time.sleep`). With a stop
        event the wait is ``stop_event.wait(timeout)``, so a stop is seen at once.

    Raises
    ------
    ValueError
        If ``speed`` or ``fast_batch_s`` is not a positive finite number.

    Notes
    -----
    Iterating yields :data:`SensorChunk` tuples. Each batch holds every event due by the
    time the scheduler woke, split into one chunk per sensor, the sensor with the earlier
    event first; within a sensor, events keep their recorded order.
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
        """Yield the recording as :data:`SensorChunk` batches, paced by ``speed``.

        Parameters
        ----------
        stop_event : threading.Event, optional
            Set it (from any thread) to end the replay at the next batch boundary.
        max_wall_s : float, optional
            End the replay after this many wall-clock seconds; events due by then are
            still delivered.

        Yields
        ------
        (sensor, t_ns, xyz)
            ``sensor`` in {"acc", "gyro"}; t_ns (n,) int64 ns; xyz (n, 3) float64 in
            m/s^2 (acc) or rad/s (gyro).

        Notes
        -----
        :attr:`progress` is reset at the start and updated after every batch.
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
        """Feed the replay into ``pipeline`` and hand every non-empty window batch to ``on_windows``.

        Bounded: it returns when the recording ends, when ``stop_event`` is set, or after
        ``max_wall_s`` seconds, whichever comes first.

        Parameters
        ----------
        pipeline : SensorPipeline
            A fresh pipeline for this session.
        on_windows : callable taking a WindowSet, optional
            Called in this thread with each batch of windows, shape (k, 6, T).
        stop_event : threading.Event, optional
        max_wall_s : float, optional
        close : bool
            Close the pipeline at the end (also after a stop), flushing its last windows.

        Returns
        -------
        ReplayProgress
            A snapshot of the final counters.
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
    """All windows of ``recording`` replayed through a fresh :class:`SensorPipeline`.

    Equal (bit for bit) to :func:`~har_models.data.pipeline.windows_from_recording` in every
    mode; a convenience for simulations and tests.

    Parameters
    ----------
    recording : Recording
    labels : LabelSet
    speed : float or None
        As :class:`ReplaySource` (default as fast as possible).
    **pipeline_kwargs
        ``window``, ``step``, ``period_ns``, ``max_gap_ns``, ``reorder_ns``.

    Returns
    -------
    WindowSet
        x (N, 6, T) float32, y (N,), t_start_ns (N,).
    """
    parts: list[WindowSet] = []
    pipe = SensorPipeline(labels, recording.labels, **pipeline_kwargs)
    ReplaySource(recording, speed).run(pipe, parts.append)
    return WindowSet.concat(parts, labels)
