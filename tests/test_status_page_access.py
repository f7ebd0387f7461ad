"""Who and what reaches the status page: text that looks like markup arrives escaped; the token becomes a cookie and leaves
the address; every answer says no-referrer; the device table comes in pages of bounded size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from support.script_module import load_script

from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.templating import render
from coordinator.server.web import ServerView, make_app
from coordinator.server.web.page import DEVICES_PER_PAGE, PageOutOfRange, page_of
from coordinator.server.web.routes import COOKIE, cookie_value
from har_models.wire.messages import ClientStatus, CoordinatorStatus
from har_models.wire.topics import Topics

T = Topics("home")
NOW = 1_800_000_000.0
TOKEN = "0123456789abcdef0123"
EVIL = '<script>alert("x")</script>'


def _view(tmp_path: Path, n: int = 3, owner: str = "Anna") -> ServerView:
    reg = Registry(tmp_path / "data")
    mon = Monitor(T, clock=lambda: 100.0, wall=lambda: NOW)
    mon.handle(T.coordinator_status, CoordinatorStatus("online", "run-1", "a1", NOW, 30.0).to_bytes(), True)
    for i in range(n):
        name = f"dev-{i:04d}"
        reg.enrol(name, owner)
        mon.handle(T.client_status(name), ClientStatus(name, "idle", sent_unix=NOW, refresh_s=30.0, fault=EVIL if i == 0 else "",
                                                       backend=EVIL if i == 1 else "").to_bytes(), False)  # fmt: skip
    return ServerView(name=EVIL, registry=reg, monitor=mon, wall=lambda: NOW, waiting=lambda: EVIL)


def test_text_that_looks_like_markup_reaches_the_page_as_text(tmp_path: Path) -> None:
    page = TestClient(make_app(_view(tmp_path, owner=EVIL))).get("/").text
    assert "<script" not in page and "alert(" in page
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
    assert f"<title>{escaped} · fedhar</title>" in page and f"<td>{escaped}</td>" in page  # the name, the owners
    assert f'<span class="fault">cannot take part: {escaped}</span>' in page and f'<p id="waiting">{escaped}</p>' in page
    # the charts' text as well: a template, autoescaped by its .svg name
    svg = render("heatmap.svg", map={"width": 300, "height": 60, "title": EVIL, "cells": []})
    assert "<script" not in svg and svg.count("&lt;script&gt;") == 2  # the label and the title


def test_the_token_becomes_a_cookie_and_leaves_the_address(tmp_path: Path) -> None:
    c = TestClient(make_app(_view(tmp_path), token=TOKEN), follow_redirects=False)
    r = c.get(f"/?page=1&token={TOKEN}")
    assert r.status_code == 303 and r.headers["location"] == "/?page=1"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={cookie_value(TOKEN)};") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    page = c.get("/")  # the client keeps the cookie, as a browser does
    assert page.status_code == 200 and TOKEN not in page.text and "token=" not in page.text  # no link carries it
    assert c.get("/api/devices").status_code == 200  # the API too, from the same browser
    fresh = TestClient(make_app(_view(tmp_path / "b"), token=TOKEN), follow_redirects=False)
    assert fresh.get("/", headers={"Cookie": f"{COOKIE}={cookie_value(TOKEN)}"}).status_code == 200
    assert fresh.get("/", headers={"Cookie": f"{COOKIE}={cookie_value('another token of some length')}"}).status_code == 401
    assert fresh.get("/", headers={"Cookie": f"{COOKIE}={TOKEN}"}).status_code == 401  # the cookie holds a keyed hash, not the token
    assert fresh.get("/?token=wrong-token-of-some-length").status_code == 401
    assert fresh.get(f"/metrics?token={TOKEN}").status_code == 200  # a scrape job with the query, as before: no redirect
    assert fresh.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_every_answer_says_no_referrer(tmp_path: Path) -> None:
    c = TestClient(make_app(_view(tmp_path), token=TOKEN), follow_redirects=False, raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answers = [c.get("/"), c.get(f"/?token={TOKEN}"), c.get("/", headers=auth), c.get("/api/devices", headers=auth),
               c.get("/metrics", headers=auth), c.get("/healthz", headers=auth), c.get("/nope", headers=auth),
               c.get("/?page=99", headers=auth)]  # fmt: skip
    assert [r.status_code for r in answers] == [401, 303, 200, 200, 200, 200, 404, 404]
    assert all(r.headers.get("referrer-policy") == "no-referrer" for r in answers)


def test_page_numbers_have_known_bounds() -> None:
    assert page_of(0, 1) == (0, 0, 1) and page_of(120, 3, 50) == (100, 120, 3) and page_of(100, 2, 50) == (50, 100, 2)
    for n, page in ((120, 4), (0, 2), (10, 0)):
        with pytest.raises(PageOutOfRange, match="pages 1 to"):
            page_of(n, page, 50)


def test_the_device_table_comes_in_pages_of_bounded_size(tmp_path: Path) -> None:
    n = 2 * DEVICES_PER_PAGE + 7
    view = _view(tmp_path, n)
    c = TestClient(make_app(view))
    pages = [c.get(f"/?page={p}").text for p in (1, 2, 3)]
    rows = [re.findall(r'<tr class="device" data-name="([^"]+)"', p) for p in pages]
    assert [len(r) for r in rows] == [DEVICES_PER_PAGE, DEVICES_PER_PAGE, 7]
    assert [name for r in rows for name in r] == [f"dev-{i:04d}" for i in range(n)]  # every device once, by name
    assert f'<span id="device-count">{n}</span>' in pages[2] and f"devices 101–{n} of {n}" in pages[2]
    assert '<a href="?page=1">1</a><a href="?page=2">2</a><strong>3</strong>' in pages[2]
    assert len(c.get("/api/devices").json()) == n  # the API keeps every device
    r = c.get("/?page=4")
    assert r.status_code == 404 and r.json() == {"error": "?page=4 is out of range; the device table has pages 1 to 3"}
    assert c.get("/?page=x").status_code == 400


def test_a_thousand_devices_and_two_thousand_rounds_make_a_page_of_bounded_size(tmp_path: Path) -> None:
    """The federation of benchmarks/bench_status_page_devices.py (which times it in Chromium): rows and bytes, not time."""
    bench = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "bench_status_page_devices.py")
    view = bench.build_fleet(tmp_path, devices=1000, rounds=2000)
    page = TestClient(make_app(view)).get("/").text
    assert len(re.findall(r'<tr class="device"', page)) == DEVICES_PER_PAGE
    assert '<span id="device-count">1000</span>' in page and '<span id="rounds-completed">2000</span>' in page
    table = page[page.index('<table id="devices">') : page.index("</table>", page.index('<table id="devices">'))]
    assert len(table.encode()) < 25_000, len(table.encode())  # 50 rows; a row per device was most of 386 kB
    assert len(page.encode()) < 150_000, len(page.encode())  # the rest is the charts, whose points are bounded
