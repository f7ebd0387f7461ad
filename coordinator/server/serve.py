"""``fedhar-coordinator serve``: a federation that never ends, in one data folder.

The data folder (default :func:`coordinator.server.settings.default_data_dir`) holds::

    server.toml          settings: the federation's at the top level, [server], [schedule]
    server.sqlite        the registry (coordinator/server/registry.py)
    run/                 the run's state, models and report (coordinator/state.py's RunState)
    versions/            v000001.safetensors ... : each completed round's global model
    enrolment/           <name>.json and <name>.png of enrolled devices (mode 0600)

Each start records a new epoch in the registry, carried in every announcement and the
coordinator's status; the run's state survives a restart (no ``--resume``): the next round
continues from the newest completed one. Rounds start when the schedule allows
(:mod:`coordinator.server.schedule`); the rounds are :class:`coordinator.runner.FederationRunner`'s over
:class:`coordinator.mqtt_grid.MqttGrid`, the same two objects ``fedhar-coordinator run`` drives.
Revoked and forgotten devices are refused everywhere in the coordinator through its ``refused``
predicate (the registry, asked at every message). SIGHUP re-reads ``server.toml``'s ``[server]``
and ``[schedule]`` tables and logs what changed (:meth:`Server.reload`): a file the next start would
refuse is refused at once with the reason, the settings in force kept; a reload during an open round
waits for the round to close and says so; each reload is written to the audit log the page shows.
SIGINT and SIGTERM stop the server, leaving its status "offline".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coordinator import state as run_state
from coordinator.admission import Admission
from coordinator.config import CoordinatorConfig
from coordinator.record import RoundRecord
from coordinator.rounds import policy_of
from coordinator.server import model_request
from coordinator.server.lifecycle import prune_bundles
from coordinator.server.registry import Registry, VersionRow
from coordinator.server.schedule import next_start, waiting_line
from coordinator.server.settings import SERVE_ROUNDS, ScheduleSettings, ServeFile, ServerSettings, read_serve_file
from har_io.broker_config import BrokerConfig
from har_io.cli import settings_from
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.serve")


def monitor_broker(server: ServerSettings, broker: BrokerConfig, credentials_dir: str | None) -> BrokerConfig | None:
    """Broker settings of the status page's monitor session, or None when there is no usable monitor account.

    In order: ``[server] monitor_password_file``; else the credential ``monitor`` that systemd
    hands the unit (``LoadCredential=monitor:/etc/fedhar/monitor.password``, in
    ``credentials_dir``); else the password in ``[server] broker_dir`` (readable when the server
    runs as the broker folder's owner); each with the user ``[server] monitor_user``. Without
    ``broker_dir`` (a development broker) the coordinator's own settings are used, under another
    client id. A generated broker allows one session per user name, so with ``broker_dir`` set
    the coordinator's account is never borrowed: that would disconnect the coordinator, and the
    two sessions would take turns for ever. Then None is returned (logged with the fix) and the
    page shows the federation without presence and device statuses.

    Parameters
    ----------
    server : ServerSettings
    broker : BrokerConfig
        The coordinator's broker settings (host, port, TLS).
    credentials_dir : str, optional
        ``$CREDENTIALS_DIRECTORY`` (systemd), or None.

    Returns
    -------
    BrokerConfig or None
    """
    sources: list[Path] = []
    if server.monitor_password_file:
        sources.append(Path(server.monitor_password_file).expanduser())
    elif credentials_dir and (Path(credentials_dir) / "monitor").is_file():
        sources.append(Path(credentials_dir) / "monitor")
    for path in sources:
        try:
            password = path.read_text().strip()
        except OSError as exc:
            log.error("status page: the monitor password file %s is unreadable (%s); no presence on the page", path, exc.strerror or exc)
            return None
        if not password:
            log.error("status page: the monitor password file %s is empty; no presence on the page", path)
            return None
        return dataclasses.replace(broker, username=server.monitor_user, password=password)
    if not server.broker_dir:
        return broker
    try:
        from coordinator.server.broker_admin import BrokerAdmin

        user, password = BrokerAdmin(Path(server.broker_dir), reload="none").monitor_credentials()
    except (ImportError, RuntimeError, OSError) as exc:
        log.error(
            "status page: the monitor account is not usable (%s); give the server its password: "
            "sudo install -m 600 %s/credentials/%s.password /etc/fedhar/monitor.password (the unit loads it as the credential "
            "'monitor'), or set [server] monitor_password_file; the page shows no presence until then",
            exc, server.broker_dir, server.monitor_user,
        )  # fmt: skip
        return None
    return dataclasses.replace(broker, username=user, password=password)


CONFIG_NAME = "server.toml"
RETRY_AFTER_FAILED_S = 300.0
"""A round that closed without changing the model is tried again (a new attempt) after at most this long, or after
``[schedule] min_round_interval_s`` if that is shorter: a failed quorum never stalls the federation for longer."""
AT_START = frozenset(
    {"name", "data_dir", "http_bind", "http_port", "token", "broker_dir", "monitor_user", "monitor_password_file", "stall_after"}
)
"""``[server]`` keys read once, when serve starts (the status page, its monitor session, the data folder): a reload
logs their change as taking effect at the next start."""
RETRY_MIN_S = 10.0
"""A round that cannot start (devices of another label set) is tried again after at least this long, so it does not spin."""


REQUEST_DONE_KEY = "model_request_done"
"""Key in the run's database: the id of the last operator pin/rollback whose round completed."""


def version_path(data_dir: Path, version: int) -> Path:
    """``<data>/versions/v000001.safetensors`` for version 1."""
    return Path(data_dir) / "versions" / f"v{version:06d}.safetensors"


def federation_config(file: ServeFile, data_dir: Path, broker: BrokerConfig, federation: str, run_id: str) -> CoordinatorConfig:
    """The federation's :class:`CoordinatorConfig` from ``server.toml``'s top-level keys.

    ``rounds`` is :data:`SERVE_ROUNDS` (a ``rounds`` key in the file is ignored, with a warning);
    the run folder is ``<data>/run``; the run continues where it stopped (``resume``). A file that
    names no ``aggregation`` takes this release's default, also for a run an earlier release
    started with another default (:func:`archive_strategy_change` says so at start). The quality
    guard (:mod:`coordinator.guard`) is on unless the file says ``guard = false``: a served federation
    runs unattended, and a collapsed version must not become the one every device receives.

    Raises
    ------
    ValueError
        For an unknown key or a bad value (the key is named), or a ``[schedule] min_clients``
        below the quorum (``min_clients``, or more with a cohort goal: :attr:`coordinator.rounds.base.RoundPolicy.quorum`;
        a round started with fewer could not change the model).
    """
    fed = CoordinatorConfig.migrate(dict(file.federation), f"{CONFIG_NAME} (federation settings)")
    fed["guard"] = {"enabled": True, **fed.get("guard", {})}
    if "rounds" in fed:
        log.warning("server.toml: rounds = %r is ignored by serve: a served federation has no last round", fed.pop("rounds"))
    cfg = settings_from(
        CoordinatorConfig, None, file=fed, what=f"{CONFIG_NAME} (federation settings)",
        run_dir=Path(data_dir) / "run", broker=broker, federation=federation, run_id=run_id, rounds=SERVE_ROUNDS, resume=True,
    )  # fmt: skip
    quorum = policy_of(cfg).quorum
    if file.schedule.min_clients < quorum:
        raise ValueError(
            f"{CONFIG_NAME}: [schedule] min_clients = {file.schedule.min_clients} is below the quorum "
            + (f"min_clients = {cfg.min_clients}" if quorum == cfg.min_clients else
               f"ceil([cohort] min_fraction x goal) = {quorum}")
            + "; a round started with fewer devices could not change the model: raise [schedule] min_clients"
        )  # fmt: skip
    return cfg


def _changes(old: Any, new: Any, table: str) -> list[str]:
    return [
        f"[{table}] {f.name} {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
        for f in dataclasses.fields(old)
        if getattr(old, f.name) != getattr(new, f.name)
    ]


def _run_id_of(data_dir: Path, name: str) -> str:
    """The run id kept in ``<data>/run``, or a new one (``<name>-YYYYmmdd-HHMMSS``) for a new data folder."""
    state = run_state.RunState(Path(data_dir) / "run")
    try:
        kept = state.get("run_id")
    finally:
        state.close()
    if isinstance(kept, str) and kept:
        return kept
    try:
        base = check_client_id(name)
    except ValueError:
        base = "serve"
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}"


