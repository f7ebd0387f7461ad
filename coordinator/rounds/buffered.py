"""Buffered asynchronous rounds (FedBuff): a new model version every K updates, stale ones weighted down.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022,
Algorithm 1. The coordinator keeps one global model x_t (version t = the round number). Each
round it hands x_t to the devices that are free, then closes as soon as K updates are in its
buffer (``[buffer] size``), counting both the updates trained from x_t and those of devices still
training an earlier version x_{t-tau} when an earlier round closed without them. A stale update
y_i is folded in as its change scaled by the staleness weight s(tau) = 1 / sqrt(1 + tau)
(the paper's polynomial staleness scaling, section 5) and rebased onto x_t:

    y_i' = x_t + s(tau_i) (y_i - x_{t - tau_i})

after which the configured strategy aggregates the buffer as it aggregates a round (the n_i
weighted mean of the changes y_i' - x_t, and its server step eta where it has one: FedAvgM,
FedExP, FedAdam). An update older than ``max_staleness`` versions is dropped. A device counts
as training (and is not selected again) from the round that selected it until its update
arrives, it goes offline or stale, or ``max_staleness`` versions pass: FedBuff's bound on
concurrent versions (``concurrency``).

Only strategies with one global model that every client takes whole can run buffered
(not :attr:`coordinator.strategies.base.Strategy.personalised`); FedDWA and FedPer's
personalised models, and FedDist's growth steps, need every update of a round together.

:class:`BufferedRounds` is the round policy (:mod:`coordinator.rounds.base`); the versions its
devices still train are kept across a restart (:meth:`BufferedRounds.record`): their models are
the kept versions of the run folder, so an update that arrives after a restart is still taken.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from coordinator.rounds.base import Batch, Late, RoundPolicy, Steering, select_clients
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec
from har_models.settings import doc

if TYPE_CHECKING:
    from coordinator.exchange import Exchange
    from coordinator.strategies import Federation

log = logging.getLogger("fedhar.coordinator")

State = Mapping[str, Any]


@dataclass(frozen=True)
class BufferSettings:
    """The ``[buffer]`` settings table: FedBuff's K, tau_max and concurrency (see the module docstring)."""

    size: int = field(
        default=0,
        metadata=doc("FedBuff's K: buffered asynchronous rounds that close once K updates are in, fresh ones and, weighted "
                     "by 1/sqrt(1 + staleness), those of devices still training an earlier version (0 = off: synchronous "
                     "rounds)", "updates", flag="--buffer-size"),
    )
    max_staleness: int = field(
        default=4,
        metadata=doc("with a buffer: the oldest version (rounds back) whose updates are still taken; a device still "
                     "training it is free again after that", "rounds", flag="--max-staleness"),
    )
    concurrency: int = field(
        default=0,
        metadata=doc("with a buffer: the most devices training at once, over every version (0 = every eligible "
                     "device that fraction selects)", "devices", flag="--concurrency"),
    )

    def check(self, cfg: Any) -> None:
        """Refuse a buffer with what needs every update of a round together (ValueError naming the setting and the fix)."""
        from coordinator import strategies

        if self.size < 0 or self.concurrency < 0 or self.max_staleness < 1:
            raise ValueError(f"need [buffer] size >= 0, concurrency >= 0 and max_staleness >= 1; got {self.size}, "
                             f"{self.concurrency}, {self.max_staleness}")  # fmt: skip
        if not self.size:
            return
        if self.size < cfg.min_clients:
            raise ValueError(f"[buffer] size (--buffer-size) must be at least min_clients ({cfg.min_clients}), got {self.size}")
        if cfg.cohort.goal:
            raise ValueError("[buffer] size and [cohort] goal both close a round at a count of updates: set one of them (0 = off)")
        if cfg.growth != "none":
            raise ValueError("buffered rounds ([buffer] size) cannot grow the model: FedDist's steps need every update of a "
                             "round together; use growth = 'none' or [buffer] size = 0")  # fmt: skip
        if strategies.strategy_class(cfg.aggregation).personalised:
            raise ValueError(f"buffered rounds ([buffer] size) need one global model every client takes whole; "
                             f"{cfg.aggregation!r} keeps personalised models: use fedavg, fedavgm, fedexp or fedadam, "
                             f"or [buffer] size = 0")  # fmt: skip
        if 0 < self.concurrency < self.size:
            raise ValueError(f"[buffer] concurrency ({self.concurrency}) must be at least its size ({self.size}) or 0 (all)")


def staleness_weight(tau: int) -> float:
    """s(tau) = 1 / sqrt(1 + tau) (Nguyen et al. 2022, section 5): 1 for a fresh update.

    Raises
    ------
    ValueError
        If ``tau`` < 0.
    """
    if tau < 0:
        raise ValueError(f"staleness must be >= 0 versions, got {tau}")
    return 1.0 / math.sqrt(1.0 + tau)


