"""Android accelerometer and gyroscope through ``SensorManager``, reached with pyjnius.

A ``SensorEventListener`` for ``TYPE_ACCELEROMETER`` (m/s^2, gravity included) and
``TYPE_GYROSCOPE`` (rad/s) at 20,000 µs (a hint to Android) only appends ``(type, timestamp, x,
y, z)``; a Python loop drains them every ``drain_s`` (:func:`events_to_chunks`, tested off the
phone). ``SensorEvent.timestamp`` is documented as the boot clock, but not every phone keeps to
it, so each sensor's time base is established from when its events arrive and mapped to the boot
clock (:mod:`har_models.data.timebase`). Source: Android developer reference
(``SensorManager.registerListener``, ``SensorEvent.timestamp``). ``jnius`` is imported only when
the source starts.
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
    """Listener events ``(type, timestamp_ns, x, y, z)`` in arrival order as one :data:`SensorChunk` per sensor.

    Other sensor types are ignored; the sensor whose first event came first leads; arrival order is
    kept (nothing sorted or dropped: that is the resampler's business). Raises ValueError if an
    event does not have five fields.
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

    ``max_report_latency_us``: batching allowed (0: each event at once; batches arrive only while
    the CPU is awake, so the foreground service holds a wake lock). At each drain the boot and wall
    clocks (``boot_clock_ns``, default :meth:`clock_ns`) establish each sensor's
    :class:`~har_models.data.timebase.StreamTimeBase`; one that cannot be established stops the source.

    Raises
    ------
    RuntimeError
        From :meth:`chunks` off Android (no ``jnius``) or without both sensors.
    SensorUnavailable
        From :meth:`chunks` when Android refuses a listener (kept in :attr:`error`, said by :meth:`fault`).
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
        """``SystemClock.elapsedRealtimeNanos()`` now (pyjnius): the events' clock, to tell a silent sensor from a quiet one."""
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
        """Fresh time bases of both sensors for a new listener, allowing for the batching latency (not the drain period)."""
        batching_ns = 1000 * self.max_report_latency_us
        return {name: StreamTimeBase(name, batching_ns=batching_ns) for name in ("acc", "gyro")}

    def on_boot_clock(self, events: Sequence[AndroidEvent]) -> list[SensorChunk]:
        """One drain's events as chunks with every sensor's stamps mapped to the boot clock (held while its base is established).

        Raises SensorUnavailable when a sensor's time base cannot be established (naming the sensor).
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
    """The Android context for system services (``autoclass``: ``jnius.autoclass``): the running service's (in the
    service's process), else the activity's (in the UI's), else None."""
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
