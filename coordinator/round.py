"""One round of a federation as pure steps over typed values: no MQTT, no files, no clocks.

The service (:mod:`coordinator.service`) moves these values over the broker and persists
them; everything a reader needs to follow a round is here, in the order it happens:

1. :func:`select_clients`: the round's participants among the eligible clients;
2. :func:`base_plan` then ``Strategy.configure_fit``: what they are asked to do;
3. :class:`Exchange`: results and failures collected until every selected client has
   answered or gone offline, or the deadline passed;
4. :func:`check_quorum`: a round with fewer contributing results than the quorum leaves the
   model unchanged (it is retried), so one client cannot move the federation alone;
5. ``Strategy.aggregate_fit(results, failures)``, growth (:mod:`coordinator.feddist_steps`),
   :func:`evaluate_round`;
6. :func:`summary_line`: the one line each round logs (from its :class:`~coordinator.record.RoundRecord`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from coordinator.config import CoordinatorConfig
from coordinator.evaluation import Evaluator, personalisation, union_of_clients
from coordinator.fedbuff import Stale
from coordinator.record import Evaluation, Metrics, RoundRecord, Traffic
from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.metrics import pct
from har_models.nn.model import ArchSpec
from har_models.wire.messages import TrainingPlan


def select_clients(eligible: Sequence[str], round_: int, min_clients: int, fraction: float, seed: int,
                   cap: int = 0) -> list[str]:  # fmt: skip
    """The clients selected for round ``round_``, sorted.

    All eligible clients when ``fraction`` covers them (FedDist: C = 1); otherwise
    max(min_clients, ceil(fraction * n)) drawn without replacement by a generator seeded
    with (seed, round), so a resumed run selects the same clients. ``cap`` > 0 (a cohort
    goal, :func:`coordinator.cohort.cohort_cap`) bounds that count from above, never below
    ``min_clients``: the same seeded draw, of fewer. Empty below ``min_clients`` (the quorum).
    """
    eligible = sorted(eligible)
    if len(eligible) < min_clients:
        return []
    k = max(min_clients, math.ceil(fraction * len(eligible)))
    if cap > 0:
        k = max(min_clients, min(k, cap))
    if k >= len(eligible):
        return eligible
    rng = np.random.default_rng([seed, round_])
    return sorted(rng.choice(eligible, size=k, replace=False).tolist())


def base_plan(cfg: CoordinatorConfig, round_: int = 0) -> TrainingPlan:
    """The strategy-independent part of round ``round_``'s training plan (local training and FedALA settings).

    Its ``lr`` is the round's under the configured schedule (:meth:`CoordinatorConfig.round_lr`);
    with the default constant schedule, ``cfg.lr`` in every round.
    """
    return TrainingPlan(
        local_epochs=cfg.local_epochs,
        lr=cfg.round_lr(round_),
        batch_size=cfg.batch_size,
        client_init=cfg.client_init,
        class_weights=cfg.class_weights,
        seed=cfg.seed,
        ala=cfg.ala_plan(),
        update_encoding=cfg.update_encoding,
    )


@dataclass
class Exchange:
    """One exchange being collected: round ``round``, stage ``stage`` (0 = the round's main exchange).

    Attributes
    ----------
    round, stage : int
    spec : ArchSpec
        Architecture the updates must have.
    selected : frozenset of str
    guidance : bool
        Whether updates must carry a FedDWA guidance model.
    updates : dict client id -> ClientUpdate
        The first valid update of each selected client.
    rejected : Counter of (client id, reason)
        Invalid messages, counted (a flood costs a counter increment, not a log line each),
        including those that arrived while no exchange was open since the previous one
        (``carried``).
    carried : Counter of (client id, reason)
        The part of ``rejected`` that arrived between exchanges (``no_open_round`` and the
        like): counted in this exchange's record, but no reason for a selected client's failure.
    duplicates : Counter of client id
        Re-sent copies of an update already counted (same client, round, stage and sha256,
        e.g. from a restarted device), updates for a round's failed attempt that arrived before
        its next attempt opened (the device sends them again there), and the updates of devices an
        exchange closed at its cohort goal did not wait for: harmless, so counted apart from ``rejected``.
    offline : set of str
        Selected clients whose status said offline while the exchange was open.
    bytes_up, bytes_down : int
        Bytes of valid updates received and of models published for this exchange.
    reference : callable client id -> state, optional
        The model published to each client for this exchange (see :func:`published_models`):
        what int8_delta updates are deltas against.
    stale : list of coordinator.fedbuff.Stale
        Buffered rounds: valid updates of devices that trained an earlier version (FedBuff), in
        the order they arrived; they count towards ``enough``.
    buffered : bool
        Whether this is a buffered round's exchange (the selected devices that did not answer
        at its close train on: reason ``still_training``).
    awaiting : int
        Buffered rounds: devices still training an earlier version; while any is, an exchange
        whose selected devices all answered waits on (for ``enough`` or the deadline).
    enough : int, optional
        A cohort goal (:class:`coordinator.cohort.Steering`): the exchange is complete once this
        many valid updates arrived (updates already received when it closes are counted too), and
        a selected client that had not answered then failed with reason ``cohort_full``. None:
        complete only when every selected client answered or went offline.
    """

    round: int
    stage: int
    spec: ArchSpec
    selected: frozenset[str]
    guidance: bool
    updates: dict[str, ClientUpdate] = field(default_factory=dict)
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    carried: Counter[tuple[str, str]] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    offline: set[str] = field(default_factory=set)
    bytes_up: int = 0
    bytes_down: int = 0
    reference: Callable[[str], Mapping[str, Any]] | None = None
    enough: int | None = None
    stale: list[Stale] = field(default_factory=list)
    buffered: bool = False
    awaiting: int = 0

    def add(self, update: ClientUpdate) -> bool:
        """Keep ``update`` if it is the first from its client (QoS 1 may deliver twice); True if kept."""
        if update.client_id in self.updates:
            return False
        self.updates[update.client_id] = update
        self.bytes_up += update.size
        return True

    def complete(self) -> bool:
        """True once every selected client has answered or gone offline, or ``enough`` updates arrived: no reason to wait longer.

        Counted, not searched: O(offline clients), so asking after every message costs the
        same whatever the number selected (updates come only from selected clients: :func:`coordinator.updates.validate_update`
        refuses the others).
        """
        if self.enough is not None and self.n_buffered >= self.enough:
            return True
        gone = sum(1 for c in self.offline if c in self.selected and c not in self.updates)
        return len(self.updates) + gone >= len(self.selected) and self.awaiting == 0

    def add_stale(self, stale: Stale) -> None:
        """Take a valid update of a device that trained an earlier version into this buffered exchange (its bytes counted)."""
        self.stale.append(stale)
        self.bytes_up += stale.update.size

    @property
    def n_buffered(self) -> int:
        """Clients with a valid update here: fresh ones, and those with only a stale one (buffered rounds)."""
        if not self.stale:
            return len(self.updates)
        return len(self.updates) + len({s.update.client_id for s in self.stale} - self.updates.keys())

    def results(self) -> list[ClientUpdate]:
        """The valid updates, ordered by client id (the aggregation order, fixed for reproducibility)."""
        return [self.updates[c] for c in sorted(self.updates)]

    def failures(self) -> list[Failure]:
        """Selected clients without a valid update, with why (offline, rejected, missed the deadline, or
        ``cohort_full``: the exchange closed at its goal before they answered)."""
        out = []
        rejected_by = {cid: reason for (cid, reason) in self.rejected - self.carried}
        full = self.enough is not None and self.n_buffered >= self.enough
        late = ("still_training" if self.buffered else "cohort_full") if full else "missed_deadline"
        for cid in sorted(self.selected - set(self.updates)):
            reason = "offline" if cid in self.offline else rejected_by.get(cid, late)
            out.append(Failure(cid, reason))
        return out

    @property
    def n_rejected(self) -> int:
        """Invalid messages in this exchange (each counted once)."""
        return sum(self.rejected.values())

    @property
    def n_duplicates(self) -> int:
        """Re-sent copies of already counted updates received in this exchange (not rejections)."""
        return sum(self.duplicates.values())


def published_models(fed: Federation) -> Callable[[str], Mapping[str, Any]]:
    """Client id -> the model published to it for the open exchange: P_i if it has one, else G.

    The same choice the service makes when it publishes models. The states are looked up
    when asked, not copied: they change only between exchanges (aggregation, growth), and
    a closed exchange validates nothing, so holding no snapshot costs no memory.
    """

    def reference(cid: str) -> Mapping[str, Any]:
        return fed.personal.get(cid, fed.global_state)

    return reference


def check_quorum(results: Sequence[ClientUpdate], failures: Sequence[Failure], min_clients: int) -> str | None:
    """None if the results may change the model, else the reason the round must leave it unchanged.

    A result counts towards the quorum only if it trained on at least one window.
    """
    contributing = [u for u in results if u.n_train > 0]
    if len(contributing) >= min_clients:
        return None
    if not results:
        why = Counter(f.reason for f in failures)
        detail = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in sorted(why.items())) or "nobody selected"
        return f"no update arrived ({detail})"
    return (
        f"{len(contributing)} update(s) with training windows, below the quorum of {min_clients} (--min-clients); "
        f"the model is left unchanged"
    )


def evaluate_round(
    round_: int,
    fed: Federation,
    spec0: ArchSpec,
    results: Sequence[ClientUpdate],
    evaluator: Evaluator | None,
    cfg: CoordinatorConfig,
) -> Evaluation:
    """The FedDist evaluation protocol for one round (Ek et al., PerCom 2021, section V-A; DESIGN.md section 6).

    Parameters
    ----------
    round_ : int
    fed : Federation
        The federation after aggregation (and growth): G is measured.
    spec0 : ArchSpec
        Architecture the clients trained this round (their w_i are measured with it).
    results : sequence of ClientUpdate
        Each carries the client's own confusion matrices on its test split.
    evaluator : Evaluator, optional
        The union test set; without it there are no global or generalisation figures.
    cfg : CoordinatorConfig
        ``generalisation_every`` and ``rounds`` decide when generalisation is measured.

    Returns
    -------
    Evaluation
        ``personalisation`` (mean over clients of each w_i on its own test split) and its
        per-client values, ``start`` (the same for each model as it starts local training,
        from the clients' "initial" matrices), ``received_union`` (the received models on
        the clients' test splits, pooled), and with an evaluator ``global_`` (G on the union test set) and, in
        the rounds due, ``generalisation`` (each w_i on the union test set, mean over clients).
    """
    ev = Evaluation()
    trained = {u.client_id: u.confusion["trained"] for u in results if "trained" in u.confusion}
    received = {u.client_id: u.confusion["received"] for u in results if "received" in u.confusion}
    initial = {u.client_id: u.confusion["initial"] for u in results if "initial" in u.confusion}
    if trained:
        mean, per = personalisation(trained)
        ev = replace(ev, personalisation=Metrics.from_json(mean), personalisation_clients=_metrics_of(per))
    if initial:  # the model each client starts training from (FedALA's protocol), averaged as personalisation
        mean, per = personalisation(initial)
        ev = replace(ev, start=Metrics.from_json(mean), start_clients=_metrics_of(per))
    pooled = union_of_clients(received)
    ev = replace(ev, received_union=Metrics.from_json(pooled) if pooled is not None else None)
    if evaluator is not None:
        ev = replace(ev, global_=Metrics.from_json(evaluator.global_metrics(fed.spec, fed.global_state)))
        every = cfg.generalisation_every
        last = round_ == cfg.rounds - 1
        if last or (every > 0 and (round_ + 1) % every == 0):
            mean, per = evaluator.generalisation(spec0, {u.client_id: u.state for u in results})
            ev = replace(ev, generalisation=Metrics.from_json(mean), generalisation_clients=_metrics_of(per))
    return ev


def _metrics_of(per: Mapping[str, Mapping[str, Any]]) -> dict[str, Metrics]:
    return {cid: Metrics.from_json(m) for cid, m in per.items()}


def device_summary(record: RoundRecord) -> str:
    """Each device's part in a round, for the round's log line: ``a 91.2%, b 88.0%, c missed (offline)``.

    A device that sent an update shows its trained model's accuracy on its own test split
    (its personalisation figure; "n/a" where it has none), one that was selected and sent no
    valid update shows why (``offline``, ``missed_deadline`` or a rejection reason; ``missed``
    alone where the record does not say). Sorted by client id; "" when the record names no device.
    """
    per = record.evaluation.personalisation_clients
    failures = record.participation.failures
    parts = {cid: f"{cid} {pct(m.accuracy)}" for cid, m in per.items()}
    for cid in record.participation.missing:
        why = failures.get(cid)
        parts[cid] = f"{cid} missed ({why})" if why else f"{cid} missed"
    return ", ".join(parts[c] for c in sorted(parts))


def summary_line(record: RoundRecord) -> str:
    """The one line a round logs, e.g. ``round 7: 30 selected, 30 updates, 0 rejected, ...``.

    "n/a" means the measure was not taken: the global figures need a union test set
    (``--eval-data`` or a simulation), the personalisation figures need client updates.
    The start figures (each model as it starts local training) follow when the round has them.
    The line ends with each device's part (:func:`device_summary`) when the record names any.
    """
    g, p = record.evaluation.global_, record.evaluation.personalisation
    part, traffic = record.participation, record.traffic or Traffic()
    unneeded = sum(1 for why in part.failures.values() if why == "cohort_full")  # the round closed at its cohort goal first
    training = sum(1 for why in part.failures.values() if why == "still_training")  # buffered: they train on
    return (
        f"round {record.round}: {part.selected} selected, {part.updates} updates"
        + (f" ({len(part.stale)} from earlier versions)" if part.stale else "")
        + f", {part.rejected} rejected, {len(part.missing) - unneeded - training} missed the deadline"
        + (f", {unneeded} not needed (cohort goal reached)" if unneeded else "")
        + (f", {training} still training (buffer full)" if training else "")
        + f", {record.seconds:.1f} s; "
        f"global acc {pct(g.accuracy if g else None)} F1 {pct(g.macro_f1 if g else None)}, "
        f"personalisation acc {pct(p.accuracy if p else None)} F1 {pct(p.macro_f1 if p else None)}"
        + (f", start acc {pct(st.accuracy)} F1 {pct(st.macro_f1)}" if (st := record.evaluation.start) else "")
        + f"; up {traffic.bytes_up / 1e6:.1f} MB, down {traffic.bytes_down / 1e6:.1f} MB"
    ) + (f"; devices: {devices}" if (devices := device_summary(record)) else "")
