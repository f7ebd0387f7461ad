"""The carrier protocol: how a round's model bytes reach the devices and their updates come back.

A carrier is one way of moving bytes (:mod:`.mqtt_chunks`: retained chunks through the broker;
:mod:`.blobs`: content-addressed objects and signed upload slots in a blob store, MQTT carrying
only control). The MQTT grid (:class:`coordinator.mqtt_grid.MqttGrid`) holds one carrier and one
update intake (:mod:`.intake`) and never asks which carrier it has: every arriving message on an
update topic goes to :meth:`Carrier.arrived`, and whatever bytes it turns out to be go through the
intake, whichever carrier brought them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from coordinator.strategies import Federation
    from coordinator.transport.intake import UpdateIntake


@dataclass(frozen=True)
class Published:
    """What publishing a round's models gave: their transfer ids, the bytes they cost, the announcement's part.

    Attributes
    ----------
    global_id : str
        The transfer id (SHA-256) of G, "" when no selected device needs it.
    personal : dict client id -> str
        The transfer id of each selected device's own model P_i.
    bytes_down : int
        Bytes delivered for this exchange (each device's copy counted).
    announce : dict
        Fields of the round announcement that depend on the carrier (``selected``, ``transport``, ``global_blob``).
    """

    global_id: str
    personal: dict[str, str]
    bytes_down: int
    announce: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Arrival:
    """A whole update envelope that arrived: ``transfer`` (its SHA-256, hex) and its bytes."""

    transfer: str
    data: bytes


class Refused(Exception):
    """A message that cannot carry an update: ``reason`` (a rejection reason of the round record) and why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Opening:
    """One exchange as the carrier sees it when publishing its models.

    Attributes
    ----------
    round, stage : int
    attempt : str
        The attempt id (a round run again after a failed quorum gets a new one).
    selected : sequence of str
    deadline_unix : float
        When the exchange closes (s since the epoch).
    late_rounds : int
        For how many rounds after it closes its devices may still deliver (FedBuff's staleness bound; 0).
    update_bytes : int
        The largest update envelope it accepts (the upload size a grant allows).
    earlier : mapping of int to int
        Earlier exchanges (stage 0) whose devices may still deliver: round -> the last round that may take their update.
    """

    round: int
    stage: int
    attempt: str
    selected: Sequence[str]
    deadline_unix: float
    late_rounds: int = 0
    update_bytes: int = 0
    earlier: Mapping[int, int] = field(default_factory=dict)


class Carrier(Protocol):
    """One way of moving a federation's model bytes (see the module docstring)."""

    name: str
    """What the announcement's ``transport`` field says (``"mqtt"``, ``"blobs"``)."""

    def open(self) -> None:
        """Make ready (a store opened, slots left by an earlier process swept).

        Raises :class:`coordinator.grid.CoordinatorError` when it cannot be used.
        """
        ...

    def close(self) -> None:
        """Release what :meth:`open` took."""
        ...

    def publish(self, fed: Federation, opening: Opening) -> Published:
        """Make the models of ``fed`` the selected devices start from available to them for this exchange.

        Raises :class:`har_io.blobs.BlobError` when a store refuses (the exchange then gets no update).
        """
        ...

    def restore(self) -> None:
        """After a reconnection to the broker, publish again what the open exchange keeps retained there."""
        ...

    def arrived(self, cid: str, index: str, payload: bytes, intake: UpdateIntake) -> Arrival | None:
        """A message from ``cid`` on its update topic (``index``: the topic's last level): the whole update once
        complete, else None (a chunk of a transfer still incomplete, or something the intake already counted).

        Raises :class:`Refused` for a message that cannot carry an update.
        """
        ...

    def tick(self, selected: Collection[str]) -> None:
        """Called about twice a second while an exchange is open (ask for stalled transfers' missing parts)."""
        ...

    def closed(self, round_: int, stage: int, late_rounds: int) -> None:
        """The exchange (``round_``, ``stage``) closed; its devices may deliver for ``late_rounds`` more rounds."""
        ...

    def forget(self, cid: str) -> None:
        """Device ``cid`` may no longer send or fetch anything (revoked or forgotten): drop what it was handed."""
        ...

    def bad_object(self, sha256: str) -> bool:
        """A device found the object named ``sha256`` damaged: write it again if it is still needed; True if done."""
        ...

    def finish(self) -> None:
        """The run finished: take back every model published."""
        ...

    def send_program(self, cid: str, version: int, envelope: bytes) -> str:
        """Send ``cid`` the ExecuTorch program envelope of architecture ``version``; a line for the log."""
        ...
