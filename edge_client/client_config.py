"""The settings of one edge client (:class:`ClientConfig`) and the check-in time a paced announcement gives it (:class:`CheckIn`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from edge_client.backends.base import BACKEND_NAMES
from edge_client.pte_fetch import PROGRAM_MODES
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.pace import Pace
from har_models.wire.topics import check_client_id

BACKENDS = BACKEND_NAMES


@dataclass(frozen=True)
class ClientConfig:
    """Settings of one edge client.

    ``client_id``: letters, digits, ``_ . -`` (also its MQTT user name); ``max_model_bytes``: largest
    model envelope accepted; ``backend``: of :class:`~edge_client.trainer.ClientTrainer`
    (:func:`edge_client.backends.factory.choose_backend` picks the best installed); ``programs``:
    whether an ``executorch`` client exports its programs or fetches them
    (:func:`edge_client.pte_fetch.needs_delivery`); ``exit_after_run``: exit once that run finished
    (simulations); ``status_refresh_s``: republish the retained status this often, so a device gone
    without a will is told apart; ``receipt_wait_s``: first wait for a receipt before sending again
    (doubling up to 60 s, :class:`edge_client.delivery.Delivery`); ``stop_flush_s``: longest wait on
    SIGTERM in a round for the open round's update to be sent and confirmed.
    """

    client_id: str
    broker: BrokerConfig
    federation: str = "default"
    max_model_bytes: int = 512 * 1024 * 1024
    exit_after_run: str | None = None
    backend: str = "torch"
    program_cache: str | None = None
    status_refresh_s: float = 30.0
    receipt_wait_s: float = 30.0
    programs: str = "auto"
    stop_flush_s: float = 10.0

    def __post_init__(self) -> None:
        check_client_id(self.client_id)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.programs not in PROGRAM_MODES:
            raise ValueError(f"programs must be one of {PROGRAM_MODES}, got {self.programs!r}")
        if not 0 <= self.stop_flush_s < 3600:
            raise ValueError(f"stop_flush_s must be in [0, 3600) seconds, got {self.stop_flush_s!r}")


@dataclass(frozen=True)
class CheckIn:
    """When this device should check in again, from the pace of a round announcement (:mod:`har_models.wire.pace`).

    ``selected``: chosen in that round (the time applies once its update is delivered); ``at_unix``:
    this device's own time in the coordinator's window, drawn once per announcement (spreading a
    population's check-ins).
    """

    run_id: str
    round: int
    stage: int
    selected: bool
    pace: Pace
    at_unix: float

    @classmethod
    def of(cls, ann: RoundAnnouncement, selected: bool, rng: random.Random, old: CheckIn | None) -> CheckIn | None:
        """The check-in of ``ann``'s pace: ``old`` for the same announcement again (a reconnection), None without a pace.

        A phone would schedule its next wake-up then (WorkManager); the agent only records it.
        """
        if ann.pace is None:
            return None
        if old is not None and (old.run_id, old.round, old.stage, old.pace) == (ann.run_id, ann.round, ann.stage, ann.pace):
            return old
        return cls(ann.run_id, ann.round, ann.stage, selected, ann.pace, ann.pace.draw(rng))
