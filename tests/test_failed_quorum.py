"""A round that closes without quorum does not stall the federation (issue 28), over a real Mosquitto on 127.0.0.1.

One of two devices is frozen (SIGSTOP) while round 0 runs, with a quorum of two: the round
closes at its deadline without quorum, and its retained announcement is cleared at once (an
observer sees no open round). The round is run again as a new attempt (a fresh attempt id):
the device that answered the first attempt re-sends its stored update without training
again, and the frozen one, once it runs again (SIGCONT), answers too. The re-run completes
within one round deadline after the device came back, and the answered device's update is
counted once. A device driven by hand through three attempts of one round re-sends the same
update for an attempt of the same model and trains again for an attempt of another model.

Every wait is bounded; only 127.0.0.1 is used.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.mqtt_watcher import Watcher

from coordinator.config import CoordinatorConfig, ModelSettings, Timing, TrainingSettings
from coordinator.service import Coordinator
from har_io.broker_config import BrokerConfig
from har_models.data.labels import LABEL_SETS
from har_models.nn.model import ArchSpec, init_state
from har_models.wire import codec
from har_models.wire.chunking import Reassembler, split_payload, transfer_id
from har_models.wire.messages import CoordinatorStatus, RoundAnnouncement
from har_models.wire.topics import Topics

pytestmark = pytest.mark.slow  # two device processes and a round that waits for its deadline

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 20.0  # each attempt's round deadline: long enough for 5 epochs of the small CNN on a loaded machine


def _client(k: int, port: int, federation: str, tmp: Path) -> subprocess.Popen[bytes]:
    cid = f"hapt-{k:02d}"
    cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, "--broker", f"127.0.0.1:{port}", "--federation", federation,
           "--source", f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}", "--state-dir", str(tmp / cid), "--threads", "1",
           "--max-seconds", "240"]  # fmt: skip
    with open(tmp / f"{cid}.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _training(topic: str, payload: bytes, retained: bool) -> bool:
    return bool(payload) and RoundAnnouncement.from_bytes(payload).state == "training"


def test_a_device_frozen_mid_round_does_not_stall_the_federation_and_an_update_counts_once(tmp_path: Path, mosquitto: int) -> None:
    fed = "frozen"
    topics = Topics(fed)
    procs = [_client(1, mosquitto, fed, tmp_path), _client(2, mosquitto, fed, tmp_path)]
    watcher = Watcher(mosquitto, topics.round)
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", broker=BrokerConfig(port=mosquitto), federation=fed, run_id=fed,
                            rounds=1, min_clients=2, model=ModelSettings(conv_filters=8, dense_units=16),
                            timing=Timing(expected_clients=2, start_timeout_s=120, round_timeout_s=DEADLINE_S),
                            training=TrainingSettings(local_epochs=5))  # fmt: skip
    out: dict[str, Any] = {}

    def coordinate() -> None:
        try:
            out["doc"] = Coordinator(cfg, progress=False).run()
        except BaseException as exc:  # handed to the test below
            out["error"] = exc
        out["done"] = time.monotonic()

    coordinator = threading.Thread(target=coordinate, daemon=True)
    coordinator.start()
    try:
        _, first, _ = watcher.wait_for(_training, 150)
        procs[1].send_signal(signal.SIGSTOP)  # hapt-02 is frozen while round 0's first attempt runs
        # The first attempt closes at its deadline without quorum; its announcement is cleared at once.
        watcher.wait_for(lambda _t, payload, _r: not payload, DEADLINE_S + 15)
        procs[1].send_signal(signal.SIGCONT)
        back = time.monotonic()
        _, second, _ = watcher.wait_for(_training, DEADLINE_S)
        coordinator.join(DEADLINE_S + 30)
        assert not coordinator.is_alive(), "the re-run of round 0 did not complete"
    finally:
        watcher.c.loop_stop()
        watcher.c.disconnect()
        _stop(procs)
        coordinator.join(60)
    assert "error" not in out, out.get("error")
    a1, a2 = RoundAnnouncement.from_bytes(first), RoundAnnouncement.from_bytes(second)
    assert (a1.round, a2.round) == (0, 0)
    assert a1.attempt == a2.attempt  # the re-run of the same model keeps its attempt: what it counted is carried over
    assert a1.global_model == a2.global_model
    assert out["done"] - back < DEADLINE_S  # completed within one deadline after the device came back
    [r0] = out["doc"]["rounds"]
    assert (r0["selected"], r0["updates"], r0["missing"]) == (2, 2, [])
    with sqlite3.connect(tmp_path / "run" / "state.sqlite") as db:
        failed = db.execute("SELECT round FROM events WHERE kind = 'round_failed'").fetchall()
    assert failed == [(0,)]  # one attempt failed, the next completed
    # The device that answered the first attempt trained once, had its receipt, and sent nothing more for the re-run.
    log1 = (tmp_path / "hapt-01.log").read_text()
    assert len(re.findall(r"\[hapt-01\] round 0: \{", log1)) == 1, log1[-3000:]
    assert log1.count("sending the stored update") == 1, log1[-3000:]  # once, after its training


def _wait_in_log(log: Path, text: str, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = log.read_text(errors="replace")
        if text in got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {log.name}:\n{log.read_text(errors='replace')[-3000:]}")


def test_a_new_attempt_of_the_same_model_gets_the_stored_update_and_of_another_model_a_retraining(tmp_path: Path, mosquitto: int) -> None:
    fed = "attempts"
    t = Topics(fed)
    spec = ArchSpec(n_classes=len(LABEL_SETS["hapt6"]), conv_filters=8, dense_units=16)
    models = [codec.encode({k: v.numpy() for k, v in init_state(spec, seed).items()}, kind="model", round=0,
                           arch_version=spec.version, meta={"arch": spec.to_dict()}) for seed in (1, 2)]  # fmt: skip
    watcher = Watcher(mosquitto, t.client_update("hapt-01", "+"))

    def announce(attempt: str, model: bytes) -> None:
        for i, chunk in enumerate(split_payload(model)):
            watcher.c.publish(t.global_model(i), chunk, qos=1, retain=True).wait_for_publish(10)
        status = CoordinatorStatus("online", fed, attempt, sent_unix=time.time(), refresh_s=30.0)
        watcher.c.publish(t.coordinator_status, status.to_bytes(), qos=1, retain=True).wait_for_publish(10)
        ann = RoundAnnouncement(run_id=fed, round=0, state="training", arch=spec.to_dict(), label_set="hapt6",
                                selected=("hapt-01",), global_model=transfer_id(model), attempt=attempt,
                                deadline_unix=time.time() + 300)  # fmt: skip
        watcher.c.publish(t.round, ann.to_bytes(), qos=1, retain=True).wait_for_publish(10)

    def next_update(timeout: float) -> str:
        """The transfer id of the next update the device sends whole (chunks of earlier sends are skipped)."""
        r = Reassembler()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            _, payload, _ = watcher.wait_for(lambda *_: True, max(0.1, end - time.monotonic()))
            done = r.add("update", payload)
            if done is not None:
                return done[0]
        raise AssertionError("no whole update arrived")

    log = tmp_path / "hapt-01.log"
    procs = [_client(1, mosquitto, fed, tmp_path)]
    try:
        announce("a1", models[0])
        first = next_update(150)
        trained = re.compile(r"\[hapt-01\] round 0: \{")
        announce("a2", models[0])  # the same model again: the stored update, not a retraining
        text = _wait_in_log(log, "sending the stored update for coordinator attempt a2", 60)
        assert len(trained.findall(text)) == 1
        announce("a3", models[1])  # another model for the same round: trained again
        text = _wait_in_log(log, "attempt a3 announces another model than the one I trained on; training again", 60)
        end = time.monotonic() + 120
        third = first
        while third == first and time.monotonic() < end:  # skip re-sends of the first update still under way
            third = next_update(end - time.monotonic())
        assert third != first
        end = time.monotonic() + 30  # the training line is logged just after the update went out
        while len(trained.findall(log.read_text())) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        assert len(trained.findall(log.read_text())) == 2
    finally:
        watcher.c.loop_stop()
        watcher.c.disconnect()
        _stop(procs)
