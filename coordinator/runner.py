"""The federation runner: bootstrap or resume, one round to a :class:`~coordinator.record.RoundRecord`, growth, persistence.

It drives the pure round steps of :mod:`coordinator.round` over a transport seam, :class:`Grid`
(after Flower's ``Grid``: eligible devices with reasons, wait, one exchange, progress, forget a
client). :class:`coordinator.mqtt_grid.MqttGrid` is the network grid; the tests use an in-memory
one, so rounds, resume, FedDist growth and strategy state run without a broker. ``fedhar-coordinator
run`` (N rounds) and ``serve`` (for months) are two short loops over the same runner::

    last = runner.start(resume)          # bootstrap or resume: the last completed round
    runner.wait_for_clients()
    record = runner.run_round(last + 1)  # None: closed without quorum, run it again
    runner.report({...})                 # report.json
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from coordinator import feddist_steps, guard, spill
from coordinator.config import CoordinatorConfig
from coordinator.evaluation import Evaluator
from coordinator.global_measure import GlobalMeasure
from coordinator.grid import CoordinatorError, Grid, StateError
from coordinator.record import (
    RoundRecord,
    records,
)
from coordinator.report import write_report
from coordinator.round import Tally, base_plan, check_quorum, evaluate_round, round_record, summary_line
from coordinator.rounds import NO_STEERING, Parts, compose
from coordinator.state import RunState, StateDamaged
from coordinator.strategies import Aggregate, Federation
from coordinator.updates import ClientUpdate
from har_io.cli import write_settings_file
from har_io.memory import release_free_memory
from har_models.data.labels import LABEL_SETS
from har_models.data.windowing import ChannelStats
from har_models.nn.model import ArchSpec, init_state

log = logging.getLogger("fedhar.coordinator")


OPERATOR_SHRINKS = "operator_step_shrinks"
"""Key in the run's database: the request ids of the operators' rollbacks so far (:meth:`FederationRunner.adopt`)."""

POLICY_STATE = "round_policy_state"
"""Key in the run's database: what the round policy keeps across a restart (:meth:`coordinator.rounds.base.RoundPolicy.record`)."""

PLOT_EVERY_S = 60.0
"""After a round, ``metrics.png`` is drawn again only if the last drawing is this old (s): drawing it costs about 0.2 s
of CPU, more than a served round's own bookkeeping. The report's JSON and table follow every round, and a report with
run facts (the end of a run, :meth:`FederationRunner.report` with ``extra``) always draws it."""


def open_state(cfg: CoordinatorConfig) -> RunState:
    """Open the run's database in ``cfg.run_dir`` (created when missing).

    Raises
    ------
    StateError
        If the database is damaged.
    """
    try:
        return RunState(cfg.run_dir)
    except StateDamaged as exc:
        raise StateError(str(exc)) from None