def rebase(update: ClientUpdate, trained_from: State, current: State, tau: int) -> ClientUpdate:
    """``update`` (trained from ``trained_from`` = x_{t-tau}) as a fresh update of ``current`` = x_t.

    Its state becomes x_t + s(tau) (y_i - x_{t-tau}) (float32, computed in float64 per tensor);
    everything else (n_train, the client's confusion matrices) is kept.

    Raises
    ------
    ValueError
        If the three models do not have the same tensor names and shapes, or ``tau`` < 0.
    """
    s = staleness_weight(tau)
    if set(update.state) != set(current) or set(trained_from) != set(current):
        raise ValueError(f"the update of {update.client_id} and the models it is rebased between have other tensors")
    out: dict[str, torch.Tensor] = {}
    for name, x_t in current.items():
        y, x_old = update.state[name], trained_from[name]
        if y.shape != x_t.shape or x_old.shape != x_t.shape:
            raise ValueError(f"{name}: the update of {update.client_id} has shape {tuple(y.shape)}, the model {tuple(x_t.shape)}")
        change = y.to(torch.float64) - x_old.to(torch.float64)
        out[name] = (x_t.to(torch.float64) + s * change).to(x_t.dtype)
    return replace(update, state=out, guidance=None)


@dataclass
class Version:
    """A closed round whose devices may still deliver: round (= version) t, its model x_t and who is still training it."""

    round: int
    spec: ArchSpec
    state: State
    training: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Stale:
    """A valid update of a device that trained an earlier version: ``update`` as received, from ``version``."""

    update: ClientUpdate
    version: Version


class InFlight:
    """The devices still training an earlier version, and those versions' models (at most ``max_staleness`` kept).

    Parameters
    ----------
    max_staleness : int
        tau_max: an update of version t - tau with tau > tau_max is no longer taken, and its
        device counts as free again.
    """

    def __init__(self, max_staleness: int):
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 version, got {max_staleness}")
        self.max_staleness = max_staleness
        self._versions: dict[int, Version] = {}

    def close(self, round_: int, spec: ArchSpec, state: State, training: Sequence[str]) -> None:
        """Round ``round_`` closed while ``training`` (selected, no update yet) still train its model ``state``."""
        if training:
            self._versions[round_] = Version(round_, spec, state, set(training))
        self.expire(round_ + 1)

    def expire(self, now_round: int) -> None:
        """Forget the versions more than ``max_staleness`` before ``now_round`` (their devices are free again)."""
        for r in [r for r in self._versions if now_round - r > self.max_staleness]:
            del self._versions[r]

    def training(self) -> set[str]:
        """Every device still training a kept version."""
        return set().union(*(v.training for v in self._versions.values()))

    def version_of(self, cid: str, round_: int) -> Version | None:
        """The kept version ``round_`` if ``cid`` is still training it, else None."""
        v = self._versions.get(round_)
        return v if v is not None and cid in v.training else None

    def arrived(self, cid: str, round_: int) -> None:
        """``cid``'s update of version ``round_`` was taken: it is free again."""
        v = self._versions.get(round_)
        if v is not None:
            v.training.discard(cid)
            if not v.training:
                del self._versions[round_]

    def drop(self, cids: set[str]) -> set[str]:
        """Devices in ``cids`` (offline, stale, revoked) are no longer waited for; returns those that were."""
        gone: set[str] = set()
        for r in list(self._versions):
            v = self._versions[r]
            gone |= v.training & cids
            v.training -= cids
            if not v.training:
                del self._versions[r]
        return gone

    def by_round(self) -> dict[int, set[str]]:
        """The kept versions' rounds and who still trains each."""
        return {r: set(v.training) for r, v in sorted(self._versions.items())}

    def __len__(self) -> int:
        return sum(len(v.training) for v in self._versions.values())


def fold(stale: Sequence[Stale], fresh: Sequence[ClientUpdate], now_round: int, spec: ArchSpec,
         current: State) -> tuple[list[ClientUpdate], dict[str, int]]:  # fmt: skip
    """The buffer of round ``now_round`` as the strategy aggregates it, and the staleness of each stale update.

    Returns ``fresh`` followed by each stale update rebased onto ``current`` (:func:`rebase`), in
    client id order, and {client id: tau}. A stale update of another architecture (a rollback to
    an earlier version of the model) or beyond ``max_staleness`` was already refused on arrival;
    a client with both a fresh and a stale update keeps its fresh one.
    """
    have = {u.client_id for u in fresh}
    out = list(fresh)
    taus: dict[str, int] = {}
    for s in sorted(stale, key=lambda s: s.update.client_id):
        cid = s.update.client_id
        if cid in have or s.version.spec.version != spec.version:
            continue
        tau = now_round - s.version.round
        out.append(rebase(s.update, s.version.state, current, tau))
        taus[cid] = tau
        have.add(cid)
    out.sort(key=lambda u: u.client_id)
    return out, taus


