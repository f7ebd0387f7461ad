"""Deadlines follow the devices, a device warming up is no missed deadline, and a device's report of a damaged object
reaches the coordinator, which writes the object again (issue 37 items 4, 8 and 9), without a broker."""

from __future__ import annotations

import time
from pathlib import Path

from coordinator.config import CoordinatorConfig, Timing, TransportSettings
from coordinator.exchange import Exchange, Steering
from coordinator.grid import device_deadline
from coordinator.mqtt_grid import MqttGrid
from coordinator.record import Participation, RoundRecord
from coordinator.round import summary_line
from coordinator.state import RunState
from coordinator.strategies import Federation
from coordinator.transport import Opening
from coordinator.transport.folder_store import FolderBlobStore
from har_io.blobs import object_key
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.messages import ClientStatus

SPEC = ArchSpec(n_classes=6, conv_filters=2, dense_units=4)


def _st(cid: str, **kw: object) -> ClientStatus:
    return ClientStatus(cid, "idle", label_set="hapt6", n_train=10, sent_unix=time.time(), refresh_s=30.0, **kw)  # type: ignore[arg-type]


def test_an_exchange_waits_what_its_slowest_device_needs_and_a_device_without_a_measure_gets_the_whole_deadline() -> None:
    t = Timing(round_timeout_s=200.0, deadline_margin=4.0, deadline_slack_s=60.0)
    fast = {"a": _st("a", train_s=5.0, download_s=1.0, upload_s=1.0), "b": _st("b", train_s=10.0, upload_s=2.0)}
    assert device_deadline(t, fast, ["a"]) == 4 * 7 + 60
    assert device_deadline(t, fast, ["a", "b"]) == 4 * 12 + 60  # the slowest of the selected
    assert device_deadline(t, {**fast, "c": _st("c", train_s=40.0)}, ["a", "c"]) == 200.0  # 220 s, bounded by the setting
    assert device_deadline(t, {**fast, "n": _st("n")}, ["a", "n"]) == 200.0  # no measure yet: its first-round allowance
    assert device_deadline(t, {**fast, "w": _st("w", train_s=1.0, warming_up=True)}, ["a", "w"]) == 200.0  # restarted
    assert device_deadline(Timing(round_timeout_s=200.0, deadline_margin=0.0), fast, ["a"]) == 200.0  # off


def test_a_device_still_warming_up_at_the_close_is_no_missed_deadline_and_the_line_says_what_each_absence_was() -> None:
    ex = Exchange(3, 0, SPEC, frozenset({"a", "b", "c", "d"}), False)
    ex.offline.add("b")
    ex.warming.add("c")
    assert {f.client_id: f.reason for f in ex.failures()} == {"a": "missed_deadline", "b": "offline", "c": "warming_up",
                                                              "d": "missed_deadline"}  # fmt: skip
    full = Exchange(3, 0, SPEC, frozenset({"c", "d"}), False, steering=Steering(close_at=0, unanswered="cohort_full"))
    full.warming.add("c")  # the exchange closed at its goal, waiting for nobody: warming up is not why c is missing
    assert {f.client_id: f.reason for f in full.failures()} == {"c": "cohort_full", "d": "cohort_full"}
    rec = RoundRecord(round=3, participation=Participation(selected=4, updates=0, missing=("a", "b", "c", "d"),
                                                           failures={"b": "offline", "c": "warming_up", "d": "not_finite"}))  # fmt: skip
    assert "0 rejected, 1 missed the deadline, 1 went offline, 1 still warming up, 1 sent no valid update" in summary_line(rec)


def test_a_device_that_found_an_object_damaged_says_so_and_the_coordinator_writes_it_again(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", run_id="r", transport=TransportSettings(kind="blobs"))
    store = FolderBlobStore(tmp_path / "blobs", "http://127.0.0.1:9", b"k" * 32)
    state = RunState(cfg.run_dir)
    try:
        grid = MqttGrid(cfg, state, blob_store=store)
        published = grid.carrier.publish(Federation(SPEC, SPEC, init_state(SPEC, 1)), Opening(0, 0, "att", ("a",), time.time() + 60))
        sha = published.global_id
        path = store.folder / object_key(sha)
        good = path.read_bytes()
        path.write_bytes(good[:-10] + b"\0" * 10)  # the disk under the store spoiled it
        grid.handle(grid.topics.client_status("a"), _st("a", bad_objects=(sha,)).to_bytes())
        assert path.read_bytes() == good
        assert [(e[1], e[2], e[3]) for e in state.events("bad_object")] == [("a", "bad_object", f"{sha} written again")]
        grid.handle(grid.topics.client_status("a"), _st("a", bad_objects=(sha,)).to_bytes())  # the same report again
        assert len(state.events("bad_object")) == 1
    finally:
        state.close()
