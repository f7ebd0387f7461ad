"""A stand-in for pyjnius on a phone: what the Android sensor source reaches through ``jnius.autoclass``.

The source asks ``autoclass`` for ``PythonService`` (its context), ``Context``, ``Sensor`` and
``SystemClock``, and subclasses ``PythonJavaClass`` for its listener; this module gives those, with
a ``SensorManager`` whose answers and events the test chooses (the phone's sensors are the
hardware mocked, behind the interface the real driver uses).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class Manager:
    """``SensorManager``: refuses the sensor type ``refuse`` (``registerListener`` answers false) and keeps the listener."""

    def __init__(self, refuse: int | None = None):
        self.refuse, self.unregistered = refuse, 0
        self.registered: list[tuple[int, int, int]] = []
        self.listener: Any = None

    def getDefaultSensor(self, typ: int) -> Any:  # noqa: N802 (Android's names)
        return types.SimpleNamespace(type=typ, getType=lambda: typ)

    def registerListener(self, listener: Any, sensor: Any, period_us: int, latency_us: int) -> bool:  # noqa: N802
        self.registered.append((sensor.type, period_us, latency_us))
        self.listener = listener
        return sensor.type != self.refuse

    def unregisterListener(self, listener: Any) -> None:  # noqa: N802
        self.unregistered += 1

    def emit(self, typ: int, stamp_ns: int, xyz: tuple[float, float, float] = (0.0, 0.0, 9.81)) -> None:
        """Deliver one ``SensorEvent`` to the registered listener, as Android's sensor thread does."""
        event = types.SimpleNamespace(sensor=self.getDefaultSensor(typ), timestamp=stamp_ns, values=list(xyz))
        self.listener.onSensorChanged(event)


def install(monkeypatch: Any, refuse: int | None = None, boot_ns: Any = None) -> Manager:
    """Put a ``jnius`` module in ``sys.modules`` (through ``monkeypatch``) and return its ``SensorManager``.

    ``boot_ns`` is what ``SystemClock.elapsedRealtimeNanos()`` answers (a callable); default 0.
    """
    manager = Manager(refuse)
    context = types.SimpleNamespace(getSystemService=lambda name: manager)
    classes = {
        "org.kivy.android.PythonService": types.SimpleNamespace(mService=context),
        "android.content.Context": types.SimpleNamespace(SENSOR_SERVICE="sensor"),
        "android.hardware.Sensor": types.SimpleNamespace(TYPE_ACCELEROMETER=1, TYPE_GYROSCOPE=4),
        "android.os.SystemClock": types.SimpleNamespace(elapsedRealtimeNanos=boot_ns or (lambda: 0)),
    }
    jnius = types.ModuleType("jnius")
    jnius.autoclass = classes.__getitem__  # type: ignore[attr-defined]
    jnius.PythonJavaClass = object  # type: ignore[attr-defined]
    jnius.java_method = lambda signature: (lambda fn: fn)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jnius", jnius)
    return manager
