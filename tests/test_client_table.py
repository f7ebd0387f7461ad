"""The one client table: parsing a status against its topic, presence with the protocol's three periods, last seen,
and the offline will that keeps what the device last reported. The grid, the status page's monitor and the device
commands all read statuses through it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.client_table import ClientTable
from coordinator.mqtt_grid import MqttGrid
from coordinator.server.monitor import Monitor
from har_models.wire.messages import ClientStatus, MessageError
from har_models.wire.topics import Topics

T0, U0 = 1000.0, 1_700_000_000.0  # monotonic and wall-clock time of the first arrival (s)


def _status(cid: str = "phone-a", **kw: object) -> bytes:
    return ClientStatus(cid, **{"state": "idle", **kw}).to_bytes()  # type: ignore[arg-type]


def test_a_live_status_is_online_for_three_refresh_periods_from_its_arrival() -> None:
    table = ClientTable()
    st = table.note("phone-a", _status(n_train=40, n_test=10, sent_unix=U0 - 5, refresh_s=30.0), False, T0, U0)
    assert st is not None and st.n_train == 40
    assert dict(table) == {"phone-a": st} and len(table) == 1
    assert table.online("phone-a", T0 + 89.9) and not table.online("phone-a", T0 + 90.0)  # 3 x 30 s
    assert table.seen()["phone-a"].received_unix == U0
    assert table.seen()["phone-a"].last_seen_unix == U0 - 5  # the time the status carries


def test_a_retained_status_is_aged_from_the_time_it_carries() -> None:
    table = ClientTable()
    table.note("phone-a", _status(sent_unix=U0 - 60, refresh_s=30.0), True, T0, U0)
    assert table.online("phone-a", T0 + 29.9) and not table.online("phone-a", T0 + 30.0)  # 90 s - 60 s already gone


def test_last_seen_is_the_arrival_when_the_status_carries_no_time() -> None:
    table = ClientTable()
    table.note("phone-a", _status(), False, T0, U0)
    assert table.seen()["phone-a"].last_seen_unix == U0
    assert table.online("phone-a", T0 + 1e6)  # refresh_s 0: a client that does not refresh never expires


def test_an_offline_will_keeps_what_the_device_last_reported_and_latest_is_the_will() -> None:
    table = ClientTable()
    table.note("phone-a", _status(n_train=40, n_test=10, backend="torch"), False, T0, U0)
    will = table.note("phone-a", _status(state="offline"), False, T0 + 1, U0 + 1)
    assert will is not None and will.n_train == 0
    known = table["phone-a"]
    assert (known.state, known.n_train, known.n_test, known.backend) == ("offline", 40, 10, "torch")
    assert table.latest("phone-a") == will and not table.online("phone-a", T0 + 1)
    assert table.seen()["phone-a"].received_unix == U0 + 1


def test_an_empty_payload_forgets_the_device() -> None:
    table = ClientTable()
    table.note("phone-a", _status(), False, T0, U0)
    assert table.note("phone-a", b"", True, T0 + 1, U0 + 1) is None
    assert "phone-a" not in table and table.latest("phone-a") is None and dict(table.seen()) == {}
    assert not table.online("phone-a", T0 + 1)


@pytest.mark.parametrize(
    ("payload", "match"),
    [(b"{not json", "not valid JSON"), (_status("phone-b"), "claims to be 'phone-b'"), (b'{"protocol": 1}', "client_id")],
)
def test_a_bad_status_raises_and_changes_nothing(payload: bytes, match: str) -> None:
    table = ClientTable()
    before = table.note("phone-a", _status(n_train=7), False, T0, U0)
    with pytest.raises(MessageError, match=match):
        table.note("phone-a", payload, False, T0 + 1, U0 + 1)
    assert table["phone-a"] == before and table.seen()["phone-a"].received_unix == U0


def test_an_id_used_by_two_processes_is_never_fresh() -> None:
    table = ClientTable()
    for inst in ("one", "two", "one"):  # an instance that another replaced came back
        table.note("phone-a", _status(instance=inst), False, T0, U0)
    assert "phone-a" in table.presence.conflicts and not table.online("phone-a", T0)


def test_the_grid_and_the_monitor_hold_the_same_kind_of_table(tmp_path) -> None:
    from coordinator.config import CoordinatorConfig
    from coordinator.state import RunState

    cfg = CoordinatorConfig(run_dir=tmp_path / "run", federation="home")
    state = RunState(cfg.run_dir)
    try:
        grid = MqttGrid(cfg, state)
        assert isinstance(grid.clients, ClientTable) and grid.presence is grid.clients.presence
        grid._on_status("phone-a", _status(n_train=3))
        grid._on_status("phone-a", _status("phone-b"))  # refused by the table: nothing changes
        assert dict(grid.statuses()) == {"phone-a": ClientStatus("phone-a", "idle", n_train=3)}
    finally:
        state.close()
    mon = Monitor(Topics("home"), clock=lambda: T0, wall=lambda: U0)
    mon.handle(Topics("home").client_status("phone-a"), _status(n_train=3, sent_unix=U0 - 2, refresh_s=30.0))
    mon.handle(Topics("home").client_status("phone-a"), _status("phone-b"))
    seen = mon.snapshot().devices["phone-a"]
    assert (seen.online, seen.last_seen_unix, seen.status.n_train) == (True, U0 - 2, 3)
    assert mon.snapshot().malformed == {"status": 1}


def test_eligibility_reads_the_statuses_waiting_in_the_inbox_before_judging_presence(tmp_path: Path) -> None:
    """After minutes without reading the broker (aggregation, evaluation), a device whose newest status waits in the
    inbox is present: its status is read before presence is judged, not after."""
    from coordinator.config import CoordinatorConfig
    from coordinator.state import RunState

    cfg = CoordinatorConfig(run_dir=tmp_path / "run", federation="home")
    state = RunState(cfg.run_dir)
    try:
        grid = MqttGrid(cfg, state)
        grid.handle(grid.topics.client_status("phone-a"), _status(n_train=3, sent_unix=time.time(), refresh_s=0.02))  # stale after 0.06 s
        time.sleep(0.2)
        assert grid.clients.online("phone-a") is False
        grid.inbox.put((grid.topics.client_status("phone-a"), _status(n_train=3, sent_unix=time.time(), refresh_s=30.0), False))
        assert list(grid.eligibility().eligible) == ["phone-a"] and grid.inbox.empty()
    finally:
        state.close()
