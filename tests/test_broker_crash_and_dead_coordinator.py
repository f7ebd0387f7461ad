"""A broker that crashes and comes back empty, and a coordinator that died without its will.

Both against a real Mosquitto on 127.0.0.1 (``simulation.broker.LocalMosquitto``, no
persistence), with the coordinator and clients as the programs users run (subprocesses).
See docs/reliability.md, "A broker that crashes" and "A dead coordinator".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.mqtt_watcher import Watcher
from support.small_federation import coordinator_args, processes, wait_or_stop

from har_models.data.labels import LABEL_SETS
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import split_payload, transfer_id
from har_models.wire.messages import ClientStatus, CoordinatorStatus, RoundAnnouncement, fresh_until
from simulation.broker import LocalMosquitto, find_mosquitto

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
WAIT_S = 10.0
ROUND_TIMEOUT_S = 150


def _need_mosquitto() -> None:
    if find_mosquitto() is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")


def _online(cid: str):
    def pred(topic: str, payload: bytes, retained: bool) -> bool:
        return topic.endswith(f"/client/{cid}/status") and bool(payload) and ClientStatus.from_bytes(payload).state != "offline"

    return pred


def _training(topic: str, payload: bytes, retained: bool) -> bool:
    return topic.endswith("/round") and bool(payload) and RoundAnnouncement.from_bytes(payload).state == "training"


def _client(cid: str, user: int, state: Path, port: int, fed: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, "--source", f"hapt:{HAPT}/user{user:02d}.npz",
           "--state-dir", str(state), "--broker", f"127.0.0.1:{port}", "--federation", fed, "--threads", "1", *extra]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def _coordinator(run: str, run_dir: Path, port: int, fed: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "coordinator.cli", "--run-id", run, "--run-dir", str(run_dir), "--broker", f"127.0.0.1:{port}",
           "--federation", fed, *coordinator_args(round_timeout_s=ROUND_TIMEOUT_S), "--local-epochs", "1",
           "--expected-clients", "1", "--min-clients", "1", *extra]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def _rounds(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "report.json").read_text())["rounds"]


# ----------------------------------------------------------------------------- unit: the message and the clock
def test_coordinator_status_carries_its_refresh_and_older_messages_still_parse():
    st = CoordinatorStatus("online", "r", "a1", sent_unix=1000.5, refresh_s=30.0)
    assert CoordinatorStatus.from_bytes(st.to_bytes()) == st
    old = b'{"attempt": "a1", "protocol": 1, "run_id": "r", "state": "online"}'  # a coordinator before the fields
    assert CoordinatorStatus.from_bytes(old) == CoordinatorStatus("online", "r", "a1", 0.0, 0.0)
    assert CoordinatorStatus("online", "r", "a1").to_bytes() == old  # one that does not refresh writes what it wrote
    for bad in ('"refresh_s": -1', '"sent_unix": "now"', '"refresh_s": true', '"sent_unix": 1e12'):
        with pytest.raises(ValueError, match="coordinator status"):
            CoordinatorStatus.from_bytes(('{"protocol": 1, "state": "online", ' + bad + "}").encode())


def test_a_status_goes_stale_after_three_refresh_periods():
    # live: from its arrival at monotonic 100 s -> 100 + 3 * 30
    assert fresh_until(5000.0, 30.0, retained=False, now=100.0, now_unix=9999.0) == 190.0
    # retained: from the time it carries; 40 s old on arrival -> 100 + 90 - 40
    assert fresh_until(5000.0, 30.0, retained=True, now=100.0, now_unix=5040.0) == 150.0
    # an hour old: stale on arrival; stamped in the future: age 0; no refresh period: never stale
    assert fresh_until(5000.0, 30.0, retained=True, now=100.0, now_unix=8600.0) == 100.0 + 90.0 - 3600.0
    assert fresh_until(5000.0, 30.0, retained=True, now=100.0, now_unix=4000.0) == 190.0
    assert fresh_until(5000.0, 0.0, retained=True, now=100.0, now_unix=8600.0) is None


# ----------------------------------------------------------------------------- item 2: a broker that crashes
@pytest.mark.slow
def test_a_broker_killed_mid_round_and_restarted_empty_gets_the_round_again_and_it_closes_with_the_update(tmp_path):
    """SIGKILL of Mosquitto after the round's models and announcement were published, before the
    client uploaded; the broker comes back on the same port with nothing retained. The client
    reconnects first (the coordinator is held with SIGSTOP until the client is online again),
    the coordinator then reconnects, publishes the round again, and the round closes with the
    client's update long before its deadline.
    """
    _need_mosquitto()
    fed = "crashfed"
    p = f"fedhar/v1/{fed}"
    b1 = LocalMosquitto(log_file=tmp_path / "b1.log", start_timeout_s=WAIT_S).__enter__()
    port = b1.port
    b2: LocalMosquitto | None = None
    try:
        with processes() as procs:
            w = Watcher(port, f"{p}/client/+/status", f"{p}/round")
            first = _client("hapt-01", 1, tmp_path / "c1", port, fed, tmp_path / "c1a.log", "--max-seconds", "400")
            procs.append(first)
            w.wait_for(_online("hapt-01"), 120)
            first.send_signal(signal.SIGSTOP)  # present and selected, but it will never get this round from this broker
            coord = _coordinator("crash", tmp_path / "run", port, fed, tmp_path / "coord.log", "--rounds", "1")
            procs.append(coord)
            w.wait_for(_training, 120)  # models are published (and acknowledged) before the announcement
            w.close()
            coord.send_signal(signal.SIGSTOP)
            assert b1.process is not None
            b1.process.kill()  # a crash: no will sent, nothing saved
            b1.process.wait(WAIT_S)
            first.kill()  # the device dies too; its will went nowhere
            first.wait(WAIT_S)
            b2 = LocalMosquitto(port=port, log_file=tmp_path / "b2.log", start_timeout_s=WAIT_S).__enter__()
            empty = Watcher(port, f"{p}/#")
            assert empty.drain(1.0) == [], "the restarted broker holds nothing"
            empty.close()
            w2 = Watcher(port, f"{p}/client/+/status")
            again = _client("hapt-01", 1, tmp_path / "c1", port, fed, tmp_path / "c1b.log", "--exit-after-run", "crash",
                            "--max-seconds", "400")  # fmt: skip
            procs.append(again)
            w2.wait_for(_online("hapt-01"), 120)  # the client is back first, on an empty broker
            w2.close()
            t0 = time.monotonic()
            coord.send_signal(signal.SIGCONT)
            assert wait_or_stop(coord, 120, tmp_path / "coord.log") == 0, (tmp_path / "coord.log").read_text()[-3000:]
            took = time.monotonic() - t0
            rounds = _rounds(tmp_path / "run")
            assert [(r["round"], r["selected"], r["updates"]) for r in rounds] == [(0, 1, 1)]
            assert rounds[0]["missing"] == []
            assert took < ROUND_TIMEOUT_S / 2, f"the round took {took:.0f} s after the broker came back"
            assert "published the round's models and announcement again" in (tmp_path / "coord.log").read_text()
            assert wait_or_stop(again, 60, tmp_path / "c1b.log") == 0
    finally:
        b1.stop()
        if b2 is not None:
            b2.stop()


# ----------------------------------------------------------------------------- item 4: a dead coordinator
@pytest.mark.slow
def test_a_stale_online_coordinator_is_gone_and_a_refreshing_one_keeps_clients_training(tmp_path):
    """A retained "online" coordinator status an hour old (its will never reached the broker) with
    its round announcement and model: a client started later does not train and logs that the
    coordinator is gone. A live coordinator refreshing every 0.5 s (stale after 1.5 s) then runs
    two rounds with the same client: each counts its update, and no staleness is ever logged for it.
    """
    _need_mosquitto()
    fed = "ghostfed"
    p = f"fedhar/v1/{fed}"
    with LocalMosquitto(log_file=tmp_path / "b.log", start_timeout_s=WAIT_S) as b, processes() as procs:
        spec = ArchSpec(n_classes=len(LABEL_SETS["hapt6"]), conv_filters=8, dense_units=32)
        env = codec.encode({k: v.numpy() for k, v in init_state(spec, 1).items()}, kind="model", round=0,
                           arch_version=spec.version, meta={"arch": spec.to_dict()})  # fmt: skip
        ghost = RoundAnnouncement(run_id="ghost", round=0, state="training", arch=spec.to_dict(), label_set="hapt6",
                                  selected=("hapt-01",), global_model=transfer_id(env), attempt="old",
                                  deadline_unix=time.time() + 3600)  # fmt: skip
        w = Watcher(b.port, f"{p}/client/+/status", f"{p}/client/+/update/+")
        for i, ch in enumerate(split_payload(env)):
            w.c.publish(f"{p}/model/global/{i}", ch, qos=1, retain=True).wait_for_publish(WAIT_S)
        w.c.publish(f"{p}/round", ghost.to_bytes(), qos=1, retain=True).wait_for_publish(WAIT_S)
        stale = CoordinatorStatus("online", "ghost", "old", sent_unix=time.time() - 3600, refresh_s=30.0)
        w.c.publish(f"{p}/coordinator/status", stale.to_bytes(), qos=1, retain=True).wait_for_publish(WAIT_S)
        log = tmp_path / "c.log"
        procs.append(_client("hapt-01", 1, tmp_path / "c", b.port, fed, log, "--exit-after-run", "live", "--max-seconds", "400"))
        w.wait_for(_online("hapt-01"), 120)
        end = time.monotonic() + 30
        while "the coordinator of run ghost is gone" not in log.read_text() and time.monotonic() < end:
            time.sleep(0.2)
        assert "the coordinator of run ghost is gone" in log.read_text(), log.read_text()[-3000:]
        assert "not training on round 0" in log.read_text()
        assert not [m for m in w.drain(3.0) if "/update/" in m[0]], "no update for a dead coordinator's round"
        w.close()

        coord = _coordinator("live", tmp_path / "run", b.port, fed, tmp_path / "coord.log", "--rounds", "2",
                             "--status-refresh", "0.5")  # fmt: skip
        procs.append(coord)
        assert wait_or_stop(coord, 300, tmp_path / "coord.log") == 0, (tmp_path / "coord.log").read_text()[-3000:]
        assert [(r["round"], r["selected"], r["updates"]) for r in _rounds(tmp_path / "run")] == [(0, 1, 1), (1, 1, 1)]
        assert wait_or_stop(procs[0], 60, log) == 0
        text = log.read_text()
        assert "the coordinator of run live is gone" not in text
        assert text.count("the coordinator of run ghost is gone") == 1  # said once, not every poll
