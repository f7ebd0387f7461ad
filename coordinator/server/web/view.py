"""The status site's view model: what the page, the JSON API and ``/metrics`` show, computed in one place.

:class:`ServerView` reads the server database (devices, versions, participation), the run's database
(round records folded as they complete, harm events) and the broker through the read-only monitor
account, so page, API and metrics never disagree; :meth:`ServerView.health` is the one list of
reasons the federation cannot make progress, for the page and ``/healthz`` alike.
"""

from __future__ import annotations

import copy
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from coordinator.record import RecordError, RoundRecord
from coordinator.server.figures import read_figures
from coordinator.server.harm import BAD_OBJECT, EVENT_KINDS, DeviceHarm, damaged_objects, harm_by_device, harm_events
from coordinator.server.metrics import RoundTotals, release_version
from coordinator.server.monitor import Monitor, MonitorSnapshot
from coordinator.server.settings import ServerSettings
from coordinator.server.version_marks import operator_versions, version_marks
from coordinator.server.web import devices as device_table
from coordinator.server.web import health as rules
from coordinator.server.web.certs import CertificateWatch
from coordinator.server.web.fold import GuardDecision, RoundFold, version_rows
from coordinator.server.web.series import round_charts
from coordinator.state import RunState, StateDamaged

log = logging.getLogger("fedhar.server.web")

KEEP_VERSIONS = ServerSettings.keep_versions
"""``[server] keep_versions``'s default."""


class RegistryLike(Protocol):
    """What the site reads of the server database (``coordinator.server.registry.Registry``)."""

    def devices(self) -> Sequence[Any]: ...  # rows with name, owner, enrolled_unix, revoked_unix, forgotten_unix, state

    # rows with version, round, created_unix, arch_version, path, figures
    def versions(self, newest: int | None = None) -> Sequence[Any]: ...

    def participation_summary(self) -> Mapping[str, Any]: ...  # name -> rounds, last_t, last (round, accuracy, macro_f1)


