"""``fedhar-coordinator serve``: a federation that never ends, in one data folder.

The data folder (default :func:`coordinator.server.settings.default_data_dir`) holds::

    server.toml          settings: the federation's at the top level, [server], [schedule]
    server.sqlite        the registry (coordinator/server/registry.py)
    serve.lock           held while serve runs (coordinator/server/data_lock.py)
    operator.sock        the operator's commands to the running server (mode 0600)
    run/                 the run's state, models and report (coordinator/state.py's RunState)
    versions/            v000001.safetensors ... : each completed round's global model
    enrolment/           <name>.json and <name>.png of enrolled devices (mode 0600)

Each start is a new epoch; the run continues from the newest completed round. Rounds start when
the schedule allows and are :class:`coordinator.runner.FederationRunner`'s over the grid built from
:class:`GridNeeds`. SIGHUP re-reads ``[server]`` and ``[schedule]``; a full disk or a held database
is a state (:meth:`Server.problems`), not an exit; SIGINT and SIGTERM stop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator import state as run_state
from coordinator.admission import Admission
from coordinator.config import CoordinatorConfig, upgrade_file
from coordinator.grid import Grid
from coordinator.server.data_lock import DataLock
from coordinator.server.operator_desk import OperatorDesk, ServerSide
from coordinator.server.registry import Registry
from coordinator.server.schedule import next_start, not_eligible, waiting_line
from coordinator.server.serve_devices import DeviceUpkeep
from coordinator.server.serve_page import PageFeeds, monitor_broker, page_blob_store, start_status_page
from coordinator.server.serve_reload import SettingsReload
from coordinator.server.serve_setup import CONFIG_NAME, archive_strategy_change, federation_config, run_id_of, setting_words
from coordinator.server.serve_versions import VersionKeeper
from coordinator.server.settings import SERVE_ROUNDS, ScheduleSettings, ServerSettings, read_serve_file
from coordinator.server.sqlite_faults import DatabaseBusy
from har_io.broker_config import BrokerConfig

log = logging.getLogger("fedhar.serve")

__all__ = ["SERVE_ROUNDS", "GridNeeds", "Server", "archive_strategy_change", "federation_config", "install_signals", "monitor_broker",
           "mqtt_grid"]  # fmt: skip

RETRY_AFTER_FAILED_S = 300.0
"""A round that closed without changing the model is tried again after at most this long (s), or
``[schedule] min_round_interval_s`` if shorter."""
RETRY_MIN_S = 10.0
"""A round that cannot start (devices of another label set) waits at least this long (s) before the next try."""
STORAGE_RETRY_S = 30.0
"""While the disk is full (or a database is held), what failed is tried again this often (s)."""
FAULTS = (run_state.StorageFull, DatabaseBusy)
"""Storage faults that are states of the server, not reasons to stop."""


@dataclass(frozen=True)
class GridNeeds:
    """What a grid for ``serve`` is built from (settings, state, architecture, admission, epoch, blob store, late-update hook)."""

    cfg: CoordinatorConfig
    state: run_state.RunState
    spec: Callable[[], Any]
    admission: Admission
    epoch: int
    blob_store: Any
    late: Callable[[str, int, int], Any]


GridBuilder = Callable[[GridNeeds], Grid]
"""Makes the grid a :class:`Server` drives (tests give an in-memory one)."""


def mqtt_grid(needs: GridNeeds) -> Grid:
    """The network grid (:class:`coordinator.mqtt_grid.MqttGrid`) on the broker of ``needs.cfg``."""
    from coordinator.mqtt_grid import MqttGrid

    return MqttGrid(needs.cfg, needs.state, needs.spec, admission=needs.admission, epoch=needs.epoch, blob_store=needs.blob_store,
                    late=needs.late)  # fmt: skip


class Server:
    """A served federation in ``data_dir`` (see the module docstring).

    ``config`` defaults to ``<data>/server.toml`` (missing: all defaults); ``tz`` is the schedule
    window's timezone; ``poll_s`` the longest wait for a message between rounds (s).

    Raises ValueError for bad settings (the key named) or a status page off loopback without a token;
    FolderInUse if another ``serve`` holds the folder; RegistryDamaged or StateError for a damaged
    database; DatabaseBusy if another program holds ``server.sqlite`` past the wait.
    """

    def __init__(self, data_dir: Path, broker: BrokerConfig, federation: str = "default", config: Path | None = None,
                 tz: dt.tzinfo | None = None, poll_s: float = 0.5, report_header: dict[str, Any] | None = None,
                 grid: GridBuilder = mqtt_grid, storage_retry_s: float = STORAGE_RETRY_S):  # fmt: skip
        self.data_dir = Path(data_dir)
        self.lock = DataLock(self.data_dir, "serve")
        self.lock.acquire_for_serve()
        try:
            self._build(broker, federation, config, report_header, grid)
        except BaseException:
            self.lock.release()
            raise
        self.tz, self.poll_s, self.storage_retry_s = tz, poll_s, storage_retry_s
        self.open_round: int | None = None  # the round running now (a reload and a pin wait for it)
        self._round = 0  # the next round to run
        self.last_end: float | None = None  # when the last round ended (UNIX s): the schedule's interval counts from it
        self._retry_at = 0.0
        self._waiting = ""
        self._waiting_logged = 0.0
        self._page_waiting: str | None = None  # why no round runs now, for the status page (None while one runs)
        self._failed: tuple[int, str, float] | None = None  # the round whose last attempt failed, why, when (unix)
        self._eligible_now = 0
        self._fault: str | None = None  # a storage fault in force ("disk full: ...")
        self._fault_kind: tuple[str, str] | None = None  # its kind and folder, logged once
        self._unkept: Callable[[], None] | None = None  # what a storage fault left undone, to try again

    def _build(self, broker: BrokerConfig, federation: str, config: Path | None, report_header: dict[str, Any] | None,
               grid: GridBuilder) -> None:  # fmt: skip
        from coordinator.rounds import compose
        from coordinator.runner import FederationRunner, open_state
        from coordinator.server.ownership import access_problems

        self.config_path = Path(config) if config is not None else self.data_dir / CONFIG_NAME
        if self.config_path.is_file():  # an earlier release's flat keys, moved into their tables (the old file kept beside)
            upgrade_file(self.config_path)
        self.file = read_serve_file(self.config_path)
        if self.file.server.http_port:
            try:
                from coordinator.server.web import check_bind
            except ImportError:  # no status page libraries: start_status_page says so
                pass
            else:
                check_bind(self.file.server.http_bind, self.file.server.token)  # refused before anything starts
        self.registry = Registry(self.data_dir)
        run_id = run_id_of(self.data_dir, self.file.server.name)
        self.cfg = federation_config(self.file, self.data_dir, broker, federation, run_id)
        archive_strategy_change(self.cfg.run_dir, self.cfg, named="aggregation" in self.file.federation)
        self.epoch = self._until_space(self.registry.new_epoch)
        self.access = access_problems(self.file.server)  # files the page reads that this account cannot: said at start
        for problem in self.access:
            log.warning("%s (the page and /metrics show no certificate expiry until then)", problem)
        # Who may take part: the registry (revoked, enrolled) and the schedule in force (charging).
        self.admission = Admission(revoked=self.registry.is_revoked, enrolled=self.registry.is_enrolled,
                                   require_charging=lambda: self.schedule.require_charging)  # fmt: skip
        state = open_state(self.cfg)
        parts = compose(self.cfg, state)  # the round policy and the strategy, shared by the grid and the runner
        self._blob_store = page_blob_store(self.cfg, self.file.server, self.admission.refused)
        self.grid = grid(GridNeeds(self.cfg, state, lambda: self.runner.spec, self.admission, self.epoch, self._blob_store,
                                   parts.policy.late))  # fmt: skip
        self.runner = FederationRunner(self.cfg, self.grid, report_header=report_header, state=state, parts=parts)
        self.versions = VersionKeeper(self.data_dir, self.registry, self.runner, run_id, self.epoch, lambda: self.server.keep_versions)
        self.reloader = SettingsReload(self.data_dir, self.config_path, broker, federation, run_id)
        self.upkeep = DeviceUpkeep(self.data_dir, self.registry, self.grid, self.runner)
        side = ServerSide(self.data_dir, lambda: self.file, self.grid, self.runner, self.versions.take_request)
        self.desk = OperatorDesk(self.data_dir, side, self._busy)
        self.grid.set_between(lambda: self.desk.serve_pending(during_round=True))

    def _until_space(self, write: Callable[[], int]) -> int:
        """``write()``, tried again every 30 s while the disk is full (logged once)."""
        said = ""
        while True:
            try:
                return write()
            except run_state.StorageFull as exc:
                if str(exc) != said:
                    log.error("%s; serve starts when there is space (free some, e.g. [server] keep_versions lower)", exc)
                    said = str(exc)
                time.sleep(STORAGE_RETRY_S)

    @property
    def server(self) -> ServerSettings:
        return self.file.server

    @property
    def schedule(self) -> ScheduleSettings:
        return self.file.schedule

    def close(self) -> None:
        """Let go of the run's state, the registry and the folder's lock (idempotent)."""
        self.runner.state.close()
        self.registry.close()
        self.lock.release()

    # ------------------------------------------------------------------------ settings reload
    def request_reload(self) -> None:
        """Ask the loop to re-read ``server.toml`` (SIGHUP); during an open round the reload waits for it to close."""
        self.reloader.request(self.open_round)

    def reload(self) -> list[str]:
        """Re-read ``server.toml`` now; the changes made."""
        self.file, changed = self.reloader.apply(self.file)
        self._waiting = ""  # log the waiting line again, with the new schedule
        return changed

    # ------------------------------------------------------------------------ what the page and the operator see
    def next_start(self, now: float | None = None) -> float:
        """UNIX time the next round may start, by the schedule (not counting the devices)."""
        now = time.time() if now is None else now
        at = next_start(now, self.last_end, self.schedule.min_round_interval_s, self.schedule.window, self.tz)
        return max(at, self._retry_at)

    def page_next_start(self, now: float | None = None) -> float | None:
        """:meth:`next_start` once ``[schedule] min_clients`` devices were eligible at the last look, else None."""
        if self._eligible_now < self.schedule.min_clients:
            return None
        return self.next_start(now)

    def page_waiting(self) -> str | None:
        """Why no round runs now, in words (the waiting line, failed attempt and ineligible devices); None while a round runs."""
        return None if self.open_round is not None else self._page_waiting

    def problems(self) -> list[str]:
        """The server's own health problems now, in words, for the page and ``/healthz``: a storage fault, unreadable files."""
        return [*self.access, *([self._fault] if self._fault else [])]

    def _busy(self, command: str) -> str | None:
        """Why a request of ``command`` waits now: a pin or rollback waits for an open round to close."""
        r = self.open_round
        if r is None or command != "model_request":
            return None
        return f"round {r} is open (it closes within {self.cfg.timing.round_timeout_s:.0f} s of its start)"

    # ------------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event | None = None) -> None:
        """Serve until ``stop`` is set (or KeyboardInterrupt: SIGINT, SIGTERM through :func:`install_signals`).

        Raises StateError or RegistryDamaged for an unusable or damaged database; CoordinatorError or
        BrokerRefused if the broker cannot be reached in 30 s or refuses the login.
        """
        from coordinator.grid import CoordinatorError, StateError
        from coordinator.server.folder_side import clear_releases, pending_releases

        stop = stop or threading.Event()
        page = monitor = None
        try:
            self.grid.open()
            last = self.runner.start(resume=True)  # continues from the newest intact round, or starts afresh
            if last < 0:
                self.grid.clear_retained()
            self._round = last + 1
            self._unkept = lambda: self.versions.catch_up(last)
            self._try(lambda: None)
            newest = self.versions.newest()
            self.last_end = newest.created_unix if newest is not None else None
            for name in pending_releases(self.data_dir):
                log.info("operator's release of %s (asked while no server ran): %s", name,
                         "released" if self.runner.release(name) else "it was not quarantined")  # fmt: skip
            clear_releases(self.data_dir)
            self.upkeep.start()
            self.desk.start()
            try:
                stall_after_s = self.server.stall_after * (self.schedule.min_round_interval_s + self.cfg.timing.round_timeout_s)
                feeds = PageFeeds(self.page_next_start, self.page_waiting, self.problems)
                page, monitor = start_status_page(self.server, self.cfg, self.data_dir, stall_after_s, feeds, self._blob_store)
            except RuntimeError as exc:  # the port is taken: the message names the setting
                raise CoordinatorError(str(exc)) from None
            # the line that says it serves comes once every part is up: the operator socket, the page, the monitor
            log.info(
                "serving federation %r: epoch %d, run %s, %s; data folder %s", self.cfg.federation, self.epoch, self.cfg.run_id,
                f"continuing after round {last} (model version {newest.version if newest else '-'})" if last >= 0 else "no round yet",
                self.data_dir,
            )  # fmt: skip
            next_look = 0.0
            while not stop.is_set():
                if self.reloader.asked.is_set():
                    self.reload()
                self.grid.wait(self.poll_s)  # a message, and what else has arrived behind it
                self.desk.serve_pending()
                if time.monotonic() >= next_look:
                    self.upkeep.look()
                    next_look = time.monotonic() + 2.0
                self._try(self._step)
        except run_state.StateDamaged as exc:
            raise StateError(str(exc)) from None
        finally:
            self.desk.stop()
            if page is not None:
                page.stop()
            if monitor is not None:
                monitor.stop()
            self.grid.close()
            self.close()

    def _try(self, work: Callable[[], None]) -> None:
        """``work()``, with a storage fault (:data:`FAULTS`) logged once and retried after ``storage_retry_s`` (first :attr:`_unkept`)."""
        try:
            if self._unkept is not None:
                if time.time() < self._retry_at:
                    return
                self._unkept()
                self._unkept = None
                self._fault_over()
            work()
        except FAULTS as exc:
            kind = (type(exc).__name__, str(getattr(exc, "folder", "")))
            if kind != self._fault_kind:  # once per fault, not at every try (the free space it names changes)
                log.error("%s; the server goes on, keeps what it holds and tries again every %g s", exc, self.storage_retry_s)
            self._fault, self._fault_kind = str(exc), kind
            self._retry_at = time.time() + self.storage_retry_s

    def _fault_over(self) -> None:
        """What a storage fault stopped went through: the fault is over."""
        if self._fault is not None:
            log.info("the storage fault is over (%s); the server goes on", self._fault)
            self._fault, self._fault_kind = None, None

    def _step(self) -> None:
        """One look of the serving loop: who is eligible, and a round when the schedule and the devices allow."""
        now = time.time()
        seen = self.grid.eligibility(self.runner.label_set)
        eligible = seen.eligible
        self._eligible_now = len(eligible)
        start_at = self.next_start(now)
        self._page_waiting = self._waiting_text(len(eligible), start_at, now, seen.left_out)
        if len(eligible) >= self.schedule.min_clients and now >= start_at:
            self._run_round(eligible)
        else:
            self._log_waiting(len(eligible), start_at, now, seen.left_out)

    def _run_round(self, eligible: Sequence[str]) -> None:
        from coordinator.grid import CoordinatorError, StateError

        r = self._round = self.runner.catch_up(self._round)
        self._waiting = ""
        log.info("round %d: starting with %d eligible devices (%s)", r, len(eligible), ", ".join(eligible))
        self.upkeep.drop_refused_models()
        try:
            self.runner.note({"epoch": self.epoch})
            self.open_round = r
            with contextlib.suppress(ValueError):  # logged; the federation goes on as it was
                self.versions.take_request()
            opened = time.time()
            record = self.runner.run_round(r)
        except StateError:
            raise
        except CoordinatorError as exc:  # e.g. devices of different label sets: not worth a restart
            log.error("round %d could not start: %s; trying again later", r, setting_words(str(exc)))
            self._retry_at = time.time() + min(RETRY_AFTER_FAILED_S, max(RETRY_MIN_S, self.schedule.min_round_interval_s))
            return
        finally:
            self.open_round = None
        if record is None:  # closed without quorum: the next attempt within one interval
            self._retry_at = time.time() + min(RETRY_AFTER_FAILED_S, self.schedule.min_round_interval_s)
            self._failed = (r, self.runner.last_failure, time.time())
            return
        self._failed = None
        self._round = r + 1
        self.last_end = time.time()
        self._retry_at = 0.0

        def keep() -> None:
            self.versions.keep(record, opened)
            self.versions.finish_request()

        self._unkept = keep  # done now; tried again after a storage fault
        keep()
        self._unkept = None
        self._fault_over()

    def _waiting_text(self, n: int, start_at: float, now: float, left_out: Mapping[str, str]) -> str:
        """The waiting line with the ineligible devices and why, after the last failed attempt if any."""
        line = waiting_line(n, self.schedule.min_clients, start_at, now, self.tz) + not_eligible(left_out)
        if self._failed is not None:
            rnd, why, at = self._failed
            when = dt.datetime.fromtimestamp(at, self.tz).strftime("%H:%M:%S")
            line = f"round {rnd}'s last attempt closed without quorum at {when} local ({setting_words(why)}); {line}"
        return line

    def _log_waiting(self, n: int, start_at: float, now: float, left_out: Mapping[str, str]) -> None:
        """Log the waiting line when it changes, and every 10 minutes while it does not."""
        line = waiting_line(n, self.schedule.min_clients, start_at, now, self.tz)
        if line == self._waiting and now - self._waiting_logged < 600:
            return
        self._waiting, self._waiting_logged = line, now
        log.info("%s%s", line, not_eligible(left_out))


def install_signals(server: Server) -> None:
    """SIGHUP re-reads the settings (from the loop); SIGTERM and SIGINT stop, even if SIGINT was inherited ignored or blocked."""

    def on_hup(signum: int, frame: object) -> None:
        server.request_reload()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP, signal.SIGTERM, signal.SIGINT})
