"""Sensing health on the status page: the rate against 50 Hz (warning colour outside 45-55 Hz), the newest window's
age, gaps, late samples, backend and architecture version, in the HTML and /api/devices."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from coordinator.server.monitor import Monitor
from coordinator.server.web import ServerView, make_app, sensing_json
from har_models.wire.messages import ClientStatus, CoordinatorStatus, SensingHealth
from har_models.wire.topics import Topics

T = Topics("home")
NOW = 1_800_000_000.0


def view_of(*statuses: ClientStatus) -> ServerView:
    mon = Monitor(T, clock=lambda: 100.0, wall=lambda: NOW)
    mon.handle(T.coordinator_status, CoordinatorStatus("online", "run-1", "a1", NOW, 30.0).to_bytes(), True)
    for st in statuses:
        mon.handle(T.client_status(st.client_id), st.to_bytes(), False)
    return ServerView(name="home", monitor=mon, wall=lambda: NOW)


def status(cid: str, health: SensingHealth | None, **kw: object) -> ClientStatus:
    return ClientStatus(cid, "idle", sent_unix=NOW, refresh_s=30.0, sensing="live", sensing_health=health, **kw)  # type: ignore[arg-type]


GOOD = SensingHealth(acc_hz=49.8, gyro_hz=50.0, window_age_s=1.5, gaps_1h=2, late=7)
SLOW = SensingHealth(acc_hz=38.5, gyro_hz=50.0, window_age_s=42.0, gaps_1h=0, late=0)


def test_api_devices_carries_health_backend_and_arch_version() -> None:
    view = view_of(status("phone-a", GOOD, backend="executorch", arch_version=3), status("phone-b", SLOW), status("old", None))
    devs = {d["name"]: d for d in TestClient(make_app(view)).get("/api/devices").json()}
    a, b, old = devs["phone-a"], devs["phone-b"], devs["old"]
    assert a["sensing"] == {"state": "live", "target_hz": 50.0, "rate_hz": 49.8, "acc_hz": 49.8, "gyro_hz": 50.0, "rate_ok": True,
                            "newest_window_age_s": 1.5, "gaps": 2, "late": 7, "charging": None}  # fmt: skip
    assert (a["backend"], a["arch_version"]) == ("executorch", 3)
    assert (b["sensing"]["rate_hz"], b["sensing"]["rate_ok"]) == (38.5, False)  # the slower stream is the rate
    assert (old["backend"], old["arch_version"], old["sensing"]["rate_hz"], old["sensing"]["rate_ok"]) == (None, None, None, None)


def test_rate_bounds_are_45_and_55_hz() -> None:
    def ok(acc: float, gyro: float | None) -> bool | None:
        return sensing_json(status("x", SensingHealth(acc_hz=acc, gyro_hz=gyro)))["rate_ok"]

    assert (ok(45.0, 55.0), ok(44.9, 50.0), ok(50.0, 55.1), ok(50.0, None)) == (True, False, False, True)
    assert sensing_json(None)["rate_hz"] is None


def test_the_page_shows_a_known_rate_in_the_right_colour() -> None:
    view = view_of(status("phone-a", GOOD, backend="executorch", arch_version=3), status("phone-b", SLOW), status("old", None))
    page = TestClient(make_app(view)).get("/").text
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr class="device" data-name="([^"]+)".*?</tr>', page, re.S)}
    a, b, old = rows["phone-a"], rows["phone-b"], rows["old"]
    assert ('acc <span class="rate-ok" data-rate="acc">49.8</span> · gyro <span class="rate-ok" data-rate="gyro">50.0</span>'
            " / 50 Hz, newest window 1.5 s old, 2 gaps in 1 h, 7 late samples") in a  # fmt: skip
    assert "<td>executorch</td><td>v3</td>" in a
    assert '<span class="rate-warn" data-rate="acc">38.5</span>' in b and '<span class="rate-ok" data-rate="gyro">50.0</span>' in b
    assert "newest window 42 s old, 0 gaps in 1 h, 0 late samples" in b
    assert "live, health not reported" in old and "<td>not reported</td><td>—</td>" in old
    assert ".rate-warn{" in page

