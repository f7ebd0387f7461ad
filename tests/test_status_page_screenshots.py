"""The status page of a small served federation in headless Chromium, in three states, with what each must say.

Two HAPT devices federate for three rounds (their run database feeds the page); their statuses and the
coordinator's are published, retained, to a real Mosquitto, which the page's monitor reads as in ``serve``.
The page is taken in three states: healthy; one device offline (its will: the page shows its last-known
windows and backend); the broker stopped (the page's broker link is down and the coordinator's state
unknown, not "offline"). With ``FEDHAR_SCREENSHOT_DIR=docs/screenshots`` the three PNGs land there
(``status-healthy.png``, ``status-device-offline.png``, ``status-broker-stopped.png``; docs/status_page.md).

Skips without Chromium, chromedriver or selenium, unless FEDHAR_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_status_page_browser import _browser, _publish_retained

from coordinator.record import records
from coordinator.server.audit import audit
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.web import ServerView, WebServer, make_app
from coordinator.state import RunState
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus, CoordinatorStatus, SensingHealth
from har_models.wire.topics import Topics
from simulation.broker import LocalMosquitto, find_mosquitto

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _wait(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_status_page_healthy_with_a_device_offline_and_with_the_broker_stopped(
    tmp_path: Path, small_simulation: Callable[..., dict[str, Any]]
) -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    driver = _browser()
    out = Path(os.environ["FEDHAR_SCREENSHOT_DIR"]) if os.environ.get("FEDHAR_SCREENSHOT_DIR") else None

    def shot(name: str) -> None:
        path = tmp_path / name
        assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
        if out is not None:
            shutil.copyfile(path, out / name)

    driver.set_window_size(1280, 2000)  # the whole page, the operator actions included
    try:
        doc = small_simulation("--rounds", "3", name="run", clients=2)
        recs = records(doc["rounds"])
        a, b = sorted(recs[-1].evaluation.personalisation_clients)
        data = tmp_path / "data"
        reg = Registry(data)
        for cid, owner in ((a, "Anna"), (b, "Ben")):
            reg.enrol(cid, owner)
            audit(data, "enrol", cid, f"owner {owner}")
        for r in recs:
            pers = r.evaluation.personalisation
            assert pers is not None
            reg.add_version(r.round + 1, r.round, r.arch.version, data / "versions" / f"v{r.round + 1:06d}.safetensors",
                            {"personalisation_accuracy": pers.accuracy, "personalisation_macro_f1": pers.macro_f1})  # fmt: skip
            for cid, m in r.evaluation.personalisation_clients.items():
                reg.note_participation(r.round, cid, m.accuracy, m.macro_f1)
        topics = Topics("home")
        now = time.time()
        health = SensingHealth(acc_hz=49.9, gyro_hz=50.0, window_age_s=1.3, gaps_1h=0, late=0)

        def status(cid: str, backend: str, n_train: int) -> bytes:
            return ClientStatus(cid, "idle", label_set="hapt6", run_id="run", last_round=2, n_train=n_train, n_test=n_train // 4,
                                sent_unix=time.time(), refresh_s=30.0, sensing="live", charging=True, backend=backend,
                                arch_version=0, sensing_health=health).to_bytes()  # fmt: skip

        with LocalMosquitto(log_file=tmp_path / "mosquitto.log", start_timeout_s=10) as broker:
            monitor = Monitor(topics, BrokerConfig(port=broker.port), client_name="fedhar-monitor-test")
            assert monitor.start(10.0), "the monitor did not connect to Mosquitto"
            state = RunState(tmp_path / "run")
            view = ServerView(name="fedhar-home", run_state=state, registry=reg, monitor=monitor, next_start=lambda: now + 1800)
            server = WebServer(make_app(view), port=0)
            port = server.start()
            try:
                _publish_retained(broker.port, [
                    (topics.coordinator_status, CoordinatorStatus("online", "run", "a1", now, 30.0).to_bytes()),
                    (topics.client_status(a), status(a, "executorch", 412)),
                    (topics.client_status(b), status(b, "torch", 388)),
                ])  # fmt: skip
                _wait(lambda: sum(d.online for d in view.snapshot().devices.values()) == 2, "two devices online")
                driver.get(f"http://127.0.0.1:{port}/")
                find = driver.find_element
                assert find("id", "broker-link").text == "up" and find("id", "coordinator-state").text == "online"
                assert find("id", "online-count").text == "2" and find("id", "rounds-completed").text == "3"
                assert not driver.find_elements("id", "health")  # nothing wrong
                shot("status-healthy.png")

                # b's phone goes away: its will says offline with 0/0 windows and no backend
                _publish_retained(broker.port, [(topics.client_status(b), ClientStatus(b, "offline", sent_unix=time.time()).to_bytes())])
                _wait(lambda: not view.snapshot().devices[b].online, "the device offline")
                driver.get(f"http://127.0.0.1:{port}/")
                row = driver.find_element("css selector", f'tr.device[data-name="{b}"]')
                cells = [td.text for td in row.find_elements("css selector", "td")]
                assert cells[2] == "offline" and cells[6] == "torch (last known)"
                assert cells[9].startswith("388/97 (last known, ") and "0/0" not in cells[9]
                assert cells[8] == "not reported while offline"  # its will carries no sensing
                assert driver.find_element("id", "online-count").text == "1"
                shot("status-device-offline.png")

                broker.stop()
                _wait(lambda: not view.snapshot().connected, "the monitor noticing the broker stopped")
                driver.get(f"http://127.0.0.1:{port}/")
                assert find("id", "broker-link").text == "down"
                assert find("id", "coordinator-state").text == "unknown (the broker cannot be reached)"
                assert find("id", "online-count").text == "unknown"  # not the last count, as if it were now
                row = driver.find_element("css selector", f'tr.device[data-name="{a}"]')
                assert row.get_attribute("data-online") == "unknown"
                assert row.find_element("css selector", "td.presence").text == "unknown (the broker cannot be reached)"
                shot("status-broker-stopped.png")
            finally:
                server.stop()
                monitor.stop()
                state.close()
                reg.close()
    finally:
        driver.quit()
