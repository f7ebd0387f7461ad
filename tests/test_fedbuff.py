"""Buffered asynchronous rounds (FedBuff, coordinator/rounds/buffered.py; Nguyen et al., AISTATS 2022, Algorithm 1)."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from support.configs import config
from support.inmemory_grid import InMemoryGrid, device_status

from coordinator.config import BufferSettings, CohortSettings, CoordinatorConfig, ModelSettings, TrainingSettings
from coordinator.exchange import Exchange, published_models
from coordinator.record import RoundRecord
from coordinator.rounds import Late, Steering, compose
from coordinator.rounds import buffered as fedbuff
from coordinator.runner import FederationRunner
from coordinator.state import RunState
from coordinator.strategies import Federation
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.messages import Receipt, TrainingPlan

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def _cfg(tmp_path: Path, **kw: Any) -> CoordinatorConfig:
    return config(dict(run_dir=tmp_path / "run", rounds=3, min_clients=2, model=ModelSettings(conv_filters=4, dense_units=8),
                       aggregation="fedavg"), kw)


def _update(cid: str, state: Mapping[str, torch.Tensor], round_: int = 0, n_train: int = 10) -> ClientUpdate:
    return ClientUpdate(cid, round_, 0, n_train, 5, dict(state), None, size=100)


# ---------------------------------------------------------------- the arithmetic, by hand
def test_the_staleness_weight_is_one_over_the_root_of_one_plus_tau() -> None:
    assert [fedbuff.staleness_weight(t) for t in (0, 1, 3, 8)] == [1.0, 1 / math.sqrt(2), 0.5, 1 / 3]
    with pytest.raises(ValueError, match="staleness"):
        fedbuff.staleness_weight(-1)


def test_a_stale_update_is_its_weighted_change_rebased_onto_the_current_model() -> None:
    old = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    now = {"w": torch.tensor([3.0, 3.0]), "b": torch.tensor([1.0])}
    y = {"w": torch.tensor([2.0, 0.0]), "b": torch.tensor([4.0])}  # change from old: (+1, -2), (+4)
    out = fedbuff.rebase(_update("a", y), old, now, tau=3)  # s(3) = 1/2
    assert torch.equal(out.state["w"], torch.tensor([3.5, 2.0])) and torch.equal(out.state["b"], torch.tensor([3.0]))
    assert out.n_train == 10 and out.client_id == "a"
    fresh = fedbuff.rebase(_update("a", y), now, now, tau=0)  # tau 0 from the current model: the update itself
    assert all(torch.equal(fresh.state[k], y[k]) for k in y)
    with pytest.raises(ValueError, match="shape"):
        fedbuff.rebase(_update("a", {"w": torch.zeros(3), "b": torch.zeros(1)}), old, now, tau=1)
    with pytest.raises(ValueError, match="other tensors"):
        fedbuff.rebase(_update("a", {"w": torch.zeros(2)}), old, now, tau=1)


def test_fold_keeps_fresh_updates_first_per_client_and_orders_the_buffer_by_client_id() -> None:
    x = {"w": torch.zeros(2)}
    v2 = fedbuff.Version(2, SPEC, {"w": torch.ones(2)}, set())
    stale = [fedbuff.Stale(_update("c", {"w": torch.full((2,), 5.0)}, 2), v2),
             fedbuff.Stale(_update("a", {"w": torch.full((2,), 9.0)}, 2), v2)]  # fmt: skip
    fresh = [_update("b", {"w": torch.full((2,), 7.0)}, 4), _update("a", {"w": torch.full((2,), 3.0)}, 4)]
    out, taus = fedbuff.fold(stale, fresh, 4, SPEC, x)
    assert [u.client_id for u in out] == ["a", "b", "c"]
    assert torch.equal(out[0].state["w"], torch.full((2,), 3.0))  # a's fresh update, as sent
    assert taus == {"c": 2}  # "a" sent a fresh update too: its stale one is left out
    c = next(u for u in out if u.client_id == "c")
    assert torch.allclose(c.state["w"], torch.full((2,), 4.0 / math.sqrt(3)))  # 0 + s(2) x (5 - 1)
    grown = fedbuff.Version(1, ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=1), {"w": torch.ones(2)}, set())
    out, taus = fedbuff.fold([fedbuff.Stale(_update("d", {"w": torch.ones(2)}, 1), grown)], [], 4, SPEC, x)
    assert out == [] and taus == {}  # trained on another architecture: not folded


def test_in_flight_forgets_a_device_once_its_update_arrived_it_vanished_or_its_version_is_too_old() -> None:
    f = fedbuff.InFlight(max_staleness=2)
    f.close(0, SPEC, {}, ["a", "b"])
    f.close(1, SPEC, {}, ["c"])
    assert f.training() == {"a", "b", "c"} and len(f) == 3
    assert f.version_of("a", 0) is not None and f.version_of("a", 1) is None and f.version_of("z", 0) is None
    f.arrived("a", 0)
    assert f.training() == {"b", "c"}
    assert f.drop({"c", "zz"}) == {"c"} and f.training() == {"b"}
    assert f.version_of("b", 0) is not None  # round 2 may take version 0's update: tau = 2 = max_staleness
    f.close(2, SPEC, {}, [])  # round 3 would take it with tau 3, beyond max_staleness 2: b is free again
    assert f.training() == set() and f.version_of("b", 0) is None
    with pytest.raises(ValueError, match="max_staleness"):
        fedbuff.InFlight(0)


def test_the_versions_still_training_after_a_restart_keep_their_upload_slots_open_to_their_staleness_bound(tmp_path: Path) -> None:
    """A restarted coordinator takes back the versions devices still train (BufferedRounds.restore); each opening names
    them with their last round (Steering.earlier), so the blob carrier keeps those devices' slots open."""
    policy = fedbuff.BufferedRounds(CoordinatorConfig(run_dir=tmp_path, buffer=BufferSettings(size=2, max_staleness=2)))
    policy.restore({"in_flight": {"3": ["c"], "4": ["d", "e"], "1": ["gone"]}},
                   lambda r: (SPEC, {}) if r >= 3 else None)  # version 1 is no longer kept: dropped  # fmt: skip
    assert policy.training() == {"c", "d", "e"}
    steering = policy.steering(0.0, 60.0, 3, 3)
    assert steering.earlier() == {3: 5, 4: 6} and steering.late_rounds == 2
    policy.in_flight.arrived("c", 3)
    assert steering.earlier() == {4: 6}  # read at each opening: a version nobody trains any more closes its slots
    assert Steering().earlier() == {}


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("kw", "what"),
    [
        (dict(buffer=BufferSettings(size=2), aggregation="feddwa"), "personalised"),
        (dict(buffer=BufferSettings(size=2), aggregation="fedper"), "personalised"),
        (dict(buffer=BufferSettings(size=2), growth="feddist"), "cannot grow"),
        (dict(buffer=BufferSettings(size=2), cohort=CohortSettings(goal=2)), "set one of them"),
        (dict(buffer=BufferSettings(size=1)), "at least min_clients"),
        (dict(buffer=BufferSettings(size=3, concurrency=2)), "concurrency"),
        (dict(buffer=BufferSettings(size=2, max_staleness=0)), "max_staleness"),
        (dict(buffer=BufferSettings(size=-1)), "size >= 0"),
    ],
)
def test_settings_buffered_rounds_cannot_honour_are_refused_by_name(tmp_path: Path, kw: dict[str, Any], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        _cfg(tmp_path, **kw)


def test_buffered_rounds_are_off_by_default_and_run_with_every_single_model_strategy(tmp_path: Path) -> None:
    assert CoordinatorConfig(run_dir=tmp_path).buffer.size == 0
    for name in ("fedavg", "fedavgm", "fedexp", "fedadam", "fedprox"):
        assert _cfg(tmp_path, aggregation=name, buffer=BufferSettings(size=2)).buffer.size == 2


# ---------------------------------------------------------------- the runner, with devices one round late
class LateGrid(InMemoryGrid):
    """Buffered rounds in memory, as the coordinator's MQTT grid runs them: devices answer in id order, devices in
    ``late`` (and any the round closed without) answer in the next exchange, from the model their round sent.

    A round closes once it is full (the stale updates, which arrive first, included); the devices it did not wait
    for go on training, and their updates reach the round policy as FedBuff's stale updates of the version they
    trained, through ``late`` (the policy's :meth:`~coordinator.rounds.base.RoundPolicy.late`, as the intake asks it).
    """

    def __init__(self, devices: Mapping[str, Any], late: set[str], policy_late: Callable[[str, int, int], Late | None]):
        super().__init__(devices)
        self.late = late
        self.policy_late = policy_late
        self._next: list[ClientUpdate] = []

    def exchange(self, fed: Federation, label_set: str, round_: int, stage: int, selected: Sequence[str],
                 plan: TrainingPlan, steering: Steering) -> Exchange:  # fmt: skip
        self.log.append(("exchange", round_, stage, tuple(selected)))
        ex = Exchange(round_, stage, fed.spec, frozenset(selected), plan.guidance, steering, reference=published_models(fed))
        for upd in self._next:
            late = self.policy_late(upd.client_id, upd.round, upd.stage)
            assert late is not None and late.take is not None
            late.take(upd)
        self._next = []
        for cid in selected:
            if cid not in self.late and not ex.complete():
                ex.add(self.train(cid, fed.global_state, round_, stage, plan))
        self._next = [self.train(cid, fed.global_state, round_, stage, plan) for cid in selected if cid not in ex.updates]
        return ex


def _late_runner(tmp_path: Path, devices: Mapping[str, Any], late: set[str], **kw: Any) -> tuple[FederationRunner, LateGrid]:
    cfg = _cfg(tmp_path, **kw)
    state = RunState(cfg.run_dir)
    parts = compose(cfg, state)
    grid = LateGrid(devices, late, parts.policy.late)
    return FederationRunner(cfg, grid, state=state, parts=parts), grid


def test_a_buffered_round_folds_a_late_device_with_its_staleness_weight_and_does_not_select_it_while_it_trains(
    tmp_path: Path,
) -> None:
    devices = {c: device_status(c, 10) for c in ("a", "b", "c")}  # steps 0.01, 0.02, 0.03 on every float tensor
    runner, grid = _late_runner(tmp_path, devices, {"c"}, buffer=BufferSettings(size=2))
    runner.start(resume=False)
    runner.ensure_federation()
    w = "conv.weight"
    g0 = runner.model()[1][w].clone()
    r0 = runner.run_round(0)
    assert r0 is not None and r0.participation.stale == {}  # a and b, fresh
    assert r0.participation.failures == {"c": "still_training"}
    g1 = runner.model()[1][w].clone()
    assert torch.allclose(g1, g0 + 0.015, atol=1e-6)  # FedAvg of +0.01 and +0.02, equal n
    r1 = runner.run_round(1)
    exchanges = [e[3] for e in grid.log if e[0] == "exchange"]
    assert exchanges[1] == ("a", "b")  # c was still training: not selected
    # c's update (+0.03 from g0) arrived first and a's filled the buffer of K = 2; b trains on
    assert r1 is not None and r1.participation.stale == {"c": 1} and r1.participation.failures == {"b": "still_training"}
    g2 = runner.model()[1][w].clone()
    assert torch.allclose(g2, g1 + (0.01 + 0.03 / math.sqrt(2)) / 2, atol=1e-6)  # s(1) = 1/sqrt(2)
    assert RoundRecord.from_json(r1.to_json()).participation.stale == {"c": 1}  # the record keeps it
    r2 = runner.run_round(2)
    assert r2 is not None and r2.participation.stale == {"b": 1}
    assert [e[3] for e in grid.log if e[0] == "exchange"][2] == ("a", "c")  # c is free again; b was training


def test_a_synchronous_record_has_no_stale_key(tmp_path: Path) -> None:
    grid = InMemoryGrid({c: device_status(c, 10) for c in ("a", "b")})
    runner = FederationRunner(_cfg(tmp_path), grid)
    runner.start(resume=False)
    rec = runner.run_round(0)
    assert rec is not None and "stale" not in rec.to_json() and rec.participation.stale == {}


# ---------------------------------------------------------------- the MQTT grid's intake
def _grid_and_sender(tmp_path: Path, **kw: Any) -> tuple[Any, Any, Callable[[str, int], None]]:
    from coordinator.service import Coordinator
    from har_io.broker_config import BrokerConfig
    from har_models.wire import codec
    from har_models.wire.chunking import split_payload

    cfg = _cfg(tmp_path, broker=BrokerConfig.parse("127.0.0.1:9"), run_id="r1", **kw, training=TrainingSettings(update_encoding="float32"))
    co = Coordinator(cfg, progress=False)
    grid = co.grid

    def send(cid: str, round_: int) -> None:
        state = {k: (v + 0.5).numpy() for k, v in init_state(SPEC, 1).items()}
        meta = {"run_id": "r1", "stage": 0, "n_train": 40, "n_test": 10}
        for i, chunk in enumerate(split_payload(codec.encode(state, kind="update", round=round_, arch_version=SPEC.version,
                                                             client_id=cid, meta=meta), 1 << 20)):  # fmt: skip
            grid.handle(grid.topics.client_update(cid, i), chunk)

    return grid, co.runner.policy, send


def test_the_mqtt_grid_takes_the_update_of_a_device_still_training_an_earlier_version_into_the_buffer(tmp_path: Path) -> None:
    grid, policy, send = _grid_and_sender(tmp_path, buffer=BufferSettings(size=2, max_staleness=2))
    assert isinstance(policy, fedbuff.BufferedRounds)
    x0 = init_state(SPEC, 1)
    policy.in_flight.close(0, SPEC, x0, ["old"])  # round 0 closed while "old" still trained; 4 back from round 4
    policy.in_flight.close(3, SPEC, x0, ["late"])  # round 3 closed while "late" still trained its model x0
    assert policy.training() == {"late"}
    sent: list[tuple[str, bytes]] = []

    class Link:  # the receipts' link, connected: what they publish is kept
        connected = threading.Event()

        def publish_nowait(self, topic: str, payload: bytes, retain: bool = False) -> None:
            sent.append((topic, payload))

    Link.connected.set()
    grid.receipts.link = Link()
    send("late", 3)  # between exchanges: kept for the next one
    assert len(policy.held) == 1 and policy.training() == set()
    receipt = Receipt.from_bytes(sent[-1][1])  # confirmed to the device, naming its own round
    assert sent[-1][0] == grid.topics.client_receipt("late") and (receipt.round, receipt.stage, receipt.state) == (3, 0, "accepted")
    ex = Exchange(4, 0, SPEC, frozenset({"a", "b"}), False, policy.steering(0.0, 1.0, 2, 2))
    grid.intake.open(ex, 1 << 30)
    grid.receipts.open(4, 0)
    send("other", 3)  # a round-3 update of a device round 3 did not leave training: refused as before
    send("old", 0)  # beyond max_staleness 2: refused, as without buffered rounds
    send("late", 3)  # the same update again: a copy, not a second entry in the buffer
    assert ex.rejected == {("other", "not_selected"): 1, ("old", "not_selected"): 1}
    assert ex.duplicates == {"late": 1} and len(policy.held) == 1
    assert not ex.complete()
    send("a", 4)
    assert ex.complete() and len(ex.updates) == 1  # one fresh, one stale: K = 2
    s = policy.held[0]
    assert s.update.client_id == "late" and s.version.round == 3
    assert all(torch.allclose(s.update.state[k], x0[k] + 0.5) for k in x0)  # as sent, decoded against its version


def test_an_exchange_that_every_selected_device_answered_waits_while_earlier_versions_are_still_training() -> None:
    ex = Exchange(5, 0, SPEC, frozenset({"a"}), False, Steering(close_at=3, unanswered="still_training"), awaited=1)
    ex.add(_update("a", {}, 5))
    assert not ex.complete()  # one device still trains version 4: its update may fill the buffer
    ex.awaited = 0
    assert ex.complete()  # nobody else can answer: close with what is there (the quorum decides)


# ---------------------------------------------------------------- real clients over MQTT
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["mqtt", "blobs"])
def test_a_simulated_federation_in_buffered_rounds_folds_the_updates_of_clients_still_training(
    small_simulation: Callable[..., dict[str, Any]], transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fedhar.coordinator")
    # 4 clients in one worker train one at a time: each round closes at K = 2, the clients it did not wait for train
    # on and their updates land in a later round's buffer as stale ones; nothing is rejected, every round counts
    doc = small_simulation("--rounds", "4", "--buffer-size", "2", "--transport", transport, "--workers", "1", clients=4)
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r["updates"] >= 2 and r["rejected"] == 0 for r in rounds)
    stale = [r.get("stale", {}) for r in rounds]
    assert stale[0] == {} and any(stale[1:]), stale
    assert all(1 <= tau <= 4 for s in stale for tau in s.values())
    assert all(set(r.get("failures", {}).values()) <= {"still_training"} for r in rounds)
    assert doc["config"]["buffer"]["size"] == 2
    if transport == "blobs":  # every counted update, stale ones too, came through the store, and at most one per
        # selection (a client still training the last round may upload before the run ends; a stale update is left
        # out of a buffer that holds a fresh one of the same client)
        taken = re.search(r"(\d+) upload\(s\) taken", caplog.text)
        assert taken is not None, caplog.text[-2000:]
        assert sum(r["updates"] for r in rounds) <= int(taken[1]) <= sum(r["selected"] for r in rounds)


