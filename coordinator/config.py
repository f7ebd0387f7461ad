"""Configuration of the coordinator: one typed object, the same names on the CLI and in reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from coordinator import strategies
from coordinator.feddist import FedDistConfig
from coordinator.guard import DEFAULT_MARGIN as DEFAULT_GUARD_MARGIN
from coordinator.strategies.feddwa import FedDWASettings
from coordinator.strategies.fedopt import ServerOptSettings
from coordinator.strategies.fedprox import FedProxSettings
from har_io.blobs import TRANSPORTS
from har_io.broker_config import BrokerConfig
from har_models.data.splits import DEFAULT_SPLIT_SEED
from har_models.nn.arch import ArchSpec
from har_models.settings import AlaConfig, LocalTraining, LrSchedule, doc, from_mapping, to_mapping
from har_models.wire.messages import UPDATE_ENCODINGS
from har_models.wire.topics import check_client_id

AGGREGATIONS = strategies.names()
"""The ``--aggregation`` choices: the registered strategies (:mod:`coordinator.strategies`)."""
GROWTHS = ("none", "feddist")
CLIENT_INITS = ("overwrite", "ala")
GROWTH_MODES = ("auto", "paper", "function_preserving")
DEFAULT_CLIENT_UPDATE_ENCODING = "int8_delta"
"""The encoding a coordinator asks its clients to upload in unless told otherwise.

