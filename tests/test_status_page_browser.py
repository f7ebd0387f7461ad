"""The status page in headless Chromium over a real federation's records and a monitor fed by a real Mosquitto.

A short federation (three HAPT clients, FedDWA, three rounds) leaves its run database; the
devices' statuses, the coordinator's status, an open round and a receipt are published, retained,
to a real Mosquitto, which the monitor reads as the status page does in ``serve``. The page,
served by uvicorn on 127.0.0.1, must show three devices of which two are online, the open round,
and SVG charts; ``/metrics``, scraped over HTTP during the same run, must equal the records. The
screenshot lands in the test's folder (and, with ``FEDHAR_SCREENSHOT=path``, there too).

Skips without Chromium, chromedriver or selenium, unless FEDHAR_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.record import records
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.web import ServerView, WebServer, make_app
from coordinator.state import RunState
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus, CoordinatorStatus, Receipt, RoundAnnouncement
from har_models.wire.topics import Topics

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install '.[test]')")
    if missing:
        why = f"the browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("FEDHAR_REQUIRE_BROWSER") == "1":
            pytest.fail(f"FEDHAR_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1500"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _publish_retained(port: int, messages: list[tuple[str, bytes]]) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-federation", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        for topic, payload in messages:
            c.publish(topic, payload, qos=1, retain=not topic.endswith("/receipt")).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def test_the_status_page_in_chromium(tmp_path: Path, mosquitto: int, small_simulation: Callable[..., dict[str, Any]]) -> None:
    driver = _browser()
    try:
        doc = small_simulation("--aggregation", "feddwa", "--rounds", "3", name="run")
        recs = records(doc["rounds"])
        clients = sorted(recs[-1].evaluation.personalisation_clients)
        assert len(clients) == 3
        reg = Registry(tmp_path / "data")
        for cid, owner in zip(clients, ("Anna", "Ben", None), strict=True):
            reg.enrol(cid, owner)
        for r in recs:
            pers = r.evaluation.personalisation
            assert pers is not None
            reg.add_version(r.round + 1, r.round, r.arch.version, tmp_path / "data" / "versions" / f"v{r.round + 1:06d}.safetensors",
                            {"personalisation_accuracy": pers.accuracy, "personalisation_macro_f1": pers.macro_f1})  # fmt: skip
        topics = Topics("home")
        now = time.time()
        states = dict(zip(clients, ("idle", "training", "offline"), strict=True))
        msgs = [(topics.coordinator_status, CoordinatorStatus("online", "run", "a1", now, 30.0).to_bytes())]
        msgs += [(topics.client_status(c), ClientStatus(c, s, run_id="run", last_round=2, n_train=200, n_test=50, sent_unix=now,
                                                       refresh_s=30.0, sensing="live").to_bytes()) for c, s in states.items()]  # fmt: skip
        msgs.append((topics.round, RoundAnnouncement("run", 3, "training", {}, "hapt6", selected=tuple(clients),
                                                      deadline_unix=now + 300).to_bytes()))  # fmt: skip
        msgs.append((topics.client_receipt(clients[0]), Receipt("run", 3, 0, "a" * 64, "accepted").to_bytes()))
        monitor = Monitor(topics, BrokerConfig(port=mosquitto), client_name="fedhar-monitor-test")
        assert monitor.start(10.0), "the monitor did not connect to Mosquitto"
        state = RunState(tmp_path / "run")
        view = ServerView(name="fedhar-home", run_state=state, registry=reg, monitor=monitor, next_start=lambda: now + 1800)
        server = WebServer(make_app(view), port=0)
        port = server.start()
        try:
            _publish_retained(mosquitto, msgs)
            end = time.monotonic() + 20
            while time.monotonic() < end and (len(view.snapshot().devices) < 3 or not view.snapshot().answered):
                time.sleep(0.05)
            assert len(view.snapshot().devices) == 3, "the monitor did not receive the three statuses"
            driver.get(f"http://127.0.0.1:{port}/")
            find = driver.find_element
            assert driver.title == "fedhar-home · fedhar"
            assert find("id", "device-count").text == "3" and find("id", "online-count").text == "2"
            assert find("id", "coordinator-state").text == "online"
            assert find("id", "round-index").text == "3" and "3 selected, 1 answered, 2 missing" in find("id", "round").text
            assert find("id", "rounds-completed").text == "3" and find("id", "last-round").text == "2"
            rows = {r.get_attribute("data-name"): r for r in driver.find_elements("css selector", "tr.device")}
            assert sorted(rows) == clients
            online = {c: rows[c].get_attribute("data-online") for c in clients}
            assert online == {clients[0]: "true", clients[1]: "true", clients[2]: "false"}
            assert rows[clients[2]].find_element("css selector", "td.presence").text == "offline"
            assert rows[clients[0]].find_element("css selector", "td:nth-child(5)").text == "3"  # rounds taken part in
            charts = driver.find_elements("css selector", "svg.chart")
            assert len(charts) == 5 and all(c.is_displayed() for c in charts)
            # 3 rounds x (global, personalisation), and the shared model's start measure of rounds 0 and 1 (taken in rounds 1, 2)
            assert all(r.evaluation.start is not None and r.evaluation.global_ is not None for r in recs)
            assert len(charts[0].find_elements("css selector", "circle")) == 3 + 3 + 2
            shared = charts[1].find_element("css selector", 'g.series[data-name="shared model"]')
            assert [float(c.get_attribute("data-y")) for c in shared.find_elements("css selector", "circle")] == [
                r.evaluation.start.macro_f1 for r in recs[1:] if r.evaluation.start is not None]
            assert find("id", "release").text == view.release
            heat = driver.find_element("css selector", "svg.heatmap")
            assert len(heat.find_elements("css selector", "rect.cell")) == 9
            versions = driver.find_elements("css selector", "#versions tr")[1:]
            assert [v.find_element("css selector", "td").text for v in versions] == ["3", "2", "1"]  # newest first
            assert versions[0].find_element("css selector", "span.mark").text == "newest"
            shot = tmp_path / "status-page.png"
            assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
            if os.environ.get("FEDHAR_SCREENSHOT"):
                shutil.copyfile(shot, os.environ["FEDHAR_SCREENSHOT"])
            # /metrics over HTTP during the same run: the counters equal the records
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                fams = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
            value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
            assert value[("fedhar_rounds_completed_total", ())] == len(recs) == 3
            assert value[("fedhar_updates_accepted_total", ())] == sum(r.participation.updates for r in recs)
            up: dict[str, int] = {}
            for r in recs:
                for enc, n in (r.traffic.up_by_encoding if r.traffic else {}).items():
                    up[enc] = up.get(enc, 0) + n
            assert set(up) == {"int8_delta"}  # the default upload
            assert sum(up.values()) == sum(r.traffic.bytes_up for r in recs if r.traffic)
            for enc, n in up.items():
                assert value[("fedhar_bytes_in_total", (("encoding", enc),))] == n
            assert value[("fedhar_bytes_out_total", (("encoding", "float32"),))] == sum(r.traffic.bytes_down for r in recs if r.traffic)
            assert value[("fedhar_devices", (("state", "online"),))] == 2
            assert value[("fedhar_devices", (("state", "enrolled"),))] == 3
            last = recs[-1].evaluation.personalisation
            assert last is not None and value[("fedhar_last_macro_f1", (("measure", "personalisation"),))] == last.macro_f1
        finally:
            server.stop()
            monitor.stop()
            state.close()
    finally:
        driver.quit()
