"""Configuration of the coordinator: one typed object whose feature settings are tables declared by their owners.

The top level holds what every federation has (its identity, rounds, quorum, selection share, seed,
strategy, growth and client initialisation). Everything a part of the coordinator reads only for
itself is a table that the part declares in its own module, with each setting's default, unit,
meaning and flag:

==================  =====================================================  ======================================
table               what                                                   declared by
==================  =====================================================  ======================================
``[timing]``        waits for the devices, deadlines, status refresh       :class:`coordinator.grid.Timing`
``[training]``      the plan's local training, update encoding, lr         :class:`coordinator.round.TrainingSettings`
                    schedule (``[training.lr_schedule]``)
``[model]``         the CNN's initial widths                               :class:`coordinator.round.ModelSettings`
``[evaluation]``    train/test split seed, generalisation period           :class:`coordinator.evaluation.EvaluationSettings`
``[ala]``           FedALA (sent to clients)                               :class:`har_models.settings.AlaConfig`
``[strategies]``    each strategy's own table (``[strategies.fedprox]``)   the strategies (:mod:`coordinator.strategies`)
``[feddist]``       FedDist growth                                         :class:`coordinator.feddist_steps.FedDistSettings`
``[transport]``     MQTT chunks or blob store                              :class:`coordinator.transport.settings.TransportSettings`
``[cohort]``        cohorts with pace steering                             :class:`coordinator.rounds.cohort.CohortSettings`
``[buffer]``        buffered asynchronous rounds (FedBuff)                 :class:`coordinator.rounds.buffered.BufferSettings`
``[guard]``         the quality guard                                      :class:`coordinator.rounds.guarded.GuardSettings`
==================  =====================================================  ======================================

Command lines and TOML files are generated from these declarations (:mod:`har_io.cli`); a table's
``check(cfg)`` refuses settings that cannot work together. Files of earlier releases, whose keys
were flat (``cohort_goal = 3``, ``[fedprox]``), are read through :data:`MOVED` with a warning that
names each new key (:meth:`CoordinatorConfig.migrate`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from coordinator import strategies
from coordinator.evaluation import EvaluationSettings
from coordinator.feddist_steps import FedDistSettings
from coordinator.grid import Timing
from coordinator.round import ModelSettings, TrainingSettings
from coordinator.rounds.buffered import BufferSettings
from coordinator.rounds.cohort import CohortSettings
from coordinator.rounds.guarded import GuardSettings
from coordinator.transport.settings import TransportSettings
from har_io.broker_config import BrokerConfig
from har_models.settings import AlaConfig, doc, from_mapping, to_mapping
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.settings")

__all__ = ["AGGREGATIONS", "CLIENT_INITS", "GROWTHS", "MOVED", "BufferSettings", "CohortSettings", "CoordinatorConfig",
           "EvaluationSettings", "FedDistSettings", "GuardSettings", "ModelSettings", "Timing", "TrainingSettings",
           "TransportSettings"]

AGGREGATIONS = strategies.names()
"""The ``--aggregation`` choices: the registered strategies (:mod:`coordinator.strategies`)."""
GROWTHS = ("none", "feddist")
CLIENT_INITS = ("overwrite", "ala")


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator needs to run a federation (see the module docstring for the tables).

    Parameters
    ----------
    run_dir : Path
        Run folder: state database, models, report.
    broker : BrokerConfig
    federation : str
        Topic namespace ``fedhar/v1/{federation}``.
    run_id : str
        Identifies the run (clients keep per-run state apart).
    resume : bool
        Continue the run found in ``run_dir`` after its last completed round.
    rounds : int
        Communication rounds R.
    seed : int
        Seeds the initial model, client selection and the clients' local shuffling.
    min_clients : int
        Quorum: fewest clients a round starts with and fewest updates it needs to change the
        model; a round that closes with fewer leaves the model unchanged and is run again.
    fraction : float
        Share of eligible clients selected per round (1.0 = all, as FedDist).
    aggregation : str
        A registered strategy (:data:`AGGREGATIONS`); default
        :data:`coordinator.strategies.DEFAULT_AGGREGATION`: FedExP (its step eta_t from the
        clients' updates, capped at 1 up to 15 clients and at 2 from 30, momentum 0.5), safe
        from 2 to 30 clients on HAPT validation windows (docs/tuning/server-step.md). The
        earlier default, FedAvgM eta 3 beta 0.5 (``--aggregation fedavgm``), was tuned on
        the 30-client main job and collapsed 2-device federations (issue 28).
    growth : {"none", "feddist"}
    client_init : {"overwrite", "ala"}
    timing, training, model, evaluation, ala, strategies, feddist, transport, cohort, buffer, guard :
        The feature tables (module docstring); each given as its dataclass or as a mapping.

    Raises
    ------
    ValueError
        For a value out of range or settings that cannot work together (the setting is named).
    """

    run_dir: Path = field(metadata=doc("run folder: state database, models, report", cli=False))
    broker: BrokerConfig = field(default_factory=BrokerConfig, metadata=doc("broker address and credentials", cli=False))
    federation: str = field(default="default", metadata=doc("federation name, topic namespace fedhar/v1/<federation>", cli=False))
    run_id: str = field(default="run", metadata=doc("run identifier", cli=False))
    resume: bool = field(default=False, metadata=doc("continue the run in run_dir after its last completed round", cli=False))
    rounds: int = field(default=15, metadata=doc("communication rounds R", "rounds"))
    seed: int = field(default=1, metadata=doc("seeds the initial model, client selection and local shuffling"))
    min_clients: int = field(default=2, metadata=doc("quorum: fewest updates a round needs to change the model", "clients"))
    fraction: float = field(default=1.0, metadata=doc("share of eligible clients selected per round (1.0 = all, as FedDist)"))
    aggregation: str = field(
        default=strategies.DEFAULT_AGGREGATION, metadata=doc("aggregation strategy", choices=AGGREGATIONS)
    )
    growth: str = field(default="none", metadata=doc("architecture growth", choices=GROWTHS))
    client_init: str = field(default="overwrite", metadata=doc("how clients start from the received model", choices=CLIENT_INITS))
    timing: Timing = field(default_factory=Timing, metadata=doc("waits for the devices and deadlines", kind="table"))
    training: TrainingSettings = field(default_factory=TrainingSettings, metadata=doc("local training in each round", kind="table"))
    model: ModelSettings = field(default_factory=ModelSettings, metadata=doc("the CNN's initial widths", kind="table"))
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings, metadata=doc("the evaluation protocol", kind="table"))
    ala: AlaConfig = field(
        default_factory=AlaConfig, metadata=doc('FedALA settings as JSON, e.g. \'{"eta": 1.0, "rand_percent": 80}\'', kind="json")
    )
    strategies: Any = field(default_factory=strategies.StrategySettings, metadata=doc("each strategy's settings", kind="table"))
    feddist: FedDistSettings = field(default_factory=FedDistSettings, metadata=doc("FedDist growth", kind="table"))
    transport: TransportSettings = field(default_factory=TransportSettings, metadata=doc("how model bytes travel", kind="table"))
    cohort: CohortSettings = field(default_factory=CohortSettings, metadata=doc("cohorts with pace steering", kind="table"))
    buffer: BufferSettings = field(default_factory=BufferSettings, metadata=doc("buffered asynchronous rounds (FedBuff)", kind="table"))
    guard: GuardSettings = field(default_factory=GuardSettings, metadata=doc("the quality guard", kind="table"))

    def __post_init__(self) -> None:
        check_client_id(self.run_id)
        for f in fields(self):
            tp = _TABLES.get(f.name)
            if tp is None:
                continue
            value = getattr(self, f.name)
            if isinstance(value, dict):
                object.__setattr__(self, f.name, from_mapping(tp, value, f.name))
            elif not isinstance(value, tp):
                raise ValueError(f"{f.name} must be {tp.__name__} settings (or a mapping), got {type(value).__name__}")
        for name, allowed in (("aggregation", strategies.names()), ("growth", GROWTHS), ("client_init", CLIENT_INITS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.rounds < 1 or self.min_clients < 1 or not 0 < self.fraction <= 1:
            raise ValueError(
                f"need rounds >= 1, min_clients >= 1, 0 < fraction <= 1; got {self.rounds}, {self.min_clients}, {self.fraction}"
            )
        for name in _TABLES:
            check = getattr(getattr(self, name), "check", None)
            if check is not None:
                check(self)

    @classmethod
    def migrate(cls, data: dict[str, Any], what: str = "") -> dict[str, Any]:
        """``data`` (a settings mapping, e.g. a TOML file's) with the keys of earlier releases moved into their tables.

        Each moved key is logged as a warning naming its new place (``cohort_goal`` -> ``[cohort] goal``); a
        key given in both places is refused.

        Raises
        ------
        ValueError
            If an old key and its new place are both given.
        """
        out = dict(data)
        for old, (table, new) in MOVED.items():
            if old not in out or (old == table and isinstance(out[old], dict)):
                continue
            value = out.pop(old)
            path = table.split(".")
            into = out
            for part in path:
                nxt = into.get(part, {})
                if not isinstance(nxt, dict):
                    raise ValueError(f"{what or 'settings'}: {part!r} must be a table of settings, got {nxt!r}")
                into[part] = dict(nxt)
                into = into[part]
            place = f"[{table}]" + (f" {new}" if new else "")
            if (new and new in into) or (not new and into):
                raise ValueError(f"{what or 'settings'}: {old!r} and {place} both given; keep only {place}")
            if new:
                into[new] = value
            elif isinstance(value, dict):
                into.update(value)
            else:
                raise ValueError(f"{what or 'settings'}: {old!r} must be a table of settings ([{table}]), got {value!r}")
            log.warning("%s: %r is the old name of %s; read as such (write it there)", what or "settings", old, place)
        return out

    @property
    def growth_mode(self) -> str:
        """The FedDist mode in force ("paper" or "function_preserving"), with "auto" resolved."""
        return self.feddist.mode_in_force(self.aggregation, self.client_init)

    def round_lr(self, round_: int) -> float:
        """The client lr of round ``round_`` (0-based): ``[training] lr`` times the schedule's factor.

        Raises
        ------
        ValueError
            If ``round_`` is negative.
        """
        return self.training.lr * self.training.lr_schedule.factor(round_, self.rounds)

    def ala_plan(self) -> dict[str, Any]:
        """The ``ala`` object of the training plan: every FedALA setting when ALA is on, else empty."""
        return to_mapping(self.ala) if self.client_init == "ala" else {}

    def settings(self) -> dict[str, Any]:
        """The federation settings a TOML file may hold (no run folder, broker or run identity)."""
        d = to_mapping(self)
        for f in fields(self):
            if not f.metadata.get("cli", True):
                d.pop(f.name, None)
        d["timing"].pop("expected_clients", None)
        return _without_none(d)

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form for the state database and the report (password left out)."""
        d = to_mapping(self)
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


def _collect_tables() -> dict[str, type]:
    import typing

    hints = typing.get_type_hints(CoordinatorConfig, localns={"Any": Any})
    out = {f.name: hints[f.name] for f in fields(CoordinatorConfig) if f.metadata.get("kind") in ("table", "json")}
    out["strategies"] = strategies.StrategySettings
    return out


_TABLES: dict[str, type] = _collect_tables()
"""Fields of :class:`CoordinatorConfig` that hold a settings dataclass (given as one or as a mapping)."""

MOVED: dict[str, tuple[str, str]] = {
    **{k: ("timing", k) for k in ("expected_clients", "start_timeout_s", "start_settle_s", "round_timeout_s", "status_refresh_s")},
    **{k: ("training", k) for k in ("local_epochs", "lr", "batch_size", "class_weights", "update_encoding", "lr_schedule")},
    **{k: ("model", k) for k in ("conv_filters", "dense_units")},
    **{k: ("evaluation", k) for k in ("split_seed", "generalisation_every")},
    **{k: (f"strategies.{k}", "") for k in strategies.settings_tables()},
    "feddist_mode": ("feddist", "mode"), "feddist_k0": ("feddist", "k0"), "feddist_delta": ("feddist", "delta"),
    "feddist_period": ("feddist", "period"), "feddist_max_width_factor": ("feddist", "max_width_factor"),
    "transport": ("transport", "kind"), "max_update_bytes": ("transport", "max_update_bytes"), "blob_store": ("transport", "store"),
    "blob_bind": ("transport", "bind"), "blob_port": ("transport", "port"), "blob_public_url": ("transport", "public_url"),
    **{k: ("transport", k) for k in ("s3_endpoint", "s3_bucket", "s3_prefix")},
    "cohort_goal": ("cohort", "goal"), "cohort_overselect": ("cohort", "overselect"),
    "cohort_min_fraction": ("cohort", "min_fraction"),
    "buffer_size": ("buffer", "size"), "max_staleness": ("buffer", "max_staleness"), "concurrency": ("buffer", "concurrency"),
    "guard": ("guard", "enabled"), "guard_margin": ("guard", "margin"),
}  # fmt: skip
"""Where each flat key of an earlier release's settings lives now: old key -> (table path, key in it; "" for a whole table)."""


def upgrade_file(path: Path) -> bool:
    """Rewrite the settings file ``path`` (a run's ``config.toml``, ``server.toml``) in the layout of the tables when it holds
    keys of an earlier release; the file as it was is kept beside it (``<name>.old``). True if it was rewritten.

    Nothing else changes: keys this release moves are moved (:data:`MOVED`, each logged), every other key and table
    stays, so the file reads as before. A file that cannot be read or written is left as it is (logged).
    """
    import tomllib

    import tomli_w

    from har_models.files import atomic_write_bytes

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        new = CoordinatorConfig.migrate(data, str(path))
        if new == data:
            return False
        backup = path.with_name(path.name + ".old")
        atomic_write_bytes(backup, path.read_bytes())
        atomic_write_bytes(path, tomli_w.dumps(new))
    except (OSError, ValueError) as exc:
        log.warning("%s holds settings of an earlier release and was not rewritten (%s); it is read as such", path, exc)
        return False
    log.warning("%s was rewritten in this release's layout (the file as it was: %s)", path, backup)
    return True


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without None values, also inside nested tables (TOML has no null)."""
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}
