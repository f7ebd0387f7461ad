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
                            "newest_window_age_s": 1.5, "window_stream_stopped": False, "gaps": 2, "late": 7,
                            "charging": None}  # fmt: skip
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


def test_an_offline_device_shows_its_last_known_windows_and_backend() -> None:
    mon = Monitor(T, clock=lambda: 100.0, wall=lambda: NOW)
    mon.handle(T.client_status("phone-a"), status("phone-a", GOOD, backend="executorch", n_train=412, n_test=96).to_bytes(), False)
    # its will: offline, 0/0 windows, no backend, no sensing
    mon.handle(T.client_status("phone-a"), ClientStatus("phone-a", "offline", sent_unix=NOW).to_bytes(), False)
    view = ServerView(name="home", monitor=mon, wall=lambda: NOW + 300)
    c = TestClient(make_app(view))
    (d,) = c.get("/api/devices").json()
    assert (d["online"], d["n_train"], d["n_test"], d["backend"]) == (False, 0, 0, None)  # what its last word says
    assert d["last_known"] == {"n_train": 412, "n_test": 96, "windows_unix": NOW, "backend": "executorch", "backend_unix": NOW}
    row = re.search(r'<tr class="device" data-name="phone-a".*?</tr>', c.get("/").text, re.S)
    assert row is not None
    assert '<td>412/96 <span class="muted">(last known, <span title="' in row.group(0) and "5 min ago</span>)" in row.group(0)
    assert '<td>executorch <span class="muted">(last known)</span></td>' in row.group(0)
    assert "<td>0/0</td>" not in row.group(0) and "<td>not reported</td>" not in row.group(0)
    assert "<td>not reported while offline</td>" in row.group(0)
    # online again: its own figures, no "last known"
    mon.handle(T.client_status("phone-a"), status("phone-a", GOOD, backend="torch", n_train=415, n_test=96).to_bytes(), False)
    (d,) = c.get("/api/devices").json()
    assert d["online"] and d["last_known"] is None and (d["n_train"], d["backend"]) == (415, "torch")


def test_a_window_age_grows_with_the_clock_when_a_replay_ends() -> None:
    wall = [NOW]
    mon = Monitor(T, clock=lambda: 100.0, wall=lambda: wall[0])
    view = ServerView(name="home", monitor=mon, wall=lambda: wall[0])
    c = TestClient(make_app(view))
    mon.handle(T.client_status("pi"), status("pi", GOOD).to_bytes(), False)
    wall[0] = NOW + 20  # the stream ended: the next statuses repeat the last age
    mon.handle(T.client_status("pi"), status("pi", GOOD).to_bytes(), False)
    wall[0] = NOW + 60
    (d,) = c.get("/api/devices").json()
    assert d["sensing"]["newest_window_age_s"] == 61.5 and d["sensing"]["window_stream_stopped"] is True
    assert "newest window 62 s old, no new window since (the stream stopped or ended)" in c.get("/").text
    # a live stream reports a new age each time: the age counts from its latest report, nothing stopped
    mon.handle(T.client_status("pi"), status("pi", SensingHealth(acc_hz=50.0, gyro_hz=50.0, window_age_s=0.7)).to_bytes(), False)
    wall[0] = NOW + 62
    (d,) = c.get("/api/devices").json()
    assert d["sensing"]["newest_window_age_s"] == 2.7 and d["sensing"]["window_stream_stopped"] is False
