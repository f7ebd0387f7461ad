"""The phone knows the home server's state: the coordinator status's optional fields, the words, and a dead server seen.

The dead-server test runs the app's controller against a real Mosquitto on loopback and a
scripted coordinator (a small paho process that publishes the retained status with a last will),
not a real coordinator (``tests/support/scripted_coordinator.py``): the server is paused (its status goes stale: "gone"), resumed, then
killed (its will: "offline"), and the Federation view says so in words each time.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.polling import poll

from edge_client.server_state import ServerState, ServerWatch, clock_words, follow_server, server_words
from har_models.wire.messages import CoordinatorStatus, MessageError, RoundOutlook

ROOT = Path(__file__).resolve().parents[1]
NOW = dt.datetime(2026, 3, 3, 14, 10).timestamp()
AT_1402 = dt.datetime(2026, 3, 3, 14, 2).timestamp()
AT_1430 = dt.datetime(2026, 3, 3, 14, 30).timestamp()


def test_the_outlook_carries_what_a_phone_shows_apart_from_the_status_a_previous_release_parses():
    o = RoundOutlook("run-1", NOW, devices_taking_part=1, devices_needed=3, next_round_unix=AT_1430, model_version=18,
                     waiting_reason="outside 02:00-03:00")  # fmt: skip
    assert RoundOutlook.from_bytes(o.to_bytes()) == o
    assert "open_round" not in json.loads(o.to_bytes())  # unset: left out
    # The status keeps the keys a client of the previous release knows (it refuses any other).
    plain = json.loads(CoordinatorStatus("online", "run-1", "a1", sent_unix=NOW, refresh_s=30.0, epoch=2).to_bytes())
    assert set(plain) == {"protocol", "state", "run_id", "attempt", "sent_unix", "refresh_s", "epoch"}
    for bad in ({"devices_needed": -1}, {"model_version": True}, {"next_round_unix": float("inf")}, {"open_round": 1.5},
                {"waiting_reason": "x" * 201}, {"waiting_reason": 5}, {"sent_unix": -1}):  # fmt: skip
        payload = json.dumps({"protocol": 1, "run_id": "r"} | bad).encode()
        with pytest.raises(MessageError, match="round outlook"):
            RoundOutlook.from_bytes(payload)


def _online(**fields) -> ServerState:
    st = CoordinatorStatus("online", "r", "a", sent_unix=NOW, refresh_s=30.0)
    return ServerState("online", None, st, RoundOutlook("r", NOW, **fields) if fields else None)


def test_the_server_in_words():
    assert server_words(_online(devices_taking_part=1, devices_needed=3), NOW) == (
        "home server online: waiting for 2 more devices (1 device taking part)"
    )
    assert server_words(_online(devices_taking_part=2, devices_needed=3, next_round_unix=AT_1430), NOW) == (
        "home server online: waiting for 1 more device; next round at about 14:30 (2 devices taking part)"
    )
    assert server_words(_online(devices_taking_part=3, devices_needed=2, next_round_unix=AT_1430, waiting_reason="outside 02:00-03:00"),
                        NOW) == "home server online: next round at about 14:30; outside 02:00-03:00 (3 devices taking part)"  # fmt: skip
    assert server_words(_online(devices_taking_part=3, open_round=18), NOW) == "home server online: round 18 open (3 devices taking part)"
    assert server_words(_online(), NOW) == "home server online"  # a coordinator that says nothing more
    assert server_words(ServerState("offline", AT_1402), NOW) == "home server offline since 14:02"
    assert server_words(ServerState("gone", AT_1402), NOW) == "home server offline since 14:02 (it stopped without saying so)"
    assert server_words(ServerState("offline", AT_1402), NOW + 86_400) == "home server offline since yesterday 14:02"
    assert clock_words(AT_1402, NOW + 3 * 86_400) == "Tue 3 Mar 14:02"
    assert server_words(ServerState("unknown"), NOW) == ""


def test_offline_since_is_the_last_sign_of_life_this_device_saw():
    watch = ServerWatch()
    alive = CoordinatorStatus("online", "r", "a", sent_unix=AT_1402, refresh_s=30.0)
    assert watch.observe(alive, "online", AT_1402 + 1).presence == "online"
    assert watch.last_online_unix == AT_1402  # the status's own stamp, not the time it was read
    will = CoordinatorStatus("offline", "r", "a", sent_unix=AT_1402 - 3600)  # a will carries its connect time
    assert watch.observe(will, "offline", NOW) == ServerState("offline", AT_1402, will)
    assert watch.observe(alive, "gone", NOW).since_unix == AT_1402
    # Never seen alive here: the status's stamp is all there is; with none, no time is claimed.
    assert ServerWatch().observe(will, "offline", NOW).since_unix == AT_1402 - 3600
    assert ServerWatch().observe(CoordinatorStatus("offline"), "offline", NOW).since_unix is None
    assert ServerWatch(AT_1402).observe(None, "unknown", NOW).presence == "unknown"


def test_the_command_line_client_logs_the_server_when_it_changes(caplog):
    agent = SimpleNamespace(cfg=SimpleNamespace(client_id="pi-1"), coordinator=None, coordinator_presence="unknown", outlook=None)
    stop, clock = threading.Event(), [AT_1402]
    with caplog.at_level(logging.INFO, logger="fedhar.client.server"):
        follow_server(agent, stop, every_s=0.01, clock=lambda: clock[0])
        agent.outlook = RoundOutlook("r", AT_1402, devices_taking_part=1, devices_needed=2)
        agent.coordinator = CoordinatorStatus("online", "r", "a", sent_unix=AT_1402, refresh_s=30.0)
        agent.coordinator_presence = "online"
        assert poll(lambda: len(caplog.records) >= 1, 10)
        clock[0] = NOW
        agent.coordinator_presence = "gone"
        assert poll(lambda: len(caplog.records) >= 2, 10)
        stop.set()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "[pi-1] home server online: waiting for 1 more device (1 device taking part)"),
        ("WARNING", "[pi-1] home server offline since 14:02 (it stopped without saying so)"),
    ]


SCRIPTED = ROOT / "tests" / "support" / "scripted_coordinator.py"


def test_a_dead_home_server_reads_offline_since_on_the_phone(tmp_path, mosquitto):
    from edge_client.app.controller import AppConfig, DeviceController
    from edge_client.app.federation_words import taking_part_words
    from edge_client.sensors.base import ReplaySensor
    from edge_client.window_log import WindowLog
    from har_models.data.hapt import read_hapt_recordings
    from har_models.data.labels import HAPT_LABELS
    from har_models.data.windowing import WindowSet
    from har_models.wire.topics import Topics

    state = tmp_path / "state"
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(2), 10)
    WindowLog(state / "recorded_windows.log", HAPT_LABELS).append(
        WindowSet(rng.normal(size=(20, 6, 128)).astype(np.float32), y, HAPT_LABELS, np.arange(20, dtype=np.int64) * 1_280_000_000))
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="phone-1", broker=f"127.0.0.1:{mosquitto}", federation="home",
                    backend="numpy")  # fmt: skip
    views: list = []
    source = ReplaySensor(read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0], speed=None, loop=False)
    sent: list[float] = []
    coord = subprocess.Popen([sys.executable, str(SCRIPTED), str(mosquitto), Topics("home").coordinator_status], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT)})  # fmt: skip
    threading.Thread(target=lambda: [sent.append(float(line.split()[1])) for line in coord.stdout], daemon=True).start()
    ctl = DeviceController(cfg, source, on_federation=views.append, charging=lambda: True, supervise_s=0.1)
    try:
        ctl.set_take_part(True)
        assert poll(lambda: views and views[-1].server.startswith("home server online"), 60), views[-1:]
        hour = clock_words(time.time() + 3600, time.time())
        assert views[-1].server in {f"home server online: waiting for 2 more devices; next round at about {h} (1 device taking part)"
                                    for h in (hour, clock_words(time.time() + 3660, time.time()))}  # fmt: skip
        assert not views[-1].server_down
        # Paused: the status is not refreshed, so after three of its 0.5 s periods the server is gone.
        coord.stdin.write("pause\n")
        coord.stdin.flush()
        assert poll(lambda: views[-1].server_down, 30), views[-1]
        last = sent[-1]
        assert views[-1].server == f"home server offline since {clock_words(last, time.time())} (it stopped without saying so)"
        assert views[-1].state == "connected" and ctl.federation.server_down
        coord.stdin.write("resume\n")
        coord.stdin.flush()
        assert poll(lambda: not views[-1].server_down, 30), views[-1]
        # Killed: the broker delivers its will, and the phone says since when.
        coord.kill()
        coord.wait(10)
        assert poll(lambda: views[-1].server_down, 30), views[-1]
        # (the will may reach the phone before its check has read the status sent just before: one of the last few)
        assert views[-1].server in {f"home server offline since {clock_words(t, time.time())}" for t in sent[-3:]}
        assert taking_part_words(views[-1]) == f"Taking part, but no rounds now: {views[-1].server}"
    finally:
        ctl.close()
        coord.kill()
