"""The coordinator's round loop over MQTT.

One thread does all the work; paho's network thread only queues messages. Per round:

1. select clients (online, with training windows, same label set);
2. publish the model(s) (retained chunks) and then the round announcement (retained);
3. collect one valid update per selected client until all arrived or the deadline passed
   (invalid, stale, duplicate and late updates are logged with a reason and ignored);
4. aggregate (strategy), check growth (FedDist; paper mode adds intermediate exchanges);
5. evaluate (FedDist protocol), persist models and the round summary, rewrite the report,
   log one summary line.
"""

from __future__ import annotations

import functools
import logging
import queue
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from coordinator import feddist, feddist_steps, spill
from coordinator.config import CoordinatorConfig
from coordinator.evaluation import Evaluator
from coordinator.presence import Presence
from coordinator.programs import ProgramDesk
from coordinator.receipts import ReceiptDesk
from coordinator.record import Architecture, FedDwaWeights, GrowthLog, Participation, Rejection, RoundRecord, Traffic, records
from coordinator.report import write_report
from coordinator.round import Exchange, base_plan, check_quorum, evaluate_round, published_models, select_clients, summary_line
from coordinator.state import RunState, StateDamaged
from coordinator.strategies import Aggregate, Federation, Strategy, make_strategy
from coordinator.updates import ClientUpdate, UpdateRejected, validate_update
from har_io.cli import write_settings_file
from har_io.memory import release_free_memory
from har_io.mqtt_link import MqttLink
from har_models.data.labels import LABEL_SETS
from har_models.data.windowing import ChannelStats
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import ChunkError, Reassembler, transfer_id
from har_models.wire.messages import (
    DEFAULT_UPDATE_ENCODING,
    ClientStatus,
    CoordinatorStatus,
    MessageError,
    RoundAnnouncement,
    RoundProgress,
    TrainingPlan,
)
from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.coordinator")


@dataclass(frozen=True)
class _Tally:
    """What a round's record needs of one exchange, without holding its updates.

    ``up_by_encoding``: bytes of the valid updates by their encoding (an envelope that names
    none is float32); ``rejected``: invalid messages by (client id, reason).
    """

    bytes_up: int
    bytes_down: int
    up_by_encoding: Counter[str]
    rejected: Counter[tuple[str, str]]

    @classmethod
    def of(cls, ex: Exchange) -> _Tally:
        by_enc: Counter[str] = Counter()
        for u in ex.updates.values():
            by_enc[str(u.meta.get("encoding", DEFAULT_UPDATE_ENCODING))] += u.size
        return cls(ex.bytes_up, ex.bytes_down, by_enc, Counter(ex.rejected))


class CoordinatorError(RuntimeError):
    """The federation cannot go on (no clients, inconsistent state); the message says why and what to do."""


class StateError(CoordinatorError):
    """The run folder cannot be used as asked (another run's folder, damaged state); restarting will not help."""


