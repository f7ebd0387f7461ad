"""Android accelerometer and gyroscope through ``SensorManager``, reached with pyjnius.

A ``SensorEventListener`` is registered for ``Sensor.TYPE_ACCELEROMETER`` (m/s^2, gravity
included) and ``Sensor.TYPE_GYROSCOPE`` (rad/s) with a sampling period of 20,000 µs
(50 Hz asked; Android treats it as a hint and may deliver faster, slower or in batches).
Each sample keeps its ``SensorEvent.timestamp``, documented as nanoseconds on the boot clock
(``SystemClock.elapsedRealtimeNanos()``), not the time the callback ran. The callback
only appends ``(type, timestamp, x, y, z)`` to a list; a Python loop drains the list
every ``drain_s`` seconds and converts it with :func:`events_to_chunks`, a pure function
tested off the phone. Not every phone keeps to the documented clock (some stamp with the wall
clock, or with a clock that paused in deep sleep, and not always the same for both sensors),
so each sensor's time base is established from when its events arrive and its stamps are
mapped to the boot clock before the pair is windowed (:mod:`har_models.data.timebase`).

Sources: Android developer reference, ``SensorManager.registerListener(SensorEventListener,
Sensor, int samplingPeriodUs, int maxReportLatencyUs)``, ``SensorEvent.timestamp``,
``Sensor.TYPE_ACCELEROMETER`` (1) and ``Sensor.TYPE_GYROSCOPE`` (4).

``jnius`` is imported only when the source starts, so this module imports anywhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from edge_client.sensors.base import SENSOR_WORDS, SensorSource, SensorUnavailable
from edge_client.sensors.replay import SensorChunk
from har_models.data.timebase import StreamTimeBase, TimeBaseRefused

log = logging.getLogger("fedhar.client.sensors.android")

TYPE_ACCELEROMETER = 1
"""``android.hardware.Sensor.TYPE_ACCELEROMETER``."""
TYPE_GYROSCOPE = 4
"""``android.hardware.Sensor.TYPE_GYROSCOPE``."""
SAMPLING_PERIOD_US = 20_000
"""Requested sampling period, microseconds (50 Hz)."""

_NAMES = {TYPE_ACCELEROMETER: "acc", TYPE_GYROSCOPE: "gyro"}

AndroidEvent = tuple[int, int, float, float, float]
"""``(sensor type, timestamp ns, x, y, z)``: what the listener keeps of one ``SensorEvent``."""


def events_to_chunks(events: Sequence[AndroidEvent]) -> list[SensorChunk]:
    """Convert listener events, in arrival order, into one :data:`SensorChunk` per sensor.

    Parameters
    ----------
    events : sequence of (type, timestamp_ns, x, y, z)
        ``type`` is the Android sensor type; ``timestamp_ns`` the event's own timestamp
        (boot clock, ns); x, y, z in m/s^2 (accelerometer) or rad/s (gyroscope). Events of
        other sensor types are ignored.

    Returns
    -------
    list of (sensor, t_ns (n,) int64, xyz (n, 3) float64)
        At most one chunk per sensor, the sensor whose first event came first leading;
        within a sensor the arrival order is kept (duplicates and out-of-order stamps are
        the resampler's business, so nothing is sorted or dropped here).

    Raises
    ------
    ValueError
        If an event does not have five fields.
    """
    if not events:
        return []
    arr = np.asarray(events, dtype=object)
    if arr.ndim != 2 or arr.shape[1] != 5:
        raise ValueError(f"events_to_chunks: expected (type, timestamp_ns, x, y, z) tuples, got an array of shape {arr.shape}")
    types = arr[:, 0].astype(np.int64)
    t = np.array([int(v) for v in arr[:, 1]], dtype=np.int64)  # exact: no float detour for 64-bit stamps
    xyz = arr[:, 2:].astype(np.float64)
    out: list[SensorChunk] = []
    present, first = np.unique(types, return_index=True)
    for typ in present[np.argsort(first)].tolist():
        name = _NAMES.get(int(typ))
        if name is None:
            continue
        sel = types == typ
        out.append((name, t[sel], xyz[sel]))
    return out


class AndroidSensorSource(SensorSource):
    """Accelerometer and gyroscope of the Android device this runs on.

    Parameters
    ----------
    sampling_period_us : int
        Period asked of Android (default 20,000 µs = 50 Hz).
    max_report_latency_us : int
        Batching latency allowed (0 = deliver each event at once). Batched events are
        only delivered while the CPU is awake: the foreground service holds a wake lock.
    drain_s : float
        How often the Python loop collects the buffered events (seconds).
    boot_clock_ns, wall_clock_ns : callables returning int, optional
        The boot clock (default :meth:`clock_ns`, ``elapsedRealtimeNanos``) and the wall clock
        (default ``time.time_ns``), read at each drain: each sensor's time base is established
        from them (:class:`~har_models.data.timebase.StreamTimeBase`) and its stamps are mapped to
        the boot clock before the two sensors are paired; a sensor whose base cannot be
        established stops the source with a :class:`SensorUnavailable` that says so.

    Raises
    ------
    RuntimeError
        From :meth:`chunks` when not running on Android (no ``jnius``) or when the device
        lacks one of the two sensors.
    SensorUnavailable
        From :meth:`chunks` when Android refuses to register a listener (``registerListener``
        returns false); kept in :attr:`error` and said by :meth:`fault`.
    """

    def __init__(
        self,
        sampling_period_us: int = SAMPLING_PERIOD_US,
        max_report_latency_us: int = 0,
        drain_s: float = 0.25,
        boot_clock_ns: Callable[[], int] | None = None,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ):
        super().__init__()
        if sampling_period_us <= 0 or max_report_latency_us < 0 or drain_s <= 0:
            raise ValueError(
                f"AndroidSensorSource: sampling_period_us ({sampling_period_us}) and drain_s ({drain_s}) must be > 0, "
                f"max_report_latency_us ({max_report_latency_us}) >= 0"
            )
        self.name = "android"
        self.sampling_period_us = int(sampling_period_us)
        self.max_report_latency_us = int(max_report_latency_us)
        self.drain_s = float(drain_s)
        self._events: list[AndroidEvent] = []
        self._lock = threading.Lock()
        self.boot_clock_ns = boot_clock_ns or self.clock_ns
        self.wall_clock_ns = wall_clock_ns
        self.time_bases: dict[str, StreamTimeBase] = {}

    @staticmethod
    def clock_ns() -> int:
        """The clock the events are stamped with, now: ``SystemClock.elapsedRealtimeNanos()`` (ns since boot).

        Lets the app tell a silent sensor (Doze, screen off) from a quiet one
        (:class:`~edge_client.freshness.SensingFreshness`). Needs pyjnius (on the phone).
        """
        from jnius import autoclass

        return int(autoclass("android.os.SystemClock").elapsedRealtimeNanos())

    def _append(self, event: AndroidEvent) -> None:
        with self._lock:
            self._events.append(event)

    def _drain(self) -> list[AndroidEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def new_time_bases(self) -> dict[str, StreamTimeBase]:
        """Fresh time bases of both sensors for a new listener (:class:`~har_models.data.timebase.StreamTimeBase`).

        They allow for the batching latency asked of Android; not for the drain period, which
        does not delay the newest event a drain collects (it was delivered just before the drain).
        """
        batching_ns = 1000 * self.max_report_latency_us
        return {name: StreamTimeBase(name, batching_ns=batching_ns) for name in ("acc", "gyro")}

    def on_boot_clock(self, events: Sequence[AndroidEvent]) -> list[SensorChunk]:
        """One drain's events as chunks with every sensor's stamps mapped to the boot clock (held while its base is established).

        The drain's arrival is the boot clock read now, its wall clock offset the wall clock read
        next; :attr:`time_bases` are the listener's (:meth:`new_time_bases`).

        Raises
        ------
        SensorUnavailable
            When a sensor's time base cannot be established (the message names the sensor).
        """
        arrival = int(self.boot_clock_ns())
        wall_minus_boot = int(self.wall_clock_ns()) - arrival
        out: list[SensorChunk] = []
        for name, t, xyz in events_to_chunks(events):
            try:
                t_boot, xyz_boot = self.time_bases[name].push(t, xyz, arrival, wall_minus_boot)
            except TimeBaseRefused as exc:
                raise SensorUnavailable(str(exc)) from exc
            if len(t_boot):
                out.append((name, t_boot, xyz_boot))
        return out

    def chunks(self, stop_event: threading.Event) -> Iterator[SensorChunk]:
        """Register the listener, yield buffered events every ``drain_s`` s, unregister on stop."""
        try:
            from jnius import autoclass
        except ImportError as exc:
            raise RuntimeError("AndroidSensorSource needs pyjnius on Android; use a replay or mpu6050 source elsewhere") from exc
        context = android_context(autoclass)
        if context is None:
            raise RuntimeError("no Android context (neither a running service nor an activity) to reach the sensors through")
        Context = autoclass("android.content.Context")
        Sensor = autoclass("android.hardware.Sensor")
        manager = context.getSystemService(Context.SENSOR_SERVICE)
        sensors = [manager.getDefaultSensor(Sensor.TYPE_ACCELEROMETER), manager.getDefaultSensor(Sensor.TYPE_GYROSCOPE)]
        if any(s is None for s in sensors):
            raise RuntimeError("this device lacks an accelerometer or a gyroscope; fedhar needs both")
        listener = _make_listener(self._append)  # kept referenced until unregistered
        for name, s in zip(("acc", "gyro"), sensors, strict=True):
            # registerListener answers false when the platform refuses (a rate it does not allow, a sensor it
            # withholds): a refused sensor is an error on the screen and in the status, never a silent stream.
            if not manager.registerListener(listener, s, self.sampling_period_us, self.max_report_latency_us):
                manager.unregisterListener(listener)
                raise SensorUnavailable(
                    f"Android refused to register the {SENSOR_WORDS[name]} listener at {self.sampling_period_us} µs "
                    f"(registerListener returned false); check the app's sensor permissions, then restart sensing"
                )
        log.info("android sensors registered at %d µs (latency %d µs)", self.sampling_period_us, self.max_report_latency_us)
        self.time_bases = self.new_time_bases()
        try:
            while not stop_event.wait(self.drain_s):
                yield from self.on_boot_clock(self._drain())
            yield from self.on_boot_clock(self._drain())
        finally:
            manager.unregisterListener(listener)
            log.info("android sensors unregistered")


def android_context(autoclass: Any) -> Any:
    """The Android context to reach system services with: the running service's, else the activity's, else None.

    In the foreground service's process (sensing, training) ``PythonService.mService`` is
    set and ``PythonActivity.mActivity`` is null; in the UI process it is the other way round.

    Parameters
    ----------
    autoclass : callable
        ``jnius.autoclass``.
    """
    try:
        service = autoclass("org.kivy.android.PythonService").mService
        if service is not None:
            return service
    except Exception:  # not running inside a python-for-android service
        pass
    try:
        return autoclass("org.kivy.android.PythonActivity").mActivity
    except Exception:  # no activity class in this process either
        return None


def _make_listener(append: Any) -> Any:
    """A pyjnius ``SensorEventListener`` that copies type, timestamp and the first three values."""
    from jnius import PythonJavaClass, java_method

    class _Listener(PythonJavaClass):
        __javainterfaces__ = ("android/hardware/SensorEventListener",)
        __javacontext__ = "app"

        @java_method("(Landroid/hardware/SensorEvent;)V")
        def onSensorChanged(self, event: Any) -> None:  # noqa: N802 (the Java interface's name)
            v = event.values
            append((int(event.sensor.getType()), int(event.timestamp), float(v[0]), float(v[1]), float(v[2])))

        @java_method("(Landroid/hardware/Sensor;I)V")
        def onAccuracyChanged(self, sensor: Any, accuracy: int) -> None:  # noqa: N802
            pass

    return _Listener()
