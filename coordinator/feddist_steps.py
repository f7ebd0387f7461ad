"""FedDist's growth phase of a round, as steps the runner drives (no call back into it).

Ek et al., PerCom 2021, algorithm 1 and section IV-B; reference/algorithms.md 3 and 5.2. After the
aggregation, for each growable layer: detect diverging neurons (:func:`coordinator.feddist.detect_growth`),
append them to G and every P_i (:func:`coordinator.feddist.apply_growth`), and in "paper" mode run an
intermediate exchange with the earlier layers frozen, whose models the next layer's detection uses.
:func:`grow` is a generator that yields an :class:`IntermediateExchange` when clients are needed and
receives its updates through ``send``; it changes the Federation given, never MQTT or files.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from coordinator import feddist, strategies
from coordinator.strategies import Aggregate, Federation, Strategy
from coordinator.updates import ClientUpdate
from har_models.nn.growth import pad_state_like
from har_models.settings import doc
from har_models.wire.messages import TrainingPlan

GROWTH_MODES = ("auto", "paper", "function_preserving")
_FD = feddist.FedDistConfig


@dataclass(frozen=True)
class FedDistSettings:
    """The ``[feddist]`` settings table (FedDist, Ek et al., PerCom 2021; read with ``growth = "feddist"``).

    ``mode`` "auto" is "paper" for plain FedDist (comparable with the paper) and "function_preserving"
    with personalisation (algorithms.md 5.2, step 6); the other defaults are :class:`coordinator.feddist.FedDistConfig`'s.
    """

    mode: str = field(
        default="auto",
        metadata=doc("outgoing weights of new units: copied + intermediate rounds (paper) or zero (function_preserving); "
                     "auto = paper for plain FedDist, function_preserving when combined with FedDWA/FedPer/ALA",
                     choices=GROWTH_MODES, flag="--feddist-mode"),
    )
    k0: float = field(default=_FD.k0, metadata=doc("FedDist k_0 (k_r = k_0 + delta * floor(r / period))", flag="--feddist-k0"))
    delta: float = field(default=_FD.delta, metadata=doc("FedDist delta", flag="--feddist-delta"))
    period: int = field(default=_FD.period, metadata=doc("FedDist period", "rounds", flag="--feddist-period"))
    max_width_factor: float = field(
        default=_FD.max_width_factor,
        metadata=doc("cap on each layer's width, as a multiple of round 0's", flag="--feddist-max-width"),
    )

    def check(self, cfg: Any) -> None:
        """Refuse an unknown mode or out-of-range values (ValueError naming the setting)."""
        if self.mode not in GROWTH_MODES:
            raise ValueError(f"[feddist] mode must be one of {GROWTH_MODES}, got {self.mode!r}")
        self.config()

    def config(self) -> feddist.FedDistConfig:
        """The growth check's settings (ValueError for values out of range)."""
        return feddist.FedDistConfig(k0=self.k0, delta=self.delta, period=self.period, max_width_factor=self.max_width_factor)

    def mode_in_force(self, aggregation: str, client_init: str) -> str:
        """The mode in force ("paper" or "function_preserving") with "auto" resolved for ``aggregation`` and ``client_init``."""
        if self.mode != "auto":
            return self.mode
        plain = strategies.strategy_class(aggregation).feddist_paper and client_init == "overwrite"
        return "paper" if plain else "function_preserving"


log = logging.getLogger("fedhar.coordinator.feddist")


@dataclass(frozen=True)
class IntermediateExchange:
    """FedDist paper mode's exchange after ``layer`` grew: stage 1 + its index, the round's contributors, a frozen plan."""

    layer: str
    stage: int
    selected: tuple[str, ...]
    plan: TrainingPlan


GrowthSteps = Generator[IntermediateExchange, Sequence[ClientUpdate], dict[str, Any]]


def grow(
    round_: int,
    fed: Federation,
    agg: Aggregate,
    results: Sequence[ClientUpdate],
    strategy: Strategy,
    base: TrainingPlan,
    cfg: feddist.FedDistConfig,
    mode: str,
) -> GrowthSteps:
    """Run FedDist's growth for round ``round_`` on ``fed`` (changed in place); return the growth log.

    ``agg`` is the round's aggregation (FedDWA re-mixes intermediate models with its p_ij); ``mode`` is
    "paper" or "function_preserving". The log: ``{"k", "n_clients", "layers": {layer: {"added",
    "per_client", "version"}}, "growth_possible"}``.
    """
    by_id = {u.client_id: u for u in results}
    order = [c for c in agg.participants if c in by_id]
    client_states = [by_id[c].state for c in order]
    out: dict[str, Any] = {"k": cfg.k_at(round_), "n_clients": len(order), "layers": {}}
    if len(order) < 2:
        return out
    for layer in feddist.GROWABLE_LAYERS:
        decision = feddist.detect_growth(
            fed.global_state, client_states, fed.spec, round_, cfg, layers=(layer,), initial_spec=fed.initial_spec
        )
        out["growth_possible"] = decision.growth_possible
        if not decision.grew:
            continue
        targets_ids = sorted(fed.personal)
        targets = [fed.global_state] + [fed.personal[c] for c in targets_ids]
        grown, new_spec = feddist.apply_growth(decision, fed.spec, targets, client_states, mode=cast(feddist.GrowthMode, mode))
        added = len(decision.for_layer(layer))
        log.info("round %d: FedDist grew %s by %d unit(s) (architecture v%d -> v%d)", round_, layer, added, fed.spec.version,
                 new_spec.version)
        per_client = {order[c]: n for c in range(len(order)) if (n := sum(1 for u in decision.for_layer(layer) if u.client == c))}
        out["layers"][layer] = {"added": added, "per_client": per_client, "version": new_spec.version}
        fed.spec, fed.global_state = new_spec, grown[0]
        fed.personal = dict(zip(targets_ids, grown[1:], strict=True))
        if mode != "paper":
            # New slots take G's values, so the next layer compares clients on the grown shapes.
            client_states = [pad_state_like(s, fed.global_state) for s in client_states]
            continue
        plan = replace(base, client_init="overwrite", frozen=feddist.frozen_tensors(layer), guidance=False, keep_local=())
        got = yield IntermediateExchange(layer, 1 + feddist.GROWABLE_LAYERS.index(layer), tuple(order), plan)
        inter = {u.client_id: u for u in got}
        inter_ups = [inter[c] for c in order if c in inter]
        if not inter_ups:
            log.warning("round %d: no intermediate updates after growing %s; keeping the grown model", round_, layer)
            client_states = [pad_state_like(s, fed.global_state) for s in client_states]
            continue
        agg = strategy.aggregate_intermediate(fed, agg, inter_ups)
        fed.global_state = agg.global_state
        fed.personal.update(agg.personal)
        order = [u.client_id for u in inter_ups]
        client_states = [u.state for u in inter_ups]
    return out
