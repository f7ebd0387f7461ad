"""Buffered asynchronous rounds (FedBuff): a new model version every K updates, stale ones weighted down.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022,
Algorithm 1. The coordinator keeps one global model x_t (version t = the round number). Each
round it hands x_t to the devices that are free, then closes as soon as K updates are in its
buffer (``buffer_size``), counting both the updates trained from x_t and those of devices still
training an earlier version x_{t-tau} when an earlier round closed without them. A stale update
y_i is folded in as its change scaled by the staleness weight s(tau) = 1 / sqrt(1 + tau)
(the paper's polynomial staleness scaling, section 5) and rebased onto x_t:

    y_i' = x_t + s(tau_i) (y_i - x_{t - tau_i})

after which the configured strategy aggregates the buffer as it aggregates a round (the n_i
weighted mean of the changes y_i' - x_t, and its server step eta where it has one: FedAvgM,
FedExP, FedAdam). An update older than ``max_staleness`` versions is dropped. A device counts
as training (and is not selected again) from the round that selected it until its update
arrives, it goes offline or stale, or ``max_staleness`` versions pass: FedBuff's bound on
concurrent versions.

Only strategies with one global model that every client takes whole can run buffered
(not :attr:`coordinator.strategies.base.Strategy.personalised`); FedDWA and FedPer's
personalised models, and FedDist's growth steps, need every update of a round together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec

State = Mapping[str, Any]


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
