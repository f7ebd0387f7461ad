"""The sensor a client reads, named by one text: ``android``, ``mpu6050[:BUS[:ADDRESS]]`` or ``replay:SOURCE``.

Shared by ``fedhar-app`` and ``fedhar-record``; the drivers are imported only when named, so a
board without pyjnius or a phone without smbus2 can use the others.
"""

from __future__ import annotations

from edge_client.sensors.base import SensorSource
from har_models.data.labels import LabelSet


def make_source(spec: str, labels: LabelSet, speed: float | None = 1.0) -> SensorSource:
    """The sensor source named by ``spec``.

    Parameters
    ----------
    spec : str
        ``android``; ``mpu6050[:BUS[:ADDRESS]]`` (e.g. ``mpu6050:1:0x68``); or
        ``replay:SOURCE`` with a ``fedhar-client --source`` value (``hapt:PATH/user01.npz``),
        replayed in a loop.
    labels : LabelSet
        Checked against the replayed recordings' label set.
    speed : float or None
        Replay speed (1.0 = real time).

    Raises
    ------
    ValueError
        On an unknown kind, a bad bus or address, or a replay of another label set.
    """
    kind, _, rest = spec.partition(":")
    if kind == "android":
        from edge_client.sensors.android import AndroidSensorSource

        return AndroidSensorSource()
    if kind == "mpu6050":
        from edge_client.sensors.mpu6050 import Mpu6050Config, Mpu6050Source

        parts = [p for p in rest.split(":") if p]
        try:
            bus = int(parts[0]) if parts else 1
            addr = int(parts[1], 0) if len(parts) > 1 else 0x68
        except ValueError:
            raise ValueError(f"sensor {spec!r}: expected mpu6050[:BUS[:ADDRESS]], e.g. mpu6050:1:0x68") from None
        return Mpu6050Source(config=Mpu6050Config(address=addr), bus_number=bus)
    if kind == "replay":
        from edge_client.sensors.base import ReplaySensor
        from har_models.data.subjects import parse_source, recordings_of

        src = parse_source(rest)
        if src.labels != labels:
            raise ValueError(f"sensor {spec!r} replays label set {src.labels.name!r}, the app records {labels.name!r}")
        recs = recordings_of(src)
        if not recs:
            raise ValueError(f"sensor {spec!r}: no recordings found")
        return ReplaySensor(recs[0], speed=speed, loop=True)
    raise ValueError(f"sensor {spec!r}: expected android, mpu6050[:BUS[:ADDRESS]] or replay:SOURCE")
