"""The coordinator's refused-id predicate, message by message, without a broker: a revoked device's status is
not counted as present, its update chunks are rejected with reason ``revoked``, an update it sent before the
revocation is taken out of the open exchange when it closes, and it is never eligible. Without a predicate
(``fedhar-coordinator run``) nothing changes. Also the epoch in the messages and the client's reaction."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from coordinator.admission import OPEN, Admission
from coordinator.config import CoordinatorConfig
from coordinator.exchange import Exchange
from coordinator.mqtt_grid import MqttGrid
from coordinator.service import Coordinator
from coordinator.updates import ClientUpdate
from har_io.broker_config import BrokerConfig
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.chunking import split_payload
from har_models.wire.messages import ClientStatus, CoordinatorStatus, RoundAnnouncement
from har_models.wire.topics import Topics

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def _coordinator(tmp_path: Path, revoked: set[str] | None, epoch: int = 0) -> MqttGrid:
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", broker=BrokerConfig.parse("127.0.0.1:9"), run_id="r1")
    admission = OPEN if revoked is None else Admission(revoked=revoked.__contains__)
    return Coordinator(cfg, progress=False, admission=admission, epoch=epoch).grid


def _status(cid: str) -> bytes:
    return ClientStatus(cid, "online", label_set="hapt6", n_train=50, sent_unix=time.time(), refresh_s=30.0).to_bytes()


def _update(cid: str) -> ClientUpdate:
    return ClientUpdate(cid, 0, 0, 50, 10, init_state(SPEC, 1), None, size=1234)


def _eligible(co: MqttGrid) -> list[str]:
    return list(co.eligibility().eligible)


TOPICS = Topics("default")


def test_a_revoked_status_is_not_present_and_it_is_never_eligible(tmp_path: Path) -> None:
    revoked: set[str] = set()
    co = _coordinator(tmp_path, revoked)
    for cid in ("a", "b", "c"):
        co.handle(TOPICS.client_status(cid), _status(cid))
    assert _eligible(co) == ["a", "b", "c"]
    revoked.add("c")
    assert _eligible(co) == ["a", "b"]  # asked at every look, so another process's revocation counts at once
    co.handle(TOPICS.client_status("c"), _status("c"), retained=True)  # its late retained status
    assert "c" not in co.clients and _eligible(co) == ["a", "b"]


def test_update_chunks_of_a_revoked_device_are_rejected_as_revoked(tmp_path: Path) -> None:
    revoked = {"c"}
    co = _coordinator(tmp_path, revoked)
    ex = Exchange(0, 0, SPEC, frozenset({"a", "c"}), False)
    co.intake.open(ex, 1 << 20)
    for chunk in split_payload(b"x" * 5000, 4096):
        co.handle(TOPICS.client_update("c", 0), chunk)
    assert ex.rejected == {("c", "revoked"): 2} and ex.updates == {}
    assert ex.failures()[1].client_id == "c"


def test_an_update_received_before_the_revocation_is_not_counted(tmp_path: Path) -> None:
    revoked: set[str] = set()
    co = _coordinator(tmp_path, revoked)
    ex = Exchange(0, 0, SPEC, frozenset({"a", "c"}), False)
    ex.add(_update("a"))
    ex.add(_update("c"))
    assert ex.bytes_up == 2468
    co.intake.open(ex, 1 << 20)
    revoked.add("c")  # revoked while the round is open
    co.intake.close()
    assert list(ex.updates) == ["a"] and ex.bytes_up == 1234
    assert ex.rejected == {("c", "revoked"): 1} and "c" in ex.offline and ex.complete()
    assert [(f.client_id, f.reason) for f in ex.failures()] == [("c", "offline")]


def test_without_a_predicate_nothing_is_refused(tmp_path: Path) -> None:
    co = _coordinator(tmp_path, None)
    assert not co.admission.refused("c")
    co.handle(TOPICS.client_status("c"), _status("c"))
    assert _eligible(co) == ["c"]


def test_the_epoch_is_in_the_status_and_left_out_when_zero(tmp_path: Path) -> None:
    assert CoordinatorStatus.from_bytes(_coordinator(tmp_path / "x", set(), epoch=7).status_bytes("online")).epoch == 7
    plain = _coordinator(tmp_path / "y", None).status_bytes("online")
    assert b"epoch" not in plain and CoordinatorStatus.from_bytes(plain).epoch == 0
    ann = RoundAnnouncement("r1", 3, "training", SPEC.to_dict(), "hapt6", epoch=2)
    assert RoundAnnouncement.from_bytes(ann.to_bytes()).epoch == 2
    assert b'"epoch"' not in RoundAnnouncement("r1", 3, "training", SPEC.to_dict(), "hapt6").to_bytes()
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        RoundAnnouncement.from_bytes(ann.to_bytes().replace(b'"epoch": 2', b'"epoch": -1'))
    with pytest.raises(ValueError, match="charging must be true, false or left out"):
        ClientStatus.from_bytes(ClientStatus("a", "online").to_bytes().replace(b"{", b'{"charging": 1, ', 1))
    assert ClientStatus.from_bytes(ClientStatus("a", "online", charging=False).to_bytes()).charging is False
    assert b"charging" not in ClientStatus("a", "online").to_bytes()


def test_a_client_drops_the_old_epochs_round_and_announces_itself(tmp_path: Path) -> None:
    from edge_client.agent import ClientConfig, EdgeAgent
    from edge_client.coordinator_watch import CoordinatorWatch
    from edge_client.delivery import PendingUpdate
    from edge_client.store import ClientStore

    store = ClientStore.__new__(ClientStore)  # the agent's reaction needs no windows: a bare store is enough here
    agent = EdgeAgent.__new__(EdgeAgent)
    agent.cfg = ClientConfig("a", BrokerConfig.parse("127.0.0.1:9"))
    agent.store, agent.epoch, agent.announcement = store, 0, None
    published: list[str] = []
    agent._state = "idle"
    agent._set_state = lambda state: published.append(state)  # type: ignore[method-assign]

    class _Delivery:
        pending: PendingUpdate | None = None
        restarts = 0

        def after_restart(self) -> None:
            self.restarts += 1

    agent.delivery = _Delivery()  # type: ignore[assignment]
    agent.topics = Topics("f")
    agent.watch = CoordinatorWatch("a")
    agent._link = type("L", (), {"connected": threading.Event()})()
    old = RoundAnnouncement("r1", 4, "training", SPEC.to_dict(), "hapt6", selected=("a",), epoch=1)
    agent._handle(agent.topics.round, old.to_bytes())
    assert agent.epoch == 1 and agent.announcement == old and published == []  # the first epoch seen only sets it
    agent._handle(agent.topics.coordinator_status, CoordinatorStatus("online", "r1", "x2", epoch=2).to_bytes())
    assert agent.epoch == 2 and agent.announcement is None and published == ["idle"]
    assert agent.delivery.restarts == 1  # an upload awaiting its receipt goes to the new coordinator (test_delivery)
    agent._handle(agent.topics.round, old.to_bytes())  # the old epoch's retained round, delivered again
    assert agent.announcement is None
    agent._handle(agent.topics.coordinator_status, CoordinatorStatus("offline", "r1", "x1", epoch=1).to_bytes())  # a late will
    assert agent.coordinator is not None and agent.coordinator.epoch == 2 and agent.coordinator.state == "online"
    unserved = RoundAnnouncement("r2", 0, "training", SPEC.to_dict(), "hapt6")  # epoch 0: a `run` coordinator, always taken
    agent._handle(agent.topics.round, unserved.to_bytes())
    assert agent.announcement == unserved
