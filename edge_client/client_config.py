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

    Parameters
    ----------
    client_id : str
        Stable device id (letters, digits, ``_ . -``); also its MQTT user name in deployments.
    broker : BrokerConfig
    federation : str
        Federation name (topic prefix ``fedhar/v1/{federation}``).
    max_model_bytes : int
        Largest model envelope accepted (bytes).
    backend : {"torch", "executorch", "executorch-android", "numpy"}
        The training backend of :class:`~edge_client.trainer.ClientTrainer`: PyTorch eager (boards,
        desktop, the simulation), ExecuTorch programs (the Python runtime, or the Java training
        module on a phone), or the numpy reference (no PyTorch);
        :func:`edge_client.backends.factory.choose_backend` picks the best installed.
    program_cache : str, optional
        Folder of the exported ExecuTorch programs (``executorch`` backends).
    programs : {"auto", "export", "fetch"}
        Whether an ``executorch`` client exports its programs or asks the coordinator for them
        (:func:`edge_client.pte_fetch.needs_delivery`; ``executorch-android`` always asks).
    exit_after_run : str, optional
        Exit once the coordinator announces that this run id finished (used by simulations);
        otherwise run until stopped.
    status_refresh_s : float
        Republish the retained status this often (s), so the coordinator can tell a present
        device from one that vanished without a last will (e.g. revoked).
    receipt_wait_s : float
        Seconds to wait for the coordinator's receipt before sending an update again; doubles
        after each further send, up to 60 s, and never beyond the round's deadline
        (:class:`edge_client.delivery.Delivery`).
    stop_flush_s : float
        Longest wait (s) when the client is stopped (SIGTERM) in the middle of a round: its update
        for the open round is sent first and its receipt awaited this long, before the client
        says it is offline and disconnects.
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

    Attributes
    ----------
    run_id : str
    round, stage : int
        The announcement the pace came with.
    selected : bool
        Whether this device was selected in that round: if so, the time applies once its update is delivered.
    pace : Pace
        The window the coordinator gave every device.
    at_unix : float
        This device's own time in that window (s since the epoch), drawn once per announcement: the jitter that
        spreads a population's check-ins.
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

        A phone would schedule its next wake-up at ``at_unix`` once it has nothing to do in the
        round and disconnect until then (Android's WorkManager; not part of the agent, which
        stays connected and only records the time for its holder to show).
        """
        if ann.pace is None:
            return None
        if old is not None and (old.run_id, old.round, old.stage, old.pace) == (ann.run_id, ann.round, ann.stage, ann.pace):
            return old
        return cls(ann.run_id, ann.round, ann.stage, selected, ann.pace, ann.pace.draw(rng))
