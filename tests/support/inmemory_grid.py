"""An in-memory grid (coordinator.grid.Grid) for tests: devices that answer at once, with no broker.

Each device "trains" by a fixed, known step: its update is the model it was sent plus
``step(cid) * ones`` on every float tensor (so a FedAvg of the updates is known in closed
form), a ``guidance`` model one more step on when the plan asks for it, and a confusion
matrix on its own test split with ``hits(cid)`` of ``n_test`` windows right; with ``trainer`` each
device's update is what that callable returns instead (devices that really train). Devices in
``silent`` are selected but never answer (a frozen phone); ``log`` records what the runner
asked of the grid, in order. Each exchange's steering (from the round policy) is kept in
``steering``: the main exchange stops taking updates once it is full (the selected devices answer
in id order), and ``announced`` keeps the pace each exchange's announcement would carry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from coordinator.admission import Eligibility, eligibility
from coordinator.exchange import Exchange, published_models
from coordinator.record import RoundRecord
from coordinator.rounds import NO_STEERING, Steering
from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate
from har_models.data.windowing import ChannelStats
from har_models.nn.model import ArchSpec
from har_models.wire.messages import ClientStatus, TrainingPlan
from har_models.wire.pace import Pace

N_CLASSES = 6  # hapt6

Trainer = Callable[[str, ArchSpec, Mapping[str, torch.Tensor], int, int, TrainingPlan], ClientUpdate]
"""``trainer(cid, spec, received, round_, stage, plan)``: device ``cid``'s update from the model it was sent."""


def device_status(cid: str, n_train: int, seed: int = 0) -> ClientStatus:
    """A present device of label set hapt6 with ``n_train`` training windows and their channel statistics."""
    x = np.random.default_rng(seed).normal(size=(8, 6, 128)).astype(np.float32)
    return ClientStatus(cid, "online", label_set="hapt6", n_train=n_train, train_stats=ChannelStats.of(x).to_json(),
                        refresh_s=0.0)  # fmt: skip


class InMemoryGrid:
    """Devices in memory that answer every exchange at once (see the module docstring).

    Parameters
    ----------
    devices : mapping of str -> ClientStatus
    step : callable, optional
        ``step(cid)``: what the device adds to every float tensor it trains (default 0.01 x (index + 1)).
    n_test : int
        Test windows of each device.
    trainer : Trainer, optional
        Each device's update, in place of the fixed step (:meth:`train`).
    """

    def __init__(self, devices: Mapping[str, ClientStatus], step: Callable[[str], float] | None = None, n_test: int = 20,
                 trainer: Trainer | None = None):  # fmt: skip
        self.devices = dict(devices)
        self.trainer = trainer
        order = sorted(self.devices)
        self.step = step or (lambda cid: 0.01 * (order.index(cid) + 1))
        self.n_test = n_test
        self.silent: set[str] = set()
        self.restarts: dict[str, float] = {}  # as a launcher's: device -> when its process was restarted (s since the epoch)
        self.left: dict[str, ClientStatus] = {}  # devices that left from their app (Grid.leaving; none unless a test says)
        self.log: list[tuple[Any, ...]] = []
        self.progress: list[int] = []
        self.steering: Steering = NO_STEERING
        self.announced: list[tuple[int, int, Pace | None]] = []  # (round, stage, pace) of each exchange's announcement

    # ---------------------------------------------------------------- the Grid protocol: the session
    def open(self) -> None:
        self.log.append(("open",))

    def close(self) -> None:
        self.log.append(("close",))

    def clear_retained(self) -> None:
        self.log.append(("clear_retained",))

    def finish(self, spec: Any, label_set: str) -> None:
        self.log.append(("finish",))

    def clear_device(self, cid: str) -> bool:
        self.log.append(("clear_device", cid))
        return True

    def set_between(self, hook: Callable[[], None]) -> None:
        self.between = hook

    def leaving(self) -> Mapping[str, ClientStatus]:
        return self.left

    # ---------------------------------------------------------------- the Grid protocol: rounds
    def eligibility(self, label_set: str) -> Eligibility:
        return eligibility(self.devices, fresh=lambda cid: True, label_set=label_set)

    def statuses(self) -> Mapping[str, ClientStatus]:
        return self.devices

    def wait(self, seconds: float) -> None:
        self.log.append(("wait",))

    def gone(self) -> set[str]:
        return set()

    def restarted(self) -> Mapping[str, float]:
        return self.restarts

    def exchange(self, fed: Federation, label_set: str, round_: int, stage: int, selected: Sequence[str],
                 plan: TrainingPlan, steering: Steering) -> Exchange:  # fmt: skip
        self.log.append(("exchange", round_, stage, tuple(selected)))
        self.steering = steering
        self.announced.append((round_, stage, steering.pace))
        ex = Exchange(round_, stage, fed.spec, frozenset(selected), plan.guidance, steering, reference=published_models(fed))
        for cid in selected:
            if ex.complete():
                break
            if cid in self.silent:
                continue
            start = fed.personal.get(cid, fed.global_state)
            if self.trainer is not None:
                ex.add(self.trainer(cid, fed.spec, start, round_, stage, plan))
            else:
                ex.add(self.train(cid, start, round_, stage, plan))
        return ex

    def new_attempt(self, round_: int, same_model: bool) -> None:
        self.log.append(("new_attempt", round_))

    def close_failed(self, round_: int) -> None:
        self.log.append(("close_failed", round_))

    def publish_progress(self, record: RoundRecord) -> None:
        self.progress.append(record.round)

    def publish_outlook(self, outlook: Any) -> None:
        self.log.append(("outlook", outlook.open_round))

    def forget(self, cid: str) -> None:
        self.devices.pop(cid, None)

    # ---------------------------------------------------------------- the devices
    def train(self, cid: str, start: Mapping[str, torch.Tensor], round_: int, stage: int, plan: TrainingPlan) -> ClientUpdate:
        """Device ``cid``'s update from model ``start``: every float tensor + step(cid), frozen ones unchanged."""
        d = self.step(cid)

        def moved(by: float) -> dict[str, torch.Tensor]:
            return {k: (v + by if v.is_floating_point() and k not in plan.frozen else v.clone()) for k, v in start.items()}

        hits = min(self.n_test, 10 + sorted(self.devices).index(cid))
        cm = np.zeros((N_CLASSES, N_CLASSES), dtype=np.int64)
        cm[0, 0], cm[0, 1] = hits, self.n_test - hits
        n_train = self.devices[cid].n_train
        return ClientUpdate(cid, round_, stage, n_train, self.n_test, moved(d), moved(2 * d) if plan.guidance else None,
                            confusion={"trained": cm}, size=1000)  # fmt: skip
