"""Aggregation strategies, one file each, and the registry: the one place that knows their names.

Every module of this folder is imported here, and each ``Strategy`` subclass that sets ``name``
registers itself, so a new strategy is one new file: the ``--aggregation`` choices, the TOML check,
the study and the error texts all read :data:`REGISTRY`; its settings table and state follow.

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

:mod:`.base` holds the interface and :mod:`.fedopt` the server optimisers' shared class; the papers'
arithmetic stays in :mod:`coordinator.aggregation`, :mod:`coordinator.feddwa` and :mod:`coordinator.server_opt`.
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
"""The default strategy: FedExP's adaptive step under momentum 0.5, capped by the number of clients; it
stayed within the measured bounds from 2 to 30 clients where FedAvgM collapsed 2-device federations
(docs/tuning/server-step.md)."""
if DEFAULT_AGGREGATION not in REGISTRY:
    raise ImportError(f"the default strategy {DEFAULT_AGGREGATION!r} is not in {__path__}")


def names() -> tuple[str, ...]:
    """The registered strategy names, sorted (the ``--aggregation`` choices)."""
    return tuple(sorted(REGISTRY))


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name``; ValueError listing the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown aggregation {name!r}; choose one of {', '.join(names())}") from None


def make_strategy(name: str, settings: Any = None) -> Strategy:
    """A fresh strategy ``name`` with its settings (None: its defaults).

    ``settings`` is the strategy's own settings object, or anything holding the tables as attributes (the
    configuration or its ``strategies`` table). Raises ValueError for an unknown name, TypeError for
    settings of the wrong type.
    """
    cls = strategy_class(name)
    if cls.settings_type is None:
        return cls()
    if settings is not None and not isinstance(settings, cls.settings_type):
        settings = getattr(getattr(settings, "strategies", settings), cls.settings_table)
    return cls(settings)


def settings_tables() -> dict[str, type]:
    """The settings dataclass of each table the registered strategies read; TypeError if two read one table differently."""
    out: dict[str, type] = {}
    for cls in REGISTRY.values():
        if cls.settings_type is None:
            continue
        known = out.setdefault(cls.settings_table, cls.settings_type)
        if known is not cls.settings_type:
            raise TypeError(f"settings table {cls.settings_table!r} is read as {known.__name__} and {cls.settings_type.__name__}")
    return out


def _strategy_settings() -> Any:
    """The ``[strategies]`` settings table: one sub-table per strategy with settings, collected from the registry."""
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
