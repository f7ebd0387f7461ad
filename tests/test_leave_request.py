"""A device's request to leave, on the server: read off its status, kept for the operator, listed, answered.

The server is constructed as ``serve`` does, without a broker: the device's statuses are put on its
link's inbox as the broker delivers them, and the grid's own pump reads them. What the broker's ACL
adds (only the device's account writes its status) is tested with a real Mosquitto in
tests/test_app_leave.py and tests/test_mosquitto_config.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from test_serve import FED, _settings

from coordinator.server.device_tables import device_table
from coordinator.server.lifecycle import drop_leave_request, leave_lines, leave_requests, note_leave_request
from edge_client.leave import leaving_status
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus

SENT = 1_700_000_000.0


def test_the_grid_takes_a_device_that_left_as_offline_and_never_selectable(tmp_path: Path) -> None:
    """The network grid reads the request off the device's status (delivered on its link's inbox as the broker would)."""
    from coordinator.server.serve import Server

    data = tmp_path / "data"
    _settings(data)
    server = Server(data, BrokerConfig.parse("127.0.0.1:9"), FED)  # not started: no broker needed
    try:
        server.registry.enrol("phone-1", "Anna")
        server.registry.enrol("phone-2", None)
        grid = server.grid
        topics = grid.topics  # type: ignore[attr-defined]  # the MQTT grid's own

        def deliver(cid: str, payload: bytes) -> None:
            grid.handle(topics.client_status(cid), payload)  # type: ignore[attr-defined]  # as the broker delivers it

        for cid in ("phone-1", "phone-2"):
            deliver(cid, ClientStatus(cid, "idle", n_train=40, sent_unix=time.time(), refresh_s=30.0).to_bytes())
        clients = grid.clients  # type: ignore[attr-defined]
        assert clients["phone-1"].selectable and grid.leaving() == {}
        deliver("phone-1", leaving_status("phone-1", forget=True, now_unix=SENT))
        assert list(grid.leaving()) == ["phone-1"] and grid.leaving()["phone-1"].left == "forget"
        assert clients["phone-1"].state == "offline" and not clients["phone-1"].selectable
        assert clients["phone-2"].selectable  # only that device
        # Enrolled again, the device says it is back: the grid forgets that it left.
        deliver("phone-1", ClientStatus("phone-1", "idle", n_train=40, sent_unix=time.time(), refresh_s=30.0).to_bytes())
        assert grid.leaving() == {} and clients["phone-1"].selectable
    finally:
        server.close()


def test_a_device_that_left_is_kept_for_the_operator_until_answered(tmp_path: Path) -> None:
    from support.inmemory_grid import InMemoryGrid, device_status

    from coordinator.server.serve import Server

    data = tmp_path / "data"
    _settings(data)
    grid = InMemoryGrid({cid: device_status(cid, 40) for cid in ("phone-1", "phone-2")})
    server = Server(data, BrokerConfig.parse("127.0.0.1:9"), FED, grid=lambda needs: grid)
    try:
        server.registry.enrol("phone-1", "Anna")
        server.registry.enrol("phone-2", None)
        grid.left = {"phone-1": ClientStatus.from_bytes(leaving_status("phone-1", forget=True, now_unix=SENT))}
        server.upkeep.note_leave_requests()
        kept = leave_requests(data)
        assert list(kept) == ["phone-1"] and kept["phone-1"]["forget"] is True and kept["phone-1"]["sent_unix"] == SENT
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(SENT))
        assert leave_lines(data) == [f"phone-1 left from its app on {when} and asks to be forgotten: fedhar-coordinator forget phone-1"]
        rows = {r["name"]: r["left"] for r in device_table(data, None)}
        assert rows == {"phone-1": "forget", "phone-2": None}
        # The same status again (a retained copy after a reconnection) is no news; a new one replaces it.
        assert not note_leave_request(data, "phone-1", True, SENT)
        assert note_leave_request(data, "phone-1", False, SENT + 60)
        assert leave_lines(data)[0].endswith("(fedhar-coordinator revoke phone-1 refuses it for good)")
        # The operator's answer (revoke or forget) drops the request.
        assert drop_leave_request(data, "phone-1") and leave_requests(data) == {} and leave_lines(data) == []
        assert not drop_leave_request(data, "phone-1")
    finally:
        server.close()


def test_an_unreadable_request_file_reads_as_no_requests(tmp_path: Path) -> None:
    (tmp_path / "leave_requests.json").write_text("{not json")
    assert leave_requests(tmp_path) == {} and leave_lines(tmp_path) == []
    assert note_leave_request(tmp_path, "phone-1", True, SENT, now=SENT + 1)
    assert leave_requests(tmp_path) == {"phone-1": {"forget": True, "sent_unix": SENT, "noted_unix": SENT + 1}}
