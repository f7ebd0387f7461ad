"""How a device answers rounds (edge_client/rounds.py, edge_client/answers.py), against a real Mosquitto on 127.0.0.1.

The test plays the coordinator on the wire (its status, announcements, a model in chunks, receipts) and the
device's training is a stand-in that returns a small update at once, so each test follows the device's
answers message by message: one update per attempt it is asked in (never for attempts that came and went
while it trained), a round done under another model trained again, an update sent and confirmed before
the device says it is offline when it is stopped in the middle of a round, and the timings it reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.cost import CostMeter
from edge_client.store import ClientStore
from edge_client.trainer import RoundOutcome
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_models.data.labels import HAPT_LABELS
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.chunking import Reassembler, transfer_id
from har_models.wire.messages import ClientStatus, CoordinatorStatus, Receipt, RoundAnnouncement
from har_models.wire.topics import Topics

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
CID, RUN = "dev", "r"
WAIT_S = 30.0  # the longest any event is waited for; each test waits for events, never for a time


def model(round_: int, seed: int = 0) -> bytes:
    """A model envelope for ``round_`` (its bytes differ by ``seed``)."""
    return codec.encode({"w": np.full(4, seed, np.float32)}, kind="model", round=round_, arch_version=SPEC.version)


def wait_for(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < end, f"waited {WAIT_S:.0f} s for {what}"
        time.sleep(0.01)


class Coordinator:
    """The coordinator's side of the wire, played by the test (one device, ``CID``)."""

    def __init__(self, port: int, unanswered: int = 0):
        self.topics = Topics("t")
        self.link = MqttLink(BrokerConfig(port=port), "t-coordinator",
                             subscriptions=[(self.topics.client_update(CID, "+"), 1), (self.topics.client_status(CID), 1)])  # fmt: skip
        assert self.link.start(10.0)
        self.unanswered = unanswered  # this many first copies get no receipt; every later one an accepted receipt
        self.on_update: Callable[[], None] = lambda: None  # called (in the reading thread) as each copy arrives
        self.updates: list[bytes] = []  # every update received whole, in order (a copy sent again counts again)
        self.events: list[str] = []  # "update", or a status's state, in arrival order
        self.statuses: list[ClientStatus] = []
        self._reassembler = Reassembler()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                topic, payload, _ = self.link.inbox.get(timeout=0.05)
            except Exception:
                continue
            if not payload:
                continue
            if topic == self.topics.client_status(CID):
                st = ClientStatus.from_bytes(payload)
                self.statuses.append(st)
                self.events.append(st.state)
                continue
            done = self._reassembler.add("u", payload)
            if done is None:
                continue
            self._reassembler.forget("u", done[0])  # a copy sent again is collected again
            self.updates.append(done[1])
            self.events.append("update")
            self.on_update()
            if len(self.updates) > self.unanswered:
                h = codec.peek_header(done[1])
                r = Receipt(RUN, h["round"], h["meta"]["stage"], done[0], "accepted")
                self.link.publish(self.topics.client_receipt(CID), r.to_bytes())

    def announce(self, round_: int, attempt: str, envelope: bytes) -> None:
        """Run round ``round_`` (again) under ``attempt``, starting from the model ``envelope``."""
        self.link.publish(self.topics.coordinator_status, CoordinatorStatus("online", RUN, attempt).to_bytes(), retain=True)
        self.link.publish_chunks(self.topics.global_model, envelope, retain=True)
        ann = RoundAnnouncement(RUN, round_, "training", SPEC.to_dict(), HAPT_LABELS.name, selected=(CID,),
                                global_model=transfer_id(envelope), deadline_unix=time.time() + 600, attempt=attempt)  # fmt: skip
        self.link.publish(self.topics.round, ann.to_bytes(), retain=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.link.stop()


class Device:
    """An agent in its own thread whose training is a stand-in: ``trainings`` counts them, ``gate`` can hold one."""

    def __init__(self, port: int, state: Path, cost: CostMeter | None = None, **cfg: Any):
        self.store = ClientStore(state, HAPT_LABELS)
        self.agent = EdgeAgent(ClientConfig(CID, BrokerConfig(port=port), federation="t", backend="numpy", **cfg), self.store, cost=cost)
        self.trainings: list[int] = []
        self.gate: Callable[[], None] = lambda: None  # runs inside each training (a test holds it there)
        self.agent.trainer.run_round = self._train  # type: ignore[method-assign,assignment]
        self.stop = threading.Event()
        self.code: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _train(self, ann: RoundAnnouncement, tensors: Mapping[str, np.ndarray]) -> RoundOutcome:
        self.gate()
        self.trainings.append(ann.round)
        update = codec.encode({"w": np.full(4, len(self.trainings), np.float32)}, kind="update", round=ann.round,
                              arch_version=SPEC.version, client_id=CID, meta={"run_id": ann.run_id, "stage": ann.stage})  # fmt: skip
        return RoundOutcome(update, None, {"stand-in": True})  # type: ignore[arg-type]

    def _run(self) -> None:
        self.code = self.agent.run(self.stop)

    def close(self) -> None:
        self.stop.set()
        self._thread.join(30)
        self.store.close()


@pytest.fixture
def wire(mosquitto: int, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(kind: str, **kw: Any) -> Any:
        made.append(Coordinator(mosquitto, **kw) if kind == "coordinator" else Device(mosquitto, tmp_path / kw.pop("state", "s"), **kw))
        return made[-1]

    yield make
    for m in reversed(made):
        m.close()


def test_a_device_busy_training_through_several_attempts_answers_the_newest_once_and_each_later_attempt_once(wire) -> None:
    co = wire("coordinator")
    dev = wire("device")
    queued = threading.Event()

    def hold() -> None:  # the coordinator runs the round four more times while the device trains
        if dev.trainings:
            return
        for attempt in ("a2", "a3", "a4", "a5"):
            co.announce(0, attempt, m0)
        wait_for(lambda: any(t == co.topics.round and b'"a5"' in p for t, p, _ in list(dev.agent._link.inbox.queue)),
                 "the four attempts to queue up behind the training")
        queued.set()

    dev.gate = hold
    m0 = model(0)
    co.announce(0, "a1", m0)
    wait_for(lambda: len(co.updates) >= 1, "the device's update")
    assert queued.is_set() and dev.trainings == [0]
    wait_for(lambda: dev.agent.delivery.pending is None, "the receipt")
    assert dev.agent.phase == "idle"  # what a screen shows (EdgeAgent.phase): trained, between rounds
    co.announce(0, "a6", m0)  # a later attempt (the round closed without quorum): it gets the stored update once
    wait_for(lambda: len(co.updates) >= 2, "the update for attempt a6")
    co.announce(0, "a6", m0)  # the same attempt again (a reconnection): nothing more
    dev.close()  # stops: everything it sent is at the broker before its last word
    wait_for(lambda: "offline" in co.events, "the device's last word")
    assert co.events.count("update") == 2 and co.updates[0] == co.updates[1]  # 6 sends before: one per attempt id
    assert dev.agent.phase == "offline"
    assert dev.trainings == [0]
    before, after = co.statuses[0], [s for s in co.statuses if s.state != "offline"][-1]
    assert before.warming_up and before.train_s is None  # from the start until its first training finished
    assert not after.warming_up and after.train_s is not None and after.train_s >= 0 and after.upload_s is not None


def test_the_holders_cost_meter_is_where_the_agent_measures_its_rounds(wire) -> None:
    meter = CostMeter()  # the app's: it measures sensing and the battery, and shows the rounds' cost on its screen
    co = wire("coordinator")
    dev = wire("device", cost=meter)
    co.announce(0, "a1", model(0))
    wait_for(lambda: len(co.updates) >= 1, "the device's update")
    wait_for(lambda: bool(meter.rounds()), "the round's cost in the holder's meter")
    assert dev.agent.cost is meter and [r.round for r in meter.rounds()] == [0]


def test_a_round_done_under_another_model_or_no_longer_stored_is_trained_again_not_left_silent(wire) -> None:
    co = wire("coordinator")
    dev = wire("device")
    for r in (2, 3):
        co.announce(r, f"a{r}", model(r))
        wait_for(lambda n=r - 1: len(co.updates) >= n, f"round {r}'s update")  # type: ignore[misc]
    # A coordinator restored from a backup runs rounds 2 and 3 again: round 2 (its update is no longer stored),
    # round 3 under another model (re-trained), and round 3 under the model the stored update was trained from.
    co.announce(2, "b2", model(2))
    wait_for(lambda: len(co.updates) >= 3, "round 2 trained again")
    co.announce(3, "b3", model(3, seed=7))
    wait_for(lambda: len(co.updates) >= 4, "round 3 trained again from the restored model")
    co.announce(3, "c3", model(3, seed=7))
    wait_for(lambda: len(co.updates) >= 5, "round 3's stored update sent to the new attempt")
    assert len(co.updates) == 5 and dev.trainings == [2, 3, 2, 3]  # the last answer was the stored update, not a fifth training
    assert co.updates[4] == co.updates[3] and len({*co.updates[:4]}) == 4


def test_a_device_stopped_mid_round_sends_its_update_and_awaits_its_receipt_before_it_says_offline(wire) -> None:
    co = wire("coordinator", unanswered=1)  # the first copy goes unanswered (the coordinator was busy, or it was lost)
    dev = wire("device", state="s", receipt_wait_s=1.0)
    co.on_update = dev.stop.set  # SIGTERM as the first copy arrives: the device finishes the delivery before its last word
    co.announce(0, "a1", model(0))
    wait_for(lambda: "offline" in co.events, "the device's last word")
    events = [e for e in co.events if e in ("update", "offline")]
    assert events == ["update", "update", "offline"]  # sent again for want of a receipt, confirmed, then offline
    dev.close()
    assert dev.code == 0
    # The update stays stored: the round run again (a new attempt) gets it from a new process, without training.
    co.on_update = lambda: None
    again = wire("device", state="s")
    again.gate = lambda: pytest.fail("the stored update answers the round; no training")
    co.announce(0, "a2", model(0))
    wait_for(lambda: len(co.updates) >= 3, "the stored update, sent by the restarted device")
    assert len(co.updates) == 3 and co.updates[2] == co.updates[0]