It is not the wire's default (:data:`har_models.wire.messages.DEFAULT_UPDATE_ENCODING`, float32),
which is what a plan or an update that names no encoding means, so that messages of earlier
releases keep their meaning. Chosen on the whole main job (30 clients, 15 rounds, seed 1):
global macro-F1 92.19 against float32's 92.24, for 0.25 of the upload bytes (``docs/results.md``).
"""
BLOB_STORES = ("folder", "s3")
"""The blob store back ends (:mod:`coordinator.blob_folder`, :mod:`coordinator.blob_s3`)."""
_LT = {f.name: f for f in fields(LocalTraining)}


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator needs to run a federation.

    Parameters
    ----------
    run_dir : Path
        Run folder: state database, models, report.
    broker : BrokerConfig
    federation : str
        Topic namespace ``fedhar/v1/{federation}``.
    run_id : str
        Identifies the run (clients keep per-run state apart).
    rounds : int
        Communication rounds R.
    expected_clients : int, optional
        Start as soon as this many clients are online (else wait ``start_timeout_s``).
    min_clients : int
        Quorum: fewest clients a round starts with and fewest updates it needs to change the
        model; a round that closes with fewer leaves the model unchanged and is run again.
    start_timeout_s : float
        Seconds to wait for ``expected_clients`` before starting with those present.
    start_settle_s : float
        Without ``expected_clients``: start once ``min_clients`` are online and no further
        client has come online for this many seconds.
    round_timeout_s : float
        Deadline of each exchange, seconds after its announcement.
    status_refresh_s : float
        Seconds between republications of the retained coordinator status (from a thread of
        its own, so a long evaluation does not stop it); clients treat a status older than
        three periods as a dead coordinator (docs/reliability.md, "A dead coordinator").
    fraction : float
        Share of eligible clients selected per round (1.0 = all, as FedDist).
    cohort_goal : int
        Updates a round aims for (0 = no goal: ``fraction`` alone decides, as before). With a
        goal, a round selects at most ``ceil(cohort_goal * (1 + cohort_overselect))`` eligible
        devices (drawn with the run's seeded generator, as ``fraction``'s selection), its main
        exchange closes as soon as ``cohort_goal`` updates arrived (or at ``round_timeout_s``,
        the round's deadline), and its announcements tell every device when to check in again
        (pace steering, :mod:`coordinator.cohort`; Bonawitz et al., MLSys 2019, section 2).
        Must be at least ``min_clients``.
    cohort_overselect : float
        Over-selection margin: select ``cohort_goal x (1 + margin)`` devices so that stragglers
        and drop-outs do not leave the round short (Bonawitz et al. select 130 % of the goal: 0.3).
    cohort_min_fraction : float
        Fraction of ``cohort_goal`` that must answer for the round to count. The quorum in
        force is ``max(min_clients, ceil(cohort_min_fraction * cohort_goal))`` updates with
        training windows: ``min_clients`` stays a floor, the fraction can only raise it. A round
        that closes below the quorum leaves the model unchanged and is run again, as before.
    seed : int
        Seeds the initial model, client selection and the clients' local shuffling.
    split_seed : int
        Seed of every client's 80/20 train/test split; the evaluation's union test set uses
        the same one.
    local_epochs, lr, batch_size, class_weights :
        Local training (defaults E = 1, lr 0.1, batch 32, balanced class weights; FedDist
        used E = 5, lr 0.01).
    lr_schedule : LrSchedule
        The client lr across rounds (``--lr-schedule``, ``--lr-warmup``, ``--lr-min-factor``,
        ``--lr-step-every``, ``--lr-step-gamma``; TOML table ``[lr_schedule]``): round r's
        plan carries ``lr x lr_schedule.factor(r, rounds)`` (:meth:`round_lr`), so clients
        follow it through the plan's ``lr`` alone.
    aggregation : str
        A registered strategy (:data:`AGGREGATIONS`); default
        :data:`coordinator.strategies.DEFAULT_AGGREGATION`: FedExP (its step eta_t from the
        clients' updates, capped at 1 up to 15 clients and at 2 from 30, momentum 0.5), safe
        from 2 to 30 clients on HAPT validation windows (docs/tuning/server-step.md). The
        earlier default, FedAvgM eta 3 beta 0.5 (``--aggregation fedavgm``), was tuned on
        the 30-client main job and collapsed 2-device federations (issue 28).
    growth : {"none", "feddist"}
    client_init : {"overwrite", "ala"}
    fedprox : FedProxSettings
        FedProx mu (``--prox-mu``; TOML table ``[fedprox]``).
    feddwa : FedDWASettings
        FedDWA K and the distances' Gram arithmetic (``--top-k``, ``--dwa-gram``; ``[feddwa]``).
    server_opt : ServerOptSettings
        Server optimiser eta, beta, beta2, tau of Reddi et al., ICLR 2021, Algorithm 2
        (``--server-lr``, ``--server-momentum``, ``--server-beta2``, ``--server-tau``;
        ``[server_opt]``); read only by the server optimisers. Left-out eta and beta
        are the optimiser's own defaults.
    feddist_mode : {"auto", "paper", "function_preserving"}
        Outgoing weights of new units copied from the source client (with the paper's
        intermediate layer-wise rounds) or zero (no client's function changes). "auto"
        (default) picks "paper" for plain FedDist (FedAvg aggregation, overwrite
        initialisation: comparable with the paper) and "function_preserving" when growth
        is combined with personalisation (reference/algorithms.md section 5.2, step 6).
    feddist_k0, feddist_delta, feddist_period, feddist_max_width_factor :
        k_r = k0 + delta * floor(r / period); width cap relative to round 0.
    ala : AlaConfig
        FedALA settings sent to clients when ``client_init`` is "ala"; typed and checked here,
        before anything is sent.
    conv_filters, dense_units : int
        Initial widths of the CNN (196, 1024).
    generalisation_every : int
        Evaluate every client's model on the union test set every this many rounds (and
        in the last round); it costs one full evaluation per client. 0 = last round only.
    max_update_bytes : int
        Largest update envelope accepted (bytes).
    update_encoding : {"float32", "float16", "int8_delta"}
        How clients encode their updates (:mod:`har_models.wire.update_encoding`). The
        default, :data:`DEFAULT_CLIENT_UPDATE_ENCODING` (``"int8_delta"``), sends 8-bit deltas
        against the received model with error feedback: 1/4 of float32's bytes, for 0.05
        points of the main job's global macro-F1 (``docs/results.md``). ``"float32"`` sends the
        trained tensors as they are.
    guard : bool
        Quality guard with rollback, which also clips an update more than 10x the round's
        others (:mod:`coordinator.guard`); False here, True in ``serve``.
    guard_margin : float
        Points of start macro-F1 a version may fall below the best before a rollback (10).
    resume : bool
        Continue the run found in ``run_dir`` after its last completed round.
    """

    run_dir: Path = field(metadata=doc("run folder: state database, models, report", cli=False))
    broker: BrokerConfig = field(default_factory=BrokerConfig, metadata=doc("broker address and credentials", cli=False))
    federation: str = field(default="default", metadata=doc("federation name, topic namespace fedhar/v1/<federation>", cli=False))
    run_id: str = field(default="run", metadata=doc("run identifier", cli=False))
    rounds: int = field(default=15, metadata=doc("communication rounds R", "rounds"))
    expected_clients: int | None = field(default=None, metadata=doc("start as soon as this many clients are online", cli=False))
    min_clients: int = field(default=2, metadata=doc("quorum: fewest updates a round needs to change the model", "clients"))
    start_timeout_s: float = field(
        default=300.0, metadata=doc("seconds to wait for clients before the first round", "s", flag="--start-timeout")
    )
    start_settle_s: float = field(
        default=10.0,
        metadata=doc("without --expected-clients: start once min_clients are online and nobody new came for this long", "s",
                     flag="--start-settle"),
    )
    round_timeout_s: float = field(
        default=900.0, metadata=doc("seconds before a round closes without the missing updates", "s", flag="--round-timeout")
    )
    status_refresh_s: float = field(
        default=30.0,
        metadata=doc("republish the retained coordinator status this often; clients treat one older than three "
                     "periods as a dead coordinator", "s", flag="--status-refresh"),
    )
    fraction: float = field(default=1.0, metadata=doc("share of eligible clients selected per round (1.0 = all, as FedDist)"))
    cohort_goal: int = field(
        default=0,
        metadata=doc("updates a round aims for: select at most goal x (1 + cohort_overselect) eligible devices, close the "
                     "round once goal updates arrived, and tell every device when to check in again (0 = off)", "updates"),
    )
    cohort_overselect: float = field(
        default=0.0, metadata=doc("over-selection margin with a cohort goal: select goal x (1 + margin) devices (0.3: 1.3 x the goal)")
    )
    cohort_min_fraction: float = field(
        default=0.0,
        metadata=doc("fraction of cohort_goal that must answer for a round to count; the quorum is "
                     "max(min_clients, ceil(fraction x goal))"),
    )
    buffer_size: int = field(
        default=0,
        metadata=doc("FedBuff's K: buffered asynchronous rounds that close once K updates are in, fresh ones and, weighted by "
                     "1/sqrt(1 + staleness), those of devices still training an earlier version (0 = off: synchronous "
                     "rounds)", "updates"),
    )
    max_staleness: int = field(
        default=4,
        metadata=doc("with buffer_size: the oldest version (rounds back) whose updates are still taken; a device still "
                     "training it is free again after that", "rounds"),
    )
    concurrency: int = field(
        default=0,
        metadata=doc("with buffer_size: the most devices training at once, over every version (0 = every eligible "
                     "device that fraction selects)", "devices"),
    )
    seed: int = field(default=1, metadata=doc("seeds the initial model, client selection and local shuffling"))
    split_seed: int = field(default=DEFAULT_SPLIT_SEED, metadata=doc("seed of every client's 80/20 train/test split"))
    local_epochs: int = field(default=LocalTraining.local_epochs, metadata=_LT["local_epochs"].metadata)
    lr: float = field(default=LocalTraining.lr, metadata=_LT["lr"].metadata)
    batch_size: int = field(default=LocalTraining.batch_size, metadata=_LT["batch_size"].metadata)
    class_weights: str = field(default=LocalTraining.class_weights, metadata=_LT["class_weights"].metadata)
    lr_schedule: LrSchedule = field(default_factory=LrSchedule, metadata=doc("client lr across rounds", kind="table"))
    aggregation: str = field(
        default=strategies.DEFAULT_AGGREGATION, metadata=doc("aggregation strategy", choices=AGGREGATIONS)
    )
    growth: str = field(default="none", metadata=doc("architecture growth", choices=GROWTHS))
    client_init: str = field(default="overwrite", metadata=doc("how clients start from the received model", choices=CLIENT_INITS))
    fedprox: FedProxSettings = field(default_factory=FedProxSettings, metadata=doc("FedProx settings", kind="table"))
    feddwa: FedDWASettings = field(default_factory=FedDWASettings, metadata=doc("FedDWA settings", kind="table"))
    server_opt: ServerOptSettings = field(
        default_factory=ServerOptSettings, metadata=doc("server optimiser settings", kind="table")
    )
    feddist_mode: str = field(
        default="auto",
        metadata=doc(
            "outgoing weights of new units: copied + intermediate rounds (paper) or zero (function_preserving); "
            "auto = paper for plain FedDist, function_preserving when combined with FedDWA/FedPer/ALA",
            choices=GROWTH_MODES,
        ),
    )
    # The defaults are FedDistConfig's and ArchSpec's, so each is written once.
    feddist_k0: float = field(default=FedDistConfig.k0, metadata=doc("FedDist k_0 (k_r = k_0 + delta * floor(r / period))"))
    feddist_delta: float = field(default=FedDistConfig.delta, metadata=doc("FedDist delta"))
    feddist_period: int = field(default=FedDistConfig.period, metadata=doc("FedDist period", "rounds"))
    feddist_max_width_factor: float = field(
        default=FedDistConfig.max_width_factor,
        metadata=doc("cap on each layer's width, as a multiple of round 0's", flag="--feddist-max-width"),
    )
    ala: AlaConfig = field(
        default_factory=AlaConfig, metadata=doc('FedALA settings as JSON, e.g. \'{"eta": 1.0, "rand_percent": 80}\'', kind="json")
    )
    conv_filters: int = field(default=ArchSpec.conv_filters, metadata=doc("initial conv filters F"))
    dense_units: int = field(default=ArchSpec.dense_units, metadata=doc("initial hidden units H"))
    generalisation_every: int = field(
        default=5, metadata=doc("rounds between generalisation evaluations (0 = last only)", "rounds")
    )
    max_update_bytes: int = field(default=512 * 1024 * 1024, metadata=doc("largest update envelope accepted", "bytes"))
    update_encoding: str = field(
        default=DEFAULT_CLIENT_UPDATE_ENCODING,
        metadata=doc(
            "how clients encode their updates: float32 as trained, float16, or int8_delta (8-bit deltas against the "
            "received model, one scale per tensor, error feedback)",
            choices=UPDATE_ENCODINGS,
        ),
    )
    guard: bool = field(
        default=False,
        metadata=doc("quality guard: a version whose clients' start macro-F1 falls more than guard_margin points below "
                     "the best version's (or is not finite) is rolled back to the best with a halved server step "
                     "(coordinator/guard.py); off in run and simulate so research figures stay raw, on in serve"),
    )
    guard_margin: float = field(
        default=DEFAULT_GUARD_MARGIN,
        metadata=doc("how far below the best version's start macro-F1 a version may fall before the guard rolls back",
                     "points"),
    )
    resume: bool = field(default=False, metadata=doc("continue the run in run_dir after its last completed round", cli=False))
    transport: str = field(
        default="mqtt",
        metadata=doc("how model bytes travel: in chunks through the broker (mqtt), or as content-addressed objects in a "
                     "blob store fetched and uploaded over HTTP with signed URLs, MQTT carrying only control (blobs; "
                     "docs/scale.md)", choices=TRANSPORTS),
    )
    blob_store: str = field(
        default="folder",
        metadata=doc("with transport blobs: a folder served over HTTP by the coordinator (folder), or an S3-compatible "
                     "store (s3: s3_bucket, s3_endpoint; credentials from the environment, never sent to devices)",
                     choices=BLOB_STORES),
    )
    blob_bind: str = field(default="127.0.0.1", metadata=doc("address the folder store's HTTP server binds (run, simulate)"))
    blob_port: int = field(default=0, metadata=doc("port of the folder store's HTTP server (0: a free one)"))
    blob_public_url: str = field(
        default="", metadata=doc("base URL devices reach the folder store at, if not http://blob_bind:port (a proxy, a name)")
    )
    s3_endpoint: str = field(default="", metadata=doc("S3 endpoint URL (empty: AWS's own)"))
    s3_bucket: str = field(default="", metadata=doc("S3 bucket that holds the objects and upload slots"))
    s3_prefix: str = field(default="", metadata=doc("key prefix inside the S3 bucket, e.g. 'fedhar/'"))

    def __post_init__(self) -> None:
        check_client_id(self.run_id)
        for f in fields(self):
            tp = _NESTED.get(f.name)
            if tp is None:
                continue
            value = getattr(self, f.name)
            if isinstance(value, dict):
                object.__setattr__(self, f.name, from_mapping(tp, value, f.name))
            elif not isinstance(value, tp):
                raise ValueError(f"{f.name} must be {tp.__name__} settings (or a mapping), got {type(value).__name__}")
        for name, allowed in (
            ("aggregation", strategies.names()),
            ("growth", GROWTHS),
            ("client_init", CLIENT_INITS),
            ("feddist_mode", GROWTH_MODES),
            ("class_weights", ("balanced", "none")),
            ("update_encoding", UPDATE_ENCODINGS),
            ("transport", TRANSPORTS),
            ("blob_store", BLOB_STORES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.rounds < 1 or self.min_clients < 1 or not 0 < self.fraction <= 1:
            raise ValueError(
                f"need rounds >= 1, min_clients >= 1, 0 < fraction <= 1; got {self.rounds}, {self.min_clients}, {self.fraction}"
            )
        if self.cohort_goal < 0 or 0 < self.cohort_goal < self.min_clients:
            raise ValueError(
                f"cohort_goal (--cohort-goal) must be 0 (off) or at least min_clients ({self.min_clients}), got {self.cohort_goal}"
            )
        if not 0 <= self.cohort_overselect <= 10 or not 0 <= self.cohort_min_fraction <= 1:
            raise ValueError(
                f"need 0 <= cohort_overselect <= 10 and 0 <= cohort_min_fraction <= 1; got {self.cohort_overselect}, "
                f"{self.cohort_min_fraction}"
            )
        self._check_buffered()
        if self.round_timeout_s <= 0 or self.start_timeout_s < 0:
            raise ValueError("round_timeout_s must be > 0 and start_timeout_s >= 0")
        if not self.status_refresh_s > 0:
            raise ValueError(f"status_refresh_s must be > 0 (seconds between coordinator status refreshes), got {self.status_refresh_s}")
        if self.transport == "blobs" and self.blob_store == "s3" and not self.s3_bucket:
            raise ValueError("transport blobs with blob_store s3 needs s3_bucket (--s3-bucket)")
        if not 0 <= self.blob_port <= 65535:
            raise ValueError(f"blob_port must be in [0, 65535], got {self.blob_port}")
        if not 0 <= self.guard_margin <= 100:
            raise ValueError(f"guard_margin (--guard-margin) must be in [0, 100] points of macro-F1, got {self.guard_margin}")

    def _check_buffered(self) -> None:
        """Refuse buffered rounds (``buffer_size``) with what needs every update of a round together."""
        if self.buffer_size < 0 or self.concurrency < 0 or self.max_staleness < 1:
            raise ValueError(f"need buffer_size >= 0, concurrency >= 0 and max_staleness >= 1; got {self.buffer_size}, "
                             f"{self.concurrency}, {self.max_staleness}")  # fmt: skip
        if not self.buffer_size:
            return
        if self.buffer_size < self.min_clients:
            raise ValueError(f"buffer_size (--buffer-size) must be at least min_clients ({self.min_clients}), got {self.buffer_size}")
        if self.cohort_goal:
            raise ValueError("buffer_size and cohort_goal both close a round at a count of updates: set one of them (0 = off)")
        if self.growth != "none":
            raise ValueError("buffered rounds (buffer_size) cannot grow the model: FedDist's steps need every update of a "
                             "round together; use growth = 'none' or buffer_size = 0")  # fmt: skip
        if strategies.strategy_class(self.aggregation).personalised:
            raise ValueError(f"buffered rounds (buffer_size) need one global model every client takes whole; "
                             f"{self.aggregation!r} keeps personalised models: use fedavg, fedavgm, fedexp or fedadam, "
                             f"or buffer_size = 0")  # fmt: skip
        if 0 < self.concurrency < self.buffer_size:
            raise ValueError(f"concurrency ({self.concurrency}) must be at least buffer_size ({self.buffer_size}) or 0 (all)")

    @property
    def growth_mode(self) -> str:
        """The FedDist mode in force ("paper" or "function_preserving"), with "auto" resolved."""
        if self.feddist_mode != "auto":
            return self.feddist_mode
        plain = strategies.strategy_class(self.aggregation).feddist_paper and self.client_init == "overwrite"
        return "paper" if plain else "function_preserving"

    def round_lr(self, round_: int) -> float:
        """The client lr of round ``round_`` (0-based): :attr:`lr` times the schedule's factor (:class:`LrSchedule`).

        Raises
        ------
        ValueError
            If ``round_`` is negative.
        """
        return self.lr * self.lr_schedule.factor(round_, self.rounds)

    def ala_plan(self) -> dict[str, Any]:
        """The ``ala`` object of the training plan: every FedALA setting when ALA is on, else empty."""
        return to_mapping(self.ala) if self.client_init == "ala" else {}

    def settings(self) -> dict[str, Any]:
        """The federation settings a TOML file may hold (no run folder, broker or run identity)."""
        d = to_mapping(self)
        for f in fields(self):
            if not f.metadata.get("cli", True):
                d.pop(f.name, None)
        return _without_none(d)

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form for the state database and the report (password left out)."""
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["feddist_mode_in_force"] = self.growth_mode
        d["broker"] = {k: v for k, v in asdict(self.broker).items() if k != "password"}
        return d

    @property
    def strategy_label(self) -> str:
        """Human-readable combination, e.g. ``feddwa + feddist(paper) + ala``."""
        parts = [self.aggregation]
        if self.growth != "none":
            parts.append(f"{self.growth}({self.growth_mode})")
        if self.client_init != "overwrite":
            parts.append(self.client_init)
        return " + ".join(parts)


_NESTED: dict[str, type] = {"ala": AlaConfig, "lr_schedule": LrSchedule, **strategies.settings_tables()}
"""Fields of :class:`CoordinatorConfig` that hold a settings dataclass (given as one or as a mapping)."""

_missing = {t: tp for t, tp in strategies.settings_tables().items()
            if t not in {f.name for f in fields(CoordinatorConfig)} or CoordinatorConfig.__annotations__.get(t) != tp.__name__}
if _missing:
    raise TypeError(f"CoordinatorConfig lacks the strategy settings tables {sorted(_missing)}: add a field of each type")


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without None values, also inside nested tables (TOML has no null)."""
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}
