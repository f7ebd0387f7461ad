"""A re-sent copy of a counted update is a duplicate, not a rejection; rejections between rounds are counted too (issue 29)."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.exchange import Exchange
from coordinator.mqtt_grid import MqttGrid
from coordinator.record import Participation, RoundRecord
from coordinator.service import Coordinator
from har_io.broker_config import BrokerConfig
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import split_payload

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
META = {"run_id": "r1", "stage": 0, "n_train": 40, "n_test": 10}


def _grid(tmp_path: Path) -> MqttGrid:
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", broker=BrokerConfig.parse("127.0.0.1:9"), run_id="r1")
    return Coordinator(cfg, progress=False).grid


def _update(round_: int, run_id: str = "r1") -> bytes:
    state = {k: v.numpy() for k, v in init_state(SPEC, 1).items()}
    return codec.encode(state, kind="update", round=round_, arch_version=SPEC.version, client_id="c1", meta={**META, "run_id": run_id})


def _send(grid: MqttGrid, data: bytes) -> None:
    for i, chunk in enumerate(split_payload(data, 1 << 20)):
        grid.handle(grid.topics.client_update("c1", i), chunk)


def _open(grid: MqttGrid, round_: int) -> Exchange:
    ex = Exchange(round_, 0, SPEC, frozenset({"c1"}), False)
    grid.receipts.open(round_, 0)
    grid.intake.open(ex, 1 << 30)
    return ex


def _close(grid: MqttGrid) -> None:
    grid.intake.close()
    grid.receipts.close()


def test_a_restarted_devices_resent_update_is_a_duplicate_not_a_stale_round(tmp_path: Path) -> None:
    grid = _grid(tmp_path)
    data = _update(3)
    ex3 = _open(grid, 3)
    _send(grid, data)
    assert list(ex3.updates) == ["c1"] and ex3.rejected == {}
    _close(grid)
    ex4 = _open(grid, 4)
    _send(grid, data)  # the device restarted and re-sends its stored round-3 update
    assert ex4.rejected == {} and ex4.duplicates == {"c1": 1} and ex4.n_duplicates == 1
    assert ex4.updates == {}
    _send(grid, _update(2))  # an update never counted stays a rejection
    assert ex4.rejected == {("c1", "stale_round"): 1}


def test_rejections_and_duplicates_between_rounds_go_into_the_next_exchange(tmp_path: Path) -> None:
    grid = _grid(tmp_path)
    data = _update(3)
    for round_, update in ((3, data), (4, _update(4))):
        _open(grid, round_)
        _send(grid, update)
        assert grid.intake.collecting is not None and list(grid.intake.collecting.updates) == ["c1"]
        _close(grid)
    _send(grid, _update(4, run_id="other"))  # no round open: counted, not dropped
    _send(grid, data)  # between rounds, a copy of the round-3 update: a duplicate
    ex5 = _open(grid, 5)
    assert ex5.rejected == {("c1", "no_open_round"): 1} and ex5.n_rejected == 1
    assert ex5.duplicates == {"c1": 1}
    # counted in the record, but not why c1 has no update in round 5
    assert [(f.client_id, f.reason) for f in ex5.failures()] == [("c1", "missed_deadline")]
    _close(grid)
    assert _open(grid, 6).rejected == {}


def test_the_record_writes_duplicates_only_when_there_were_some() -> None:
    rec = RoundRecord(round=1, participation=Participation(selected=2, updates=2, duplicates=3))
    d = rec.to_json()
    assert d["duplicates"] == 3 and list(d)[-1] == "duplicates"
    assert RoundRecord.from_json(d) == rec and RoundRecord.from_json(d).to_json() == d
    plain = RoundRecord(round=1, participation=Participation(selected=2, updates=2)).to_json()
    assert "duplicates" not in plain
    assert RoundRecord.from_json(plain).participation.duplicates == 0


def test_an_update_for_a_failed_attempt_that_arrives_before_the_next_one_is_no_rejection(tmp_path: Path, mosquitto: int) -> None:
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", broker=BrokerConfig(port=mosquitto), run_id="r1")
    grid = Coordinator(cfg, progress=False).grid
    grid.open()  # close_failed clears the retained announcement at the broker
    try:
        _open(grid, 3)
        _close(grid)
        grid.close_failed(3)  # round 3's attempt closed without quorum (e.g. the broker went down and took every device with it)
        data = _update(3)
        _send(grid, data)  # the device delivers once the broker is back, before the next attempt opens
        _send(grid, _update(2))  # another round's update: a rejection as before
        _send(grid, _update(3, run_id="other"))  # another run's: a rejection as before
        ex = _open(grid, 3)  # the next attempt counts the update that came between the two (its device may have stopped)
        assert ex.rejected == {("c1", "no_open_round"): 2} and ex.duplicates == {} and list(ex.updates) == ["c1"]
        _send(grid, data)  # the device sends its stored update again: its chunks are answered with a receipt, nothing more
        assert list(ex.updates) == ["c1"] and ex.rejected == {("c1", "no_open_round"): 2} and ex.duplicates == {}
        assert list(grid.receipts.accepted_transfers) == ["c1"]
    finally:
        grid.close()


def test_a_device_answers_a_round_once_however_many_attempts_it_takes(tmp_path: Path) -> None:
    """A round that failed its quorum runs again under the same attempt with the updates it counted (their devices have
    their receipts and send nothing more); when the model changed meanwhile, a new attempt counts nothing of the old."""
    grid = _grid(tmp_path)
    first = _open(grid, 3)
    _send(grid, _update(3))
    assert list(first.updates) == ["c1"]
    _close(grid)
    attempt = grid.attempt
    grid.close_failed(3)
    grid.new_attempt(3, same_model=True)
    again = _open(grid, 3)
    assert grid.attempt == attempt and list(again.updates) == ["c1"] and again.duplicates == {}  # counted, nothing re-sent
    _close(grid)
    grid.close_failed(3)
    grid.new_attempt(3, same_model=False)  # an operator's pin changed the model: a new attempt, trained afresh
    fresh = _open(grid, 3)
    assert grid.attempt != attempt and fresh.updates == {}
    _send(grid, _update(3))  # what the device sends now counts, and is no copy of the forgotten one
    assert list(fresh.updates) == ["c1"] and fresh.duplicates == {}
