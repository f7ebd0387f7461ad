"""The one sensor-source interface: timestamped 3-axis samples per sensor, start and stop.

Every source (Android, an MPU-6050 on I2C, a replay) delivers
:data:`~edge_client.sensors.replay.SensorChunk` tuples ``(sensor, t_ns, xyz)``: ``"acc"`` (m/s^2,
gravity included) or ``"gyro"`` (rad/s), the sensor's own stamps in arrival order (they may
repeat or step back a little), ``(n, 3)`` float64. They go into
:class:`~har_models.data.pipeline.SensorPipeline`, so live devices and replays share one path.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from edge_client.sensors.replay import ReplaySource, SensorChunk
from har_io.threads import join_started
from har_models.data.recording import Recording

log = logging.getLogger("fedhar.client.sensors")

SENSORS = ("acc", "gyro")
"""Sensor names a source may deliver."""

SENSOR_WORDS = {"acc": "accelerometer", "gyro": "gyroscope"}

STALL_S = 10.0
"""Seconds without a sample after which a sensor counts as stopped (:meth:`SensorSource.fault`): five times the
longest gap the pipeline bridges, and far above any batching latency the sources ask for (0 to 1 s)."""


class SensorUnavailable(RuntimeError):
    """A sensor that cannot be used here, for a reason one sentence says (no bus device, no driver, refused); kept in
    :attr:`SensorSource.error` without a traceback."""


class SensorSource(ABC):
    """A source of timestamped accelerometer and gyroscope samples, ``name`` for logs and the app.

    Subclasses implement :meth:`chunks`, a blocking generator ending when its stop event is set (or
    the source runs dry); :meth:`start` runs it in a background thread.
    """

    name: str = "sensor"

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.stall_s = STALL_S
        self.host_clock: Callable[[], float] = time.monotonic
        self._started_at: float | None = None
        self._last_sample: dict[str, float] = {}  # sensor -> host time (s) its newest chunk with samples arrived

    @abstractmethod
    def chunks(self, stop_event: threading.Event) -> Iterator[SensorChunk]:
        """Yield :data:`SensorChunk` batches until ``stop_event`` is set or the source ends."""

    def open(self) -> None:
        """Acquire the sensor now, so a missing device is a :class:`SensorUnavailable` here, not in the thread (default:
        nothing; :meth:`start` works without it)."""
        return None

    def start(self, on_chunk: Callable[[SensorChunk], object], on_end: Callable[[], object] | None = None) -> None:
        """Deliver chunks to ``on_chunk`` (keep it short) from a background thread until :meth:`stop`; ``on_end`` runs
        there once the source ended or was stopped. RuntimeError if already running."""
        if self.running:
            raise RuntimeError(f"{self.name}: already running; stop() it first")
        self._stop = threading.Event()
        self.error = None
        self._started_at, self._last_sample = self.host_clock(), {}

        def loop() -> None:
            try:
                for chunk in self.chunks(self._stop):
                    if len(chunk[1]):
                        self._last_sample[chunk[0]] = self.host_clock()
                    on_chunk(chunk)
            except SensorUnavailable as exc:  # its sentence says it all; the holder of the source reports it
                self.error = exc
                log.debug("%s: sensor unavailable: %s", self.name, exc)
            except Exception as exc:  # reported, not raised into a dead thread
                self.error = exc
                log.exception("%s: sensor thread failed", self.name)
            finally:
                if on_end is not None:
                    on_end()

        self._thread = threading.Thread(target=loop, name=f"sensor-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the source to stop and wait up to ``timeout_s`` seconds for its thread."""
        self._stop.set()
        join_started(self._thread, timeout_s)
        self._thread = None

    def fault(self) -> str:
        """Why this source delivers no usable samples, in words for the screen and the status; "" when it does.

        A fault: the source failed or was refused (:attr:`error`); no sample in :attr:`stall_s` since it
        started; or one sensor silent for :attr:`stall_s` while the other goes on. Both silent after
        delivering is the OS withholding them (paused sensing, :class:`~edge_client.freshness.SensingFreshness`).
        """
        if self.error is not None:
            return f"sensor {self.name} failed: {self.error}"
        started = self._started_at
        if not self.running or started is None:
            return ""
        now = self.host_clock()
        if not self._last_sample:
            if now - started >= self.stall_s:
                return (f"sensor {self.name} has delivered no sample in the {now - started:.0f} s since it started: "
                        "the platform accepted it but sends nothing; restart sensing, or the device")  # fmt: skip
            return ""
        newest = max(self._last_sample.values())
        if now - newest >= self.stall_s:
            return ""  # everything is silent: paused by the OS, not a stopped listener
        for sensor in SENSORS:
            last = self._last_sample.get(sensor, started)
            if now - last >= self.stall_s:
                others = ", ".join(SENSOR_WORDS[s] for s in SENSORS if s != sensor)
                return (f"sensor {self.name}: the {SENSOR_WORDS[sensor]} has sent nothing for {now - last:.0f} s while the "
                        f"{others} goes on; its listener stopped: restart sensing")  # fmt: skip
        return ""

    @property
    def running(self) -> bool:
        """True while the background thread of :meth:`start` runs."""
        return self._thread is not None and self._thread.is_alive()


class ReplaySensor(SensorSource):
    """A recorded session replayed through the sensor interface; ``speed`` as :class:`ReplaySource`; with ``loop`` it
    starts again when it ends, each pass's stamps shifted past the previous one (the pipeline sees a gap)."""

    def __init__(self, recording: Recording, speed: float | None = 1.0, loop: bool = False):
        super().__init__()
        self.recording = recording
        self.speed = speed
        self.loop = loop
        self.name = f"replay {recording.subject}/{recording.session}"

    def chunks(self, stop_event: threading.Event) -> Iterator[SensorChunk]:
        """Yield the recording's events paced by ``speed`` (see :class:`~edge_client.sensors.replay.ReplaySource`)."""
        shift = 0
        rec = self.recording
        t_lo = min(int(rec.acc.t_ns.min()), int(rec.gyro.t_ns.min())) if len(rec.acc) and len(rec.gyro) else 0
        t_hi = max(int(rec.acc.t_ns.max()), int(rec.gyro.t_ns.max())) if len(rec.acc) and len(rec.gyro) else 0
        while not stop_event.is_set():
            for sensor, t, xyz in ReplaySource(rec, self.speed).chunks(stop_event):
                yield sensor, t + shift, xyz
            if not self.loop:
                return
            shift += t_hi - t_lo + 1_000_000_000  # one second of silence between passes
