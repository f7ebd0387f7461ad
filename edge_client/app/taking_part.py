"""Taking part in the federation from the app: the supervisor thread that starts, watches and restarts the MQTT agent.

Once a second it decides whether the device should train now (the switch, the charger, enough
windows), starts :class:`edge_client.agent.EdgeAgent` in its own thread, restarts a failed one with
exponential back-off and reports a :class:`~edge_client.app.views.FederationView` in words. The
agent module is imported only when an agent starts (the app runs without PyTorch until then).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_client.app.config import CREDENTIALS_DIR, MIN_TRAIN_WINDOWS, AppConfig
from edge_client.app.federation_words import connection_cause, missing_backend, not_enough_data
from edge_client.app.joining import enrol, enrolled, federation_fields, note_accepted
from edge_client.app.round_notes import ServerNotes, note_update, trained_accuracy, versions_of
from edge_client.app.views import FederationView, LiveView, settings_view
from edge_client.cost import CostMeter, cost_words
from edge_client.freshness import SensingFreshness, SensingHealthMeter
from edge_client.leave import LeaveOutcome, announce_leaving, delete_federation_state
from edge_client.recorder import sync_to_store
from edge_client.sensors.base import SensorSource
from edge_client.sent_log import SENT_KEY, with_versions
from edge_client.server_state import server_words
from edge_client.store import ClientStore
from edge_client.window_log import WindowLog
from har_io.broker_config import BrokerConfig
from har_io.enrolment import EnrolmentBundle
from har_io.exit_codes import Exit
from har_io.threads import join_started

log = logging.getLogger("fedhar.app")

BATTERY_READ_S = 60.0
"""Seconds between two readings of the battery level (a JNI call on Android, a sysfs file on Linux)."""

BACKOFF_FIRST_S = 2.0
"""Wait before restarting an agent that failed the first time (seconds); doubled after each failure."""
BACKOFF_MAX_S = 300.0
"""Longest wait between two restarts of a failing agent (seconds)."""

EXIT_BROKER_REFUSED = Exit.BROKER_REFUSED
EXIT_DUPLICATE_ID = Exit.DUPLICATE_ID
"""Exit codes of :meth:`edge_client.agent.EdgeAgent.run` (from :mod:`har_io.exit_codes`: the agent module is imported later)."""


class TakingPart:
    """The federation half of :class:`~edge_client.app.controller.DeviceController` (its state is set by :meth:`_init_taking_part`)."""

    # What the controller sets before it calls _init_taking_part:
    cfg: AppConfig
    store: ClientStore
    window_log: WindowLog
    source: SensorSource
    cost: CostMeter
    freshness: SensingFreshness | None
    health: SensingHealthMeter
    federation: FederationView
    live: LiveView
    _charging: Callable[[], bool]
    _battery: Callable[[], float | None]
    _on_federation: Callable[[FederationView], None]
    _on_live: Callable[[LiveView], None]

    def _init_taking_part(self, clock: Any, supervise_s: float) -> None:
        """Set the supervisor's state and start its thread (call last in the controller's constructor)."""
        self._fed_lock = threading.Lock()
        self._clock = clock
        self._supervise_s = supervise_s
        self._battery_read_at = -float("inf")
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
        # (file identity, round, accuracy, run id, the server's model version) of the last update sent
        self._last_update: tuple[tuple[int, int, int], int | None, float | None, str, int | None] | None = None
        self._server = ServerNotes(self.store)
        self._sensor_fault = ""
        self.store.fault_listeners.append(lambda _fault: self._wake_event.set())  # the screen shows a storage fault at once
        self._supervisor = threading.Thread(target=self._supervise, name="federation-supervisor", daemon=True)
        self._supervisor.start()
        self._refresh_federation()

    def set_take_part(self, on: bool) -> None:
        """Allow or forbid taking part (the supervisor acts within ``supervise_s``); on tries at once, whatever the back-off."""
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
        """Use another broker (``host:port``; ValueError otherwise); a running agent is restarted."""
        self.set_federation(broker=host_port)

    def set_federation(self, **fields: Any) -> None:
        """Change how the device joins its federation; a running agent is restarted with the new settings.

        ``fields``: any of :func:`federation_fields`' (``client_id``, ``broker``, ``federation``,
        ``username``, ``password``, ``password_file``, ``tls_ca``, ``backend``); a ``password`` is
        written to the app's private folder and only its file kept. Raises ValueError for an invalid
        field (naming it and the fix); nothing is changed then.
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
        """Join the federation an enrolment bundle names; return the bundle taken (for the screen).

        ``source``: the bundle's file or JSON text (pasted or scanned); ``ca_file``: the CA for a bundle
        naming it by fingerprint only (default: the one set). Raises ``EnrolmentRefused`` (nothing
        changed) or OSError if the file cannot be read.
        """
        return enrol(self, source, ca_file)

    def leave(self, forget: bool) -> LeaveOutcome:
        """Leave the federation: stop taking part, tell the server, delete what joined this device to it.

        The agent stops; the device's own account publishes its leaving status ("forget": ask the
        operator to delete what the server holds of it); credentials, the enrolled CA and the local
        model with its training state are deleted and the settings go back to a device that never
        joined (client id, backend, windows and timeline stay). Blocks up to twice
        :data:`edge_client.leave.CONNECT_WAIT_S` while the broker is asked: call it off the UI thread.
        Raises OSError if the credentials or the model cannot be deleted.
        """
        with self._fed_lock:
            self.federation.take_part = False
        self._stop_agent()
        cfg = self.cfg
        told, why = False, "no broker account is set"
        if cfg.username or cfg.password_file or cfg.tls_ca:
            try:
                broker = _broker_config(cfg, missing_ok=True)
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
            note_accepted(self.cfg.state_dir)  # a later refusal of the same password is a re-issue, rename or revocation
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

            missing = () if cfg.backend == "auto" else missing_runtimes(cfg.backend)
            if missing:
                raise ImportError(f"No module named {missing[0]!r}", name=missing[0])
            # The choice of fedhar-client: the best backend installed on this device, unless the settings name one.
            backend, why = choose_backend(None if cfg.backend == "auto" else cfg.backend)
            log.info("training backend: %s (%s)", backend, why)

            broker = _broker_config(cfg)
            agent = EdgeAgent(ClientConfig(client_id=cfg.client_id, broker=broker, federation=cfg.federation, backend=backend), self.store,
                              cost=self.cost)  # sensing's CPU and the battery measured here, the rounds there: one set of figures
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
        join_started(self._agent_thread, 30)
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
                v.state = "training" if agent.phase == "training" else "connected"
            v.error = self._error if v.take_part else ""
            sensor_fault = self.source.fault()
            if sensor_fault and not v.error:  # a refused or stopped sensor: on this screen, the Live one, and in the status
                v.error = sensor_fault
            if self.store.fault:  # whatever else holds: nothing can be kept, and the server is told (the agent's status)
                v.state, v.error = "cannot take part: storage failed", self.store.fault
            if agent is not None and agent.announcement is not None:
                v.round = int(agent.announcement.round)
            now = time.time()
            state = self._server.observe(agent, now) if agent is not None else None
            v.server, v.server_down = (server_words(state, now), state.down) if state is not None else ("", False)
            last_round, v.last_accuracy, v.model_version = self._last_update_info()
            if v.round is None:
                v.round = last_round
            v.cost = cost_words(self.cost.snapshot(), self.cost.rounds(), self.cost.battery_seen())
            try:
                v.sent = with_versions(self.store.get_meta(SENT_KEY, []), versions_of(self.store))
            except Exception as exc:  # an unreadable store: the state above already says so
                log.debug("sent ledger: %s", exc)
            view = replace(v)
        self._on_federation(view)
        if sensor_fault != self._sensor_fault:
            self._sensor_fault = sensor_fault
            self.live = replace(self.live, activity=None, confidence=0.0, note=sensor_fault) if sensor_fault else replace(self.live)
            self._on_live(self.live)

    def _last_update_info(self) -> tuple[int | None, float | None, int | None]:
        """Round, local accuracy and server model version of the last update sent (re-read, and its confusion matrices
        kept for the History screen, when its file changes)."""
        path = self.store.folder / "last_update.bin"
        try:
            st = path.stat()
        except OSError:
            return None, None, None
        # The file is replaced whole at each update (a new inode): its identity, not only its time, tells them apart.
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._last_update is None or self._last_update[0] != ident:
            last = self.store.load_last_update()
            if last is None:
                return None, None, None
            note_update(self.store, last[1], st.st_mtime)
            self._last_update = (ident, int(last[0]["round"]), trained_accuracy(last[1]), str(last[0].get("run_id", "")), None)
        ident_, round_, acc, run_id, version = self._last_update
        if version is None:  # noted while the round was open; looked up until it is known
            version = versions_of(self.store).get((run_id, round_)) if round_ is not None else None
            self._last_update = (ident_, round_, acc, run_id, version)
        return round_, acc, version


def _broker_config(cfg: AppConfig, missing_ok: bool = False) -> BrokerConfig:
    """The agent's :class:`~har_io.broker_config.BrokerConfig` from the app's settings (``missing_ok``: no password file).

    Raises OSError if the password file cannot be read, ValueError for a bad address.
    """
    host, _, port = cfg.broker.rpartition(":")
    pw = cfg.password_file
    password = pw.read_text().strip() if pw and (not missing_ok or pw.is_file()) else None
    return BrokerConfig(host=host, port=int(port), username=cfg.username, password=password,
                        tls_ca=str(cfg.tls_ca) if cfg.tls_ca else None, enrolled=enrolled(cfg.state_dir))  # fmt: skip
