"""One exchange being collected: the valid updates of the selected devices, the failures and what was refused.

An exchange is one announcement and its answers: round ``round``, stage ``stage`` (0 = the round's
main exchange; FedDist's intermediate exchanges have stages 1, 2, ...). The grid fills it from the
update intake (:mod:`coordinator.transport.intake`) until :meth:`Exchange.complete` or the deadline,
then hands it to the runner, which reads it and no longer writes it. When it may close before every
selected device answered is the round policy's (:class:`Steering`), and so is what an update for an
exchange that is not open is worth (:class:`Late`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate, Failure
from har_models.nn.model import ArchSpec
from har_models.wire.pace import Pace


def _nobody() -> Set[str]:
    return frozenset()


def _none_awaited(present: Callable[[str], bool]) -> int:
    return 0


def _no_earlier() -> Mapping[int, int]:
    return {}


@dataclass(frozen=True)
class Steering:
    """What the grid applies to a round's main exchange beyond the plan (from :meth:`RoundPolicy.steering`).

    Attributes
    ----------
    close_at : int, optional
        The exchange is complete once this many devices contributed (a valid update of this exchange,
        or one the policy holds, ``held``); None: only when every selected device answered or went offline.
    pace : Pace, optional
        Carried by the round's announcements (pace steering; None: left out).
    unanswered : str
        The failure reason of a selected device that had not answered when the exchange closed at ``close_at``.
    held : callable () -> set of str
        Devices whose update the policy holds for this round from elsewhere (FedBuff's updates of earlier
        versions): they count towards ``close_at``.
    awaiting : callable (present) -> int
        Devices the policy still waits for beyond the selected ones (FedBuff's devices training an earlier
        version), given ``present(cid)``, the grid's word on whether a device is still there; while any is
        awaited, an exchange whose selected devices all answered stays open (for ``close_at`` or the deadline).
    late_rounds : int
        For how many rounds after the exchange closes its devices may still deliver (FedBuff's staleness
        bound): their upload slots stay open that long.
    earlier : callable () -> mapping of int to int
        The earlier exchanges (stage 0) whose devices may still deliver: round -> the last round that may take
        their update (FedBuff's versions still training, also after a restart of the coordinator).
    """

    close_at: int | None = None
    pace: Pace | None = None
    unanswered: str = "missed_deadline"
    held: Callable[[], Set[str]] = _nobody
    awaiting: Callable[[Callable[[str], bool]], int] = _none_awaited
    late_rounds: int = 0
    earlier: Callable[[], Mapping[int, int]] = _no_earlier


NO_STEERING = Steering()
"""An exchange that waits for every selected device (or its deadline), with no pace in its announcements."""


@dataclass(frozen=True)
class Late:
    """What an update for an exchange other than the open one is to the round policy (:meth:`RoundPolicy.late`).

    Attributes
    ----------
    round : int
        The round (model version) the update was made for.
    spec : ArchSpec, optional
        The architecture it must have; None for an update that is no fault but not needed (it is counted
        with the duplicates, unread).
    reference : mapping, optional
        The model it was made from (int8_delta updates are deltas against it).
    take : callable, optional
        Hands the validated update to the policy.
    """

    round: int
    spec: ArchSpec | None = None
    reference: Any = None
    take: Callable[[ClientUpdate], None] | None = None

    @property
    def harmless(self) -> bool:
        """True for an update the policy does not want, but that is no fault of its device."""
        return self.take is None



@dataclass
class Exchange:
    """One exchange being collected (see the module docstring).

    Attributes
    ----------
    round, stage : int
    spec : ArchSpec
        Architecture the updates must have.
    selected : frozenset of str
    guidance : bool
        Whether updates must carry a FedDWA guidance model.
    steering : Steering
        When the exchange may close early, and the reason of those it did not wait for.
    updates : dict client id -> ClientUpdate
        The first valid update of each selected client.
    rejected : Counter of (client id, reason)
        Invalid messages, counted (a flood costs a counter increment, not a log line each),
        including those that arrived while no exchange was open since the previous one (``carried``).
    carried : Counter of (client id, reason)
        The part of ``rejected`` that arrived between exchanges: counted in this exchange's record,
        but no reason for a selected client's failure.
    duplicates : Counter of client id
        Harmless repeats: re-sent copies of an update already counted, updates for a failed attempt
        that arrived before the next one opened, updates the round policy did not need.
    offline : set of str
        Selected clients whose status said offline (or who vanished) while the exchange was open.
    bytes_up, bytes_down : int
        Bytes of valid updates received and of models published for this exchange.
    reference : callable client id -> state, optional
        The model published to each client (:func:`published_models`): what int8_delta updates are deltas against.
    awaited : int
        Devices the round policy still waits for beyond the selected ones (refreshed by the grid from
        ``steering.awaiting``).
    warming : set of str
        Selected devices without an update whose status said, at the close, that they were still warming up
        (their first training since a start): their failure is ``warming_up``, not a missed deadline.
    """

    round: int
    stage: int
    spec: ArchSpec
    selected: frozenset[str]
    guidance: bool
    steering: Steering = NO_STEERING
    updates: dict[str, ClientUpdate] = field(default_factory=dict)
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    carried: Counter[tuple[str, str]] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    offline: set[str] = field(default_factory=set)
    bytes_up: int = 0
    bytes_down: int = 0
    reference: Callable[[str], Mapping[str, Any]] | None = None
    awaited: int = 0
    warming: set[str] = field(default_factory=set)

    def add(self, update: ClientUpdate) -> bool:
        """Keep ``update`` if it is the first from its client (QoS 1 may deliver twice); True if kept."""
        if update.client_id in self.updates:
            return False
        self.updates[update.client_id] = update
        self.bytes_up += update.size
        return True

    @property
    def contributors(self) -> int:
        """Clients with a valid update for this round: this exchange's, and those the round policy holds from elsewhere."""
        held = self.steering.held()
        if not held:
            return len(self.updates)
        return len(self.updates) + len(set(held) - self.updates.keys())

    def full(self) -> bool:
        """True once the steering's ``close_at`` contributors are in."""
        return self.steering.close_at is not None and self.contributors >= self.steering.close_at

    def complete(self) -> bool:
        """True once every selected client answered or went offline (and nobody else is awaited), or the exchange is full.

        Counted, not searched: O(offline clients), so asking after every message costs the
        same whatever the number selected (updates come only from selected clients).
        """
        if self.full():
            return True
        gone = sum(1 for c in self.offline if c in self.selected and c not in self.updates)
        return len(self.updates) + gone >= len(self.selected) and self.awaited == 0

    def results(self) -> list[ClientUpdate]:
        """The valid updates, ordered by client id (the aggregation order, fixed for reproducibility)."""
        return [self.updates[c] for c in sorted(self.updates)]

    def failures(self) -> list[Failure]:
        """Selected clients without a valid update, with why: offline, their rejection, the steering's
        ``unanswered`` when the exchange closed full (nobody was waited for), else ``warming_up`` for a device
        still warming up at the deadline, else ``missed_deadline``."""
        rejected_by = {cid: reason for (cid, reason) in self.rejected - self.carried}

        def late(cid: str) -> str:
            if self.full():
                return self.steering.unanswered
            return "warming_up" if cid in self.warming else "missed_deadline"

        return [Failure(cid, "offline" if cid in self.offline else rejected_by.get(cid) or late(cid))
                for cid in sorted(self.selected - set(self.updates))]  # fmt: skip

    @property
    def n_rejected(self) -> int:
        """Invalid messages in this exchange (each counted once)."""
        return sum(self.rejected.values())

    @property
    def n_duplicates(self) -> int:
        """Harmless repeats received in this exchange (not rejections)."""
        return sum(self.duplicates.values())


def published_models(fed: Federation) -> Callable[[str], Mapping[str, Any]]:
    """Client id -> the model published to it for the open exchange: P_i if it has one, else G.

    The same choice the carrier makes when it publishes models. The states are looked up when
    asked, not copied: they change only between exchanges (aggregation, growth), and a closed
    exchange validates nothing, so holding no snapshot costs no memory.
    """

    def reference(cid: str) -> Mapping[str, Any]:
        return fed.personal.get(cid, fed.global_state)

    return reference