def archive_strategy_change(run_dir: Path, cfg: CoordinatorConfig, now: float | None = None, named: bool = True) -> str | None:
    """Take up a changed ``aggregation`` at start: named in ``server.toml`` (``named``), a deliberate change logged at INFO.

    A ``server.toml`` that names none (``named=False``) gets this release's default; when the run
    was started by a release with another default, the switch is a WARNING that names both
    strategies, why the default changed and the line that keeps the old one.

    When ``run_dir / "config.toml"`` names another strategy than ``cfg.aggregation``: the file is
    copied to ``config.<YYYYmmdd-HHMMSS>.toml``; each round's saved strategy state
    (``models/r*/strategy_state.safetensors``, or a server optimiser's older file) is renamed to
    ``strategy_state.<old name>.<stamp>.safetensors``, kept but no longer loaded, so the new strategy
    starts from its initial state without an error; and ``config.toml`` is rewritten with the new
    settings. Nothing happens for a new run folder or an unchanged strategy.

    Returns
    -------
    str or None
        The old strategy's name when it changed, else None.

    Raises
    ------
    OSError
        If the run folder cannot be written (the caller stops with the path named).
    """
    from har_io.cli import read_settings_file, write_settings_file

    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        return None
    try:
        old = read_settings_file(path).get("aggregation")
    except ValueError as exc:
        log.warning("%s is unreadable (%s); it is written again with the settings in force", path, exc)
        write_settings_file(path, cfg.settings())
        return None
    if not isinstance(old, str) or old == cfg.aggregation:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    kept = path.with_name(f"config.{stamp}.toml")
    kept.write_bytes(path.read_bytes())
    moved = 0
    for name in (run_state.STRATEGY_STATE_FILE, run_state.LEGACY_SERVER_OPT_FILE):
        for file in sorted((Path(run_dir) / "models").glob(f"r*/{name}")):
            file.rename(file.with_name(f"strategy_state.{old}.{stamp}.safetensors"))
            moved += 1
    write_settings_file(path, cfg.settings())
    where = (f"{cfg.aggregation} starts from its initial state; the old settings are kept in {kept} and {moved} saved state "
             f"file(s) of {old} renamed to strategy_state.{old}.{stamp}.safetensors")  # fmt: skip
    if named:
        log.info("aggregation changed from %r to %r in server.toml: %s", old, cfg.aggregation, where)
    else:
        log.warning(
            "server.toml names no aggregation, and this release's default is %r, not %r as when this run started: "
            "the federation now uses %r (%s). The default changed because FedAvgM with server step 3 can collapse "
            "a federation of a few devices (docs/tuning/server-step.md). To keep %r, put aggregation = %r in server.toml",
            cfg.aggregation, old, cfg.aggregation, where, old, old,
        )  # fmt: skip
    return old