class BufferedRounds(RoundPolicy):
    """FedBuff's rounds as a round policy (see the module docstring).

    Selection takes only eligible devices that train no earlier version, at most ``concurrency``
    minus those training; a round closes at K contributors (fresh, or held from earlier versions);
    the selected devices it did not wait for keep training (``still_training``) and their update is
    taken later, for as long as its version is at most ``max_staleness`` rounds old.
    """

    name = "buffered"

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return cfg.buffer.size > 0

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.settings: BufferSettings = cfg.buffer
        self.in_flight = InFlight(self.settings.max_staleness)
        self.held: list[Stale] = []  # valid updates of earlier versions, for the next round's buffer

    def select(self, eligible: Sequence[str], round_: int) -> list[str]:
        """Eligible devices not training an earlier version and without an update waiting in the buffer, ``fraction`` of
        them, at most ``concurrency`` minus those training (FedBuff's bound on concurrent clients). May be empty while some train."""
        training = self.in_flight.training()
        # A device whose update waits in the buffer gave this version its part: a fresh update would leave that one out unnamed.
        free = sorted(set(eligible) - training - self._held_ids())
        room = self.settings.concurrency - len(training) if self.settings.concurrency else len(free)
        if room <= 0 or not free:
            return []
        return select_clients(free, round_, 1, self.cfg.fraction, self.cfg.seed, room)

    @property
    def versions_needed(self) -> int:
        return self.settings.max_staleness

    def busy(self) -> bool:
        return len(self.in_flight) > 0

    def training(self) -> set[str]:
        """The devices still training an earlier version."""
        return self.in_flight.training()

    def steering(self, now_unix: float, period_s: float, present: int, selected: int) -> Steering:
        return Steering(close_at=self.settings.size, unanswered="still_training", held=self._held_ids, awaiting=self._awaiting,
                        late_rounds=self.settings.max_staleness, earlier=self._earlier)  # fmt: skip

    def _earlier(self) -> dict[int, int]:
        """The versions devices still train, each with the last round that takes its update (its staleness bound)."""
        return {r: r + self.settings.max_staleness for r, ids in self.in_flight.by_round().items() if ids}

    def _held_ids(self) -> Set[str]:
        return {s.update.client_id for s in self.held}

    def _awaiting(self, present: Callable[[str], bool]) -> int:
        """Stop waiting for devices training an earlier version that are no longer there; how many are still awaited."""
        gone = {cid for cid in self.in_flight.training() if not present(cid)}
        for cid in sorted(self.in_flight.drop(gone)):
            log.info("no longer waiting for %s's update of an earlier version: it went offline", cid)
        return len(self.in_flight)

    def late(self, cid: str, round_: int, stage: int) -> Late | None:
        v = self.in_flight.version_of(cid, round_) if stage == 0 else None
        if v is None:
            return None

        def take(update: ClientUpdate) -> None:
            self.in_flight.arrived(cid, round_)
            self.held.append(Stale(update, v))
            log.debug("update of %s for version %d taken into the buffer", cid, round_)

        return Late(round_, v.spec, v.state, take)

    def closed(self, ex: Exchange, fed: Federation) -> None:
        self.in_flight.close(ex.round, fed.spec, fed.global_state, sorted(ex.selected - ex.updates.keys() - ex.offline))

    def batch(self, ex: Exchange, round_: int, spec: ArchSpec, received: Any) -> Batch:
        """The exchange's updates and the held ones of earlier versions, rebased onto ``received`` (:func:`fold`)."""
        fresh = ex.results()
        if not self.held:
            return Batch(fresh, fresh)
        results, taus = fold(self.held, fresh, round_, spec, received)
        taken = {s.update.client_id: s.update for s in self.held if s.update.client_id in taus}
        trained = sorted([*fresh, *taken.values()], key=lambda u: u.client_id)
        return Batch(results, trained, taus, [s.update for s in self.held])

    def completed(self) -> None:
        """The round aggregated its batch: the held updates are spent (those of another architecture with them)."""
        self.held = []

    def record(self) -> dict[str, Any]:
        """The versions devices still train: {round: [device ids]} (their models are the run folder's kept versions)."""
        return {"in_flight": {str(r): sorted(ids) for r, ids in self.in_flight.by_round().items()}}

    def restore(self, saved: dict[str, Any], models: Callable[[int], tuple[ArchSpec, Any] | None]) -> None:
        """Take back the versions devices still train; a version whose model is no longer kept is dropped (logged)."""
        for key, ids in sorted(dict(saved.get("in_flight", {})).items()):
            r = int(key)
            found = models(r)
            if found is None:
                log.warning("buffered rounds: the model of version %d is no longer kept; the updates of %s for it are not "
                            "taken", r, ", ".join(ids))  # fmt: skip
                continue
            self.in_flight.close(r, found[0], found[1], [str(c) for c in ids])
        if len(self.in_flight):
            log.info("buffered rounds: still waiting for %d update(s) of earlier versions: %s", len(self.in_flight),
                     ", ".join(sorted(self.in_flight.training())))  # fmt: skip
