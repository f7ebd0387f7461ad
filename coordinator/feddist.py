"""FedDist: grow the hidden layers with the neurons that diverge from the average.

Ek, Portet, Lalanda, Vega, "A Federated Learning Aggregation Algorithm for Pervasive Computing:
Evaluation and Comparison", PerCom 2021 (arXiv 2110.10223); the authors' code as summarised in
reference/algorithms.md section 3. For each growable layer l (conv, then hidden; never the output),
client c's neuron j is compared with neuron j of the average (rows: incoming weights, then bias):

    d_{c,j} = || V_l^{(c)}[j] - V_l^{(avg)}[j] ||_2                          (algorithms.md 3.2)
    diverges iff d_{c,j} > mu_j + k_r * sigma_j,  k_r = k_0 + delta * floor(r / period)   (3.3)

with mu_j, sigma_j (ddof 0) over clients, k_0 = 3.0, delta = 0.25, period = 5, r 0-based. Each
diverging (c, j) becomes a new unit of layer l (:mod:`har_models.nn.growth`). By Samuelson's
inequality nothing can be flagged while sqrt(n - 1) <= k_r (at least 11 clients at k_r = 3).

Modes: ``"function_preserving"`` (algorithms.md 5.2 step 6A) detects both layers against the shadow
average and grows with zero outgoing weights; ``"paper"`` (3.5, 3.6) goes layer by layer with an
intermediate round that freezes :func:`frozen_tensors` ``(l)``. The functions here never train.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from har_models.nn.growth import GROWTH_MODES, GrowthMode, NewUnitSource, append_units
from har_models.nn.model import ArchSpec, State, check_state

log = logging.getLogger(__name__)


GROWABLE_LAYERS: tuple[str, ...] = ("conv", "hidden")
"""Layers FedDist may widen, in treatment order. ``out`` never grows."""


@dataclass(frozen=True)
class FedDistConfig:
    """Settings of the FedDist growth check: k0 (``stdCount`` 3.0), +delta (0.25) every ``period`` (5) rounds.

    Width caps (``max_conv_filters``, ``max_dense_units``) default to ``max_width_factor`` (2.0) times the
    initial width, keeping models and MQTT payloads bounded; flagged units beyond a cap are dropped (logged).
    Raises ValueError for negative k0 or delta, period < 1, caps < 1 or factor < 1.
    """

    k0: float = 3.0
    delta: float = 0.25
    period: int = 5
    max_conv_filters: int | None = None
    max_dense_units: int | None = None
    max_width_factor: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k0) and self.k0 >= 0):
            raise ValueError(f"FedDistConfig.k0 must be finite and >= 0, got {self.k0}")
        if not (math.isfinite(self.delta) and self.delta >= 0):
            raise ValueError(f"FedDistConfig.delta must be finite and >= 0 (k_r never decreases), got {self.delta}")
        if int(self.period) < 1:
            raise ValueError(f"FedDistConfig.period must be >= 1 round, got {self.period}")
        for name in ("max_conv_filters", "max_dense_units"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f"FedDistConfig.{name} must be >= 1 or None (= max_width_factor x initial), got {v}")
        if not (math.isfinite(self.max_width_factor) and self.max_width_factor >= 1.0):
            raise ValueError(f"FedDistConfig.max_width_factor must be >= 1.0, got {self.max_width_factor}")

    def k_at(self, round_idx: int) -> float:
        """k_r = k0 + delta * floor(r / period) for the 0-based round ``round_idx``."""
        return threshold_k(round_idx, self.k0, self.delta, self.period)

    def caps(self, initial_spec: ArchSpec) -> dict[str, int]:
        """Maximum width per growable layer: ``{"conv": filters, "hidden": units}``."""
        f = self.max_conv_filters
        h = self.max_dense_units
        return {
            "conv": int(f) if f is not None else int(self.max_width_factor * initial_spec.conv_filters),
            "hidden": int(h) if h is not None else int(self.max_width_factor * initial_spec.dense_units),
        }


@dataclass(frozen=True)
class NewUnit:
    """One diverging neuron: neuron ``neuron`` of ``client_states[client]`` becomes a new unit of ``layer``."""

    layer: str
    client: int
    neuron: int


@dataclass(frozen=True)
class GrowthDecision:
    """What :func:`detect_growth` found in round ``round_idx`` (0-based) at threshold ``k_r``.

    ``growth_possible`` is ``sqrt(n_clients - 1) > k_r``; ``units`` are ordered by layer, client, neuron;
    ``dropped`` were flagged beyond a width cap; ``n_flagged`` counts both per examined layer.
    """

    round_idx: int
    k_r: float
    n_clients: int
    growth_possible: bool
    layers: tuple[str, ...]
    units: tuple[NewUnit, ...] = ()
    dropped: tuple[NewUnit, ...] = ()
    n_flagged: dict[str, int] = field(default_factory=dict)

    @property
    def grew(self) -> bool:
        """True if at least one unit is to be appended."""
        return bool(self.units)

    def for_layer(self, layer: str) -> tuple[NewUnit, ...]:
        """The units to append to ``layer``, in order."""
        return tuple(u for u in self.units if u.layer == layer)

    def per_client(self) -> dict[str, dict[int, int]]:
        """Units triggered per layer and client (for the round log)."""
        out: dict[str, dict[int, int]] = {}
        for u in self.units:
            out.setdefault(u.layer, {}).setdefault(u.client, 0)
            out[u.layer][u.client] += 1
        return out

    def to_dict(self) -> dict[str, object]:
        """JSON-able form, for the coordinator's decision log."""
        return {
            "round": self.round_idx,
            "k_r": self.k_r,
            "n_clients": self.n_clients,
            "growth_possible": self.growth_possible,
            "layers": list(self.layers),
            "units": [[u.layer, u.client, u.neuron] for u in self.units],
            "dropped": [[u.layer, u.client, u.neuron] for u in self.dropped],
            "n_flagged": dict(self.n_flagged),
        }


