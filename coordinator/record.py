"""The typed record of one completed round: what the report, compare, the study and an observer read.

Pure data (no MQTT, no files): participation, traffic, FedDist's growth log, FedDWA's p_ij, the
evaluation figures (DESIGN.md section 6) and the time taken. :meth:`RoundRecord.to_json` writes the
flat per-round object of ``report.json`` and ``state.sqlite`` (keys in :data:`RECORD_KEYS` order);
optional keys are written only when they hold something, so older records load unchanged.
``RoundRecord.from_json(r.to_json()) == r`` and ``from_json(d).to_json() == d`` (key order included);
rows of other writers (``fedhar-baseline``) load with defaults for what they lack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from har_models.wire.messages import DEFAULT_UPDATE_ENCODING

DEFAULT_ENCODING = DEFAULT_UPDATE_ENCODING
"""The update encoding an absent ``bytes_up_by_encoding`` stands for."""

MEASURES = ("global", "personalisation", "generalisation", "start")
"""The measures a record carries, in report order: the FedDist protocol's three (Ek et al., PerCom 2021)
then "start" (each model as it starts local training, on its own test split: FedALA, Zhang et al., AAAI 2023)."""

PROTOCOL_MEASURES = MEASURES[:3]
"""The FedDist protocol's three measures (global, personalisation, generalisation), without "start"."""


class RecordError(ValueError):
    """A round record's JSON that cannot be read: the message names the key and what it should be."""


def _num(d: Mapping[str, Any], key: str, what: str, optional: bool = False) -> Any:
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordError(f"{what}: {key!r} must be a number, got {v!r:.60}")
    return v


