"""The served federation says why it waits: the serving loop (``Server.run``) over in-memory devices (no broker)
tells the status page which devices are not eligible and why, that a round's last attempt closed without quorum,
and forgets the failed attempt once the round completes; ``/api/round`` and the page show it while no round is open."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from markupsafe import escape
from starlette.testclient import TestClient
from support.inmemory_grid import device_status
from support.serving import LoopGrid, until

from coordinator.server.monitor import Monitor
from coordinator.server.web import ServerView, make_app
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.topics import Topics

BROKER = BrokerConfig.parse("127.0.0.1:9")
pytestmark = pytest.mark.slow  # the loop's retry after the failed attempt and its interval after the round: about 3 s


def test_serve_tells_the_page_why_it_waits_after_a_failed_quorum_and_while_a_device_is_missing(tmp_path: Path) -> None:
    from coordinator.server.serve import Server

    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text(
        "min_clients = 2\n[model]\nconv_filters = 4\ndense_units = 8\n[server]\nhttp_port = 0\n"
        "[schedule]\nmin_clients = 2\nmin_round_interval_s = 1\n"
    )
    grid = LoopGrid({cid: device_status(cid, 30) for cid in ("phone-anna", "pi-kitchen")})
    grid.silent.add("pi-kitchen")  # selected, but its update never comes: the attempt closes without quorum
    server = Server(data, BROKER, "home", grid=lambda needs: grid, poll_s=0.02)
    stop = threading.Event()
    loop = threading.Thread(target=server.run, args=(stop,), daemon=True)
    loop.start()
    try:
        failed = until(lambda: (w := server.page_waiting()) and "closed without quorum" in w and w, 20, "a failed attempt")
        assert failed.startswith("round 0's last attempt closed without quorum at ")
        assert "(1 update(s) with training windows, below the quorum of 2 (the min_clients setting)" in failed
        assert "waiting: 2 eligible devices, 2 needed" in failed
        # The page shows it under "no round open"; /api/round gives it while no round is open, and none while one is.
        mon = Monitor(Topics("home"))
        view = ServerView(monitor=mon, waiting=lambda: failed)
        c = TestClient(make_app(view))
        assert c.get("/api/round").json()["waiting"] == failed
        page = c.get("/").text
        assert "no round open (idle)" in page
        assert f'<p id="waiting">{escape(failed)}</p>' in page  # as the page's templates escape it
        mon.handle(Topics("home").round, RoundAnnouncement("r", 0, "training", {}, "hapt6", selected=("phone-anna",)).to_bytes())
        assert c.get("/api/round").json()["waiting"] is None and 'id="waiting"' not in c.get("/").text
        # The device answers the next attempt: the round completes and the failed attempt is no reason any more.
        grid.silent.clear()
        until(lambda: server.runner.state.last_completed_round() >= 0, 20, "round 0 completing")
        until(lambda: (w := server.page_waiting()) and "closed without quorum" not in w, 20, "the failure forgotten")
        # A device that goes away is named with its reason.
        grid.devices["pi-kitchen"] = device_status("pi-kitchen", 0)
        missing = until(lambda: (w := server.page_waiting()) and "not eligible" in w and w, 20, "a device left out")
        assert missing.startswith("waiting: 1 of 2 eligible devices") and "not eligible: pi-kitchen (" in missing
    finally:
        stop.set()
        loop.join(20)
    assert not loop.is_alive()