def threshold_k(
    round_idx: int, k0: float = FedDistConfig.k0, delta: float = FedDistConfig.delta, period: int = FedDistConfig.period
) -> float:
    """The FedDist threshold schedule k_r = k_0 + delta * floor(r / period) (algorithms.md 3.3).

    Raises ValueError if ``round_idx`` < 0 or ``period`` < 1.
    """
    if int(round_idx) < 0:
        raise ValueError(f"threshold_k: round_idx must be >= 0 (0-based round), got {round_idx}")
    if int(period) < 1:
        raise ValueError(f"threshold_k: period must be >= 1, got {period}")
    return float(k0) + float(delta) * (int(round_idx) // int(period))


def samuelson_bound(n_clients: int) -> float:
    """sqrt(n - 1): growth is possible in a round only if ``samuelson_bound(n) > k_r``."""
    return math.sqrt(max(int(n_clients) - 1, 0))


def neuron_rows(state: Mapping[str, torch.Tensor], layer: str) -> torch.Tensor:
    """The neuron matrix V_l ``(n_units, fan_in + 1)`` of a growable layer: row j = unit j's incoming weights, then its bias.

    Raises ValueError if ``layer`` is not in :data:`GROWABLE_LAYERS` or its tensors are missing.
    """
    w, b = _layer_tensors(state, layer, "neuron_rows")
    return torch.cat([w.reshape(w.shape[0], -1), b.reshape(-1, 1)], 1)


def neuron_distances(
    global_state: Mapping[str, torch.Tensor],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    layer: str,
) -> torch.Tensor:
    """d_{c,j} ``(n_clients, n_units)`` float64: each client neuron against the same-index neuron of the average (3.2).

    Raises ValueError if ``layer`` is unknown, ``client_states`` is empty, or a client's layer has another shape.
    """
    if not client_states:
        raise ValueError("neuron_distances: client_states is empty; pass the models uploaded this round")
    ws, bs = (t.detach().double() for t in _layer_tensors(global_state, layer, "neuron_distances"))
    ws = ws.reshape(ws.shape[0], -1)
    out = torch.empty(len(client_states), ws.shape[0], dtype=torch.float64)
    for c, st in enumerate(client_states):
        wc, bc = _layer_tensors(st, layer, "neuron_distances")
        if wc.numel() != ws.numel() or tuple(bc.shape) != tuple(bs.shape):
            raise ValueError(
                f"neuron_distances: client {c} has {layer} tensors of shapes {tuple(wc.shape)}, {tuple(bc.shape)}; "
                f"the average has {tuple(ws.shape)}, {tuple(bs.shape)}. Pad or reject stale uploads first"
            )
        sq = (wc.detach().double().reshape(ws.shape) - ws).pow_(2).sum(1) + (bc.detach().double() - bs).pow(2)
        out[c] = sq.sqrt_()
    return out


def flag_diverging(distances: torch.Tensor, k: float) -> torch.Tensor:
    """The FedDist rule on ``(n_clients, n_units)`` distances: d_{c,j} > mu_j + k * sigma_j (strict, ddof 0).

    Raises ValueError if ``distances`` is not 2-D or holds NaN/inf, or ``k`` is not finite.
    """
    if distances.dim() != 2:
        raise ValueError(f"flag_diverging: distances must be (n_clients, n_units), got shape {tuple(distances.shape)}")
    if not math.isfinite(float(k)):
        raise ValueError(f"flag_diverging: k must be finite, got {k}")
    d = distances.detach().double()
    if not torch.isfinite(d).all():
        bad = sorted({int(i) for i in (~torch.isfinite(d)).nonzero()[:, 0]})
        raise ValueError(f"flag_diverging: distances of clients {bad} are NaN/inf; exclude non-finite uploads first")
    mu = d.mean(0)
    sigma = d.std(0, correction=0)
    return d > mu + float(k) * sigma


def detect_growth(
    global_state: Mapping[str, torch.Tensor],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    spec: ArchSpec,
    round_idx: int,
    config: FedDistConfig | None = None,
    *,
    layers: Sequence[str] = GROWABLE_LAYERS,
    initial_spec: ArchSpec | None = None,
) -> GrowthDecision:
    """Find the diverging neurons of one round (algorithms.md 3.6) at k_r = ``config.k_at(round_idx)``.

    ``layers`` is both (function-preserving mode) or one at a time (paper mode). Units are accepted up
    to each layer's width cap; ``initial_spec`` (version 0) sets the default caps and may be omitted
    only for ``spec.version == 0`` or with both caps set. Below the Samuelson bound nothing is computed
    and ``growth_possible=False`` (logged).

    Raises ValueError if ``client_states`` is empty, a state does not match ``spec``, a layer is
    unknown, distances are non-finite, or ``initial_spec`` is needed but missing.
    """
    cfg = config or FedDistConfig()
    unknown = [layer for layer in layers if layer not in GROWABLE_LAYERS]
    if unknown or not layers:
        raise ValueError(f"detect_growth: layers must be a non-empty subset of {GROWABLE_LAYERS}, got {tuple(layers)}")
    if not client_states:
        raise ValueError("detect_growth: client_states is empty; pass the models uploaded this round")
    _check_against(spec, global_state, "global_state")
    for c, st in enumerate(client_states):
        _check_against(spec, st, f"client_states[{c}]")
    if initial_spec is None:
        if spec.version != 0 and (cfg.max_conv_filters is None or cfg.max_dense_units is None):
            raise ValueError(
                f"detect_growth: spec is version {spec.version}; pass initial_spec (the version-0 architecture) "
                "or set both FedDistConfig.max_conv_filters and max_dense_units"
            )
        initial_spec = spec
    caps = cfg.caps(initial_spec)
    ordered = tuple(layer for layer in GROWABLE_LAYERS if layer in layers)
    n = len(client_states)
    k_r = cfg.k_at(round_idx)
    possible = samuelson_bound(n) > k_r
    if not possible:
        log.warning(
            "FedDist round %d: growth impossible with %d clients at k_r=%.3f (sqrt(n-1)=%.3f <= k_r; needs >= %d clients)",
            round_idx, n, k_r, samuelson_bound(n), math.floor(k_r * k_r + 1) + 1,
        )
        return GrowthDecision(round_idx, k_r, n, False, ordered)

    widths = {"conv": spec.conv_filters, "hidden": spec.dense_units}
    units: list[NewUnit] = []
    dropped: list[NewUnit] = []
    n_flagged: dict[str, int] = {}
    for layer in ordered:
        flags = flag_diverging(neuron_distances(global_state, client_states, layer), k_r)
        flagged = [NewUnit(layer, int(c), int(j)) for c, j in flags.nonzero().tolist()]  # row-major: clients, then neurons
        room = max(caps[layer] - widths[layer], 0)
        units += flagged[:room]
        dropped += flagged[room:]
        n_flagged[layer] = len(flagged)
        if len(flagged) > room:
            log.warning(
                "FedDist round %d: layer %s at cap %d (width %d): %d of %d flagged units dropped",
                round_idx, layer, caps[layer], widths[layer], len(flagged) - room, len(flagged),
            )
    decision = GrowthDecision(round_idx, k_r, n, True, ordered, tuple(units), tuple(dropped), n_flagged)
    log.info(
        "FedDist round %d: k_r=%.3f, %d clients, new units per layer and client: %s",
        round_idx, k_r, n, decision.per_client() or "none",
    )
    return decision


def apply_growth(
    decision: GrowthDecision,
    spec: ArchSpec,
    targets: Sequence[Mapping[str, torch.Tensor]],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    *,
    mode: GrowthMode,
) -> tuple[list[State], ArchSpec]:
    """Append the decided units to every target state (e.g. ``[G, P_0, ..., P_{N-1}]``); returns them and the grown spec.

    Incoming weights and bias come from the flagged client's neuron; outgoing weights are copied
    (``mode="paper"``, algorithms.md 3.4) or zero (``"function_preserving"``, 5.2 step 6A). The spec is
    version + 1, or unchanged if nothing grew. Raises ValueError for an unknown mode, a client index
    outside ``client_states`` or a state that does not fit.
    """
    if mode not in GROWTH_MODES:
        raise ValueError(f"apply_growth: mode must be one of {GROWTH_MODES}, got {mode!r}")
    bad = [u for u in decision.units if not 0 <= u.client < len(client_states)]
    if bad:
        raise ValueError(
            f"apply_growth: units {bad[:3]} refer to clients outside client_states (n={len(client_states)}); "
            "pass the same client_states as to detect_growth"
        )
    conv: list[NewUnitSource] = [(client_states[u.client], u.neuron) for u in decision.for_layer("conv")]
    dense: list[NewUnitSource] = [(client_states[u.client], u.neuron) for u in decision.for_layer("hidden")]
    out: list[State] = []
    new_spec = spec
    for t in targets:
        grown, new_spec = append_units(t, spec, conv=conv, dense=dense, mode=mode)
        out.append(grown)
    if decision.grew:
        log.info(
            "FedDist round %d: grew v%d -> v%d (%s): conv %d -> %d, hidden %d -> %d, %d states",
            decision.round_idx, spec.version, new_spec.version, mode, spec.conv_filters, new_spec.conv_filters,
            spec.dense_units, new_spec.dense_units, len(out),
        )
    return out, new_spec


def frozen_tensors(layer: str) -> tuple[str, ...]:
    """Tensors frozen in the paper's intermediate round after ``layer`` grew: layers 0..l (algorithms.md 3.5).

    Raises ValueError if ``layer`` is not in :data:`GROWABLE_LAYERS`.
    """
    if layer not in GROWABLE_LAYERS:
        raise ValueError(f"frozen_tensors: layer must be one of {GROWABLE_LAYERS}, got {layer!r}")
    upto = GROWABLE_LAYERS[: GROWABLE_LAYERS.index(layer) + 1]
    return tuple(f"{name}.{kind}" for name in upto for kind in ("weight", "bias"))


def _layer_tensors(state: Mapping[str, torch.Tensor], layer: str, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layer not in GROWABLE_LAYERS:
        raise ValueError(f"{who}: layer must be one of {GROWABLE_LAYERS} (the output layer never grows), got {layer!r}")
    try:
        return state[f"{layer}.weight"], state[f"{layer}.bias"]
    except KeyError as exc:
        raise ValueError(f"{who}: state has no tensor {exc.args[0]!r}") from None


def _check_against(spec: ArchSpec, state: Mapping[str, torch.Tensor], what: str) -> None:
    check_state(spec, state, f"detect_growth: {what} (pad or reject stale uploads first)", finite=False)
