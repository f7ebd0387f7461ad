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
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_client.app.predictor import Predictor, load_predictor
from edge_client.cost import ROUND_COST_KEY, CostMeter, cost_words
from edge_client.freshness import SensingFreshness, SensingHealthMeter
from edge_client.leave import LeaveOutcome, announce_leaving, delete_federation_state
from edge_client.power import battery_percent, is_charging
from edge_client.recorder import RECORDED_LOG, Recorder, sync_to_store
from edge_client.sensors.base import SensorSource
from edge_client.sensors.replay import SensorChunk
from edge_client.sent_log import SENT_KEY
from edge_client.store import ClientStore
from edge_client.timeline import guidance
from edge_client.timeline_store import TIMELINE_FILE, TimelineStore
from edge_client.window_log import WindowLog
from har_io.enrolment import EnrolmentBundle, read_bundle
from har_io.exit_codes import Exit
from har_models.data.labels import LabelSet
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack
from har_models.files import atomic_write_bytes
from har_models.wire import codec
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.app")

MIN_TRAIN_WINDOWS = 10
"""Fewest recorded training windows before the device offers to take part."""

TRAIN_FRACTION = 0.8
"""Share of the recorded windows that become training windows (the rest are the local test set)."""

APP_BACKENDS = ("auto", "torch", "executorch", "executorch-android", "numpy")
"""Training backends the app's settings may name; "auto" leaves the choice to the client."""

BATTERY_READ_S = 60.0
"""Seconds between two readings of the battery level (a JNI call on Android, a sysfs file on Linux)."""

BACKOFF_FIRST_S = 2.0
"""Wait before restarting an agent that failed the first time (seconds); doubled after each failure."""
BACKOFF_MAX_S = 300.0
"""Longest wait between two restarts of a failing agent (seconds)."""

PASSWORD_FILE = "credentials/mqtt.password"
"""Where the app keeps the broker password, relative to its private folder (mode 0600, folder 0700)."""

CREDENTIALS_DIR = "credentials"
"""The app's folder of secrets and certificates, relative to its private folder (mode 0700): the password and an enrolled CA."""
ENROLLED_MARK = "credentials/enrolled"
"""Present while the stored password came from an enrolment bundle (a typed password removes it): a refused login
then asks for a new bundle, since nobody on the device typed anything to check."""