class Coordinator:
    """Runs a federation described by a :class:`CoordinatorConfig`.

    Parameters
    ----------
    cfg : CoordinatorConfig
    evaluator : Evaluator, optional
        Union test set for the global and generalisation measures (research harness).
    progress : bool
        Show a progress bar on the terminal.
    report_header : dict, optional
        Extra run facts for the report (dataset, command, ...).
    clients_gone : callable, optional
        For a launcher that started the clients itself (``fedhar-simulate``): returns the ids
        of client processes that have exited and, if none is left, the error to stop with.
        Exited clients are not waited for; with none left the run stops at once.
    refused : callable, optional
        ``refused(client_id)`` True for a device that must never be heard again (revoked or
        forgotten on the home server, :class:`coordinator.server.registry.Registry`): its status
        is ignored and not counted as present, its updates are rejected with reason
        ``revoked`` (also one already received in an open exchange), it is never selected.
        Asked at every message, so a revocation made by another process counts at once.
    selectable : callable, optional
        ``selectable(client_id, status)`` False for a device the served federation leaves out
        of the selection (not enrolled, not charging); eligibility is otherwise unchanged.
    epoch : int
        The served coordinator's epoch (one per start of ``fedhar-coordinator serve``), carried
        in every announcement and coordinator status; 0 (``run``) leaves it out of them.
    """

    def __init__(
        self,
        cfg: CoordinatorConfig,
        evaluator: Evaluator | None = None,
        progress: bool = True,
        report_header: dict[str, Any] | None = None,
        clients_gone: Callable[[], tuple[set[str], str | None]] | None = None,
        refused: Callable[[str], bool] | None = None,
        selectable: Callable[[str, ClientStatus], bool] | None = None,
        epoch: int = 0,
    ):
        self.cfg = cfg
        self._refused = refused
        self._selectable = selectable
        self.epoch = epoch
        self._refused_logged: set[str] = set()
        self.evaluator = evaluator
        self.progress = progress
        self.report_header = dict(report_header or {})
        self._clients_gone = clients_gone
        self.topics = Topics(cfg.federation)
        self.strategy: Strategy = make_strategy(cfg.aggregation, cfg)
        self.feddist_cfg = feddist.FedDistConfig(
            k0=cfg.feddist_k0, delta=cfg.feddist_delta, period=cfg.feddist_period, max_width_factor=cfg.feddist_max_width_factor
        )
        try:
            self.state = RunState(cfg.run_dir)
        except StateDamaged as exc:
            raise StateError(str(exc)) from None
        self.clients: dict[str, ClientStatus] = {}
        self.reassembler = Reassembler(max_payload_bytes=cfg.max_update_bytes)
        # A fresh id per coordinator process and per re-run of a round that closed without quorum:
        # a client that already answered the round re-sends its stored update for a new attempt.
        self.attempt = uuid.uuid4().hex[:12]
        self._tried_round: int | None = None  # the round this process last ran an attempt of
        self.fed: Federation | None = None
        self.label_set = ""
        self._collect: Exchange | None = None  # the exchange being collected
        self._header: dict[str, Any] = dict(self.report_header)
        self._bar: tqdm | None = None
        self._rejected_outside: Counter[tuple[str, str]] = Counter()  # invalid messages while no exchange is open
        self._spill_dir = cfg.run_dir / "spill"  # this round's updates (coordinator.spill); removed when it closes
        self._link = MqttLink(
            cfg.broker,
            f"fedhar-coordinator-{cfg.federation}",
            subscriptions=[
                (self.topics.client_status("+"), 1),
                (self.topics.client_update("+", "+"), 1),
                (self.topics.client_program_request("+"), 1),  # coordinator/programs.py
            ],
            will=(self.topics.coordinator_status, self._status_bytes("offline")),
            on_connect=lambda link: link.publish_nowait(
                self.topics.coordinator_status, self._status_bytes("online"), retain=True
            ),
        )
        # What this run keeps retained on the broker while it runs; a broker that crashes (no
        # autosave, or one older than the round) comes back without it, so it is published
        # again after every reconnection (_restore_retained, from the main thread).
        self._open: tuple[int, list[str], str, bytes] | None = None  # round, selected, global id, announcement
        self._progress_bytes: bytes | None = None  # the last progress message
        self._restored_connects = 0  # the link's connection count the retained state was last published for
        self._stop_refresh = threading.Event()
        self.presence = Presence()  # status expiry and duplicate client ids
        self.receipts = ReceiptDesk(self._link, self.topics, cfg.run_id, self.reassembler)  # end-to-end delivery
        self._owned_chunks: dict[str, int] = {}  # retained chunk topic base -> chunks published (cleared at the end)
        self.programs = ProgramDesk(  # ExecuTorch programs for clients that ask (coordinator/programs.py)
            self._link, self.topics, cfg.run_id, lambda: self.fed.spec if self.fed is not None else None,
            on_reject=lambda cid, reason, detail: self.state.event(None, cid, "program_request_rejected", f"{reason}: {detail}"),
        )

    # ------------------------------------------------------------------------------ helpers
    def _status_bytes(self, state: str) -> bytes:
        return CoordinatorStatus(
            state, self.cfg.run_id, self.attempt, sent_unix=time.time(), refresh_s=self.cfg.status_refresh_s, epoch=self.epoch
        ).to_bytes()

    def _new_attempt(self, round_: int) -> None:
        """Start a new attempt (a round run again after it closed without quorum): a fresh attempt id, published at once.

        Every selected client answers an attempt: one that already trained on the same model
        re-sends its stored update, one whose model changed trains again. The coordinator
        status goes out before the announcement, since a client acts only on an announcement
        whose attempt its coordinator status names.
        """
        self.attempt = uuid.uuid4().hex[:12]
        log.info("round %d: attempt %s (the round is run again)", round_, self.attempt)
        if self._link.connected.is_set():
            try:
                self._link.publish(self.topics.coordinator_status, self._status_bytes("online"), retain=True)
            except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
                log.warning("round %d: the status naming the new attempt was not published (%s); the refresh sends it", round_, exc)

    def _close_failed_round(self, round_: int, why: str) -> None:
        """Show round ``round_`` closed at once after it failed: clear its retained announcement.

        Clients then stop delivering for it and an observer (the status page) sees no open
        round, instead of "answered" counts of an attempt that is over; the next attempt
        announces the round again.
        """
        log.error("round %d closed without changing the model: %s", round_, why)
        self.state.event(round_, None, "round_failed", why)
        try:
            self._link.publish(self.topics.round, b"", retain=True)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("round %d: the closed round's announcement was not cleared (%s)", round_, exc)

    def is_refused(self, cid: str) -> bool:
        """True if ``cid`` is refused (the ``refused`` predicate; always False without one)."""
        return self._refused is not None and self._refused(cid)

    def _refresh_status(self) -> None:
        """Republish the retained "online" status every ``status_refresh_s`` seconds (own thread, until the run stops).

        A client treats a coordinator status older than three periods as a dead coordinator
        (its will may never have reached the broker); this thread keeps a live one fresh even
        while the main thread aggregates or evaluates for minutes.
        """
        while not self._stop_refresh.wait(self.cfg.status_refresh_s):
            if self._link.connected.is_set():
                self._link.publish_nowait(self.topics.coordinator_status, self._status_bytes("online"), retain=True)

    def _restore_retained(self) -> None:
        """After a reconnection, publish again what this run keeps retained: the open round's models and
        announcement, and the last progress message (the status goes from the link's on-connect hook).

        A broker that crashed and restarted empty (or from an autosave older than the round)
        has lost them, and a client that subscribes finds no round to work on: the round then
        waited for its deadline. Publishing again costs one more copy of the models for the
        clients subscribed; a client that already answered the round does not train again.
        Runs in the main thread (from :meth:`_pump`); a failure is logged and tried again after
        the next reconnection, never fatal.
        """
        connects = self._link.connects
        if connects <= self._restored_connects or not self._link.connected.is_set():
            return
        self._restored_connects = connects
        if connects <= 1:
            return
        try:
            if self._open is not None:
                round_, selected, global_id, ann = self._open
                new_global, personal, _ = self._publish_models(round_, selected)
                expected = RoundAnnouncement.from_bytes(ann)
                if new_global != global_id or personal != expected.personal_models:
                    log.error("round %d: the models published again differ from the announced ones; clients may wait", round_)
                self._link.publish(self.topics.round, ann, retain=True)
                log.info("round %d: reconnected (connection #%d); published the round's models and announcement again",
                         round_, connects)  # fmt: skip
            if self._progress_bytes is not None:
                self._link.publish(self.topics.progress, self._progress_bytes, retain=True)
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            log.warning("could not publish the retained round state again after reconnecting (%s); trying after the next", exc)

    def _pump(self, timeout: float) -> bool:
        """Handle at most one incoming message (waiting up to ``timeout`` seconds); False if none came.

        Whatever a message holds, its failure stays with it: it is logged (rate-limited),
        counted and dropped, and the coordinator goes on.
        """
        if self._link.fatal is not None:
            raise self._link.fatal
        if self._link.connects != self._restored_connects:
            self._restore_retained()
        try:
            topic, payload, retained = self._link.inbox.get(timeout=timeout)
        except queue.Empty:
            return False
        parsed = self.topics.parse_client_topic(topic)
        if parsed is None:
            return True
        cid, kind = parsed
        try:
            if kind == "status":
                self._on_status(cid, payload, retained)
            elif kind == "update":
                self._on_update_chunk(cid, payload)
            elif kind == "program_request":
                self.programs.on_request(cid, payload)
        except Exception as exc:
            self._reject(cid, "internal_error", f"{type(exc).__name__}: {exc}")
        return True

    def _on_status(self, cid: str, payload: bytes, retained: bool = False) -> None:
        if self.is_refused(cid):
            # A revoked device's late or retained status must not make it present again.
            self.clients.pop(cid, None)
            self.presence.forget(cid)
            if self._collect is not None and cid in self._collect.selected:
                self._collect.offline.add(cid)
            if cid not in self._refused_logged:
                self._refused_logged.add(cid)
                log.warning("ignoring the status of revoked device %s (it is not counted as present)", cid[:64])
            if payload and self._link.connected.is_set():  # a late retained status: nobody else is to see it either
                self._link.publish_nowait(self.topics.client_status(cid), b"", retain=True)
            return
        if not payload:
            self.clients.pop(cid, None)
            self.presence.forget(cid)
            return
        try:
            st = ClientStatus.from_bytes(payload)
        except MessageError as exc:
            log.warning("ignoring malformed status of client %r: %s", cid, exc)
            return
        if st.client_id != cid:
            log.warning("ignoring status on the topic of %r that claims to be %r", cid, st.client_id)
            return
        self.presence.note(st, retained)
        prev = self.clients.get(cid)
        self.clients[cid] = st if st.state != "offline" or prev is None else replace(prev, state="offline")
        if self._collect is not None and cid in self._collect.selected:
            if st.state == "offline":
                self._collect.offline.add(cid)
            else:
                self._collect.offline.discard(cid)
        if prev is None or prev.state != st.state:
            log.debug("client %s is %s", cid, st.state)

    def _on_update_chunk(self, cid: str, payload: bytes) -> None:
        if self.is_refused(cid):
            self._reject(cid, "revoked", "the device was revoked; nothing it sends is counted")
            return
        if cid in self.presence.conflicts:
            self._reject(cid, "duplicate_identity", "two processes use this client id")
            return
        self.receipts.before_chunk(cid, payload)
        try:
            done = self.reassembler.add(f"update/{cid}", payload)
        except ChunkError as exc:
            self._reject(cid, exc.reason, str(exc))
            return
        if done is None:
            return
        c = self._collect
        if c is None:
            self._reject(cid, "no_open_round", "an update arrived while no round was open")
            return
        status = self.clients.get(cid)
        try:
            upd = validate_update(
                done[1],
                topic_client=cid,
                run_id=self.cfg.run_id,
                round_=c.round,
                stage=c.stage,
                spec=c.spec,
                selected=c.selected,
                want_guidance=c.guidance,
                max_bytes=self.cfg.max_update_bytes,
                reported_n_train=status.n_train if status is not None else None,
                reference=c.reference(cid) if c.reference is not None else None,
            )
        except UpdateRejected as exc:
            self._reject(cid, exc.reason, str(exc))
            return
        if cid in c.updates:
            self.receipts.accepted(cid, done[0])  # a re-sent update: acknowledge it again
            log.debug("round %d: duplicate update from %s ignored", c.round, cid)
            return
        try:
            upd = spill.spill_update(upd, self._spill_dir / f"r{c.round:04d}-s{c.stage}")
        except OSError as exc:  # a full disk: keep this update in memory rather than lose it
            log.warning("round %d: cannot spill the update of %s to disk (%s); keeping it in memory", c.round, cid, exc)
        c.add(upd)
        self.receipts.accepted(cid, done[0])
        if self._bar is not None:
            self._bar.set_postfix_str(f"round {c.round}: {len(c.updates)}/{len(c.selected)} updates")

    def _reject(self, cid: str, reason: str, detail: str) -> None:
        """Count an invalid message; log the first of each (client, reason) per exchange, and the total at its close."""
        c = self._collect
        key = (cid[:64], reason)
        counts = c.rejected if c is not None else self._rejected_outside
        counts[key] += 1
        if counts[key] == 1:
            rnd = c.round if c is not None else "-"
            log.warning("round %s: rejected update from %s: %s (%s); repeats are counted", rnd, key[0], reason, detail[:300])

    # ------------------------------------------------------------------------------ setup
    def _eligible(self) -> list[str]:
        return sorted(
            cid
            for cid, st in self.clients.items()
            if st.state != "offline"
            and st.n_train > 0
            and (not self.label_set or st.label_set == self.label_set)
            and self.presence.fresh(cid)
            and (self._refused is None or not self._refused(cid))
            and (self._selectable is None or self._selectable(cid, st))
        )

    def _check_clients_alive(self) -> set[str]:
        """Ids of launcher-started clients that exited; raises CoordinatorError when none is left."""
        if self._clients_gone is None:
            return set()
        gone, fatal = self._clients_gone()
        if fatal:
            raise CoordinatorError(fatal)
        return gone

    def _wait_for_clients(self) -> None:
        want = self.cfg.expected_clients
        end = time.monotonic() + self.cfg.start_timeout_s
        log.info(
            "waiting for %s clients (up to %.0f s)",
            want if want else f"at least {self.cfg.min_clients}",
            self.cfg.start_timeout_s,
        )
        last, changed = -1, time.monotonic()
        while time.monotonic() < end:
            n = len(self._eligible())
            if n != last:
                log.info("%d client(s) online with training windows", n)
                last, changed = n, time.monotonic()
            gone = self._check_clients_alive()
            if want is not None and n >= want - len(gone):
                if gone:
                    log.warning("not waiting for %d client(s) whose process exited: %s", len(gone), ", ".join(sorted(gone)))
                return
            # Without an expected count: start once enough clients are here and no newcomer arrived for a while.
            if want is None and n >= self.cfg.min_clients and time.monotonic() - changed >= self.cfg.start_settle_s:
                return
            self._pump(0.2)
        if len(self._eligible()) < self.cfg.min_clients:
            raise CoordinatorError(
                f"only {len(self._eligible())} client(s) with training windows came online within {self.cfg.start_timeout_s:.0f} s; "
                f"need {self.cfg.min_clients}. Check that clients use broker {self.cfg.broker.host}:{self.cfg.broker.port} "
                f"and federation {self.cfg.federation!r}."
            )

    def _new_federation(self) -> Federation:
        present = [self.clients[c] for c in self._eligible()]
        names = sorted({st.label_set for st in present})
        if len(names) != 1 or names[0] not in LABEL_SETS:
            raise CoordinatorError(f"clients report label sets {names}; all must use one known set ({sorted(LABEL_SETS)})")
        self.label_set = names[0]
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
            n_classes=len(LABEL_SETS[self.label_set]),
            conv_filters=self.cfg.conv_filters,
            dense_units=self.cfg.dense_units,
            input_mean=mean,
            input_std=std,
        )
        log.info(
            "new federation: %s, %d classes, %s parameters, normalisation from %d training samples of %d clients",
            self.label_set,
            spec.n_classes,
            f"{spec.n_parameters():,}",
            stats.count,
            len(present),
        )
        self.state.put("run_id", self.cfg.run_id)
        self.state.put("label_set", self.label_set)
        self.state.put("initial_spec", spec.to_json())
        self.state.put("config", self.cfg.to_json())
        write_settings_file(self.cfg.run_dir / "config.toml", self.cfg.settings())
        return Federation(spec, spec, init_state(spec, self.cfg.seed), {})

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
        self.label_set = self.state.get("label_set", "")
        self.fed = Federation(spec, ArchSpec.from_json(self.state.get("initial_spec")), g, personal)
        log.info("resuming run %s after round %d (architecture v%d)", self.cfg.run_id, last, spec.version)
        self._resume_strategy(last, spec)
        return last

    def _resume_strategy(self, last: int, spec: ArchSpec) -> None:
        """Give the strategy back the state saved with round ``last`` (e.g. a server optimiser's m_t, v_t).

        A missing or unusable state is logged and the strategy starts from its initial state;
        the run goes on either way.
        """
        name = self.strategy.name
        try:
            saved = self.state.load_strategy_state(last, name)
            if saved is not None:
                self.strategy.load_state_dict(saved, spec)
        except ValueError as exc:
            log.error("%s; strategy %s restarts from its initial state", exc, name)
            return
        if saved is None and self.strategy.keeps_state:
            log.warning("round %d has no saved state of strategy %s; it restarts from its initial state", last, name)

    # ------------------------------------------------------------------------------ a round
    def _publish_models(self, round_: int, selected: Sequence[str]) -> tuple[str, dict[str, str], int]:
        """Publish G (if anyone needs it) and the P_i of selected clients; return transfer ids and bytes delivered."""
        assert self.fed is not None
        fed, spec = self.fed, self.fed.spec
        meta = {"arch": spec.to_dict()}
        personal: dict[str, str] = {}
        down = 0
        need_global = [c for c in selected if c not in fed.personal]
        global_id = ""
        if need_global:
            env = codec.encode(fed.global_state, kind="model", round=round_, arch_version=spec.version, meta=meta)
            n = self._link.publish_chunks(self.topics.global_model, env, retain=True)
            self._own_chunks(self.topics.global_model(0), n)
            global_id = transfer_id(env)
            down += len(env) * len(need_global)
        for cid in selected:
            if cid in fed.personal:
                env = codec.encode(
                    fed.personal[cid], kind="model", round=round_, arch_version=spec.version, client_id=cid, meta=meta
                )
                n = self._link.publish_chunks(functools.partial(self.topics.client_model, cid), env, retain=True)
                self._own_chunks(self.topics.client_model(cid, 0), n)
                personal[cid] = transfer_id(env)
                down += len(env)
        return global_id, personal, down

    def _own_chunks(self, first_topic: str, n: int) -> None:
        base = first_topic.rsplit("/", 1)[0]
        self._owned_chunks[base] = max(n, self._owned_chunks.get(base, 0))

    def _exchange(self, round_: int, stage: int, selected: list[str], plan: TrainingPlan) -> Exchange:
        """Publish models + announcement, collect updates until every selected client answered or went offline, or the deadline."""
        assert self.fed is not None
        spec = self.fed.spec
        global_id, personal, down = self._publish_models(round_, selected)
        deadline = time.time() + self.cfg.round_timeout_s
        ann = RoundAnnouncement(
            run_id=self.cfg.run_id,
            round=round_,
            state="training",
            arch=spec.to_dict(),
            label_set=self.label_set,
            selected=tuple(selected),
            plan=plan,
            global_model=global_id,
            personal_models=personal,
            deadline_unix=deadline,
            stage=stage,
            attempt=self.attempt,
            epoch=self.epoch,
        )
        c = self._collect = Exchange(
            round_, stage, spec, frozenset(selected), plan.guidance, bytes_down=down, reference=published_models(self.fed)
        )
        c.offline.update(cid for cid in selected if cid in self.clients and self.clients[cid].state == "offline")
        self.receipts.open(round_, stage)
        ann_bytes = ann.to_bytes()
        self._open = (round_, list(selected), global_id, ann_bytes)
        self._link.publish(self.topics.round, ann_bytes, retain=True)
        end = time.monotonic() + self.cfg.round_timeout_s
        next_check = 0.0
        while not c.complete() and time.monotonic() < end:
            self._pump(max(0.0, min(0.25, end - time.monotonic())))
            self.receipts.request_missing(c.selected)
            c.offline.update(cid for cid in c.selected if not self.presence.fresh(cid))  # vanished without a will
            if self._refused is not None:
                c.offline.update(cid for cid in c.selected if cid not in c.offline and self._refused(cid))
            if time.monotonic() >= next_check:
                c.offline.update(self._check_clients_alive() & c.selected)
                next_check = time.monotonic() + 0.5
        # Handle what had already arrived at the close, but no more than that: under a flood of
        # messages the inbox never empties, and the round must still close at its deadline.
        for _ in range(self._link.inbox.qsize()):
            if not self._pump(0.0):
                break
        if self._refused is not None:
            self._drop_refused(c)
        self._collect = None
        self._open = None
        self.receipts.close()
        for (cid, reason), n in sorted(c.rejected.items()):
            self.state.event(round_, cid, "rejected", f"{reason}: {n} message(s)")
            if n > 1:
                log.warning("round %d: %d messages from %s rejected (%s)", round_, n, cid, reason)
        for f in c.failures():
            kind = f.reason if f.reason in ("offline", "missed_deadline") else "no_valid_update"
            self.state.event(round_, f.client_id, kind, f"stage {stage}")
        return c

    def _drop_refused(self, c: Exchange) -> None:
        """Take out of exchange ``c`` the updates of devices revoked while it was open (counted as rejected ``revoked``)."""
        for cid in sorted(c.updates):
            if self.is_refused(cid):
                upd = c.updates.pop(cid)
                c.bytes_up -= upd.size
                c.offline.add(cid)
                c.rejected[(cid[:64], "revoked")] += 1
                log.warning("round %d: the update of %s is not counted: the device was revoked during the round", c.round, cid)

    def _run_round(self, round_: int) -> RoundRecord | None:
        """Run round ``round_`` (steps of :mod:`coordinator.round`); its record, or None if it must be run again."""
        assert self.fed is not None
        spill.clear(self._spill_dir)  # what a failed or interrupted round left
        t0 = time.monotonic()
        if self._tried_round == round_:
            self._new_attempt(round_)
        self._tried_round = round_
        selected = select_clients(self._eligible(), round_, self.cfg.min_clients, self.cfg.fraction, self.cfg.seed)
        if not selected:
            log.warning("round %d: fewer than %d eligible clients online; waiting", round_, self.cfg.min_clients)
            self.state.event(round_, None, "round_skipped", "not enough clients")
            return None
        plan = self.strategy.configure_fit(round_, base_plan(self.cfg, round_))
        spec0 = self.fed.spec
        ex = self._exchange(round_, 0, selected, plan)
        results, failures = ex.results(), ex.failures()
        bytes_up, bytes_down, rejected = ex.bytes_up, ex.bytes_down, ex.n_rejected
        why = check_quorum(results, failures, self.cfg.min_clients)
        agg = None
        if why is None:
            try:
                agg = self.strategy.aggregate_fit(round_, self.fed, results, failures)
            except ValueError as exc:
                why = str(exc)
        if agg is None:
            self._close_failed_round(round_, str(why))
            return None
        self.fed.global_state = agg.global_state
        self.fed.personal.update(agg.personal)
        main = _Tally.of(ex)
        up_by_encoding, rejections = main.up_by_encoding, main.rejected
        growth_log = None
        if self.cfg.growth == "feddist":
            growth_log, growth_exchanges = self._grow(round_, agg, results)
            for gx in growth_exchanges:
                bytes_up += gx.bytes_up
                bytes_down += gx.bytes_down
                rejected += sum(gx.rejected.values())
                up_by_encoding.update(gx.up_by_encoding)
                rejections.update(gx.rejected)

        record = RoundRecord(
            round=round_,
            participation=Participation(
                selected=len(selected),
                updates=len(results),
                rejected=rejected,
                missing=tuple(sorted(set(selected) - set(ex.updates))),
                failures={f.client_id: f.reason for f in failures},
                rejections=tuple(Rejection(cid, why, n) for (cid, why), n in sorted(rejections.items())),
            ),
            arch=Architecture(self.fed.spec.version, self.fed.spec.conv_filters, self.fed.spec.dense_units),
            traffic=Traffic(bytes_up, bytes_down, dict(sorted(up_by_encoding.items()))),
            growth=GrowthLog.from_json(growth_log) if growth_log is not None else None,
            # FedDWA p_ij (Liu et al., IJCAI 2023, Eq. 17), row i = target, for the study's heat map
            feddwa_weights=FedDwaWeights(
                tuple(agg.participants), tuple(tuple(round(float(x), 6) for x in row) for row in agg.mixing.t().tolist())
            ) if agg.mixing is not None else None,
            evaluation=evaluate_round(round_, self.fed, spec0, results, self.evaluator, self.cfg),
        )
        record = replace(record, seconds=time.monotonic() - t0)
        summary = record.to_json()
        self.state.complete_round(round_, self.fed.spec, self.fed.global_state, self.fed.personal, summary,
                                  strategy_state=(self.strategy.name, self.strategy.state_dict()))
        log.info(summary_line(record))
        del ex, results, agg
        spill.clear(self._spill_dir)
        release_free_memory()
        return record

    def _grow(self, round_: int, agg: Aggregate, results: list[ClientUpdate]) -> tuple[dict[str, Any], list[_Tally]]:
        """Drive FedDist's growth steps (:mod:`coordinator.feddist_steps`): run each intermediate exchange they ask for.

        Returns the growth log and the traffic and rejections of each intermediate exchange.
        """
        assert self.fed is not None
        steps = feddist_steps.grow(
            round_, self.fed, agg, results, self.strategy, base_plan(self.cfg, round_), self.feddist_cfg, self.cfg.growth_mode
        )
        exchanges: list[_Tally] = []
        try:
            ask = next(steps)
            while True:
                ex = self._exchange(round_, ask.stage, list(ask.selected), ask.plan)
                exchanges.append(_Tally.of(ex))
                ask = steps.send(ex.results())
        except StopIteration as done:
            out: dict[str, Any] = done.value
        for layer, info in out["layers"].items():
            self.state.event(round_, None, "growth", f"{layer} +{info['added']} -> v{info.pop('version')}")
        return out, exchanges

    def _publish_progress(self, record: RoundRecord) -> None:
        """Publish ``record`` as the federation's retained progress message (an observer's view of the run).

        A record too large for one message goes without its per-client parts; a broker that
        does not take it costs a warning, never the run.
        """
        for rec in (record, record.without_details()):
            try:
                payload = RoundProgress(self.cfg.run_id, rec.round, self.cfg.rounds, rec.to_json()).to_bytes()
                self._progress_bytes = payload  # published again after a reconnection (_restore_retained)
                self._link.publish(self.topics.progress, payload, retain=True)
                return
            except ValueError as exc:  # too large for the message or the broker (PayloadTooLarge)
                log.warning("round %d: progress message: %s", record.round, exc)
            except (OSError, RuntimeError) as exc:
                log.warning("round %d: the progress message was not published (%s)", record.round, exc)
                return

    # ------------------------------------------------------------------------------ main
    def run(self) -> dict[str, Any]:
        """Run (or resume) the federation to its last round; return the report document.

        Raises
        ------
        CoordinatorError
            If no usable clients come online in time.
        har_io.mqtt_link.BrokerRefused
            If the broker refused the login or TLS failed (not retried; the message says how to fix it).
        """
        t_start = time.monotonic()
        self._connect()
        try:
            if not self.cfg.resume and (self.state.last_completed_round() >= 0 or self.state.get("run_id") is not None):
                raise StateError(
                    f"{self.cfg.run_dir} already belongs to run {self.state.get('run_id')!r} "
                    f"({self.state.last_completed_round() + 1} completed rounds); continue it with --resume, "
                    f"or give a new --run-dir"
                )
            last = self._resume() if self.cfg.resume else -1
            if last < 0:
                self._link.publish(self.topics.round, b"", retain=True)  # forget any earlier run's round
                self._link.publish(self.topics.progress, b"", retain=True)  # ... and its progress
                # ... and the models it left retained (it may have crashed before clearing them)
                self._link.sweep_retained([self.topics.global_model("+"), self.topics.client_model("+", "+")])
            self._wait_for_clients()
            if self.fed is None:
                self.fed = self._new_federation()
            header = self._header = {
                **self.report_header,
                "run_id": self.cfg.run_id,
                "strategy": self.cfg.strategy_label,
                "seed": self.cfg.seed,
                "config": self.cfg.to_json(),
                "label_set": self.label_set,
            }
            start = last + 1
            with (
                logging_redirect_tqdm(),
                tqdm(
                    total=self.cfg.rounds,
                    initial=start,
                    desc="rounds",
                    unit="round",
                    disable=not self.progress or not sys.stderr.isatty(),
                    dynamic_ncols=True,
                ) as bar,
            ):
                self._bar = bar
                r = start
                failures = 0
                while r < self.cfg.rounds:
                    record = self._run_round(r)
                    if record is None:
                        failures += 1
                        if failures >= 3:
                            raise CoordinatorError(f"round {r} failed 3 times in a row; see the log and {self.cfg.run_dir}")
                        self._wait_for_clients()
                        continue
                    failures = 0
                    header["wall_seconds"] = round(time.monotonic() - t_start, 1)
                    write_report(self.cfg.run_dir, header, records(self.state.rounds()))
                    self._publish_progress(record)
                    bar.update(1)
                    r += 1
            self._bar = None
            assert self.fed is not None
            fin = RoundAnnouncement(
                run_id=self.cfg.run_id,
                round=self.cfg.rounds - 1,
                state="finished",
                arch=self.fed.spec.to_dict(),
                label_set=self.label_set,
                attempt=self.attempt,
                epoch=self.epoch,
            )
            self._link.publish(self.topics.round, fin.to_bytes(), retain=True)
            # The run owns its retained model chunks: nobody may train on them once it ended.
            self._link.clear_retained([f"{base}/{i}" for base, n in sorted(self._owned_chunks.items()) for i in range(n)])
            header["wall_seconds"] = round(time.monotonic() - t_start, 1)
            return write_report(self.cfg.run_dir, header, records(self.state.rounds()))
        except StateDamaged as exc:  # any read or write of the database, at any point of the run
            raise StateError(str(exc)) from None
        finally:
            self.close()

    def _connect(self) -> None:
        """Connect to the broker (30 s at most) and start refreshing the coordinator status.

        Raises
        ------
        CoordinatorError
            If the broker cannot be reached within 30 s.
        har_io.mqtt_link.BrokerRefused
            If it refused the login or TLS failed.
        """
        if not self._link.start(wait_s=30.0):
            if self._link.fatal is not None:
                raise self._link.fatal
            raise CoordinatorError(f"cannot reach the broker at {self.cfg.broker.host}:{self.cfg.broker.port} within 30 s")
        self._restored_connects = self._link.connects  # nothing of this run is retained yet
        threading.Thread(target=self._refresh_status, name="coordinator-status-refresh", daemon=True).start()

    def close(self) -> None:
        """Stop refreshing, close the program desk, and leave the broker with the retained status "offline"."""
        self._stop_refresh.set()
        self.programs.close()
        self._link.stop(final=(self.topics.coordinator_status, self._status_bytes("offline")))

    # ------------------------------------------------------------------------------ served federation
    # fedhar-coordinator serve (coordinator/server/serve.py) drives the rounds itself, one at a time
    # when its schedule says so, with the same round machinery as run().
    def start_served(self) -> int:
        """Connect and take up the run in ``run_dir`` where it stopped; the last completed round (-1: none).

        A run folder with completed rounds continues from its newest intact round (the models and
        the strategy's state), as ``run --resume`` does; without any, the earlier runs' retained
        round, progress and models are cleared from the broker.

        Raises
        ------
        StateError
            If the folder holds another run or no intact round, or its database is damaged.
        CoordinatorError, har_io.mqtt_link.BrokerRefused
            As :meth:`_connect`.
        """
        self._connect()
        try:
            last = self._resume()
            if last < 0:
                self._link.publish(self.topics.round, b"", retain=True)
                self._link.publish(self.topics.progress, b"", retain=True)
                self._link.sweep_retained([self.topics.global_model("+"), self.topics.client_model("+", "+")])
        except StateDamaged as exc:
            raise StateError(str(exc)) from None
        return last

    @property
    def link(self) -> MqttLink:
        """The coordinator's broker session (for a serving loop that clears a revoked device's retained topics)."""
        return self._link

    def pump(self, timeout: float) -> bool:
        """Handle at most one incoming message, waiting up to ``timeout`` s; False if none came (:meth:`_pump`)."""
        return self._pump(timeout)

    def eligible(self) -> list[str]:
        """The clients a round started now could select (sorted ids)."""
        return self._eligible()

    def serve_round(self, round_: int, header: dict[str, Any]) -> RoundRecord | None:
        """Run round ``round_`` now; on success rewrite the report and publish the progress message.

        Creates the federation first (from the eligible clients' statuses) when there is none yet.

        Returns
        -------
        RoundRecord or None
            None if the round closed without changing the model (it is run again later).

        Raises
        ------
        StateError
            If the run folder's database cannot be read or written.
        CoordinatorError
            If the clients' label sets or statistics do not allow a federation.
        """
        try:
            if self.fed is None:
                self.fed = self._new_federation()
            self._header = {
                **self.report_header, **header, "run_id": self.cfg.run_id, "strategy": self.cfg.strategy_label,
                "seed": self.cfg.seed, "config": self.cfg.to_json(), "label_set": self.label_set,
            }  # fmt: skip
            record = self._run_round(round_)
            if record is None:
                return None
            write_report(self.cfg.run_dir, self._header, records(self.state.rounds()))
            self._publish_progress(record)
            return record
        except StateDamaged as exc:
            raise StateError(str(exc)) from None

    def write_final_report(self, extra: dict[str, Any]) -> dict[str, Any]:
        """Rewrite the report with extra run facts (wall time, peak memory) known only at the end.

        Raises
        ------
        StateError
            If the run folder's database cannot be read.
        """
        self._header.update(extra)
        try:
            rounds = self.state.rounds()
        except StateDamaged as exc:
            raise StateError(str(exc)) from None
        return write_report(self.cfg.run_dir, self._header, records(rounds))

