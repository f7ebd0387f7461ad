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
                assert cells[2] == "offline" and cells[7] == "torch (last known)"
                assert cells[10].startswith("388/97 (last known, ") and "0/0" not in cells[10]
                assert cells[9] == "not reported while offline"  # its will carries no sensing
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


SIZES = ((480, 800), (800, 600), (1280, 720))
"""The window sizes of the section screenshots: a phone held upright, a small laptop, a desktop."""

SECTIONS = ((None, "status-health-devices"), ("shared-model", "status-shared-model"), ("model-versions", "status-versions-disk"))
"""Each section the screenshots show: the element scrolled to the top (None: the page's top), and the file name's stem."""


def _harmed_federation(root: Path, now: float) -> ServerView:
    """Twelve rounds of four devices: the guard keeps, rolls back the version of round 6, and judges on; dev-c is clipped twice and then
    quarantined, dev-d's messages are rejected; an operator pinned version 5; round 12 opened 25 minutes ago with a 5-minute
    deadline and nobody answers."""
    from coordinator.record import RoundRecord
    from har_models.nn.model import ArchSpec, init_state
    from har_models.wire.messages import RoundAnnouncement

    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    names = ["dev-a", "dev-b", "dev-c", "dev-d"]
    data = root / "data"
    reg = Registry(data)
    for name, owner in zip(names, ("Anna", "Ben", "Carl", "Dora"), strict=True):
        reg.enrol(name, owner)
    state = RunState(data / "run")

    def start(r: int) -> float:  # round r's start measure: the shared version of round r - 1, spoiled in round 6
        return 0.62 + r / 80 - (0.15 if r == 7 else 0)

    best = -1
    for r in range(12):
        per = {c: {"accuracy": 0.8, "macro_f1": 0.78 + r / 100, "n": 40 + 5 * i} for i, c in enumerate(names)}
        row: dict[str, Any] = {
            "round": r, "selected": 4, "updates": 4, "rejected": 1 if r % 3 == 0 else 0, "missing": [], "seconds": 40.0 + r,
            "bytes_up": 400_000, "bytes_down": 800_000, "arch_version": 0, "conv_filters": 4, "dense_units": 8,
            "rejections": [["dev-d", "bad_shape", 1]] if r % 3 == 0 else [],
            "personalisation": {"accuracy": 0.85, "macro_f1": 0.8 + r / 100}, "personalisation_clients": per,
            "start": {"accuracy": start(r) + 0.05, "macro_f1": start(r)}, "start_clients": per}  # fmt: skip
        if r:  # the guard's rule (coordinator/guard.py) on these figures, margin 10 points
            reason = (f"start macro-F1 {100 * start(r):.1f}% against the best's (round {best}) {100 * start(best + 1):.1f}% "
                      "on 4 client(s), margin 10 points") if best >= 0 else "first version judged"  # fmt: skip
            back = best >= 0 and start(r) < start(best + 1) - 0.1
            best = best if back or (best >= 0 and start(r) < start(best + 1)) else r - 1
            row["guard"] = {"action": "rollback" if back else "keep", "judged_round": r - 1, "to_round": best, "reason": reason}
        state.complete_round(r, spec, init_state(spec, 0), {}, RoundRecord.from_json(row).to_json())
        path = data / "versions" / f"v{r + 1:06d}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 26_000)
        reg.add_version(r + 1, r, 0, path, {})
        for cid, m in per.items():
            reg.note_participation(r, cid, m["accuracy"], m["macro_f1"])
    state.event(6, "dev-c", "clipped_update", "update norm 812 is more than 10 x the other updates' median 0.9")
    state.event(7, "dev-c", "clipped_update", "update norm 790 is more than 10 x the other updates' median 0.8")
    state.event(8, "dev-c", "quarantined", "clipped in 2 consecutive rounds")
    audit(data, "pin", None, "pin to version 5")
    topics = Topics("home")
    wall = [now - 25 * 60]
    monitor = Monitor(topics, wall=lambda: wall[0])
    monitor.handle(topics.coordinator_status, CoordinatorStatus("online", "run", "a1", now, 30.0).to_bytes(), True)
    monitor.handle(topics.round, RoundAnnouncement("run", 12, "training", {}, "hapt6", selected=tuple(names),
                                                   deadline_unix=wall[0] + 300).to_bytes(), True)  # fmt: skip
    wall[0] = now
    health = SensingHealth(acc_hz=49.9, gyro_hz=50.0, window_age_s=1.3, gaps_1h=0, late=0)
    for cid in names:
        monitor.handle(topics.client_status(cid), ClientStatus(cid, "idle", n_train=412, n_test=96, sent_unix=now, refresh_s=1e6,
                       sensing="live", charging=True, backend="torch", sensing_health=health).to_bytes(), True)  # fmt: skip
    return ServerView(name="fedhar-home", run_state=state, registry=reg, monitor=monitor, next_start=lambda: None, keep_versions=50)


def test_the_changed_sections_at_three_window_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sections issue 40 changed (health and harm, the shared model, the versions and the disk) at 480x800, 800x600 and
    1280x720, each checked for what it must say; with ``FEDHAR_SCREENSHOT_DIR=docs/screenshots`` the nine PNGs land there."""
    from coordinator.server.web import health as rules

    driver = _browser()
    out = Path(os.environ["FEDHAR_SCREENSHOT_DIR"]) if os.environ.get("FEDHAR_SCREENSHOT_DIR") else None
    view = _harmed_federation(tmp_path, time.time())
    disk = view.disk()
    assert disk is not None
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(rules.shutil, "disk_usage", lambda p: usage._replace(free=disk.need_until_full // 2))  # short of 50 versions
    server = WebServer(make_app(view), port=0)
    port = server.start()
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        find = driver.find_element
        assert "round 12 has been open for 25 min, more than 2 times its deadline (5 min)" in find("id", "health").text
        assert find("css selector", "p.warning").text.startswith("disk: ")
        assert find("id", "quarantined-count").text == "1" and find("id", "release").text == view.release
        harm = find("css selector", 'tr.harm[data-name="dev-c"]').text
        assert "quarantined since round 8: clipped in 2 consecutive rounds" in harm
        assert find("id", "guard-devices").text == "4" and find("id", "guard-windows").text == str(40 + 45 + 50 + 55)
        marks = {r.get_attribute("data-version"): r.get_attribute("data-marks") for r in driver.find_elements("css selector", "tr.version")}
        assert (marks["12"], marks["11"], marks["7"], marks["5"]) == ("newest", "best", "rolled back", "pinned")
        for w, h in SIZES:
            driver.set_window_size(w, h)
            for anchor, stem in SECTIONS:
                driver.execute_script("arguments[0] ? document.getElementById(arguments[0]).scrollIntoView() : window.scrollTo(0, 0)",
                                      anchor)  # fmt: skip
                name = f"{stem}-{w}x{h}.png"
                assert driver.save_screenshot(str(tmp_path / name)) and (tmp_path / name).stat().st_size > 5_000
                if out is not None:
                    shutil.copyfile(tmp_path / name, out / name)
    finally:
        server.stop()
        driver.quit()