class Server:
    """A served federation in ``data_dir`` (see the module docstring).

    Parameters
    ----------
    data_dir : Path
    config : Path, optional
        The settings file (default ``<data>/server.toml``; a missing one means all defaults).
    broker : BrokerConfig
    federation : str
        Topic namespace ``fedhar/v1/<federation>``.
    tz : tzinfo, optional
        Timezone of the schedule's window (default the machine's).
    poll_s : float
        Longest wait for a message while waiting for the next round (s).

    Raises
    ------
    ValueError
        For bad settings (the key named), or a status page bound off loopback without a token.
    coordinator.server.registry.RegistryDamaged, coordinator.service.StateError
        For a damaged database.
    """

    def __init__(
        self,
        data_dir: Path,
        broker: BrokerConfig,
        federation: str = "default",
        config: Path | None = None,
        tz: dt.tzinfo | None = None,
        poll_s: float = 0.5,
        report_header: dict[str, Any] | None = None,
    ):
        from coordinator.mqtt_grid import MqttGrid
        from coordinator.rounds import compose
        from coordinator.runner import FederationRunner, open_state

        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = Path(config) if config is not None else self.data_dir / CONFIG_NAME
        self.file = read_serve_file(self.config_path)
        self.tz = tz
        self.poll_s = poll_s
        if self.file.server.http_port:
            try:
                from coordinator.server.web import check_bind
            except ImportError:  # no status page libraries: start_status_page says so
                pass
            else:
                check_bind(self.file.server.http_bind, self.file.server.token)  # refused before anything starts
        self.registry = Registry(self.data_dir)
        run_id = _run_id_of(self.data_dir, self.file.server.name)
        self.cfg = federation_config(self.file, self.data_dir, broker, federation, run_id)
        archive_strategy_change(self.cfg.run_dir, self.cfg, named="aggregation" in self.file.federation)
        self.epoch = self.registry.new_epoch()
        # Who may take part: the registry (revoked, enrolled) and the schedule in force (charging).
        self.admission = Admission(revoked=self.registry.is_revoked, enrolled=self.registry.is_enrolled,
                                   require_charging=lambda: self.schedule.require_charging)  # fmt: skip
        state = open_state(self.cfg)
        parts = compose(self.cfg, state)
        self._blob_store = self._page_blob_store()
        self.grid = MqttGrid(self.cfg, state, lambda: self.runner.spec, admission=self.admission, epoch=self.epoch,
                             blob_store=self._blob_store, late=parts.policy.late)  # fmt: skip
        self.runner = FederationRunner(self.cfg, self.grid, report_header=report_header, state=state, parts=parts)
        self._reload = threading.Event()
        self._open_round: int | None = None  # the round run_round is running (a reload waits for it)
        self._deferred_round: int | None = None  # the round a deferred reload waits for
        self._pending: list[str] = []  # changes read by a reload that take effect at the next start
        self._last_end: float | None = None
        self._retry_at = 0.0
        self._waiting = ""
        self._waiting_logged = 0.0
        self._page_waiting: str | None = None  # why no round runs now, for the status page (None while one runs)
        self._failed: tuple[int, str, float] | None = None  # the round whose last attempt failed, why, when (unix)
        self._revoked_seen: set[str] = set()
        self._monitor: Any = None
        self._eligible_now = 0
        self._request_taken = ""  # id of the operator's pin/rollback taken up by this process
        self._request_pending: model_request.ModelRequest | None = None  # taken up, its round not yet completed

    @property
    def server(self) -> ServerSettings:
        return self.file.server

    @property
    def schedule(self) -> ScheduleSettings:
        return self.file.schedule

    # ------------------------------------------------------------------------ settings reload
    def request_reload(self) -> None:
        """Ask the loop to re-read ``server.toml`` (SIGHUP). During an open round the reload waits
        for the round to close, and says so in the log and in the audit log (shown on the page)."""
        self._reload.set()
        if self._open_round is not None and self._deferred_round is None:
            self._deferred_round = self._open_round
            log.info("reload: deferred until round %d closes", self._open_round)
            self._audit_reload(f"deferred until round {self._open_round} closes")

    def _audit_reload(self, detail: str) -> None:
        from coordinator.server.audit import audit

        try:
            audit(self.data_dir, "reload", None, detail)
        except OSError as exc:
            log.warning("reload: the audit log in %s cannot be written (%s); the reload is only in this log", self.data_dir, exc)

    def _refusal(self, new: ServeFile) -> str | None:
        """Why the next start with ``new`` would fail (None: it would start): bad federation settings, or a
        status page off loopback without a token."""
        try:
            federation_config(new, self.data_dir, self.cfg.broker, self.cfg.federation, self.cfg.run_id)
        except ValueError as exc:
            return str(exc)
        if new.server.http_port:
            try:
                from coordinator.server.web import check_bind
            except ImportError:
                return None
            try:
                check_bind(new.server.http_bind, new.server.token)
            except ValueError as exc:
                return str(exc)
        return None

    def reload(self) -> list[str]:
        """Re-read ``server.toml``: the ``[server]`` and ``[schedule]`` tables take effect at once.

        Returns the changes made, as lines (``[schedule] min_clients 2 -> 3``). A file the next
        start would refuse (a bad key or value, or a status page off loopback without a token) is
        refused now: logged as an ERROR with the reason, written to the audit log as a refused
        reload, and the settings in force are kept. ``[server]`` keys read only at start
        (:data:`AT_START`) and the federation settings (the top-level keys, e.g. ``aggregation``)
        are logged at INFO as taking effect at the next start. Every reload is written to the audit
        log (``<data>/audit.jsonl``, shown on the page), a deferred one with the round it waited for.
        """
        deferred, self._deferred_round = self._deferred_round, None
        after = f" (deferred until round {deferred} closed)" if deferred is not None else ""
        try:
            new = read_serve_file(self.config_path)
        except (ValueError, OSError) as exc:
            why: str | None = str(exc)
        else:
            why = self._refusal(new)
        if why is not None:
            log.error("reload refused%s: %s; the settings in force are kept (fix %s, or the next start fails too)",
                      after, why, self.config_path)  # fmt: skip
            self._audit_reload(f"refused{after}: {why}; the settings in force are kept")
            return []
        changes = _changes(self.file.server, new.server, "server") + _changes(self.file.schedule, new.schedule, "schedule")
        later = [c for c in changes if c.split()[1] in AT_START]
        changes = [c for c in changes if c not in later]
        fed_old, fed_new = self.file.federation, new.federation
        for key in sorted(set(fed_old) | set(fed_new)):
            if fed_old.get(key) != fed_new.get(key):
                later.append(f"{key} {fed_old.get(key)!r} -> {fed_new.get(key)!r}")
        # The page, its bind and token, and the federation's settings are set up once at start.
        self.file = ServeFile(new.server, new.schedule, fed_old)
        self._pending = later
        if deferred is not None:
            log.info("reload: round %d closed; the deferred reload is applied now", deferred)
        for line in changes:
            log.info("reload: %s", line)
        for line in later:
            log.info("reload: %s takes effect at the next start", line)
        if not changes and not later:
            log.info("reload: %s read; nothing changed", self.config_path)
        detail = "; ".join(changes + [f"{c} (at the next start)" for c in later]) or "nothing changed"
        self._audit_reload(f"applied{after}: {detail}")
        self._waiting = ""  # log the waiting line again, with the new schedule
        return changes

    # ------------------------------------------------------------------------ the loop
    def _newest_version(self) -> VersionRow | None:
        rows = self.registry.versions()
        return rows[-1] if rows else None

    def next_start(self, now: float | None = None) -> float:
        """UNIX time the next round may start, by the schedule (not counting the devices)."""
        now = time.time() if now is None else now
        at = next_start(now, self._last_end, self.schedule.min_round_interval_s, self.schedule.window, self.tz)
        return max(at, self._retry_at)

    def page_next_start(self, now: float | None = None) -> float | None:
        """What the status page shows as the next start: :meth:`next_start` once ``[schedule] min_clients``
        devices were eligible at the last look, else None ("when enough devices are eligible"): the schedule
        alone would say "in 0 s" while the server is waiting for a device."""
        if self._eligible_now < self.schedule.min_clients:
            return None
        return self.next_start(now)

    def page_waiting(self) -> str | None:
        """Why no round runs now, in words, for the status page and ``/api/round``; None while a round runs.

        E.g. ``"round 9's last attempt closed without quorum at 01:20:13 local (1 update(s) with training windows,
        below the quorum of 2 ...); waiting: 2 eligible devices, 2 needed (next start not before 01:20:33 local)"``
        or ``"waiting: 1 of 2 eligible devices; not eligible: pi-kitchen (offline)"``. Written by the serving loop
        each time it looks (a plain attribute read: safe from the page's threads).
        """
        return None if self._open_round is not None else self._page_waiting

    def run(self, stop: threading.Event | None = None) -> None:
        """Serve until ``stop`` is set (or KeyboardInterrupt: SIGINT, SIGTERM through :func:`install_signals`).

        Raises
        ------
        coordinator.service.StateError
            If the run folder cannot be used or its database is damaged.
        coordinator.server.registry.RegistryDamaged
            If ``server.sqlite`` is damaged.
        coordinator.service.CoordinatorError, har_io.mqtt_link.BrokerRefused
            If the broker cannot be reached in 30 s, or refuses the login.
        """
        from coordinator.runner import CoordinatorError, StateError

        stop = stop or threading.Event()
        grid, runner = self.grid, self.runner
        grid.open()
        last = runner.start(resume=True)  # continues from the newest intact round, or starts afresh
        if last < 0:
            grid.clear_retained()
        self._catch_up_version(last)
        newest = self._newest_version()
        if newest is not None:
            self._last_end = newest.created_unix
        log.info(
            "serving federation %r: epoch %d, run %s, %s; data folder %s",
            self.cfg.federation, self.epoch, self.cfg.run_id,
            f"continuing after round {last} (model version {newest.version if newest else '-'})" if last >= 0 else "no round yet",
            self.data_dir,
        )  # fmt: skip
        round_ = last + 1
        self._revoked_seen = set(self.registry.revoked_names())
        next_revocation_check = 0.0
        page = None
        try:
            try:
                page = self.start_status_page()
            except RuntimeError as exc:  # the port is taken: the message names the setting
                raise CoordinatorError(str(exc)) from None
            while not stop.is_set():
                if self._reload.is_set():
                    self._reload.clear()
                    self.reload()
                grid.wait(self.poll_s)  # a message, and what else has arrived behind it
                if time.monotonic() >= next_revocation_check:
                    self._clear_new_revocations()
                    self._note_leave_requests()
                    next_revocation_check = time.monotonic() + 2.0
                now = time.time()
                seen = grid.eligibility(runner.label_set)
                eligible = seen.eligible
                self._eligible_now = len(eligible)
                start_at = self.next_start(now)
                self._page_waiting = self._waiting_text(len(eligible), start_at, now, seen.left_out)
                if len(eligible) >= self.schedule.min_clients and now >= start_at:
                    self._waiting = ""
                    log.info("round %d: starting with %d eligible devices (%s)", round_, len(eligible), ", ".join(eligible))
                    self._drop_refused_models()
                    try:
                        runner.note({"epoch": self.epoch})
                        round_ = runner.catch_up(round_)
                        self._open_round = round_
                        self._take_model_request()
                        opened = time.time()
                        record = runner.run_round(round_)
                    except StateError:
                        raise
                    except CoordinatorError as exc:  # e.g. devices of different label sets: not worth a restart
                        log.error("round %d could not start: %s; trying again later", round_, exc)
                        wait = min(RETRY_AFTER_FAILED_S, max(RETRY_MIN_S, self.schedule.min_round_interval_s))
                        self._retry_at = time.time() + wait
                        continue
                    finally:
                        self._open_round = None
                    if record is None:  # closed without quorum: the next attempt within one interval
                        self._retry_at = time.time() + min(RETRY_AFTER_FAILED_S, self.schedule.min_round_interval_s)
                        self._failed = (round_, runner.last_failure, time.time())
                        continue
                    self._failed = None
                    self._after_round(record, opened)
                    self._finish_model_request()
                    self._last_end = time.time()
                    self._retry_at = 0.0
                    round_ += 1
                else:
                    self._log_waiting(len(eligible), start_at, now, seen.left_out)
        except run_state.StateDamaged as exc:
            raise StateError(str(exc)) from None
        finally:
            if page is not None:
                page.stop()
                if self._monitor is not None:
                    self._monitor.stop()
            grid.close()
            self.registry.close()

    def _take_model_request(self) -> None:
        """Take up an operator's pending pin or rollback (:mod:`coordinator.server.model_request`) before a round.

        Once per request and process: the runner continues from the requested version's model
        (:meth:`coordinator.runner.FederationRunner.adopt`). A request already done (its id in the run's
        database) is deleted; one that cannot be done (the version is no longer kept, no best version) is
        logged and deleted, and the federation goes on as it was.
        """
        from coordinator.runner import CoordinatorError

        try:
            req = model_request.read_request(self.data_dir)
        except ValueError as exc:
            log.error("%s", exc)
            return
        if req is None or req.id == self._request_taken:
            return
        if self.runner.state.get(REQUEST_DONE_KEY) == req.id:
            model_request.clear_request(self.data_dir, req)
            return
        try:
            self.runner.ensure_federation()
            if req.version is None:
                best = self.runner.best_model()
                if best is None:
                    raise ValueError("the quality guard holds no best version yet (it is off, or no version was judged)")
                spec, state = best
            else:
                rows = {v.version: v for v in self.registry.versions()}
                if req.version not in rows:
                    raise ValueError(f"version {req.version} is not kept (kept: {sorted(rows)})")
                spec, state = run_state.load_state_file(rows[req.version].path)
            self.runner.adopt(spec, state, rollback_id=req.id if req.action == "rollback" else None,
                              keep_best=req.version is None)  # fmt: skip
        except (ValueError, OSError, CoordinatorError) as exc:
            log.error("operator's %s cannot be done: %s; the request is dropped", req.describe(), exc)
            model_request.clear_request(self.data_dir, req)
            return
        self._request_taken = req.id
        self._request_pending = req
        log.warning("operator's %s: the next round starts from it%s", req.describe(),
                    " with a halved server step" if req.action == "rollback" else "")  # fmt: skip

    def _finish_model_request(self) -> None:
        """The round that started from a requested model completed: note the request done and delete its file."""
        req = self._request_pending
        if req is None:
            return
        self.runner.state.put(REQUEST_DONE_KEY, req.id)
        model_request.clear_request(self.data_dir, req)
        self._request_pending = None

    def _catch_up_version(self, last: int) -> None:
        """Give round ``last`` its version when a stop came between the round's commit and its version file.

        The run's state commits a round before serve writes its version (a SIGKILL can fall in
        between); the model taken up is that round's, so it becomes the next version now, with its
        participation rows from the round's record.
        """
        newest = self._newest_version()
        if last < 0 or (newest is not None and newest.round >= last):
            return
        done = [r for r in self.runner.records() if r.round == last]
        if done:
            log.info("round %d was completed but not kept as a version (the server stopped in between); keeping it now", last)
            self._after_round(done[0])

    def _clear_new_revocations(self) -> None:
        """For each device revoked since the last look (``fedhar-coordinator revoke`` runs in another
        process): clear its retained status and personalised model chunks on the broker, through this
        server's own session (logging in as the coordinator elsewhere would disconnect this one)."""
        now = self.registry.revoked_names()
        for cid in sorted(now - self._revoked_seen):
            self.grid.forget(cid)
            if self.grid.clear_device(cid):
                log.info("device %s was revoked: what the broker retained of it is cleared", cid)
        self._revoked_seen = set(now)

    def _note_leave_requests(self) -> None:
        """Keep the word of each device that left from its app (:meth:`coordinator.grid.Grid.leaving`) in the data folder, for the operator.

        Nothing is deleted here: ``fedhar-coordinator devices`` lists the requests, and the operator
        answers one with ``forget NAME`` (or ``revoke NAME``). A device that left is offline, so it
        is not selected meanwhile.
        """
        from coordinator.server.lifecycle import note_leave_request

        for cid, st in sorted(self.grid.leaving().items()):
            if self.registry.is_revoked(cid):
                continue
            try:
                if note_leave_request(self.data_dir, cid, st.left == "forget", st.sent_unix) and st.left == "forget":
                    log.warning("device %s asks to be forgotten: fedhar-coordinator forget %s deletes what the server holds of it",
                                cid, cid)  # fmt: skip
            except OSError as exc:
                log.error("device %s left, but its request cannot be kept in %s: %s", cid, self.data_dir, exc)

    def _drop_refused_models(self) -> None:
        """Forget the personalised models of devices revoked or forgotten since they were made (not saved again)."""
        for cid in self.runner.personal_ids():
            if self.registry.is_revoked(cid) and self.runner.forget_client(cid):
                log.info("the personalised model of revoked device %s is dropped", cid)

    def _page_blob_store(self) -> Any:
        """The folder blob store the status page serves under ``/blobs/`` (transport blobs, folder store, a page); else None.

        Its URLs start with ``blob_public_url``, else with the page's own address (known once the
        page bound its port). Without a page the grid serves the store on ``blob_bind:blob_port``.

        Raises
        ------
        ValueError
            If the page binds a wildcard address (``0.0.0.0``, ``::``) and no ``blob_public_url``
            says how devices reach it.
        """
        cfg = self.cfg
        if cfg.transport.kind != "blobs" or cfg.transport.store != "folder" or not self.file.server.http_port:
            return None
        try:
            from coordinator.transport.folder_store import FolderBlobStore, load_secret
        except ImportError:  # no web libraries: the page is not served either
            return None
        if not cfg.transport.public_url and self.file.server.http_bind in ("0.0.0.0", "::", ""):
            raise ValueError(f"[server] http_bind = {self.file.server.http_bind!r} serves the blob store on every address: "
                                   "set [transport] public_url (e.g. 'http://homeserver.lan:8765') so devices find it")  # fmt: skip
        return FolderBlobStore(cfg.run_dir / "blobs", cfg.transport.public_url, load_secret(cfg.run_dir / "blob-secret"),
                               refused=self.admission.refused)  # fmt: skip

    def start_status_page(self) -> Any:
        """Start the status page (coordinator.server.web) in a thread when ``[server] http_port`` is not 0.

        Returns the running page server, or None when there is none (port 0, or the web module or
        its libraries are not installed: logged). The page reads the federation through its own
        monitor session: the broker's read-only monitor account when ``[server] broker_dir`` is set,
        else this server's broker settings under another client id.

        Raises
        ------
        RuntimeError
            If the page does not start (the port is taken).
        """
        if self.server.http_port == 0:
            return None
        try:
            from coordinator.server.monitor import Monitor
            from coordinator.server.web import ServerView, start_status_page
        except ImportError as exc:
            log.warning("no status page: %s (install the coordinator extra)", exc)
            return None
        from har_models.wire.topics import Topics

        broker = monitor_broker(self.server, self.cfg.broker, os.environ.get("CREDENTIALS_DIRECTORY"))
        monitor = None
        if broker is not None:
            monitor = Monitor(Topics(self.cfg.federation), broker, client_name=f"fedhar-monitor-{self.cfg.federation}")
            monitor.start(wait_s=None)
        stall_after_s = self.server.stall_after * (self.schedule.min_round_interval_s + self.cfg.timing.round_timeout_s)
        view = ServerView(name=self.server.name, run_state=run_state.RunState(self.cfg.run_dir), registry=Registry(self.data_dir),
                          monitor=monitor, next_start=self.page_next_start, waiting=self.page_waiting, stall_after_s=stall_after_s,
                          broker_dir=Path(self.server.broker_dir) if self.server.broker_dir else None,
                          keep_versions=self.server.keep_versions)  # fmt: skip
        try:
            blob_routes: list[Any] = []
            if self._blob_store is not None:
                from coordinator.transport.folder_store import blob_app

                blob_routes = list(blob_app(self._blob_store).routes)
            page = start_status_page(view, self.server.http_bind, self.server.http_port, self.server.token, blob_routes=blob_routes)
            if self._blob_store is not None and not self.cfg.transport.public_url:
                host = self.server.http_bind
                self._blob_store.base_url = f"http://{f'[{host}]' if ':' in host else host}:{page.port}"
            if self._blob_store is not None:
                log.info("blob transport: models and uploads in %s, served at %s/blobs/", self._blob_store.folder,
                         self._blob_store.base_url)  # fmt: skip
        except BaseException:
            if monitor is not None:
                monitor.stop()
            raise
        log.info("status page on http://%s:%d/", self.server.http_bind, page.port)
        self._monitor = monitor
        return page

    def _waiting_text(self, n: int, start_at: float, now: float, left_out: Mapping[str, str]) -> str:
        """The waiting line with the devices that are not eligible and why, after the last failed attempt if any."""
        line = waiting_line(n, self.schedule.min_clients, start_at, now, self.tz) + _not_eligible(left_out)
        if self._failed is not None:
            rnd, why, at = self._failed
            when = dt.datetime.fromtimestamp(at, self.tz).strftime("%H:%M:%S")
            line = f"round {rnd}'s last attempt closed without quorum at {when} local ({why}); {line}"
        return line

    def _log_waiting(self, n: int, start_at: float, now: float, left_out: Mapping[str, str]) -> None:
        """Log the waiting line when it changes, and every 10 minutes while it does not."""
        line = waiting_line(n, self.schedule.min_clients, start_at, now, self.tz)
        if line == self._waiting and now - self._waiting_logged < 600:
            return
        self._waiting, self._waiting_logged = line, now
        log.info("%s%s", line, _not_eligible(left_out))

    def _after_round(self, record: RoundRecord, opened_unix: float | None = None) -> None:
        """Keep the round's global model as the next version, note each device's part, apply the retention.

        ``opened_unix``: when the round opened (UNIX s; None: now), the time of its participation rows,
        so that a bundle re-issued while the round was open is not taken as used by an update sent with
        the old password (:func:`coordinator.server.lifecycle.prune_bundles`).
        """
        spec, global_state = self.runner.model()
        newest = self._newest_version()
        version = 1 if newest is None else newest.version + 1
        path = version_path(self.data_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        run_state.save_state_file(path, spec, global_state,
                        extra={"version": str(version), "round": str(record.round), "run_id": self.cfg.run_id})  # fmt: skip
        ev = record.evaluation
        figures: dict[str, Any] = {
            "round": record.round,
            "updates": record.participation.updates,
            "selected": record.participation.selected,
            "personalisation_accuracy": ev.personalisation.accuracy if ev.personalisation else None,
            "personalisation_macro_f1": ev.personalisation.macro_f1 if ev.personalisation else None,
            "global_accuracy": ev.global_.accuracy if ev.global_ else None,
            "global_macro_f1": ev.global_.macro_f1 if ev.global_ else None,
            "epoch": self.epoch,
        }
        figures = {k: (None if isinstance(v, float) and v != v else v) for k, v in figures.items()}  # NaN is not JSON
        self.registry.add_version(version, record.round, spec.version, path, figures)
        for cid, m in sorted(ev.personalisation_clients.items()):
            self.registry.note_participation(record.round, cid, m.accuracy, m.macro_f1, t=opened_unix)
        prune_bundles(self.data_dir)  # devices that contributed have joined: their bundles (passwords) go
        log.info("round %d: model version %d kept in %s", record.round, version, path)
        rows = self.registry.versions()
        for old in rows[: max(0, len(rows) - self.server.keep_versions)]:
            old.path.unlink(missing_ok=True)
            self.registry.delete_version(old.version)


def install_signals(server: Server) -> None:
    """SIGHUP re-reads the settings (:meth:`Server.reload` from the loop); SIGTERM and SIGINT stop.

    SIGINT is given Python's own handler even when the process started with it ignored or
    blocked (both are inherited: a shell's ``trap '' INT``, ``nohup``, a parent that blocked it),
    so ``serve`` always stops on Ctrl-C or ``kill -INT`` as documented.
    """

    def on_hup(signum: int, frame: object) -> None:
        server.request_reload()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP, signal.SIGTERM, signal.SIGINT})


def _not_eligible(left_out: Mapping[str, str]) -> str:
    """``"; not eligible: a (offline), b (no training windows)"`` for the waiting line, or "" when every device is.

    Revoked devices are left out: they are no candidates (the devices table says revoked), and a
    forgotten one's name must not come back on the page.
    """
    named = sorted((c, r) for c, r in left_out.items() if r != "revoked")
    return "; not eligible: " + ", ".join(f"{c} ({r})" for c, r in named) if named else ""
