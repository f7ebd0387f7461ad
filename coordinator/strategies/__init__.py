"""Aggregation strategies, one file each, and the registry: the one place that knows their names.

Every module of this folder is imported here; each class in it that subclasses
:class:`~coordinator.strategies.base.Strategy` and sets ``name`` registers itself under that
name. So a new strategy is one new file: the ``--aggregation`` choices, the TOML check, the
study's strategy names, the probe's servers and the error texts all read :data:`REGISTRY`.
One with settings of its own also gets its table as a field of
:class:`coordinator.config.CoordinatorConfig` (which refuses to import without it); its
state, if any, is persisted with each round through ``state_dict`` without further code.

=========  ==============================================================  =================
name       what the coordinator does                                        client extras
=========  ==============================================================  =================
fedavg     theta = sum_k n_k/n theta_k (McMahan et al. 2017)               --
fedprox    as fedavg                                                       (mu/2)||w - w^t||^2 (Li et al. 2020)
fedper     as fedavg; only the conv layer is used by clients               keep hidden+out local (Arivazhagan et al. 2019)
feddwa     client i gets sum_j p_ij w_j, p from guidance distances         train + upload guidance (Liu et al. 2023)
fedavgm    x = x_t - eta m, m = beta m + Delta (Hsu et al. 2019)           --
fedexp     as fedavgm with eta_t from the updates' agreement (FedExP,      --
           Jhunjhunwala et al. 2023), m = beta m + eta_t Delta, x = x_t - m
fedadam    Adam on the pseudo-gradient Delta (Reddi et al. 2021)           --
fedyogi    Yogi on the pseudo-gradient Delta (Reddi et al. 2021)           --
=========  ==============================================================  =================

Files: :mod:`.base` (the interface, :class:`Federation`, :class:`Aggregate`), :mod:`.fedavg`,
:mod:`.fedprox`, :mod:`.fedper`, :mod:`.feddwa`, :mod:`.fedopt` (the server optimisers'
shared class and settings), :mod:`.fedexp`, :mod:`.fedavgm`, :mod:`.fedadam`, :mod:`.fedyogi`. The papers'
arithmetic stays in :mod:`coordinator.aggregation`, :mod:`coordinator.feddwa` and
:mod:`coordinator.server_opt`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import field, make_dataclass
from typing import Any

from coordinator.strategies.base import Aggregate, Federation, Strategy, contributors, fedavg_of

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

from coordinator.strategies.fedavg import FedAvg  # noqa: E402  (imported above; named here for the harness)

REGISTRY: dict[str, type[Strategy]] = Strategy.registry
"""Strategy classes by ``--aggregation`` name (filled as the modules above are imported)."""

DEFAULT_AGGREGATION = "fedexp"
"""The coordinator's default strategy: FedExP's adaptive step under momentum 0.5, capped by the number of clients
(:mod:`coordinator.strategies.fedexp`). The earlier default, FedAvgM eta 3 beta 0.5 (``--aggregation fedavgm``), was
chosen on the 30-client main job and collapsed 2-device federations (global macro-F1 0.06 after 15 rounds, issue 28);
FedExP stayed within the measured bounds from 2 to 30 clients (docs/tuning/server-step.md)."""
if DEFAULT_AGGREGATION not in REGISTRY:
    raise ImportError(f"the default strategy {DEFAULT_AGGREGATION!r} is not in {__path__}")


def names() -> tuple[str, ...]:
    """The registered strategy names, sorted (the ``--aggregation`` choices)."""
    return tuple(sorted(REGISTRY))


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name``.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones).
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown aggregation {name!r}; choose one of {', '.join(names())}") from None


def make_strategy(name: str, settings: Any = None) -> Strategy:
    """A fresh strategy ``name`` with its settings.

    Parameters
    ----------
    name : str
        A registered name (:func:`names`).
    settings : optional
        Either the strategy's own settings object, or anything holding the settings tables as
        attributes (the configuration's ``strategies`` table, :data:`StrategySettings`, or the
        configuration itself), from which the one the strategy reads (its ``settings_table``)
        is taken. None: its defaults.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones).
    TypeError
        If the settings are of the wrong type.
    """
    cls = strategy_class(name)
    if cls.settings_type is None:
        return cls()
    if settings is not None and not isinstance(settings, cls.settings_type):
        settings = getattr(getattr(settings, "strategies", settings), cls.settings_table)
    return cls(settings)


def settings_tables() -> dict[str, type]:
    """The settings dataclass of each settings table the registered strategies read (table -> type).

    Raises
    ------
    TypeError
        If two strategies read one table with different types.
    """
    out: dict[str, type] = {}
    for cls in REGISTRY.values():
        if cls.settings_type is None:
            continue
        known = out.setdefault(cls.settings_table, cls.settings_type)
        if known is not cls.settings_type:
            raise TypeError(f"settings table {cls.settings_table!r} is read as {known.__name__} and {cls.settings_type.__name__}")
    return out


def _strategy_settings() -> Any:
    """The ``[strategies]`` settings table: one sub-table per strategy that has settings (``[strategies.fedprox]``),
    collected from the registry, so a new strategy with settings needs no line in the coordinator's configuration."""
    from har_models.settings import doc

    tables = sorted(settings_tables().items())
    return make_dataclass(
        "StrategySettings",
        [(t, tp, field(default_factory=tp, metadata=doc((tp.__doc__ or t).strip().splitlines()[0], kind="table")))
         for t, tp in tables],
        frozen=True,
    )  # fmt: skip


StrategySettings: Any = _strategy_settings()
"""The settings dataclass of the ``[strategies]`` table (fields: each strategy's ``settings_table``)."""

__all__ = [
    "DEFAULT_AGGREGATION",
    "REGISTRY",
    "Aggregate",
    "FedAvg",
    "Federation",
    "Strategy",
    "StrategySettings",
    "contributors",
    "fedavg_of",
    "make_strategy",
    "names",
    "settings_tables",
    "strategy_class",
]
