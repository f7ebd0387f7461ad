"""What the app does, without the UI: sensing, recording, live prediction, taking part in the federation.

The Kivy screens (:mod:`edge_client.app.main`) only call :class:`DeviceController` and
show the views it reports. Everything slow runs in background threads: the sensor
thread (source -> recorder + live pipeline -> predictor), a federation supervisor thread
(charging state, starting and stopping the MQTT agent) and the agent's own thread.
Reports reach the UI through the callbacks given, which the app wraps with
``kivy.clock.Clock.schedule_once`` so widgets are touched only on the UI thread.

Nothing here imports Kivy or PyTorch at module level: the same controller runs in the
Android foreground service, on a Raspberry Pi and in tests.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_client.app.predictor import Predictor, load_predictor
from edge_client.power import is_charging
from edge_client.recorder import RECORDED_LOG, Recorder, sync_to_store
from edge_client.sensors.base import SensorSource
from edge_client.sensors.replay import SensorChunk
from edge_client.store import ClientStore
from edge_client.window_log import WindowLog
from har_models.data.labels import LabelSet
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack
from har_models.wire import codec

log = logging.getLogger("fedhar.app")

MIN_TRAIN_WINDOWS = 10
"""Fewest recorded training windows before the device offers to take part."""


@dataclass
class LiveView:
    """What the Live screen shows.

    Attributes
    ----------
    activity : str or None
        Predicted activity of the newest window (None: no model or no window yet).
    confidence : float
        Its probability, 0..1.
    windows : int
        Windows predicted since sensing started (one per 1.28 s hop).
    t_start_ns : int
        Start of the newest window, in the sensor's time base.
    note : str
        Why there is no prediction, when there is none.
    """

    activity: str | None = None
    confidence: float = 0.0
    windows: int = 0
    t_start_ns: int = 0
    note: str = "waiting for the first window (2.56 s)"


@dataclass
class FederationView:
    """What the Federation screen shows.

    Attributes
    ----------
    broker : str
        ``host:port``.
    state : str
        "off", "waiting for charger", "not enough data", "connecting", "connected",
        "training", "disconnected".
    round : int or None
        Current round announced by the coordinator (or the last one this device answered).
    last_accuracy : float or None
        Accuracy of the last locally trained model on this device's test windows, 0..1.
    take_part, charge_only, charging : bool
    """

    broker: str = "127.0.0.1:1883"
    state: str = "off"
    round: int | None = None
    last_accuracy: float | None = None
    take_part: bool = False
    charge_only: bool = True
    charging: bool = True


@dataclass
class AppConfig:
    """Settings of the app on one device.

    Parameters
    ----------
    state_dir : Path
        The device's store (windows, model, recorded log); survives restarts.
    labels : LabelSet
        Activities the owner can record.
    client_id : str
        The device's id in the federation (its MQTT user name).
    broker : str
        ``host:port`` of the broker.
    federation : str
        Federation name (topic prefix).
    max_windows : int
        Bound of the recorded-window log (see :class:`~edge_client.window_log.WindowLog`).
    split_seed : int
        Seed of the 80/20 split of recorded windows.
    username, password_file, tls_ca : optional
        Broker credentials, as ``fedhar-client`` takes them.
    """

    state_dir: Path
    labels: LabelSet
    client_id: str
    broker: str = "127.0.0.1:1883"
    federation: str = "default"
    max_windows: int = 20_000
    split_seed: int = 1
    username: str | None = None
    password_file: Path | None = None
    tls_ca: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class DeviceController:
    """The device's app logic.

    Parameters
    ----------
    cfg : AppConfig
    source : SensorSource
        Where samples come from (Android, MPU-6050, replay).
    on_live, on_counts, on_federation : callables, optional
        Called from background threads with a :class:`LiveView`, the counts per activity
        (dict), or a :class:`FederationView`.
    predictor_loader : callable
        Store -> predictor or None (default :func:`~edge_client.app.predictor.load_predictor`).
    charging : callable returning bool
        Charging state (default :func:`~edge_client.power.is_charging`).
    supervise_s : float
        How often the federation supervisor looks at the charging state and the agent.
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
    ):
        self.cfg = cfg
        self.source = source
        self.store = ClientStore(cfg.state_dir, cfg.labels)
        self.window_log = WindowLog(cfg.state_dir / RECORDED_LOG, cfg.labels, max_windows=cfg.max_windows)
        self.recorder = Recorder(self.window_log)
        self._on_live = on_live or (lambda v: None)
        self._on_counts = on_counts or (lambda c: None)
        self._on_federation = on_federation or (lambda v: None)
        self._predictor_loader = predictor_loader
        self._charging = charging
        self._supervise_s = supervise_s
        self._live_pipe = SensorPipeline(cfg.labels, LabelTrack.constant(0))  # every window kept, label unused
        self._predictor: Predictor | None = None
        self._model_mtime: float | None = None
        self.live = LiveView()
        self.federation = FederationView(broker=cfg.broker)
        self._fed_lock = threading.Lock()
        self._agent: Any = None
        self._agent_thread: threading.Thread | None = None
        self._agent_stop = threading.Event()
        self._closing = threading.Event()
        self._wake_event = threading.Event()
        self._n_train = len(self.store.windows("train"))
        self._last_update: tuple[float, int | None, float | None] | None = None  # (mtime, round, accuracy)
        self._supervisor = threading.Thread(target=self._supervise, name="federation-supervisor", daemon=True)
        self._supervisor.start()
        self._refresh_federation()

    # -- sensing ---------------------------------------------------------------------------
    def start_sensing(self) -> None:
        """Start the sensor thread (no-op if it runs)."""
        if not self.source.running:
            self._live_pipe = SensorPipeline(self.cfg.labels, LabelTrack.constant(0))
            self.source.start(self._on_chunk, on_end=self._on_source_end)

    def stop_sensing(self) -> None:
        """Stop the sensor thread."""
        self.source.stop()

    def _on_source_end(self) -> None:
        self.recorder.flush()
        self._on_counts(self.recorder.counts())

    def _on_chunk(self, chunk: SensorChunk) -> None:
        recorded = self.recorder.push(chunk)
        if len(recorded):
            self._on_counts(self.recorder.counts())
        live = self._live_pipe.push(*chunk)
        if len(live):
            self._predict(live.x[-1:], int(live.t_start_ns[-1]) if live.t_start_ns is not None else 0, len(live))

    def _current_predictor(self) -> Predictor | None:
        path = self.store.folder / "local_model.safetensors"
        mtime = path.stat().st_mtime if path.exists() else None
        if mtime != self._model_mtime:  # a round finished (or the first model arrived): reload
            self._model_mtime = mtime
            self._predictor = self._predictor_loader(self.store) if mtime is not None else None
        return self._predictor

    def _predict(self, x: np.ndarray, t_start_ns: int, n_new: int) -> None:
        pred = self._current_predictor()
        view = replace(self.live, windows=self.live.windows + n_new, t_start_ns=t_start_ns)
        if pred is None:
            view.activity, view.confidence = None, 0.0
            view.note = "no model yet: take part in a federation round first"
        else:
            p = pred.predict(x)[0]
            k = int(np.argmax(p))
            view.activity, view.confidence, view.note = self.cfg.labels.names[k], float(p[k]), ""
        self.live = view
        self._on_live(view)

    # -- recording -------------------------------------------------------------------------
    def start_recording(self, activity: str) -> None:
        """Label what follows as ``activity`` (starts sensing if needed).

        Raises
        ------
        KeyError
            For an activity outside the label set.
        """
        self.recorder.start(activity)
        self.start_sensing()

    def stop_recording(self) -> None:
        """Stop labelling; the recorded windows become training data in the background."""
        self.recorder.stop()
        threading.Thread(target=self._sync, name="sync-store", daemon=True).start()

    def _sync(self) -> None:
        n_train, n_test = sync_to_store(self.window_log, self.store, self.cfg.split_seed)
        self._n_train = n_train
        log.info("recorded windows in the store: %d training, %d test", n_train, n_test)
        self._on_counts(self.recorder.counts())

    def counts(self) -> dict[str, int]:
        """Recorded windows per activity."""
        return self.recorder.counts()

    # -- federation ------------------------------------------------------------------------
    def set_take_part(self, on: bool) -> None:
        """Allow or forbid taking part in federated rounds (the supervisor acts within ``supervise_s``)."""
        with self._fed_lock:
            self.federation.take_part = on
        self._wake()

    def set_charge_only(self, on: bool) -> None:
        """Train only while the device charges."""
        with self._fed_lock:
            self.federation.charge_only = on
        self._wake()

    def set_broker(self, host_port: str) -> None:
        """Use another broker (``host:port``); a running agent is restarted.

        Raises
        ------
        ValueError
            If the address is not ``host:port`` with a port in 1..65535.
        """
        broker = parse_broker(host_port)
        with self._fed_lock:
            self.cfg = replace(self.cfg, broker=broker)
            self.federation.broker = self.cfg.broker
        self._stop_agent()
        self._wake()

    def _wake(self) -> None:
        self._refresh_federation()
        self._wake_event.set()

    def _supervise(self) -> None:
        while not self._closing.is_set():
            try:
                self._supervise_once()
            except Exception:  # the supervisor must outlive any one failure
                log.exception("federation supervisor")
            self._wake_event.wait(self._supervise_s)
            self._wake_event.clear()

    def _supervise_once(self) -> None:
        charging = bool(self._charging())
        with self._fed_lock:
            self.federation.charging = charging
            want = self.federation.take_part and (charging or not self.federation.charge_only)
        running = self._agent_thread is not None and self._agent_thread.is_alive()
        if want and not running:
            self._start_agent()
        elif not want and running:
            self._stop_agent()
        self._refresh_federation()

    def _start_agent(self) -> None:
        n_train, _ = sync_to_store(self.window_log, self.store, self.cfg.split_seed)
        self._n_train = n_train
        if n_train < MIN_TRAIN_WINDOWS:
            return
        from edge_client.agent import ClientConfig, EdgeAgent
        from edge_client.backends.factory import choose_backend
        from har_io.mqtt_link import BrokerConfig

        host, _, port = self.cfg.broker.rpartition(":")
        password = self.cfg.password_file.read_text().strip() if self.cfg.password_file else None
        tls_ca = str(self.cfg.tls_ca) if self.cfg.tls_ca else None
        broker = BrokerConfig(host=host, port=int(port), username=self.cfg.username, password=password, tls_ca=tls_ca)
        backend, why = choose_backend()  # the choice of fedhar-client: the best backend installed on this device
        log.info("training backend: %s (%s)", backend, why)
        agent = EdgeAgent(
            ClientConfig(client_id=self.cfg.client_id, broker=broker, federation=self.cfg.federation, backend=backend), self.store
        )
        self._agent_stop = stop = threading.Event()
        self._agent = agent
        self._agent_thread = threading.Thread(target=agent.run, args=(stop,), name="mqtt-agent", daemon=True)
        self._agent_thread.start()
        log.info("taking part in federation %s at %s as %s", self.cfg.federation, self.cfg.broker, self.cfg.client_id)

    def _stop_agent(self) -> None:
        self._agent_stop.set()
        t = self._agent_thread
        if t is not None and t is not threading.current_thread():
            t.join(30)
        self._agent_thread = None
        self._agent = None

    def _refresh_federation(self) -> None:
        with self._fed_lock:
            v = self.federation
            agent = self._agent
            running = self._agent_thread is not None and self._agent_thread.is_alive()
            if not v.take_part:
                v.state = "off"
            elif v.charge_only and not v.charging:
                v.state = "waiting for charger"
            elif not running:
                v.state = "not enough data" if self._n_train < MIN_TRAIN_WINDOWS else "connecting"
            elif not agent._link.connected.is_set():
                v.state = "connecting" if agent.announcement is None else "disconnected"
            else:
                v.state = "training" if agent._state == "training" else "connected"
            if agent is not None and agent.announcement is not None:
                v.round = int(agent.announcement.round)
            last_round, v.last_accuracy = self._last_update_info()
            if v.round is None:
                v.round = last_round
            view = replace(v)
        self._on_federation(view)

    def _last_update_info(self) -> tuple[int | None, float | None]:
        """Round and local accuracy of the last update sent (re-read only when its file changes)."""
        path = self.store.folder / "last_update.bin"
        mtime = path.stat().st_mtime if path.exists() else None
        if mtime is None:
            return None, None
        if self._last_update is None or self._last_update[0] != mtime:
            last = self.store.load_last_update()
            if last is None:
                return None, None
            self._last_update = (mtime, int(last[0]["round"]), _trained_accuracy(last[1]))
        return self._last_update[1], self._last_update[2]

    def close(self) -> None:
        """Stop every thread and close the store."""
        self._closing.set()
        self._wake_event.set()
        self.stop_sensing()
        self._stop_agent()
        self._supervisor.join(10)
        self.store.close()


def parse_broker(host_port: str) -> str:
    """``"host:port"`` normalised.

    Raises
    ------
    ValueError
        If the address is not ``host:port`` with a port in 1..65535.
    """
    host, sep, port = host_port.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"broker address {host_port!r} is not HOST:PORT (e.g. 192.168.1.10:1883)")
    return f"{host}:{int(port)}"


def _trained_accuracy(envelope: bytes) -> float | None:
    """Accuracy on the local test windows of the model in an update envelope (its confusion matrix)."""
    try:
        cm = codec.peek_header(envelope).get("meta", {}).get("confusion", {}).get("trained")
    except codec.EnvelopeError:
        return None
    if not cm:
        return None
    m = np.asarray(cm, dtype=np.float64)
    return float(np.trace(m) / m.sum()) if m.sum() else None


def default_data_dir() -> Path:
    """The platform's folder for app data: the app's private storage on Android, else ``$XDG_DATA_HOME`` or ~/.local/share."""
    try:
        from android.storage import app_storage_path  # python-for-android only

        return Path(app_storage_path())
    except ImportError:
        return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
