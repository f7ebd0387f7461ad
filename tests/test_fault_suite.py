"""Faults during a running federation, over a real Mosquitto on 127.0.0.1.

- a flood of junk on a client's update topic: the round still closes by its deadline, honest
  updates are counted, and rejections cost a counter, not a log line and a database row each;
- a client SIGKILLed mid-round: its last will closes the round without waiting for the deadline;
- the coordinator SIGKILLed while it collects a round: restarted with --resume, the run
  completes and no completed round is lost.

Every loop here is bounded in time and count, and only 127.0.0.1 is used.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.configs import config
from support.mqtt_watcher import Watcher
from support.small_federation import coordinator_args

from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.topics import Topics

pytestmark = pytest.mark.slow  # federations with killed clients and coordinators

ROOT = Path(__file__).resolve().parents[1]


def _client(k: int, port: int, federation: str, tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    cid = f"hapt-{k:02d}"
    cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, "--broker", f"127.0.0.1:{port}", "--federation", federation,
           "--source", f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}", "--state-dir", str(tmp / cid), "--threads", "1",
           "--max-seconds", "300", *extra]  # fmt: skip
    with open(tmp / f"{cid}.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def _small(run_dir: Path, port: int, federation: str, **kw: object) -> CoordinatorConfig:
    return config(dict(run_dir=run_dir, broker=BrokerConfig(port=port), federation=federation, run_id=federation, min_clients=1,
                       model={"conv_filters": 8, "dense_units": 16}, timing={"start_timeout_s": 120, "round_timeout_s": 120}), kw)


def _flood(port: int, topic: str, stop: threading.Event, sent: list[int], limit: int = 60_000, seconds: float = 30.0) -> None:
    """Publish 32-byte junk on ``topic`` as fast as the broker takes it, at most ``limit`` messages or ``seconds``."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="flooder")
    c.connect("127.0.0.1", port)
    c.loop_start()
    end = time.monotonic() + seconds
    n = 0
    while not stop.is_set() and n < limit and time.monotonic() < end:
        c.publish(topic, b"J" * 32, qos=0)
        n += 1
        if n % 500 == 0:
            time.sleep(0.05)  # let paho drain its queue: the flood stays bounded in memory
    sent.append(n)
    c.loop_stop()
    c.disconnect()


def test_a_junk_flood_neither_delays_the_deadline_nor_floods_logs_and_database(tmp_path, mosquitto, caplog):
    fed = "flood"
    topic = Topics(fed).client_update("hapt-01", 0)
    procs = [_client(k, mosquitto, fed, tmp_path) for k in (1, 2)]
    stop, sent = threading.Event(), []
    flooder = threading.Thread(target=_flood, args=(mosquitto, topic, stop, sent), daemon=True)
    try:
        cfg = _small(tmp_path / "run", mosquitto, fed, rounds=2, timing={"expected_clients": 2, "round_timeout_s": 20})
        flooder.start()
        doc = Coordinator(cfg, progress=False).run()
    finally:
        stop.set()
        flooder.join(40)
        _stop(procs)
    assert sent and sent[0] > 1000, sent
    assert [r["updates"] for r in doc["rounds"]] == [2, 2]  # the honest updates were counted
    assert all(r["seconds"] < 20 + 10 for r in doc["rounds"])  # closed by the deadline (plus its close-out)
    assert sum(r["rejected"] for r in doc["rounds"]) > 100
    with sqlite3.connect(tmp_path / "run" / "state.sqlite") as db:
        rows = db.execute("SELECT round, client, detail FROM events WHERE kind = 'rejected'").fetchall()
    # One row per (round, client, reason), whatever the number of messages.
    assert len(rows) <= 4 and all("message(s)" in d for _, _, d in rows), rows
    warnings = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warnings) <= 8, [w.getMessage() for w in warnings][:10]


def test_a_client_killed_mid_round_closes_the_round_by_its_last_will(tmp_path, mosquitto):
    fed = "killed"
    # Client 2 trains slowly (many local epochs), so it is still training when it is killed.
    procs = [_client(1, mosquitto, fed, tmp_path), _client(2, mosquitto, fed, tmp_path)]
    killer_done = threading.Event()
    # Killed once round 1's announcement selected it, so it dies while the round waits for it (killed when round 0's
    # report appears, its will could reach the coordinator before round 1's selection, which then leaves it out).
    watcher = Watcher(mosquitto, Topics(fed).round)

    def kill_client_2_once_round_1_opens() -> None:
        try:
            watcher.wait_for(lambda _t, payload, _r: bool(payload) and RoundAnnouncement.from_bytes(payload).round == 1
                             and "hapt-02" in RoundAnnouncement.from_bytes(payload).selected, 120)  # fmt: skip
            procs[1].send_signal(signal.SIGKILL)
        finally:
            watcher.close()
            killer_done.set()

    threading.Thread(target=kill_client_2_once_round_1_opens, daemon=True).start()
    try:
        cfg = _small(tmp_path / "run", mosquitto, fed, rounds=2, timing={"expected_clients": 2, "round_timeout_s": 600},
                     training={"local_epochs": 40})
        doc = Coordinator(cfg, progress=False).run()
    finally:
        killer_done.wait(130)
        _stop(procs)
    r1 = doc["rounds"][1]
    assert r1["updates"] == 1 and r1["missing"] == ["hapt-02"]
    assert r1["seconds"] < 300  # the will closed it; the deadline was 600 s away


def test_a_coordinator_killed_while_collecting_resumes_without_losing_a_round(tmp_path, mosquitto):
    fed = "crash"
    run_dir = tmp_path / "run"
    procs = [_client(k, mosquitto, fed, tmp_path) for k in (1, 2)]
    cmd = [sys.executable, "-m", "coordinator.cli", "--broker", f"127.0.0.1:{mosquitto}", "--federation", fed, "--run-id", fed,
           "--run-dir", str(run_dir), "--rounds", "3", "--expected-clients", "2", "--local-epochs", "30", "--server-lr", "1",
           *coordinator_args(dense_units=16)]  # fmt: skip
    try:
        with open(tmp_path / "c1.log", "wb") as log:
            first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        end = time.monotonic() + 180
        while time.monotonic() < end and first.poll() is None:  # kill it as round 1 is being collected
            report = run_dir / "report.json"
            if report.exists() and len(json.loads(report.read_text()).get("rounds", [])) >= 1:
                first.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        first.wait(30)
        assert first.returncode == -signal.SIGKILL, (tmp_path / "c1.log").read_text()[-2000:]
        second = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    finally:
        _stop(procs)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    rounds = json.loads((run_dir / "report.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r["updates"] == 2 for r in rounds)