EXIT_BROKER_REFUSED = Exit.BROKER_REFUSED
EXIT_DUPLICATE_ID = Exit.DUPLICATE_ID
"""Exit codes of :meth:`edge_client.agent.EdgeAgent.run` (from :mod:`har_io.exit_codes`: the agent module is imported later)."""


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
    note: str = "waiting for the first 3 seconds of movement"


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
    client_id, federation : str
        Who the device is and which federation it joins.
    username : str or None
        Broker user name (None: anonymous).
    password_set : bool
        Whether a password is stored (the password itself is never part of a view).
    tls_ca : str or None
        CA certificate file; None: no TLS.
    backend : str
        Training backend asked for (one of :data:`APP_BACKENDS`).
    error : str
        Why the device does not train or connect, in words ("" when nothing is wrong):
        a refused login, a certificate the CA did not sign, an unreachable broker, too few
        windows, a missing backend.
    restarts : int
        Times the agent was started again after a failure since the settings last changed.
    retry_in_s : float or None
        Seconds until the next restart of a failed agent (None: none pending).
    sent : list of dict
        What left the device, round by round (:mod:`edge_client.sent_log`), oldest first.
    cost : list of str
        What sensing and rounds cost the device, and the battery's drain, in words
        (:func:`edge_client.cost.cost_words`).
    """

    broker: str = "127.0.0.1:1883"
    state: str = "off"
    round: int | None = None
    last_accuracy: float | None = None
    take_part: bool = False
    charge_only: bool = True
    charging: bool = True
    client_id: str = ""
    federation: str = "default"
    username: str | None = None
    password_set: bool = False
    tls_ca: str | None = None
    backend: str = "auto"
    error: str = ""
    restarts: int = 0
    retry_in_s: float | None = None
    sent: list[dict[str, Any]] = field(default_factory=list)
    cost: list[str] = field(default_factory=list)


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
        Broker credentials, as ``fedhar-client`` takes them (the password is read from its
        file when the agent starts, never kept in the settings).
    backend : str
        Training backend, one of :data:`APP_BACKENDS` ("auto": the client's own choice).
    timeline_days : float
        Days the recognised timeline and the corrections are kept (90).
    raw_days : float
        Days the raw samples behind the timeline are kept: how long a stretch can be corrected
        into training windows (2; about 100 MB a day of sensing).
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
    backend: str = "auto"
    timeline_days: float = 90.0
    raw_days: float = 2.0
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
    clock : callable returning float
        Monotonic seconds (replaceable in tests of the restart back-off).
    battery : callable returning float or None
        Battery level in percent, None where the platform reports none (default
        :func:`~edge_client.power.battery_percent`); read at most every :data:`BATTERY_READ_S`.
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
        self._battery_read_at = -float("inf")
        self._wall_offset_ns: int | None = None  # wall clock minus sensor clock, fixed at the first window
        self._last_wall_ns = -(2**62)
        self._on_live = on_live or (lambda v: None)
        self._on_counts = on_counts or (lambda c: None)
        self._on_federation = on_federation or (lambda v: None)
        self._predictor_loader = predictor_loader
        self._charging = charging
        self._supervise_s = supervise_s
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
        self._fed_lock = threading.Lock()
        self._clock = clock
        self._failures = 0  # consecutive failed agent runs since the settings changed or the agent last connected
        self._settings_generation = 0  # counts changes of the federation settings
        self._agent_generation = 0  # the generation the running (or last) agent was started with
        self._retry_at = 0.0  # clock time before which a failed agent is not started again
        self._error = ""
        self._agent_exc: BaseException | None = None
        self._agent_since = 0.0
        self._agent: Any = None
        self._agent_thread: threading.Thread | None = None
        self._agent_stop = threading.Event()
        self._closing = threading.Event()
        self._wake_event = threading.Event()
        self._last_update: tuple[tuple[int, int, int], int | None, float | None] | None = None  # (file identity, round, accuracy)
        self._sensor_fault = ""
        self.store.fault_listeners.append(lambda _fault: self._wake_event.set())  # the screen shows a storage fault at once
        self._supervisor = threading.Thread(target=self._supervise, name="federation-supervisor", daemon=True)
        self._supervisor.start()
        self._refresh_federation()

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
        """Window starts on the wall clock: the sensor's stamps plus one offset, fixed at the first window.

        One fixed offset keeps the timeline's spacing that of the sensor clock (a replay at 25x
        shows the recording's own durations); it is taken again when a mapped time would lie
        before the newest stored one (the sensor clock stepped back, the service restarted).
        """
        t = np.asarray(t_sensor_ns, np.int64)
        if self._wall_offset_ns is None or int(t[0]) + self._wall_offset_ns <= self._last_wall_ns:
            self._wall_offset_ns = time.time_ns() - int(t[-1]) - 2_560_000_000  # the newest window ended just now
            self._wall_offset_ns = max(self._wall_offset_ns, self._last_wall_ns + 1 - int(t[0]))
        wall = t + self._wall_offset_ns
        self._last_wall_ns = int(wall[-1])
        return wall

    # -- timeline and corrections --------------------------------------------------------
    def relabel(self, start_ns: int, end_ns: int, activity: str) -> int:
        """Relabel a stretch of the timeline as ``activity``; its raw samples become training windows.

        The windows join the recorded-window log (the recorder's own) and the store's training
        windows, so the next round trains on them.

        Returns
        -------
        int
            Windows made from the stretch (0 when its raw samples are older than ``raw_days``).

        Raises
        ------
        KeyError
            For an activity outside the label set.
        """
        ws = self.timeline.relabel(start_ns, end_ns, activity)
        if len(ws):
            self.window_log.append(ws)
            self._sync()
        log.info("relabelled %.1f min as %s: %d training windows", (end_ns - start_ns) / 60e9, activity, len(ws))
        return len(ws)

    def guidance(self) -> list[str]:
        """What to record next, in words (:func:`~edge_client.timeline.guidance`)."""
        return guidance(self.counts())

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
        log.info("recorded windows in the store: %d training, %d test", n_train, n_test)
        self._on_counts(self.recorder.counts())

    def counts(self) -> dict[str, int]:
        """Recorded windows per activity."""
        return self.recorder.counts()

    # -- federation ------------------------------------------------------------------------
    def set_take_part(self, on: bool) -> None:
        """Allow or forbid taking part in federated rounds (the supervisor acts within ``supervise_s``).

        Switching it on tries at once, whatever the back-off of earlier failures.
        """
        with self._fed_lock:
            if on and not self.federation.take_part:
                self._failures, self._retry_at, self._error = 0, 0.0, ""
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
        self.set_federation(broker=host_port)

    def set_federation(self, **fields: Any) -> None:
        """Change how the device joins its federation; a running agent is restarted with the new settings.

        Parameters
        ----------
        **fields
            Any of ``client_id``, ``broker``, ``federation``, ``username``, ``password``,
            ``password_file``, ``tls_ca``, ``backend`` (see :func:`federation_fields`). A
            ``password`` is written to the app's private folder (:func:`store_password`)
            and only its file is kept.

        Raises
        ------
        ValueError
            For a field that is not valid (the message names it and the fix); nothing is
            changed then.
        """
        changes = federation_fields(self.cfg.state_dir, fields)
        with self._fed_lock:
            self.cfg = replace(self.cfg, **changes)
            keep = {k: getattr(self.federation, k) for k in ("state", "round", "last_accuracy", "take_part", "charge_only", "charging")}
            self.federation = replace(settings_view(self.cfg), **keep)
            self._failures, self._retry_at, self._error = 0, 0.0, ""  # new settings: try at once
            self._settings_generation += 1  # an agent of the old settings that ends now is no failure of the new ones
        self._stop_agent()
        self._wake()

    def enrol(self, source: str | Path, ca_file: str | Path | None = None) -> EnrolmentBundle:
        """Join the federation an enrolment bundle names: every Federation field from the bundle.

        Parameters
        ----------
        source : str or Path
            The bundle's file, or its JSON text (pasted, or scanned from its QR code).
        ca_file : path, optional
            The CA certificate for a bundle that names its CA by fingerprint only (a scanned QR
            code of a large CA); default: the CA already set, if any.

        Returns
        -------
        EnrolmentBundle
            The bundle taken (for the screen: coordinator, federation, client id).

        Raises
        ------
        har_io.enrolment.EnrolmentRefused
            For a refused bundle, its ``reason`` named in the message; nothing is changed then.
        OSError
            If the bundle's file cannot be read.
        """
        return enrol(self, source, ca_file)

    def leave(self, forget: bool) -> LeaveOutcome:
        """Leave the federation: stop taking part, tell the server, delete what joined this device to it.

        The agent is stopped first; then the device's own broker account publishes its leaving
        status (:func:`edge_client.leave.announce_leaving`, "forget" when ``forget``); then the
        broker password, the enrolled CA and the local model with its training state are
        deleted (:func:`edge_client.leave.delete_federation_state`) and the settings go back to
        a device that never joined (the client id and backend stay). Recorded windows and the
        timeline stay. Blocks while the broker is asked (at most twice
        :data:`edge_client.leave.CONNECT_WAIT_S` seconds: the login, then the acknowledgement): call
        it off the UI thread.

        Parameters
        ----------
        forget : bool
            Also ask the server's operator to delete what the server holds of this device.

        Returns
        -------
        LeaveOutcome
            Whether the server was told (and why not), and what was deleted.

        Raises
        ------
        OSError
            If the credentials or the model cannot be deleted (the agent is stopped already).
        """
        with self._fed_lock:
            self.federation.take_part = False
        self._stop_agent()
        cfg = self.cfg
        told, why = False, "no broker account is set"
        if cfg.username or cfg.password_file or cfg.tls_ca:
            try:
                from har_io.broker_config import BrokerConfig

                host, _, port = cfg.broker.rpartition(":")
                password = cfg.password_file.read_text().strip() if cfg.password_file and cfg.password_file.is_file() else None
                broker = BrokerConfig(host=host, port=int(port), username=cfg.username, password=password,
                                      tls_ca=str(cfg.tls_ca) if cfg.tls_ca else None, enrolled=enrolled(cfg.state_dir))  # fmt: skip
            except (OSError, ValueError) as exc:
                why = f"the server was not told: {exc}"
            else:
                not_told = announce_leaving(broker, cfg.federation, cfg.client_id, forget)
                told, why = not_told is None, not_told or ""
        deleted = delete_federation_state(self.store, cfg.state_dir / CREDENTIALS_DIR)
        with self._fed_lock:
            self.cfg = replace(cfg, broker=AppConfig.broker, federation=AppConfig.federation, username=None, password_file=None,
                               tls_ca=None)  # fmt: skip
            self.federation = replace(settings_view(self.cfg), charge_only=self.federation.charge_only, charging=self.federation.charging)
            self._failures, self._retry_at, self._error = 0, 0.0, ""
            self._last_update = None
        log.warning("left the federation %s as %s%s; deleted: %s", cfg.federation, cfg.client_id,
                    " and asked to be forgotten" if forget and told else "", ", ".join(deleted) or "nothing")  # fmt: skip
        self._wake()
        return LeaveOutcome(forget=forget, told=told, not_told="" if told else why, deleted=tuple(deleted))

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
        if self._clock() - self._battery_read_at >= BATTERY_READ_S:
            self._battery_read_at = self._clock()
            self.cost.note_battery(self._battery(), charging)
        with self._fed_lock:
            self.federation.charging = charging
            want = self.federation.take_part and (charging or not self.federation.charge_only)
        running = self._agent_thread is not None and self._agent_thread.is_alive()
        if not running and self._agent is not None:
            self._agent_ended()
        if running:
            self._watch_agent()
        if want and not running and self._clock() >= self._retry_at:
            self._start_agent()
        elif not want and running:
            self._stop_agent()
        self._refresh_federation()

    def _fail(self, error: str) -> None:
        """Note a failed start or run: show ``error`` and wait longer before the next try (exponential back-off)."""
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0**self._failures)
        self._failures += 1
        self._retry_at = self._clock() + delay
        if error != self._error:
            log.warning("federation: %s; next try in %.0f s", error, delay)
        self._error = error

    def _agent_ended(self) -> None:
        """The agent's thread returned on its own: say why, and schedule its restart with back-off."""
        agent, exc = self._agent, self._agent_exc
        self._agent, self._agent_thread, self._agent_exc = None, None, None
        code = getattr(agent, "exit_code", 0)
        if self._agent_generation != self._settings_generation:
            return  # it ran with settings changed since: its end says nothing of the new ones, which start afresh
        if exc is not None:
            self._fail(f"the training agent stopped: {type(exc).__name__}: {exc}")
        elif code == EXIT_DUPLICATE_ID:
            self._fail(f"another device already takes part as {self.cfg.client_id!r}: give this one its own client id")
        elif code:
            self._fail(connection_cause(agent, self.cfg) or f"the training agent stopped with exit code {code}")
        elif self.federation.take_part and not self._closing.is_set():
            self._fail("the training agent stopped")

    def _watch_agent(self) -> None:
        """A running agent: clear the error once it is connected, else find out why it is not (at most every few seconds)."""
        agent = self._agent
        if agent is None:
            return
        if agent.connection.connected:
            self._failures, self._error = 0, ""
            return
        cause = connection_cause(agent, self.cfg)
        if cause is not None:
            self._error = cause

    def _start_agent(self) -> None:
        n_train, _ = sync_to_store(self.window_log, self.store, self.cfg.split_seed)
        if n_train < MIN_TRAIN_WINDOWS:
            self._error = not_enough_data(n_train)
            return
        if self._error.startswith("nothing to train on"):
            self._error = ""
        cfg = self.cfg
        try:
            from edge_client.agent import ClientConfig, EdgeAgent
            from edge_client.backends.factory import choose_backend, missing_runtimes
            from har_io.broker_config import BrokerConfig

            missing = () if cfg.backend == "auto" else missing_runtimes(cfg.backend)
            if missing:
                raise ImportError(f"No module named {missing[0]!r}", name=missing[0])
            # The choice of fedhar-client: the best backend installed on this device, unless the settings name one.
            backend, why = choose_backend(None if cfg.backend == "auto" else cfg.backend)
            log.info("training backend: %s (%s)", backend, why)

            host, _, port = cfg.broker.rpartition(":")
            password = cfg.password_file.read_text().strip() if cfg.password_file else None
            tls_ca = str(cfg.tls_ca) if cfg.tls_ca else None
            broker = BrokerConfig(host=host, port=int(port), username=cfg.username, password=password, tls_ca=tls_ca,
                                  enrolled=enrolled(cfg.state_dir))  # fmt: skip
            agent = EdgeAgent(ClientConfig(client_id=cfg.client_id, broker=broker, federation=cfg.federation, backend=backend), self.store)
        except ImportError as exc:
            self._fail(missing_backend(cfg.backend, exc))
            return
        except (OSError, ValueError) as exc:
            self._fail(f"cannot start the training agent: {exc}")
            return
        self._agent_stop = stop = threading.Event()
        self._agent = agent
        if self.freshness is not None:
            agent.sensing = self.freshness.state
        agent.sensing_health = self.health.snapshot
        agent.cost = self.cost  # sensing's CPU and the battery measured here, the rounds there: one set of figures in the status
        agent.fault = self.source.fault  # a refused or stopped sensor, in the status (the store's own fault is added there)
        agent.charging = lambda: self.federation.charging  # as the supervisor last read it (no OS call from the agent's threads)
        self._agent_since = self._clock()
        self._agent_generation = self._settings_generation
        if self._failures:
            with self._fed_lock:
                self.federation.restarts += 1
        self._agent_thread = threading.Thread(target=self._run_agent, args=(agent, stop), name="mqtt-agent", daemon=True)
        self._agent_thread.start()
        log.info("taking part in federation %s at %s as %s", cfg.federation, cfg.broker, cfg.client_id)

    def _run_agent(self, agent: Any, stop: threading.Event) -> None:
        try:
            agent.run(stop)
        except Exception as exc:  # shown on the screen and restarted with back-off, never a silent death
            log.exception("training agent")
            self._agent_exc = exc

    def _stop_agent(self) -> None:
        self._agent_stop.set()
        t = self._agent_thread
        if t is not None and t is not threading.current_thread():
            t.join(30)
        self._agent_thread = None
        self._agent = None
        self._agent_exc = None

    def _refresh_federation(self) -> None:
        with self._fed_lock:
            v = self.federation
            agent = self._agent
            running = self._agent_thread is not None and self._agent_thread.is_alive()
            wait = self._retry_at - self._clock()
            v.retry_in_s = round(wait, 1) if self._failures and wait > 0 and not running else None
            if not v.take_part:
                v.state = "off"
            elif v.charge_only and not v.charging:
                v.state = "waiting for charger"
            elif not running:
                n_train = self.store.window_counts().n_train  # the store's now, however the windows came
                if n_train < MIN_TRAIN_WINDOWS:
                    v.state = "not enough data"
                    self._error = not_enough_data(n_train)
                else:
                    v.state = "failed" if self._failures else "connecting"
            elif not agent.connection.connected:
                v.state = "connecting" if agent.announcement is None else "disconnected"
            else:
                v.state = "training" if agent._state == "training" else "connected"
            v.error = self._error if v.take_part else ""
            sensor_fault = self.source.fault()
            if sensor_fault and not v.error:  # a refused or stopped sensor: on this screen, the Live one, and in the status
                v.error = sensor_fault
            if self.store.fault:  # whatever else holds: nothing can be kept, and the server is told (the agent's status)
                v.state, v.error = "cannot take part: storage failed", self.store.fault
            if agent is not None and agent.announcement is not None:
                v.round = int(agent.announcement.round)
            last_round, v.last_accuracy = self._last_update_info()
            if v.round is None:
                v.round = last_round
            v.cost = cost_words(self.cost.snapshot(), self.cost.rounds(), self.cost.battery_seen())
            try:
                v.sent = list(self.store.get_meta(SENT_KEY, []))
            except Exception as exc:  # an unreadable store: the state above already says so
                log.debug("sent ledger: %s", exc)
            view = replace(v)
        self._on_federation(view)
        if sensor_fault != self._sensor_fault:
            self._sensor_fault = sensor_fault
            self.live = replace(self.live, activity=None, confidence=0.0, note=sensor_fault) if sensor_fault else replace(self.live)
            self._on_live(self.live)

    def _last_update_info(self) -> tuple[int | None, float | None]:
        """Round and local accuracy of the last update sent (re-read only when its file changes)."""
        path = self.store.folder / "last_update.bin"
        try:
            st = path.stat()
        except OSError:
            return None, None
        # The file is replaced whole at each update (a new inode): its identity, not only its time, tells them apart.
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._last_update is None or self._last_update[0] != ident:
            last = self.store.load_last_update()
            if last is None:
                return None, None
            self._last_update = (ident, int(last[0]["round"]), _trained_accuracy(last[1]))
        return self._last_update[1], self._last_update[2]

    def close(self) -> None:
        """Stop every thread and close the store."""
        self._closing.set()
        self._wake_event.set()
        self.stop_sensing()
        self._stop_agent()
        self._supervisor.join(10)
        self.store.close()
        self.timeline.close()


def taking_part_words(v: FederationView) -> str:
    """Why the device is or is not training now, in one sentence for the person holding it.

    Parameters
    ----------
    v : FederationView

    Returns
    -------
    str
    """
    if v.state == "off":
        return "Not taking part: switch on \"Take part in training\" to help train the shared model"
    if v.state == "waiting for charger":
        return "Not training now: the phone is not charging, and you chose to train only while charging"
    if v.state == "training":
        return f"Training round {v.round} on this phone now"
    if v.state == "connected":
        return "Taking part: connected, waiting for the server's next round" + (f" (last round {v.round})" if v.round is not None else "")
    if v.state == "connecting":
        return f"Taking part: connecting to the server at {v.broker}"
    if v.state == "disconnected":
        return f"Taking part, but the server at {v.broker} cannot be reached now; trying again"
    return f"Not training: {v.error}" if v.error else f"Not training ({v.state})"


def settings_view(cfg: AppConfig) -> FederationView:
    """The Federation screen's view of the settings in ``cfg`` (the state fields at their defaults)."""
    return FederationView(
        broker=cfg.broker,
        client_id=cfg.client_id,
        federation=cfg.federation,
        username=cfg.username,
        password_set=cfg.password_file is not None and cfg.password_file.is_file(),
        tls_ca=str(cfg.tls_ca) if cfg.tls_ca else None,
        backend=cfg.backend,
    )


def not_enough_data(n_train: int) -> str:
    """The words shown when too few windows are recorded: how many there are and how many are needed."""
    need = MIN_TRAIN_WINDOWS - n_train
    recorded = -(-need * 10 // int(TRAIN_FRACTION * 10))  # 80 % of recorded windows train: record a bit more than missing
    return (
        f"nothing to train on: {n_train} training windows recorded, {MIN_TRAIN_WINDOWS} needed; "
        f"record about {recorded} more windows ({recorded * 2.56 / 60:.1f} min of an activity)"
    )


def missing_backend(backend: str, exc: ImportError) -> str:
    """The words shown when the training backend cannot be imported."""
    name = getattr(exc, "name", None) or str(exc)
    which = "the client's default training backend" if backend == "auto" else f"the {backend} training backend"
    return f"{which} cannot run here: module {name!r} is not installed; choose the numpy backend, or install it"


def describe_refusal(kind: str, text: str, cfg: AppConfig) -> str:
    """A broker's refusal (``BrokerRefused.kind`` and message) in the words the screen shows."""
    if kind == "auth":
        user = cfg.username if cfg.username else "(none)"
        if enrolled(cfg.state_dir):
            return (f"login refused: the broker no longer accepts this device ({user!r}) with its enrolment bundle; the device was "
                    f"revoked or the bundle is out of date: ask the server's operator for a new bundle and enrol with it")  # fmt: skip
        return f"login refused: the broker does not accept user {user!r} with this password; check the user name and password"
    if kind == "tls":
        if "not signed by" in text or "verify failed" in text.lower():
            return f"wrong CA certificate: the broker's certificate is not signed by {cfg.tls_ca}; choose the CA that signed it"
        return f"TLS failed: {text}"
    return text


def enrolled(state_dir: Path) -> bool:
    """Whether the stored password came from an enrolment bundle (:data:`ENROLLED_MARK`)."""
    return (state_dir / ENROLLED_MARK).is_file()


def connection_cause(agent: Any, cfg: AppConfig) -> str | None:
    """Why ``agent`` is not connected, in words; None when connected or nothing is known yet.

    The one place that reads the cause off the agent: a refusal the link treats as final
    (:attr:`har_io.mqtt_link.MqttLink.fatal`: credentials, certificates) in the app's words,
    which name the user and the CA, else the cause of the last failed attempt that the link
    reports (:attr:`edge_client.agent.EdgeAgent.connection`: "broker unreachable: ...",
    "DNS: unknown host ...").

    Parameters
    ----------
    agent : EdgeAgent
    cfg : AppConfig
        The settings the agent runs with (for the words: user, CA, address).
    """
    link = getattr(agent, "_link", None)
    if link is None:
        return None
    fatal = getattr(link, "fatal", None)
    if fatal is not None:
        return describe_refusal(str(getattr(fatal, "kind", "")), str(fatal), cfg)
    status = agent.connection
    if status.connected:
        return None
    return status.error


def federation_fields(state_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Check the Federation settings typed or imported and turn them into :class:`AppConfig` fields.

    The one entry for entering the settings by hand and, later, for an enrolment bundle:
    both give the same keys.

    Parameters
    ----------
    state_dir : Path
        The app's private folder (a ``password`` is stored there, see :func:`store_password`).
    fields : dict
        Any of ``client_id`` (1-64 letters, digits, ``_ . -``), ``broker`` (``HOST:PORT``),
        ``federation`` (same rules as a client id), ``username`` ("" or None: anonymous),
        ``password`` (str; "" removes the stored one), ``enrolled`` (True: that password came
        from an enrolment bundle, see :data:`ENROLLED_MARK`), ``password_file`` (path or None),
        ``tls_ca`` (path of an existing CA certificate; "" or None: no TLS), ``backend``
        (one of :data:`APP_BACKENDS`).

    Returns
    -------
    dict
        AppConfig field -> value (``password`` becomes ``password_file``).

    Raises
    ------
    ValueError
        For an unknown key or an invalid value, naming it and the fix.
    """
    known = {"client_id", "broker", "federation", "username", "password", "password_file", "tls_ca", "backend", "enrolled"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown federation setting(s) {unknown}; known: {sorted(known)}")
    out: dict[str, Any] = {}
    if "client_id" in fields:
        out["client_id"] = check_client_id(str(fields["client_id"]).strip())
    if "broker" in fields:
        out["broker"] = parse_broker(str(fields["broker"]))
    if "federation" in fields:
        fed = str(fields["federation"]).strip()
        try:
            out["federation"] = check_client_id(fed)
        except ValueError:
            raise ValueError(f"federation name {fed!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'") from None
    if "username" in fields:
        user = str(fields["username"] or "").strip()
        if any(c.isspace() for c in user) or len(user) > 128:
            raise ValueError(f"user name {user!r} is invalid: no spaces, at most 128 characters")
        out["username"] = user or None
    if "tls_ca" in fields:
        ca = str(fields["tls_ca"] or "").strip()
        if ca and not Path(ca).is_file():
            raise ValueError(f"CA certificate {ca}: no such file; give the path of the CA certificate (.crt, PEM)")
        out["tls_ca"] = Path(ca) if ca else None
    if "backend" in fields:
        backend = str(fields["backend"] or "auto")
        if backend not in APP_BACKENDS:
            raise ValueError(f"training backend {backend!r} is unknown; use one of {', '.join(APP_BACKENDS)}")
        out["backend"] = backend
    if "password_file" in fields:
        out["password_file"] = Path(fields["password_file"]) if fields["password_file"] else None
    if "password" in fields and fields["password"] is not None:
        out["password_file"] = store_password(state_dir, str(fields["password"]))
        mark = state_dir / ENROLLED_MARK
        if fields.get("enrolled"):
            mark.write_text("the password in this folder came from an enrolment bundle\n")
        else:  # typed by hand: a refused login is the typist's to check
            mark.unlink(missing_ok=True)
    return out


def enrol(controller: Any, source: str | Path, ca_file: str | Path | None = None) -> EnrolmentBundle:
    """:meth:`DeviceController.enrol` for any controller with ``cfg`` and ``set_federation`` (the Android UI's too)."""
    bundle, fields = enrolment_fields(controller.cfg.state_dir, source, ca_file if ca_file is not None else controller.cfg.tls_ca)
    controller.set_federation(**fields)
    log.info("enrolled: client %s of federation %s (coordinator %r) at %s", bundle.client_id, bundle.federation,
             bundle.coordinator, fields["broker"])  # fmt: skip
    return bundle


def enrolment_fields(state_dir: Path, source: str | Path, ca_file: str | Path | None = None) -> tuple[EnrolmentBundle, dict[str, Any]]:
    """Read an enrolment bundle and give the Federation fields it sets (the keys of :func:`federation_fields`).

    An inline CA certificate is written to ``<state_dir>/credentials/`` (mode 0600); a bundle
    that names its CA by fingerprint only takes ``ca_file``, which must match it. The user
    name is the client id; the password goes to the private folder as a typed one does.

    Parameters
    ----------
    state_dir : Path
        The app's private folder.
    source : str or Path
        The bundle's file, or its JSON text.
    ca_file : path, optional
        The CA certificate of a fingerprint-only bundle.

    Returns
    -------
    (EnrolmentBundle, dict)
        The bundle, and ``client_id``, ``broker``, ``federation``, ``username``, ``password``, ``tls_ca``, ``enrolled``.

    Raises
    ------
    har_io.enrolment.EnrolmentRefused
        A malformed bundle, one of an unknown version, or a CA that does not match (its reason named).
    OSError
        If the file cannot be read or the CA not written.
    """
    bundle = read_bundle(source)
    if bundle.tls_ca_pem is not None:
        ca_file = None  # the bundle's own CA wins over one set by hand
    broker = bundle.broker_config(state_dir / CREDENTIALS_DIR, ca_file=ca_file)
    if (state_dir / CREDENTIALS_DIR).is_dir():
        os.chmod(state_dir / CREDENTIALS_DIR, 0o700)
    fields: dict[str, Any] = {
        "client_id": bundle.client_id,
        "broker": broker.address,
        "federation": bundle.federation,
        "username": bundle.username,
        "password": bundle.password,
        "tls_ca": broker.tls_ca or "",
        "enrolled": True,
    }
    return bundle, fields


def store_password(state_dir: Path, password: str) -> Path | None:
    """Keep the broker password in the app's private folder, readable by its owner only.

    Written to :data:`PASSWORD_FILE` under ``state_dir`` (folder mode 0700, file 0600,
    replaced atomically); an empty password removes the file. The password is never logged.

    Returns
    -------
    Path or None
        The file, or None when the password was empty.

    Raises
    ------
    ValueError
        If the password contains a line break (the file holds one line).
    """
    path = state_dir / PASSWORD_FILE
    if not password:
        path.unlink(missing_ok=True)
        return None
    if "\n" in password or "\r" in password:
        raise ValueError("the password must be one line (no line breaks)")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    atomic_write_bytes(path, password.encode(), mode=0o600)  # its temporary file is private too (mkstemp: 0600)
    return path


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