def _int(d: Mapping[str, Any], key: str, what: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordError(f"{what}: {key!r} must be an integer, got {v!r:.60}")
    return v


def _obj(v: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise RecordError(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def _check_keys(d: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise RecordError(f"{what}: unknown key(s) {extra}; expected some of {list(allowed)}")


@dataclass(frozen=True)
class Metrics:
    """Classification figures of one model on one test set, or their mean over clients.

    From :func:`har_models.nn.metrics.summarise` (``n`` set) or ``mean_over_clients``
    (``accuracy_weighted`` and ``clients`` set). ``accuracy`` and ``macro_f1`` are in [0, 1], NaN on an empty test set.
    """

    accuracy: float
    macro_f1: float
    weighted_f1: float | None = None
    n: int | None = None
    accuracy_weighted: float | None = None
    clients: int | None = None

    KEYS = ("accuracy", "macro_f1", "weighted_f1", "n", "accuracy_weighted", "clients")

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON object; unset ones are left out."""
        return {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not None}

    @classmethod
    def from_json(cls, d: Any, what: str = "metrics") -> Metrics:
        """Read :meth:`to_json`'s object; RecordError naming ``what`` if it is malformed."""
        d = _obj(d, what)
        _check_keys(d, cls.KEYS, what)
        return cls(
            accuracy=_num(d, "accuracy", what),
            macro_f1=_num(d, "macro_f1", what),
            weighted_f1=_num(d, "weighted_f1", what, optional=True),
            n=_int(d, "n", what) if "n" in d else None,
            accuracy_weighted=_num(d, "accuracy_weighted", what, optional=True),
            clients=_int(d, "clients", what) if "clients" in d else None,
        )

    def same_as(self, other: Metrics) -> bool:
        """Equality in which NaN equals NaN (a figure not measurable on an empty test set)."""
        return all(
            a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
            for a, b in ((getattr(self, k), getattr(other, k)) for k in self.KEYS)
        )


def _per_client(v: Any, what: str) -> dict[str, Metrics]:
    return {str(cid): Metrics.from_json(m, f"{what}[{cid!r}]") for cid, m in _obj(v, what).items()}


@dataclass(frozen=True)
class Rejection:
    """Messages of one client rejected in a round for one reason (:func:`coordinator.updates.validate_update`'s codes)."""

    client_id: str
    reason: str
    count: int


@dataclass(frozen=True)
class Participation:
    """Who took part in a round.

    ``failures`` maps each missing client to why (``offline``, ``missed_deadline``, ``cohort_full``,
    ``still_training`` or a rejection reason); ``duplicates`` counts re-sent copies of counted updates
    (not in ``rejected``); ``stale`` maps buffered updates (FedBuff) to their staleness tau in rounds.
    """

    selected: int = 0
    updates: int = 0
    rejected: int = 0
    missing: tuple[str, ...] = ()
    failures: Mapping[str, str] = field(default_factory=dict)
    rejections: tuple[Rejection, ...] = ()
    duplicates: int = 0
    stale: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Architecture:
    """The model after the round (FedDist may have grown it): version and the CNN's widths F and H."""

    version: int = 0
    conv_filters: int | None = None
    dense_units: int | None = None


@dataclass(frozen=True)
class Traffic:
    """Bytes moved in a round: valid update envelopes up, model envelopes down (once per client that needed them).

    ``up_by_encoding`` splits ``bytes_up`` by update encoding and must sum to it (RecordError otherwise).
    """

    bytes_up: int = 0
    bytes_down: int = 0
    up_by_encoding: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.up_by_encoding and sum(self.up_by_encoding.values()) != self.bytes_up:
            raise RecordError(f"traffic: bytes by encoding {dict(self.up_by_encoding)} do not sum to bytes_up {self.bytes_up}")


@dataclass(frozen=True)
class LayerGrowth:
    """Units FedDist added to one layer in a round, and how many came from each client."""

    added: int
    per_client: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GrowthLog:
    """FedDist's growth in a round (Ek et al., PerCom 2021, algorithm 1; :func:`coordinator.feddist_steps.grow`).

    ``k`` is the threshold k_r = k_0 + delta * floor(r / period); ``layers`` holds the grown layers in
    growth order; ``growth_possible`` is None when fewer than two clients took part.
    """

    k: float
    n_clients: int
    layers: Mapping[str, LayerGrowth] = field(default_factory=dict)
    growth_possible: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The log as the JSON object the round summary holds under ``growth``."""
        out: dict[str, Any] = {
            "k": self.k,
            "n_clients": self.n_clients,
            "layers": {name: {"added": g.added, "per_client": dict(g.per_client)} for name, g in self.layers.items()},
        }
        if self.growth_possible is not None:
            out["growth_possible"] = self.growth_possible
        return out

    @classmethod
    def from_json(cls, d: Any) -> GrowthLog:
        """Read :meth:`to_json`'s object (also the dict :func:`coordinator.feddist_steps.grow` returns)."""
        d = _obj(d, "growth")
        _check_keys(d, ("k", "n_clients", "layers", "growth_possible"), "growth")
        layers = {}
        for name, g in _obj(d.get("layers", {}), "growth.layers").items():
            g = _obj(g, f"growth.layers[{name!r}]")
            per_obj = _obj(g.get("per_client", {}), f"growth.layers[{name!r}].per_client")
            per = {str(c): _int(per_obj, c, f"growth.layers[{name!r}].per_client") for c in per_obj}
            layers[str(name)] = LayerGrowth(_int(g, "added", f"growth.layers[{name!r}]"), per)
        possible = d.get("growth_possible")
        if possible is not None and not isinstance(possible, bool):
            raise RecordError(f"growth: 'growth_possible' must be true or false, got {possible!r:.40}")
        return cls(k=_num(d, "k", "growth"), n_clients=_int(d, "n_clients", "growth"), layers=layers,
                   growth_possible=possible)  # fmt: skip


@dataclass(frozen=True)
class FedDwaWeights:
    """FedDWA's aggregation weights of a round (Liu et al., IJCAI 2023, Eq. 17, with top-K).

    ``p`` has shape (n, n): p_ij is the weight of client j's trained model in client i's personalised
    model, rounded to 6 decimals.
    """

    clients: tuple[str, ...]
    p: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.clients)
        if len(self.p) != n or any(len(row) != n for row in self.p):
            raise RecordError(f"feddwa_weights: p must be {n} x {n} for {n} clients")

    def to_json(self) -> dict[str, Any]:
        """``{"clients": [...], "p": [[...], ...]}``."""
        return {"clients": list(self.clients), "p": [list(row) for row in self.p]}

    @classmethod
    def from_json(cls, d: Any) -> FedDwaWeights:
        """Read :meth:`to_json`'s object."""
        d = _obj(d, "feddwa_weights")
        _check_keys(d, ("clients", "p"), "feddwa_weights")
        clients, p = d.get("clients"), d.get("p")
        if not isinstance(clients, list) or not all(isinstance(c, str) for c in clients):
            raise RecordError("feddwa_weights: 'clients' must be a list of client ids")
        if not isinstance(p, list) or not all(isinstance(row, list) for row in p):
            raise RecordError("feddwa_weights: 'p' must be a list of rows")
        rows = tuple(tuple(_num({"p": x}, "p", "feddwa_weights") for x in row) for row in p)
        return cls(tuple(clients), rows)


@dataclass(frozen=True)
class ClientResult:
    """One client's figures in a round: its trained model on its own test split and on the union test set."""

    client_id: str
    personalisation: Metrics | None
    generalisation: Metrics | None


@dataclass(frozen=True)
class Evaluation:
    """A round's evaluation figures (FedDist protocol; :func:`coordinator.round.evaluate_round`).

    ``personalisation``/``generalisation``: mean over clients of each trained model on its own test split /
    on the union test set; ``received_union``: the received models on the union; ``global_``: the global
    model on the union test set; ``start``: each model after the client's initialisation, before training,
    on its own test split (FedALA, Zhang et al., AAAI 2023, section 5). ``*_clients`` hold the per-client figures.
    """

    personalisation: Metrics | None = None
    personalisation_clients: Mapping[str, Metrics] = field(default_factory=dict)
    received_union: Metrics | None = None
    global_: Metrics | None = None
    generalisation: Metrics | None = None
    generalisation_clients: Mapping[str, Metrics] = field(default_factory=dict)
    start: Metrics | None = None
    start_clients: Mapping[str, Metrics] = field(default_factory=dict)

    def measure(self, name: str) -> Metrics | None:
        """The figures of ``name`` ("global", "personalisation", "generalisation", "received_union", "start"); KeyError otherwise."""
        table = {"global": self.global_, "personalisation": self.personalisation, "generalisation": self.generalisation,
                 "received_union": self.received_union, "start": self.start}  # fmt: skip
        return table[name]

    def clients(self) -> list[ClientResult]:
        """Per-client results, sorted by client id."""
        ids = sorted(set(self.personalisation_clients) | set(self.generalisation_clients))
        return [ClientResult(c, self.personalisation_clients.get(c), self.generalisation_clients.get(c)) for c in ids]


_OLD_KEYS = ("round", "selected", "updates", "rejected", "missing", "arch_version", "conv_filters", "dense_units",
             "bytes_up", "bytes_down", "growth", "feddwa_weights", "personalisation", "personalisation_clients",
             "received_union", "global", "generalisation", "generalisation_clients", "seconds")  # fmt: skip
RECORD_KEYS = (*_OLD_KEYS, "failures", "rejections", "bytes_up_by_encoding", "start", "start_clients", "guard", "attempts",
               "duplicates", "stale")
"""Every key of a record's JSON, in the order :meth:`RoundRecord.to_json` writes them."""


GUARD_ACTIONS = ("keep", "rollback", "abstain")
"""What the quality guard (:mod:`coordinator.guard`) did in a round."""


@dataclass(frozen=True)
class GuardNote:
    """What the quality guard decided in a round (:mod:`coordinator.guard`); the record's optional ``guard`` key.

    ``action``: "keep", "rollback" (continue from ``to_round``'s model) or "abstain" (too little evidence).
    ``judged_round`` is this round - 1 (-1: the initial model); ``to_round`` the best version's round;
    ``devices`` and ``windows`` the evidence (0 in records written before they were kept).
    """

    action: str
    judged_round: int
    to_round: int
    reason: str = ""
    devices: int = 0
    windows: int = 0

    def __post_init__(self) -> None:
        if self.action not in GUARD_ACTIONS:
            raise RecordError(f"guard: action must be one of {list(GUARD_ACTIONS)}, got {self.action!r}")

    def to_json(self) -> dict[str, Any]:
        """``{"action", "judged_round", "to_round", "reason"}``, and ``devices`` and ``windows`` when any were compared."""
        d: dict[str, Any] = {"action": self.action, "judged_round": self.judged_round, "to_round": self.to_round,
                             "reason": self.reason}  # fmt: skip
        if self.devices or self.windows:
            d.update(devices=self.devices, windows=self.windows)
        return d

    @classmethod
    def from_json(cls, d: Any, what: str = "guard") -> GuardNote:
        """Read :meth:`to_json`'s object; RecordError naming ``what`` if it is malformed."""
        d = _obj(d, what)
        _check_keys(d, ("action", "judged_round", "to_round", "reason", "devices", "windows"), what)
        return cls(str(d.get("action")), _int(d, "judged_round", what), _int(d, "to_round", what), str(d.get("reason", "")),
                   _int(d, "devices", what, 0), _int(d, "windows", what, 0))  # fmt: skip


@dataclass(frozen=True)
class RoundRecord:
    """Everything about one completed round.

    ``traffic`` is None for writers that moved nothing (a centralised baseline); ``seconds`` is wall time
    (monotonic) from selection to the stored record; ``attempts`` counts exchanges including failed quorums.
    """

    round: int
    participation: Participation = field(default_factory=Participation)
    arch: Architecture = field(default_factory=Architecture)
    traffic: Traffic | None = None
    growth: GrowthLog | None = None
    feddwa_weights: FedDwaWeights | None = None
    evaluation: Evaluation = field(default_factory=Evaluation)
    seconds: float = 0.0
    guard: GuardNote | None = None
    attempts: int = 1

    # ------------------------------------------------------------------ readers' shortcuts
    def measure(self, name: str) -> Metrics | None:
        """Shortcut for ``self.evaluation.measure(name)``."""
        return self.evaluation.measure(name)

    def without_details(self) -> RoundRecord:
        """The record without per-client figures and p_ij (what grows with the square of the clients)."""
        ev = replace(self.evaluation, personalisation_clients={}, generalisation_clients={}, start_clients={})
        return replace(self, evaluation=ev, feddwa_weights=None)

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The flat JSON object of the module docstring (``report.json``'s per-round entry)."""
        p, a, t, e = self.participation, self.arch, self.traffic, self.evaluation
        out: dict[str, Any] = {
            "round": self.round,
            "selected": p.selected,
            "updates": p.updates,
            "rejected": p.rejected,
            "missing": list(p.missing),
            "arch_version": a.version,
            "conv_filters": a.conv_filters,
            "dense_units": a.dense_units,
        }
        if t is not None:
            out["bytes_up"] = t.bytes_up
            out["bytes_down"] = t.bytes_down
        if self.growth is not None:
            out["growth"] = self.growth.to_json()
        if self.feddwa_weights is not None:
            out["feddwa_weights"] = self.feddwa_weights.to_json()
        if e.personalisation is not None:
            out["personalisation"] = e.personalisation.to_json()
            out["personalisation_clients"] = {c: m.to_json() for c, m in e.personalisation_clients.items()}
        out["received_union"] = e.received_union.to_json() if e.received_union is not None else None
        if e.global_ is not None:
            out["global"] = e.global_.to_json()
        if e.generalisation is not None:
            out["generalisation"] = e.generalisation.to_json()
            out["generalisation_clients"] = {c: m.to_json() for c, m in e.generalisation_clients.items()}
        out["seconds"] = self.seconds
        if p.failures:
            out["failures"] = dict(p.failures)
        if p.rejections:
            out["rejections"] = [[r.client_id, r.reason, r.count] for r in p.rejections]
        if t is not None and set(t.up_by_encoding) - {DEFAULT_ENCODING}:
            out["bytes_up_by_encoding"] = dict(t.up_by_encoding)
        if e.start is not None:
            out["start"] = e.start.to_json()
            out["start_clients"] = {c: m.to_json() for c, m in e.start_clients.items()}
        if self.guard is not None:
            out["guard"] = self.guard.to_json()
        if self.attempts != 1:
            out["attempts"] = self.attempts
        if p.duplicates:
            out["duplicates"] = p.duplicates
        if p.stale:
            out["stale"] = dict(p.stale)
        return out

    @classmethod
    def from_json(cls, d: Any) -> RoundRecord:
        """Read a per-round object of ``report.json`` (or ``state.sqlite``, or the progress message).

        Raises RecordError naming the key for a non-object, a key outside :data:`RECORD_KEYS` or a wrong type.
        """
        d = _obj(d, "round record")
        _check_keys(d, RECORD_KEYS, "round record")
        rnd = _int(d, "round", "round record")
        what = f"round {rnd}"
        missing = d.get("missing", [])
        if not isinstance(missing, list) or not all(isinstance(c, str) for c in missing):
            raise RecordError(f"{what}: 'missing' must be a list of client ids")
        failures = _obj(d.get("failures", {}), f"{what}: 'failures'")
        if not all(isinstance(v, str) for v in failures.values()):
            raise RecordError(f"{what}: 'failures' must map client ids to reasons")
        rejections = []
        for item in d.get("rejections", []):
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], str)):
                raise RecordError(f"{what}: each of 'rejections' must be [client id, reason, count], got {item!r:.60}")
            rejections.append(Rejection(item[0], item[1], _int({"count": item[2]}, "count", f"{what}: 'rejections'")))
        part = Participation(
            selected=_int(d, "selected", what, 0),
            updates=_int(d, "updates", what, 0),
            rejected=_int(d, "rejected", what, 0),
            missing=tuple(missing),
            failures=dict(failures),
            rejections=tuple(rejections),
            duplicates=_int(d, "duplicates", what, 0),
            stale={str(c): _int(d["stale"], c, f"{what}: 'stale'") for c in _obj(d.get("stale", {}), f"{what}: 'stale'")},
        )
        arch = Architecture(
            version=_int(d, "arch_version", what, 0),
            conv_filters=_int(d, "conv_filters", what) if d.get("conv_filters") is not None else None,
            dense_units=_int(d, "dense_units", what) if d.get("dense_units") is not None else None,
        )
        traffic = None
        if "bytes_up" in d or "bytes_down" in d:
            up = _int(d, "bytes_up", what, 0)
            by_enc = d.get("bytes_up_by_encoding")
            if by_enc is None:
                enc = {DEFAULT_ENCODING: up} if up else {}
            else:
                enc = {str(k): _int(by_enc, k, f"{what}: 'bytes_up_by_encoding'") for k in _obj(by_enc, what)}
            traffic = Traffic(up, _int(d, "bytes_down", what, 0), enc)

        def opt(key: str) -> Metrics | None:
            return Metrics.from_json(d[key], f"{what}: {key!r}") if d.get(key) else None

        ev = Evaluation(
            personalisation=opt("personalisation"),
            personalisation_clients=_per_client(d.get("personalisation_clients") or {}, f"{what}: 'personalisation_clients'"),
            received_union=opt("received_union"),
            global_=opt("global"),
            generalisation=opt("generalisation"),
            generalisation_clients=_per_client(d.get("generalisation_clients") or {}, f"{what}: 'generalisation_clients'"),
            start=opt("start"),
            start_clients=_per_client(d.get("start_clients") or {}, f"{what}: 'start_clients'"),
        )
        return cls(
            round=rnd,
            participation=part,
            arch=arch,
            traffic=traffic,
            growth=GrowthLog.from_json(d["growth"]) if d.get("growth") is not None else None,
            feddwa_weights=FedDwaWeights.from_json(d["feddwa_weights"]) if d.get("feddwa_weights") is not None else None,
            evaluation=ev,
            seconds=_num(d, "seconds", what) if "seconds" in d else 0.0,
            guard=GuardNote.from_json(d["guard"], f"{what}: 'guard'") if d.get("guard") is not None else None,
            attempts=_int(d, "attempts", what, 1),
        )


def records(rows: Sequence[Any]) -> list[RoundRecord]:
    """``RoundRecord.from_json`` of each row (e.g. ``report.json``'s ``rounds``); RecordError names the bad one."""
    return [r if isinstance(r, RoundRecord) else RoundRecord.from_json(r) for r in rows]