def test_a_client_uploads_to_its_blob_grant_after_a_buffered_round_closed_without_it(tmp_path: Path, monkeypatch: Any) -> None:
    # The device trains round 3 over blobs; round 4 is announced (without it, over MQTT) while it trains: the update still
    # goes once to round 3's slot, the transport the exchange it was trained for named, not in chunks over the broker.
    import numpy as np

    from edge_client import blob_upload
    from edge_client.agent import ClientConfig, EdgeAgent
    from edge_client.store import ClientStore
    from edge_client.trainer import RoundOutcome
    from har_io.broker_config import BrokerConfig
    from har_models.data.labels import HAPT_LABELS
    from har_models.wire import codec
    from har_models.wire.blob_messages import BlobGrant, UploadGrant
    from har_models.wire.chunking import transfer_id
    from har_models.wire.messages import CoordinatorStatus, RoundAnnouncement
    from har_models.wire.topics import Topics

    agent = EdgeAgent(ClientConfig("a", BrokerConfig(port=9), backend="numpy"), ClientStore(tmp_path / "a", HAPT_LABELS))
    spec, topics = SPEC.to_dict(), Topics()
    model = codec.encode({"w": np.zeros(2, np.float32)}, kind="model", round=3, arch_version=SPEC.version)
    update = codec.encode({"w": np.ones(2, np.float32)}, kind="update", round=3, arch_version=SPEC.version, client_id="a",
                          meta={"run_id": "r", "stage": 0})  # fmt: skip
    agent._handle(topics.coordinator_status, CoordinatorStatus("online", "r", "att").to_bytes())
    agent._handle(topics.round, RoundAnnouncement("r", 3, "training", spec, "hapt6", global_model=transfer_id(model),
                                                  attempt="att", transport="blobs", deadline_unix=4e9).to_bytes())  # fmt: skip
    agent._handle(topics.client_grant("a"), BlobGrant("r", 3, 0, "att", UploadGrant("http://127.0.0.1:9/u", 4e9, 4096)).to_bytes())
    agent.models[transfer_id(model)] = model
    sent: list[tuple[str, ...]] = []
    agent._link.connected.set()  # the broker session, as the delivery sees it
    monkeypatch.setattr(agent._link, "publish_nowait", lambda *a, **k: None)
    monkeypatch.setattr(agent._link, "publish", lambda topic, payload, **k: sent.append(("notice", topic)))
    monkeypatch.setattr(agent._link, "publish_chunks", lambda *a, **k: sent.append(("chunks",)))  # never called: asserted below
    monkeypatch.setattr(blob_upload, "upload_update", lambda upload, payload: sent.append(("put", upload.url, transfer_id(payload))))

    def train(ann: RoundAnnouncement, transfer: str, key: tuple[str, int, int]) -> RoundOutcome:
        round4 = RoundAnnouncement("r", 4, "training", spec, "hapt6", selected=("b",), attempt="att", deadline_unix=4e9)
        agent._link.inbox.put((topics.round, round4.to_bytes(), False))  # announced while this client trains
        return RoundOutcome(update, None, {})  # type: ignore[arg-type]

    monkeypatch.setattr(agent.rounds, "decode_and_train", train)
    agent._maybe_work()
    assert agent.announcement is not None and agent.announcement.round == 4
    assert sent == [("put", "http://127.0.0.1:9/u", transfer_id(update)), ("notice", topics.client_update("a", "blob"))]