class FederationRunner:
    """Runs the rounds of a federation described by a :class:`CoordinatorConfig` over a :class:`Grid`.

    Parameters
    ----------
    cfg : CoordinatorConfig
    grid : Grid
    evaluator : Evaluator, optional
        Union test set for the global and generalisation measures (research harness).
    report_header : dict, optional
        Extra run facts for the report (dataset, command, ...).
    state : RunState, optional
        The run's database, when the grid shares it (default: :func:`open_state`).
    parts : Parts, optional
        The round policy and strategy, when the grid shares them (default: :func:`coordinator.rounds.compose`).

    Raises
    ------
    StateError
        If the run folder's database is damaged.
    """

    def __init__(self, cfg: CoordinatorConfig, grid: Grid, evaluator: Evaluator | None = None,
                 report_header: Mapping[str, Any] | None = None, state: RunState | None = None,
                 parts: Parts | None = None):  # fmt: skip
        self.cfg = cfg
        self.grid = grid
        self.evaluator = evaluator
        self.measure = GlobalMeasure(evaluator, cfg.evaluation.global_from == "clients", cfg.rounds - 1)
        self.report_header = dict(report_header or {})
        self.state = state if state is not None else open_state(cfg)
        parts = parts if parts is not None else compose(cfg, self.state)
        self.policy = parts.policy
        self.strategy = parts.strategy
        # a restart must find every version the round policy may still need
        self.state.keep_rounds = max(self.state.keep_rounds, 1 + self.policy.versions_needed)
        self._fed: Federation | None = None
        self._label_set = ""
        self._extra: dict[str, Any] = {}
        self._plotted = -math.inf  # monotonic time of the last metrics.png (s)
        self._tried_round: int | None = None  # the round the last attempt was of
        self._tried_model: tuple[ArchSpec, int] | None = None  # the version it published (spec, identity of the global model)
        self._failed_quorums = 0  # exchanges of that round that closed without quorum (its record's attempts - 1)
        self.last_failure = ""  # why the last run_round closed without changing the model ("" after a completed round)
        self._restarts_waited: dict[str, float] = {}  # device -> the restart (its time) already waited for
        self._opened: float | None = None  # when the last round attempt opened (monotonic s), for the pace's period
        self._period_s = cfg.timing.round_timeout_s  # expected time between round openings (s): the deadline until one is seen
        self._amended: list[int] = []  # earlier rounds whose records the last completed round added a figure to

    # ------------------------------------------------------------------ what others may read
    @property
    def label_set(self) -> str:
        """The federation's label set ("" before it exists)."""
        return self._label_set

    @property
    def spec(self) -> ArchSpec | None:
        """The architecture in force (None before the federation exists)."""
        return self._fed.spec if self._fed is not None else None

    def model(self) -> tuple[ArchSpec, Mapping[str, Any]]:
        """The architecture and global model in force.

        Raises
        ------
        CoordinatorError
            If there is no federation yet.
        """
        if self._fed is None:
            raise CoordinatorError("there is no federation yet: no round has run")
        return self._fed.spec, self._fed.global_state

    def records(self) -> list[RoundRecord]:
        """The records of the completed rounds, in order.

        Raises
        ------
        StateError
            If the run folder's database cannot be read.
        """
        try:
            return records(self.state.rounds())
        except StateDamaged as exc:
            raise StateError(str(exc)) from None

    def forget_client(self, cid: str) -> bool:
        """Drop the personalised model of ``cid`` (revoked or forgotten; not saved again); True if it had one."""
        if self._fed is None or cid not in self._fed.personal:
            return False
        del self._fed.personal[cid]
        return True

    def rename_client(self, old: str, new: str) -> bool:
        """Device ``old`` is now called ``new``: its personalised model goes with it (True if it had one).

        Raises
        ------
        ValueError
            If ``new`` already has a personalised model.
        """
        if self._fed is None or old not in self._fed.personal:
            return False
        if new in self._fed.personal:
            raise ValueError(f"{new} already has a personalised model; forget it before renaming {old} to it")
        self._fed.personal[new] = self._fed.personal.pop(old)
        return True

    def release(self, cid: str) -> bool:
        """Release device ``cid`` from the quality guard's quarantine (an operator's command); True if it was quarantined."""
        return self.strategy.release(cid)

    def personal_ids(self) -> list[str]:
        """Ids of the devices that have a personalised model (sorted)."""
        return sorted(self._fed.personal) if self._fed is not None else []

    @property
    def best_round(self) -> int | None:
        """The round whose model the quality guard holds as the best version (None: guard off or nothing judged)."""
        best = self.strategy.best_version()
        return best[0] if best is not None else None

    def best_model(self) -> tuple[ArchSpec, Mapping[str, Any]] | None:
        """The quality guard's best version (architecture, global model); None when there is none."""
        best = self.strategy.best_version()
        return (best[1], best[2]) if best is not None else None

    def adopt(self, spec: ArchSpec, global_state: Mapping[str, Any], rollback_id: str | None = None,
              keep_best: bool = False) -> None:  # fmt: skip
        """Continue the federation from ``global_state`` (an operator's pin or rollback): the next round sends it out.

        ``rollback_id``: an operator's rollback (its request id), which also takes a smaller server step, as after a
        guard rollback, once per id: the ids are kept in the run's database, so a request taken up again after a
        restart (whose resume already shrank the step) only resets the momentum. Unless ``keep_best`` (the adopted
        model is the guard's best), the quality guard forgets its best version and judges afresh from the adopted
        one: the operator's choice is not rolled back to an older best. Personalised models are kept.

        Raises
        ------
        CoordinatorError
            If there is no federation yet.
        ValueError
            If ``global_state`` does not fit ``spec``.
        """
        if self._fed is None:
            raise CoordinatorError("there is no federation yet: no round has run, so there is no version to continue from")
        if set(global_state) != set(spec.shapes()) or any(tuple(global_state[k].shape) != tuple(v)
                                                          for k, v in spec.shapes().items()):  # fmt: skip
            raise ValueError("the adopted model's tensors do not match its architecture")
        self._fed.spec = spec
        self._fed.global_state = {k: v.clone() for k, v in global_state.items()}
        done = list(self.state.get(OPERATOR_SHRINKS, []))
        if rollback_id is not None and rollback_id not in done:
            self.strategy.shrink_step(guard.STEP_FACTOR)
            self.state.put(OPERATOR_SHRINKS, [*done, rollback_id])
        else:  # the old momentum points where the federation no longer is
            self.strategy.shrink_step(1.0)
        if not keep_best:
            self.strategy.forget_best()

    # ------------------------------------------------------------------ bootstrap or resume
    def start(self, resume: bool) -> int:
        """Take up the run in ``cfg.run_dir``; the last completed round (-1: none).

        ``resume`` False (a new run) refuses a folder that already holds a run; True continues
        from the newest intact round (models and the strategy's state), or starts afresh in an
        empty folder.

        Raises
        ------
        StateError
            If the folder holds another run (or, without ``resume``, any run), no intact round,
            or a damaged database.
        """
        try:
            if not resume and (self.state.last_completed_round() >= 0 or self.state.get("run_id") is not None):
                raise StateError(
                    f"{self.cfg.run_dir} already belongs to run {self.state.get('run_id')!r} "
                    f"({self.state.last_completed_round() + 1} completed rounds); continue it with --resume, "
                    f"or give a new --run-dir"
                )
            return self._resume() if resume else -1
        except StateDamaged as exc:
            raise StateError(str(exc)) from None

    def _resume(self) -> int:
        if self.state.get("run_id") not in (None, self.cfg.run_id):
            raise StateError(
                f"{self.cfg.run_dir} holds run {self.state.get('run_id')!r}, not {self.cfg.run_id!r}; "
                f"resume it with --run-id {self.state.get('run_id')}"
            )
        if self.state.last_completed_round() < 0:
            return -1
        found = self.state.load_latest_intact()
        if found is None:
            raise StateError(
                f"no completed round of run {self.cfg.run_id!r} in {self.cfg.run_dir} has intact model files "
                f"(see the log for each damaged file); start a new run in another folder"
            )
        last, spec, g, personal = found
        from coordinator.config import upgrade_file

        if (self.cfg.run_dir / "config.toml").is_file():
            upgrade_file(self.cfg.run_dir / "config.toml")  # an earlier release's layout, kept beside it as config.toml.old
        self._label_set = self.state.get("label_set", "")
        self._fed = Federation(spec, ArchSpec.from_json(self.state.get("initial_spec")), g, personal)
        log.info("resuming run %s after round %d (architecture v%d)", self.cfg.run_id, last, spec.version)
        self._resume_parts()
        self._resume_strategy(last, spec)
        self.measure.resume(last, spec, self._fed.global_state, "global" in self.state.rounds(after=last - 1, limit=1)[0])
        return last

    def _resume_parts(self) -> None:
        """Take the round's parts back as the completed rounds left them: the server step after the operators'
        rollbacks (:meth:`adopt`, counted in the run's database) and the strategy's own decisions (a quality guard's
        best version and halvings, :meth:`~coordinator.strategies.base.Strategy.restore`), both before the saved
        moments are loaded (a shrink resets them); and the versions the round policy may still receive updates for,
        whose models are the run folder's kept versions."""
        for _ in range(len(self.state.get(OPERATOR_SHRINKS, []))):
            self.strategy.shrink_step(guard.STEP_FACTOR)
        self.strategy.restore(self.records())
        self.policy.restore(dict(self.state.get(POLICY_STATE, {})), self._version_model)

    def _version_model(self, round_: int) -> tuple[ArchSpec, Any] | None:
        """The model version ``round_`` handed out (made by round ``round_ - 1``), if the run folder still keeps it."""
        try:
            if round_ == 0:
                spec = ArchSpec.from_json(self.state.get("initial_spec"))
                return spec, init_state(spec, self.cfg.seed)
            spec, g, _ = self.state.load_round_models(round_ - 1)
            return spec, g
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("version %d: %s", round_, exc)
            return None

    def _resume_strategy(self, last: int, spec: ArchSpec) -> None:
        """Give the strategy back the state saved with round ``last`` (e.g. a server optimiser's m_t, v_t).

        A missing or unusable state is logged and the strategy starts from its initial state;
        the run goes on either way.
        """
        name = self.strategy.persisted_name
        try:
            saved = self.state.load_strategy_state(last, name)
            if saved is not None:
                self.strategy.load_state_dict(saved, spec)
        except ValueError as exc:
            log.error("%s; strategy %s restarts from its initial state", exc, name)
            return
        if saved is None and self.strategy.keeps_state:
            log.warning("round %d has no saved state of strategy %s; it restarts from its initial state", last, name)

    def catch_up(self, round_: int) -> int:
        """The round to open next, ``round_`` unless the devices are ahead of the run folder.

        A device's status names the last round of this run it sent an update for. After a restore from
        backup (or a run folder rolled back), devices may have done rounds this folder never completed;
        opening one of those again is a round they already did under another version, which a device
        of an earlier release ignores. So when an eligible device reports a round beyond ``round_``, the
        numbering continues after the newest such round (the model is the folder's newest: nothing is
        lost that the folder held), and the jump is logged and recorded as a ``devices_ahead`` event. A
        device that reports ``round_`` itself re-sends its stored update to the new attempt, as after a
        crash, so ``round_`` opens as it is.
        """
        statuses = self.grid.statuses()
        ahead = max((st.last_round for cid, st in statuses.items() if st.run_id == self.cfg.run_id
                     and cid in self.grid.eligibility(self._label_set).eligible), default=-1)  # fmt: skip
        if ahead <= round_:
            return round_
        who = sorted(cid for cid, st in statuses.items() if st.run_id == self.cfg.run_id and st.last_round == ahead)
        log.warning("round %d: %s already sent an update for round %d of this run (the run folder was restored or rolled "
                    "back); continuing at round %d from the folder's newest model", round_, ", ".join(who), ahead, ahead + 1)
        self.state.event(round_, None, "devices_ahead", f"{', '.join(who)} at round {ahead}; continuing at round {ahead + 1}")
        return ahead + 1

    def wait_for_clients(self) -> None:
        """Wait (up to ``start_timeout_s``) for the expected clients, or for the quorum and a quiet ``start_settle_s``.

        The quorum is ``min_clients``, or more with a cohort goal (:attr:`coordinator.rounds.base.RoundPolicy.quorum`).

        Raises
        ------
        CoordinatorError
            If fewer eligible clients than the quorum came in time, or the grid's clients are all gone.
        """
        want = self.cfg.timing.expected_clients
        end = time.monotonic() + self.cfg.timing.start_timeout_s
        log.info(
            "waiting for %s clients (up to %.0f s)",
            want if want else f"at least {self.policy.quorum}",
            self.cfg.timing.start_timeout_s,
        )
        last, changed = -1, time.monotonic()
        while time.monotonic() < end:
            n = len(self.grid.eligibility(self._label_set).eligible)
            if n != last:
                log.info("%d client(s) online with training windows", n)
                last, changed = n, time.monotonic()
            gone = self.grid.gone()
            if want is not None and n >= want - len(gone):
                if gone:
                    log.warning("not waiting for %d client(s) whose process exited: %s", len(gone), ", ".join(sorted(gone)))
                return
            # Without an expected count: start once enough clients are here and no newcomer arrived for a while.
            if want is None and n >= self.policy.quorum and time.monotonic() - changed >= self.cfg.timing.start_settle_s:
                return
            self.grid.wait(0.2)
        n = len(self.grid.eligibility(self._label_set).eligible)
        if n < self.policy.quorum:
            raise CoordinatorError(
                f"only {n} client(s) with training windows came online within {self.cfg.timing.start_timeout_s:.0f} s; "
                f"need {self.policy.quorum}. Check that clients use broker {self.cfg.broker.host}:{self.cfg.broker.port} "
                f"and federation {self.cfg.federation!r}."
            )

    def wait_for_restarted(self, round_: int) -> None:
        """Before round ``round_``: wait (up to ``start_timeout_s``) for devices whose process was restarted to come back.

        A launcher (``fedhar-simulate``) restarts a crashed worker; its clients miss the round
        the crash fell in, and, without this wait, every further round that opens before the
        replacement process is online (a Ray actor is placed and imports PyTorch first: seconds
        on a loaded machine). With it, a crash costs its clients that one round however long
        the restart takes. A device is back once it is eligible with a status its new process
        sent: another process instance than when its restart was first seen here, or sent
        after the restart. Each restart is waited for once; a device given up by the launcher
        is not waited for. Devices no launcher restarted (``serve``'s) never wait here.

        Raises
        ------
        CoordinatorError
            If the grid's clients are all gone.
        """
        self.grid.gone()  # a death not noticed yet (the round closed by its last will first) is noticed, and restarted
        restarted = self.grid.restarted()
        new = {cid: at for cid, at in restarted.items() if self._restarts_waited.get(cid) != at}
        if not new:
            return
        statuses = self.grid.statuses()
        old = {cid: statuses[cid].instance if cid in statuses else None for cid in new}

        def back(cid: str) -> bool:
            st = self.grid.statuses().get(cid)
            return st is not None and (st.instance != old[cid] or st.sent_unix >= new[cid])

        t0 = time.monotonic()
        end = t0 + self.cfg.timing.start_timeout_s
        pending, said = set(new), False
        while True:
            self.grid.gone()  # notices deaths, places replacements; raises once every client is gone
            restarted = self.grid.restarted()
            eligible = set(self.grid.eligibility(self._label_set).eligible)
            pending = {c for c in pending if restarted.get(c) == new[c] and not (c in eligible and back(c))}
            if not pending or time.monotonic() >= end:
                break
            if not said:  # only when there is something to wait for
                said = True
                log.info("round %d: waiting up to %.0f s for %d restarted client(s) to come back: %s", round_,
                         self.cfg.timing.start_timeout_s, len(pending), ", ".join(sorted(pending)))  # fmt: skip
            self.grid.wait(0.2)
        self._restarts_waited.update(new)
        if pending:
            log.warning("round %d: restarted client(s) %s not back within %g s; the round opens without them", round_,
                        ", ".join(sorted(pending)), self.cfg.timing.start_timeout_s)  # fmt: skip
        elif said:
            log.info("round %d: restarted client(s) back after %.1f s", round_, time.monotonic() - t0)

    def ensure_federation(self) -> None:
        """Create the federation from the eligible clients' statuses when there is none yet.

        Raises
        ------
        CoordinatorError
            If the clients' label sets or statistics do not allow a federation.
        StateError
            If the run folder's database cannot be written.
        """
        if self._fed is None:
            try:
                self._fed = self._new_federation()
            except StateDamaged as exc:
                raise StateError(str(exc)) from None

    def _new_federation(self) -> Federation:
        statuses = self.grid.statuses()
        present = [statuses[c] for c in self.grid.eligibility(self._label_set).eligible]
        names = sorted({st.label_set for st in present})
        if len(names) != 1 or names[0] not in LABEL_SETS:
            raise CoordinatorError(f"clients report label sets {names}; all must use one known set ({sorted(LABEL_SETS)})")
        self._label_set = names[0]
        stats = None
        for st in present:
            try:
                s = ChannelStats.from_json(st.train_stats)
            except ValueError as exc:
                log.warning("client %s: unusable training statistics (%s); left out of the normalisation", st.client_id, exc)
                continue
            stats = s if stats is None else stats + s
        if stats is None:
            raise CoordinatorError("no client reported usable training statistics; cannot set the input normalisation")
        mean, std = stats.mean_std()
        spec = ArchSpec(
            n_classes=len(LABEL_SETS[self._label_set]),
            conv_filters=self.cfg.model.conv_filters,
            dense_units=self.cfg.model.dense_units,
            input_mean=mean,
            input_std=std,
        )
        log.info(
            "new federation: %s, %d classes, %s parameters, normalisation from %d training samples of %d clients",
            self._label_set,
            spec.n_classes,
            f"{spec.n_parameters():,}",
            stats.count,
            len(present),
        )
        self.state.put("run_id", self.cfg.run_id)
        self.state.put("label_set", self._label_set)
        self.state.put("initial_spec", spec.to_json())
        self.state.put("config", self.cfg.to_json())
        write_settings_file(self.cfg.run_dir / "config.toml", self.cfg.settings())
        return Federation(spec, spec, init_state(spec, self.cfg.seed), {})

    # ------------------------------------------------------------------ a round
    def run_round(self, round_: int) -> RoundRecord | None:
        """Run round ``round_`` (steps of :mod:`coordinator.round`), persist it, rewrite the report, publish its progress.

        Creates the federation first when there is none. A round that closes without quorum
        leaves the model unchanged, is shown closed at once, and its next run is a new attempt.

        Returns
        -------
        RoundRecord or None
            None if the round must be run again (too few eligible clients, or no quorum).

        Raises
        ------
        StateError
            If the run folder's database cannot be read or written.
        CoordinatorError
            If the clients' label sets or statistics do not allow a federation.
        """
        self.ensure_federation()
        try:
            record = self._run_round(round_)
        except StateDamaged as exc:
            raise StateError(str(exc)) from None
        if record is not None:
            self.report(plot=time.monotonic() - self._plotted >= PLOT_EVERY_S)
            for earlier in self._amended:  # a figure this round's clients measured: observers get that round again
                self.grid.publish_progress(records(self.state.rounds(after=earlier - 1, limit=1))[0])
            self.grid.publish_progress(record)
        return record

    def _run_round(self, round_: int) -> RoundRecord | None:
        assert self._fed is not None
        fed = self._fed
        t0 = time.monotonic()
        if self._tried_round == round_:  # the updates the failed attempt kept (spilled) count again if the model is the same
            self.grid.new_attempt(round_, same_model=self._tried_model == (fed.spec, id(fed.global_state)))
        else:
            spill.clear(self.cfg.run_dir / "spill")  # what an interrupted round left
            self._failed_quorums = 0
        self._tried_round, self._tried_model = round_, (fed.spec, id(fed.global_state))
        eligible = self.grid.eligibility(self._label_set).eligible
        selected = self.policy.select(eligible, round_)
        if not selected and not self.policy.busy():
            log.warning("round %d: fewer than %d eligible clients online; waiting", round_, self.policy.quorum)
            self.state.event(round_, None, "round_skipped", "not enough clients")
            self.last_failure = f"fewer than {self.policy.quorum} eligible devices at its start"
            return None
        if self._opened is not None:  # the pace's period: the last time between two openings (serve's schedule included)
            self._period_s = max(1e-3, t0 - self._opened)
        self._opened = t0
        steering = self.policy.steering(time.time(), self._period_s, len(eligible), len(selected))
        plan = self.strategy.configure_fit(round_, base_plan(self.cfg, round_))
        spec0, received = fed.spec, fed.global_state  # the version the clients receive (judged by the guard)
        before = (fed.spec, fed.global_state, dict(fed.personal), self.strategy.state_dict())  # put back if it cannot be kept
        ex = self.grid.exchange(fed, self._label_set, round_, 0, selected, plan, steering)
        self.policy.closed(ex, fed)
        batch = self.policy.batch(ex, round_, spec0, received)
        failures = ex.failures()
        why = check_quorum(batch.results, failures, self.policy.quorum)
        agg = None
        if why is None:
            try:
                agg = self.strategy.aggregate_fit(round_, fed, batch.results, failures)
            except ValueError as exc:
                why = str(exc)
        if agg is None:
            log.error("round %d closed without changing the model: %s", round_, why)
            self.state.event(round_, None, "round_failed", str(why))
            self._failed_quorums += 1
            self.last_failure = str(why)
            self.grid.close_failed(round_)
            return None
        self.policy.completed()
        fed.global_state = agg.global_state
        fed.personal.update(agg.personal)
        tallies = [Tally.of(ex, batch.extra)]
        growth_log = None
        if self.cfg.growth == "feddist":
            growth_log, growth_exchanges = self._grow(round_, agg, batch.results)
            tallies += growth_exchanges
        guard_note = self.strategy.judge(round_, fed, spec0, received, ex.results())  # start measures of spec0's version
        waiting = self.measure.pending  # G of the round before, measured by this round's clients: put back if not kept
        amend = self.measure.settle(round_, received, before[2], batch.trained, self.strategy.left_out())
        self._amended = sorted(amend)
        evaluation = evaluate_round(round_, fed, spec0, batch.trained, self.evaluator, self.cfg, self.strategy.left_out(),
                                    self.measure.of_round(round_, fed.spec, fed.global_state, bool(fed.personal)))  # fmt: skip
        record = round_record(round_, ex, batch, agg, tallies, failures, growth_log, fed.spec, evaluation)
        record = replace(record, seconds=time.monotonic() - t0, guard=guard_note, attempts=1 + self._failed_quorums)
        self.last_failure = ""
        summary = record.to_json()
        try:
            self.state.complete_round(round_, fed.spec, fed.global_state, fed.personal, summary,
                                      strategy_state=(self.strategy.persisted_name, self.strategy.state_dict()),
                                      amend=amend)  # fmt: skip
        except OSError:  # a full disk: the round did not happen; its next attempt starts from the same model and state
            fed.spec, fed.global_state, fed.personal = before[0], before[1], before[2]
            self.measure.pending = waiting
            if before[3]:
                self.strategy.load_state_dict(before[3], before[0])
            raise
        self.state.put(POLICY_STATE, self.policy.record())
        log.info(summary_line(record))
        del ex, batch, agg
        spill.clear(self.cfg.run_dir / "spill")
        release_free_memory()
        return record

    def _grow(self, round_: int, agg: Aggregate, results: list[ClientUpdate]) -> tuple[dict[str, Any], list[Tally]]:
        """Drive FedDist's growth steps (:mod:`coordinator.feddist_steps`): run each intermediate exchange they ask for.

        Returns the growth log and the traffic and rejections of each intermediate exchange.
        """
        assert self._fed is not None
        fed = self._fed
        steps = feddist_steps.grow(
            round_, fed, agg, results, self.strategy, base_plan(self.cfg, round_), self.cfg.feddist.config(), self.cfg.growth_mode
        )
        exchanges: list[Tally] = []
        try:
            ask = next(steps)
            while True:
                ex = self.grid.exchange(fed, self._label_set, round_, ask.stage, list(ask.selected), ask.plan, NO_STEERING)
                exchanges.append(Tally.of(ex))
                ask = steps.send(ex.results())
        except StopIteration as done:
            out: dict[str, Any] = done.value
        for layer, info in out["layers"].items():
            self.state.event(round_, None, "growth", f"{layer} +{info['added']} -> v{info.pop('version')}")
        return out, exchanges

    def measure_last(self) -> None:
        """At the end of a run: the global figures still waiting for a next round's clients, taken on the union test set."""
        for round_, keys in self.measure.flush().items():
            self.state.amend_round(round_, keys)

    # ------------------------------------------------------------------ the report
    def note(self, extra: Mapping[str, Any]) -> None:
        """Add run facts to the report's header (kept for every later report) without writing it."""
        self._extra.update(extra)

    def report(self, extra: Mapping[str, Any] | None = None, plot: bool = True) -> dict[str, Any]:
        """Rewrite ``report.json`` and ``report.md`` (and ``metrics.png`` if ``plot``) from the completed rounds; return
        the report document.

        ``extra``: run facts added to the header and kept for later reports (wall time, peak
        memory, the served epoch).

        Raises
        ------
        StateError
            If the run folder's database cannot be read.
        """
        self._extra.update(extra or {})
        header = {
            **self.report_header,
            "run_id": self.cfg.run_id,
            "strategy": self.cfg.strategy_label,
            "seed": self.cfg.seed,
            "config": self.cfg.to_json(),
            "label_set": self._label_set,
            **self._extra,
        }
        if plot:
            self._plotted = time.monotonic()
        return write_report(self.cfg.run_dir, header, self.records(), plot=plot)