@dataclass
class ServerView:
    """Everything the page, the API and the metrics read; every method is safe to call from any thread.

    ``run_state`` is best a RunState of its own on the run folder (the page's reads stay outside the
    coordinator's transactions); ``next_start`` and ``waiting`` come from ``serve``; ``stall_after_s``
    (None: never) is how long without a completed round :meth:`health` calls a stall; ``broker_dir``
    holds the TLS certificates whose expiry is shown; ``keep_versions`` multiplies the disk budget.
    """

    name: str = "fedhar-home"
    run_state: RunState | None = None
    registry: RegistryLike | None = None
    monitor: Monitor | None = None
    next_start: Callable[[], float | None] | None = None
    waiting: Callable[[], str | None] | None = None
    wall: Callable[[], float] = time.time
    stall_after_s: float | None = None
    broker_dir: Path | None = None
    keep_versions: int = KEEP_VERSIONS
    problems: Callable[[], list[str]] | None = None  # the serving loop's own faults in force (a full disk, a held database)
    _certs: CertificateWatch | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _seen: tuple[int, int] | None = field(default=None, repr=False)
    _last_t: float | None = field(default=None, repr=False)
    _born: float = field(default_factory=time.time, repr=False)
    _fold: RoundFold = field(default_factory=RoundFold, repr=False)
    _charts: tuple[tuple[int, int] | None, list[str]] = field(default=(None, []), repr=False)
    _harm: tuple[Any, dict[str, DeviceHarm]] = field(default=(None, {}), repr=False)
    bad_rows: int = 0

    # ------------------------------------------------------------------ sources
    @property
    def release(self) -> str:
        """This program's release ("unknown" from a source tree without metadata)."""
        return release_version()

    @property
    def data_dir(self) -> Path | None:
        """The data folder (the registry's), or None without a registry."""
        data = getattr(self.registry, "data_dir", None)
        return Path(data) if data is not None else None

    def snapshot(self) -> MonitorSnapshot:
        """The monitor's view now (an empty one without a monitor)."""
        return self.monitor.snapshot() if self.monitor is not None else MonitorSnapshot()

    def _sync(self) -> tuple[int, int] | None:
        """Bring the fold up to the run's database (only newer rounds unless rows were rewritten); its version after.

        Rows that do not read as records are skipped and counted in :attr:`bad_rows`. Raises StateDamaged.
        """
        assert self.run_state is not None
        with self._lock:
            version = self.run_state.rounds_version()
            if version == self._seen:
                return version
            if self._seen is None or version[0] != self._seen[0] or version[1] < self._seen[1]:
                self._fold, self.bad_rows = RoundFold(), 0
            for row in self.run_state.rounds(after=self._fold.last):
                try:
                    rec = RoundRecord.from_json(row)
                except RecordError as exc:
                    self.bad_rows += 1
                    log.warning("status page: a round row is not a record and is left out: %s", exc)
                    continue
                self._fold.add(rec)
            self._last_t = self.run_state.completed_unix(self._fold.last) if self._fold.last >= 0 else None
            self._seen = version
            return version

    def _folded(self) -> RoundFold:
        """The fold, current (without a database: a fold of the monitor's last record alone)."""
        if self.run_state is None:
            fold = RoundFold()
            for rec in self.records():
                fold.add(rec)
            return fold
        self._sync()
        return self._fold

    def records(self, since: int = 0, limit: int | None = None) -> list[RoundRecord]:
        """The completed rounds from round ``since`` on, at most ``limit`` (without a database: the retained last one).

        Raises StateDamaged if the run's database cannot be read.
        """
        if self.run_state is None:
            snap = self.snapshot()
            try:
                rec = RoundRecord.from_json(snap.progress.record) if snap.progress is not None else None
            except RecordError:
                return []
            return [rec] if rec is not None and rec.round >= since and (limit is None or limit > 0) else []
        self._sync()
        out = []
        for row in self.run_state.rounds(after=since - 1, limit=limit):
            try:
                out.append(RoundRecord.from_json(row))
            except RecordError:
                continue  # counted and logged once by _sync
        return out

    def warm(self) -> None:
        """Fold every round record now (what the first request would do), logging a damaged database."""
        try:
            t0 = time.monotonic()
            if self.run_state is not None and self._sync() is not None:
                log.info("status page: %d rounds read in %.1f s", self._fold.totals.rounds, time.monotonic() - t0)
        except StateDamaged as exc:
            log.error("status page: %s", exc)

    def broker_link(self) -> bool | None:
        """Whether the page's own session with the broker is up; None when it has none (no monitor link)."""
        if self.monitor is None or self.monitor.link is None:
            return None
        return self.snapshot().connected

    def certificates(self) -> list[Any]:
        """The broker's certificates' expiry (server and CA); [] without a broker folder or TLS, or an unreadable file."""
        if self.broker_dir is None:
            self._certs = None
            return []
        if self._certs is None or self._certs.folder != Path(self.broker_dir):
            self._certs = CertificateWatch(Path(self.broker_dir))
        return self._certs.read(self.wall())

    def certificate_seconds_left(self) -> dict[str, float]:
        """Seconds until each certificate of :meth:`certificates` expires, by ``which`` (negative: expired)."""
        now = self.wall()
        return {c.which: c.seconds_left(now) for c in self.certificates()}

    def audit(self, newest: int | None = 10) -> list[Any]:
        """The ``newest`` entries of the operator audit log (None: all)."""
        from coordinator.server.audit import read_audit

        if self.data_dir is None:
            return []
        try:
            return read_audit(self.data_dir, newest)
        except OSError as exc:
            log.warning("status page: the audit log cannot be read: %s", exc)
            return []

    def seconds_since_last_round(self) -> float | None:
        """Seconds since the newest completed round was recorded (None: no round yet, or no database)."""
        if self.run_state is None:
            return None
        self._sync()
        with self._lock:
            return None if self._last_t is None else max(0.0, self.wall() - self._last_t)

    # ------------------------------------------------------------------ what the federation is doing
    def totals(self) -> RoundTotals:
        """What ``/metrics`` exports of the completed rounds, O(new rounds) a call.

        ``without_quorum`` is the larger of the records' count and the run's ``round_failed`` events.
        """
        if self.run_state is None:
            return RoundTotals.of(self.records())
        self._sync()
        failed = self.run_state.count_events("round_failed")
        with self._lock:
            out = copy.deepcopy(self._fold.totals)
        out.without_quorum = max(out.without_quorum, failed)
        return out

    def charts(self) -> list[str]:
        """The page's round charts (SVG text), drawn again only when a round was added or rewritten."""
        if self.run_state is None:
            return round_charts(self.records())
        version = self._sync()
        with self._lock:
            if self._charts[0] != version:
                self._charts = (version, self._fold.series.draw())
            return list(self._charts[1])

    def guard(self) -> GuardDecision | None:
        """The quality guard's newest decision with its evidence (None: it never judged)."""
        return self._folded().guard

    def harm(self) -> dict[str, DeviceHarm]:
        """Each shown device's clipped updates, rejected messages and quarantine (:mod:`coordinator.server.harm`)."""
        if self.run_state is None:
            every = harm_by_device([], self._folded().rejected)
        else:
            self._sync()
            key = (self._seen, tuple(self.run_state.count_events(k) for k in EVENT_KINDS))
            with self._lock:
                every, rejected = self._harm[1], {c: dict(r) for c, r in self._fold.rejected.items()}
            if self._harm[0] != key:
                every = harm_by_device(harm_events(self.run_state), rejected)
                with self._lock:
                    self._harm = (key, every)
        rows = self.devices_registered()
        shown = {str(r.name) for r in rows} | set(self.snapshot().devices) | set(self._folded().took)
        shown -= {str(r.name) for r in rows if str(r.state) == "forgotten"}
        return {name: h for name, h in every.items() if name in shown}

    def damaged_objects(self) -> dict[str, int]:
        """Stored object (SHA-256 hex) -> devices' reports that its bytes were damaged ({} when none; one count first)."""
        if self.run_state is None or not self.run_state.count_events(BAD_OBJECT):
            return {}
        return damaged_objects(self.run_state.events(BAD_OBJECT))

    def disk(self) -> rules.DiskBudget | None:
        """What the federation needs on disk and has free; None without a data folder. Raises OSError."""
        if self.data_dir is None or self.registry is None:
            return None
        paths = [Path(v.path) for v in self.registry.versions()]
        fold = self._folded()
        run_dir = self.run_state.folder if self.run_state is not None else None
        return rules.measure_disk(self.data_dir, run_dir, paths, self.keep_versions, fold.last_updates)

    def health(self) -> list[str]:
        """Why the federation cannot make progress now, one reason each (broker link, databases, disk, stuck round, files, stall)."""
        out = list(self.problems()) if self.problems is not None else []
        if self.broker_link() is False:
            out.append("the broker cannot be reached: presence, the open round and the coordinator's state are unknown; "
                       "what the page shows is the last known")  # fmt: skip
        try:
            out += self._progress_problems()
        except (StateDamaged, sqlite3.Error) as exc:
            out.append(f"a database cannot be read: {exc}")
        try:
            disk = self.disk()
            if disk is not None and (problem := disk.problem()):
                out.append(problem)
        except (StateDamaged, sqlite3.Error):
            pass  # said above
        except OSError as exc:
            out.append(f"the data folder's disk cannot be read: {exc}")
        self.certificates()
        if self._certs is not None and self._certs.problem is not None:
            out.append(self._certs.problem)
        return out

    def _progress_problems(self) -> list[str]:
        out = []
        self.devices_registered()  # the server database must read as well as the run's
        cur = self.current_round()
        snap = self.snapshot()
        if cur["state"] == "training" and (stuck := rules.stuck_round(cur["round"], snap.announced_unix, cur["deadline_unix"] or 0.0,
                                                                      self.wall())):  # fmt: skip
            out.append(stuck)
        if self.stall_after_s is not None and self.next_start is not None and self.next_start() is not None:
            since = self.seconds_since_last_round()
            waited = since if since is not None else max(0.0, self.wall() - self._born)
            if waited > self.stall_after_s:
                out.append(f"no round completed for {waited / 60:.0f} min (more than {self.stall_after_s / 60:.0f} min) "
                           "while enough devices are eligible")  # fmt: skip
        return out

    def warnings(self) -> list[str]:
        """What the page warns of before it stops progress: the disk running short of the next rounds' need, and
        stored objects devices downloaded damaged (the store's disk or a proxy spoils bytes)."""
        try:
            disk = self.disk()
            damaged = self.damaged_objects()
        except (OSError, StateDamaged, sqlite3.Error):
            return []
        out = [w] if disk is not None and disk.problem() is None and (w := disk.warning()) else []
        out += [f"stored object {sha[:12]} reached devices damaged ({n} {'report' if n == 1 else 'reports'}); "
                "the coordinator writes an object it still holds again" for sha, n in sorted(damaged.items())]  # fmt: skip
        return out

    # ------------------------------------------------------------------ devices, rounds, versions
    def devices_registered(self) -> list[Any]:
        """The registry's device rows ([] without a registry)."""
        return list(self.registry.devices()) if self.registry is not None else []

    def devices(self) -> list[dict[str, Any]]:
        """One JSON object per device: enrolled ones, and any other the broker or the records show.

        Keys: ``name``, ``owner``, ``state``, ``renamed_to``, ``online`` (None: unknown while the broker link is
        down), ``status``, ``last_seen_unix``, ``refresh_s``, ``last_contribution_unix``, ``rounds``,
        ``last_round``, ``last_accuracy``, ``last_macro_f1``, ``arch_version``, ``backend``, ``program_fault``,
        ``fault``, ``n_train``, ``n_test``, ``sensing``, ``cost``, ``last_known`` and the harm keys
        (:meth:`~coordinator.server.harm.DeviceHarm.to_json`).
        """
        fold = self._folded()
        with self._lock:
            took = dict(fold.took)
        part = self.registry.participation_summary() if self.registry is not None else {}
        return device_table.device_rows(self.snapshot(), self.devices_registered(), part, took, self.harm(),
                                        fold.arch_at, self.wall(), self.broker_link() is False)  # fmt: skip

    def device_counts(self) -> dict[str, int]:
        """Devices by state for the metrics: enrolled, revoked, forgotten (registry) and online (monitor)."""
        return device_table.device_counts(self.devices_registered(), self.snapshot())

    def current_round(self) -> dict[str, Any]:
        """The open round and its progress, the last completed round and the next start (JSON object).

        Keys: ``coordinator``, ``state`` ("training", "finished", "idle"), ``run_id``, ``round``, ``stage``,
        ``epoch``, ``selected``, ``answered``, ``missing``, ``deadline_unix``, ``deadline_in_s``,
        ``last_completed``, ``rounds_planned``, ``next_start_unix``, ``waiting``.
        """
        snap = self.snapshot()
        now = self.wall()
        ann = snap.announcement
        last = snap.progress.round if snap.progress is not None else None
        done = self.totals().last_round if self.run_state is not None else -1
        if done >= 0:
            last = done if last is None else max(last, done)
        open_ = ann is not None and ann.state == "training" and (last is None or ann.round > last)
        cs = snap.coordinator
        return device_table.clean({
            "coordinator": {"online": snap.coordinator_online, "state": cs.state if cs else None, "run_id": cs.run_id if cs else None},
            "state": ("training" if open_ else ann.state if ann is not None and ann.state == "finished" else "idle"),
            "run_id": ann.run_id if ann is not None else None,
            "epoch": ann.epoch if ann is not None else None,
            "round": ann.round if open_ and ann is not None else None,
            "stage": ann.stage if open_ and ann is not None else None,
            "selected": sorted(snap.selected) if open_ else [],
            "answered": sorted(snap.answered) if open_ else [],
            "missing": sorted(snap.selected - snap.answered) if open_ else [],
            "deadline_unix": ann.deadline_unix if open_ and ann is not None else None,
            "deadline_in_s": round(ann.deadline_unix - now, 1) if open_ and ann is not None and ann.deadline_unix else None,
            "last_completed": last,
            "rounds_planned": snap.progress.rounds if snap.progress is not None else None,
            "next_start_unix": self.next_start() if self.next_start is not None else None,
            "waiting": self.waiting() if self.waiting is not None and not open_ else None,
        })  # fmt: skip

    def versions(self, newest: int | None = None) -> list[dict[str, Any]]:
        """Model versions (all, or the ``newest``), newest first, with ``figures``, ``quality`` and ``marks``."""
        from coordinator.server import model_request

        if self.registry is None:
            return []
        every = list(self.registry.versions())
        rows = [device_table.clean({"version": v.version, "round": v.round, "created_unix": v.created_unix,
                                    "arch_version": v.arch_version, "path": str(v.path), "figures": read_figures(v.figures or {})})
                for v in (every[-newest:] if newest else every)]  # fmt: skip
        fold = self._folded()
        try:
            req = model_request.read_request(self.data_dir) if self.data_dir is not None else None
        except ValueError:
            req = None
        with self._lock:
            marks = version_marks([int(v.version) for v in every], {int(v.version): int(v.round) for v in every}, fold.best_round(),
                                  set(fold.rolled_back), operator_versions(self.audit(None)),
                                  (req.action, req.version) if req is not None else None)  # fmt: skip
            out = version_rows(rows, fold, marks)
        return sorted(device_table.clean(out), key=lambda r: -int(r["version"]))

    def malformed_counts(self) -> dict[str, int]:
        """The monitor's counts of ignored messages by kind."""
        return dict(self.snapshot().malformed)
