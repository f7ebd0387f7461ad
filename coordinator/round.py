"""One round of a federation as pure steps over typed values: no MQTT, no files, no clocks.

The runner (:class:`coordinator.runner.FederationRunner`) moves these values through the grid and
persists them; a round, in the order it happens:

1. the round policy's selection (:meth:`coordinator.rounds.base.RoundPolicy.select`);
2. :func:`base_plan` then ``Strategy.configure_fit``: what the selected devices are asked to do
   (its settings: the ``[training]`` table, :class:`TrainingSettings`);
3. :class:`coordinator.exchange.Exchange`: results and failures collected until the exchange is
   complete or the deadline passed;
4. :func:`check_quorum`: a round with fewer contributing results than the quorum leaves the
   model unchanged (it is retried), so one client cannot move the federation alone;
5. ``Strategy.aggregate_fit(results, failures)``, growth (:mod:`coordinator.feddist_steps`),
   :func:`evaluate_round`;
6. :func:`summary_line`: the one line each round logs (from its :class:`~coordinator.record.RoundRecord`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

from coordinator.evaluation import Evaluator, personalisation, union_of_clients
from coordinator.record import (
    Architecture,
    Evaluation,
    FedDwaWeights,
    GrowthLog,
    Metrics,
    Participation,
    Rejection,
    RoundRecord,
    Traffic,
)
from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.metrics import pct
from har_models.nn.model import ArchSpec
from har_models.settings import LocalTraining, LrSchedule, doc
from har_models.wire.messages import DEFAULT_UPDATE_ENCODING, UPDATE_ENCODINGS, TrainingPlan

if TYPE_CHECKING:  # types only: the exchange and the round policies come after this module
    from coordinator.exchange import Exchange
    from coordinator.rounds.base import Batch
    from coordinator.strategies import Aggregate

_LT = {f.name: f for f in fields(LocalTraining)}

DEFAULT_CLIENT_UPDATE_ENCODING = "int8_delta"
"""The encoding a coordinator asks its clients to upload in unless told otherwise.

It is not the wire's default (:data:`har_models.wire.messages.DEFAULT_UPDATE_ENCODING`, float32),
which is what a plan or an update that names no encoding means, so that messages of earlier
releases keep their meaning. Chosen on the whole main job (30 clients, 15 rounds, seed 1):
global macro-F1 92.19 against float32's 92.24, for 0.25 of the upload bytes (``docs/results.md``).
"""


@dataclass(frozen=True)
class TrainingSettings:
    """The ``[training]`` settings table: what each selected device does in a round (the plan's local training).

    Parameters
    ----------
    local_epochs, lr, batch_size, class_weights :
        Local training (:class:`har_models.settings.LocalTraining`'s defaults: E = 1, lr 0.1, batch 32,
        balanced class weights; FedDist used E = 5, lr 0.01).
    update_encoding : {"float32", "float16", "int8_delta"}
        How clients encode their updates (:mod:`har_models.wire.update_encoding`); default
        :data:`DEFAULT_CLIENT_UPDATE_ENCODING`: 1/4 of float32's bytes, for 0.05 points of the main
        job's global macro-F1 (``docs/results.md``).
    lr_schedule : LrSchedule
        The client lr across rounds (``[training.lr_schedule]``): round r's plan carries
        ``lr x lr_schedule.factor(r, rounds)`` (:meth:`CoordinatorConfig.round_lr`).
    """

    local_epochs: int = field(default=LocalTraining.local_epochs, metadata=_LT["local_epochs"].metadata)
    lr: float = field(default=LocalTraining.lr, metadata=_LT["lr"].metadata)
    batch_size: int = field(default=LocalTraining.batch_size, metadata=_LT["batch_size"].metadata)
    class_weights: str = field(default=LocalTraining.class_weights, metadata=_LT["class_weights"].metadata)
    update_encoding: str = field(
        default=DEFAULT_CLIENT_UPDATE_ENCODING,
        metadata=doc("how clients encode their updates: float32 as trained, float16, or int8_delta (8-bit deltas against the "
                     "received model, one scale per tensor, error feedback)", choices=UPDATE_ENCODINGS),
    )
    lr_schedule: LrSchedule = field(default_factory=LrSchedule, metadata=doc("client lr across rounds", kind="table"))

    def check(self, cfg: Any) -> None:
        """Refuse values outside their choices (ValueError naming the setting)."""
        for name, allowed in (("class_weights", ("balanced", "none")), ("update_encoding", UPDATE_ENCODINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"[training] {name} must be one of {allowed}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ModelSettings:
    """The ``[model]`` settings table: the CNN's initial widths (FedDist's HAR CNN: 196 filters F, 1,024 units H)."""

    conv_filters: int = field(default=ArchSpec.conv_filters, metadata=doc("initial conv filters F"))
    dense_units: int = field(default=ArchSpec.dense_units, metadata=doc("initial hidden units H"))


class PlanSettings(Protocol):
    """What :func:`base_plan` reads of the federation's settings (a :class:`coordinator.config.CoordinatorConfig`)."""

    @property
    def training(self) -> TrainingSettings: ...

    @property
    def client_init(self) -> str: ...

    @property
    def seed(self) -> int: ...

    def round_lr(self, round_: int) -> float: ...

    def ala_plan(self) -> dict[str, Any]: ...


class EvaluationPlan(Protocol):
    """What :func:`evaluate_round` reads of the federation's settings."""

    @property
    def rounds(self) -> int: ...

    @property
    def evaluation(self) -> Any: ...


def base_plan(cfg: PlanSettings, round_: int = 0) -> TrainingPlan:
    """The strategy-independent part of round ``round_``'s training plan (local training and FedALA settings).

    Its ``lr`` is the round's under the configured schedule (:meth:`CoordinatorConfig.round_lr`);
    with the default constant schedule, ``[training] lr`` in every round.
    """
    t = cfg.training
    return TrainingPlan(
        local_epochs=t.local_epochs,
        lr=cfg.round_lr(round_),
        batch_size=t.batch_size,
        client_init=cfg.client_init,
        class_weights=t.class_weights,
        seed=cfg.seed,
        ala=cfg.ala_plan(),
        update_encoding=t.update_encoding,
    )


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
        f"{len(contributing)} update(s) with training windows, below the quorum of {min_clients} (the min_clients setting); "
        f"the model is left unchanged"
    )


def evaluate_round(
    round_: int,
    fed: Federation,
    spec0: ArchSpec,
    results: Sequence[ClientUpdate],
    evaluator: Evaluator | None,
    cfg: EvaluationPlan,
    left_out: Collection[str] = (),
    global_figures: Mapping[str, Any] | None = None,
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
    cfg : EvaluationPlan
        ``[evaluation] generalisation_every`` and ``rounds`` decide when generalisation is measured.
    left_out : collection of str
        Devices whose measure of the shared model is not trusted (quarantined): left out of ``start`` and
        ``received_union``; their own models still count in personalisation.
    global_figures : mapping, optional
        G's figures on the union test set when already known this round (:class:`coordinator.global_measure.GlobalMeasure`);
        None leaves ``global_`` to be added when they are (the next round's clients measure G).

    Returns
    -------
    Evaluation
        ``personalisation`` (mean over clients of each w_i on its own test split) and its
        per-client values, ``start`` (the same for each model as it starts local training,
        from the clients' "initial" matrices), ``received_union`` (the received models on
        the clients' test splits, pooled), ``global_`` (G on the union test set) when ``global_figures`` are given, and
        with an evaluator, in the rounds due, ``generalisation`` (each w_i on the union test set, mean over clients).
    """
    ev = Evaluation()
    trained = {u.client_id: u.confusion["trained"] for u in results if "trained" in u.confusion}
    received = {u.client_id: u.confusion["received"] for u in results if "received" in u.confusion and u.client_id not in left_out}
    initial = {u.client_id: u.confusion["initial"] for u in results if "initial" in u.confusion and u.client_id not in left_out}
    if trained:
        mean, per = personalisation(trained)
        ev = replace(ev, personalisation=Metrics.from_json(mean), personalisation_clients=_metrics_of(per))
    if initial:  # the model each client starts training from (FedALA's protocol), averaged as personalisation
        mean, per = personalisation(initial)
        ev = replace(ev, start=Metrics.from_json(mean), start_clients=_metrics_of(per))
    pooled = union_of_clients(received)
    ev = replace(ev, received_union=Metrics.from_json(pooled) if pooled is not None else None)
    if global_figures is not None:
        ev = replace(ev, global_=Metrics.from_json(global_figures))
    if evaluator is not None:
        every = cfg.evaluation.generalisation_every
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


@dataclass(frozen=True)
class Tally:
    """What a round's record needs of one exchange, without holding its updates.

    ``up_by_encoding``: bytes of the valid updates by their encoding (an envelope that names
    none is float32); ``rejected``: invalid messages by (client id, reason).
    """

    bytes_up: int
    bytes_down: int
    up_by_encoding: Counter[str]
    rejected: Counter[tuple[str, str]]
    duplicates: int = 0

    @classmethod
    def of(cls, ex: Exchange, extra: Sequence[ClientUpdate] = ()) -> Tally:
        """The tally of ``ex`` and of ``extra`` updates the round aggregates from elsewhere (a buffer's)."""
        by_enc: Counter[str] = Counter()
        for u in [*ex.updates.values(), *extra]:
            by_enc[str(u.meta.get("encoding", DEFAULT_UPDATE_ENCODING))] += u.size
        return cls(ex.bytes_up + sum(u.size for u in extra), ex.bytes_down, by_enc, Counter(ex.rejected), ex.n_duplicates)


def round_record(round_: int, ex: Exchange, batch: Batch, agg: Aggregate, tallies: Sequence[Tally], failures: Sequence[Failure],
                 growth_log: dict[str, Any] | None, spec: ArchSpec, evaluation: Evaluation) -> RoundRecord:  # fmt: skip
    """The record of round ``round_``: who took part (``ex``, ``batch``, ``failures``), its traffic over every exchange
    (``tallies``), the architecture ``spec`` after growth, growth, FedDWA's p_ij (``agg``) and ``evaluation`` (the guard's
    note and the timing are added by the caller)."""
    rejections: Counter[tuple[str, str]] = Counter()
    by_encoding: Counter[str] = Counter()
    for t in tallies:
        rejections.update(t.rejected)
        by_encoding.update(t.up_by_encoding)
    return RoundRecord(
        round=round_,
        participation=Participation(
            selected=len(ex.selected),
            updates=len(batch.results),
            rejected=sum(t.rejected.total() for t in tallies),
            missing=tuple(sorted(ex.selected - set(ex.updates))),
            failures={f.client_id: f.reason for f in failures},
            rejections=tuple(Rejection(cid, why, n) for (cid, why), n in sorted(rejections.items())),
            duplicates=sum(t.duplicates for t in tallies),
            stale=batch.stale,
        ),
        arch=Architecture(spec.version, spec.conv_filters, spec.dense_units),
        traffic=Traffic(sum(t.bytes_up for t in tallies), sum(t.bytes_down for t in tallies), dict(sorted(by_encoding.items()))),
        growth=GrowthLog.from_json(growth_log) if growth_log is not None else None,
        # FedDWA p_ij (Liu et al., IJCAI 2023, Eq. 17), row i = target, for the study's heat map
        feddwa_weights=FedDwaWeights(
            tuple(agg.participants), tuple(tuple(round(float(x), 6) for x in row) for row in agg.mixing.t().tolist())
        ) if agg.mixing is not None else None,
        evaluation=evaluation,
    )  # fmt: skip


def summary_line(record: RoundRecord) -> str:
    """The one line a round logs, e.g. ``round 7: 30 selected, 30 updates, 0 rejected, ...``.

    "n/a" means the measure was not taken: the global figures need a union test set
    (``--eval-data`` or a simulation), the personalisation figures need client updates.
    The start figures (each model as it starts local training) follow when the round has them.
    The line ends with each device's part (:func:`device_summary`) when the record names any.
    """
    g, p = record.evaluation.global_, record.evaluation.personalisation
    part, traffic = record.participation, record.traffic or Traffic()
    why = Counter(part.failures.get(cid, "missed_deadline") for cid in part.missing)
    words = {"offline": "went offline", "warming_up": "still warming up", "cohort_full": "not needed (cohort goal reached)",
             "still_training": "still training (buffer full)"}  # fmt: skip
    return (
        f"round {record.round}: {part.selected} selected, {part.updates} updates"
        + (f" ({len(part.stale)} from earlier versions)" if part.stale else "")
        + f", {part.rejected} rejected, {why.pop('missed_deadline', 0)} missed the deadline"
        + "".join(f", {n} {words[r]}" for r, n in sorted(why.items()) if r in words)
        + (f", {refused} sent no valid update" if (refused := sum(n for r, n in why.items() if r not in words)) else "")
        + f", {record.seconds:.1f} s; "
        f"global acc {pct(g.accuracy if g else None)} F1 {pct(g.macro_f1 if g else None)}, "
        f"personalisation acc {pct(p.accuracy if p else None)} F1 {pct(p.macro_f1 if p else None)}"
        + (f", start acc {pct(st.accuracy)} F1 {pct(st.macro_f1)}" if (st := record.evaluation.start) else "")
        + f"; up {traffic.bytes_up / 1e6:.1f} MB, down {traffic.bytes_down / 1e6:.1f} MB"
    ) + (f"; devices: {devices}" if (devices := device_summary(record)) else "")
