"""The home server end to end against a real Mosquitto with TLS and an ACL (tests/support/secured_broker.py):
three devices enrolled with ``fedhar-coordinator enrol`` join with their bundle alone, ``serve`` runs rounds
as they are eligible, one is revoked mid-run (refused by the broker, its late retained status and an update
sent after the revocation not counted, never selected again), and a SIGKILLed ``serve`` started again goes
on from the newest version in a new epoch that the clients notice."""

from __future__ import annotations

import json
import queue
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry_views import kept_versions
from support.small_federation import CONV_FILTERS, DENSE_UNITS, processes, wait_for

from coordinator.server.registry import Registry
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_models.wire.messages import ClientStatus
from har_models.wire.topics import Topics

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
FED = "homefed"
DEVICES = ("dev-a", "dev-b", "dev-c")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _newest(data: Path) -> int:
    v = kept_versions(data)
    return v[-1][0] if v else 0


def _took(data: Path, name: str) -> set[int]:
    reg = Registry(data)
    try:
        return {p.round for p in reg.participation(name)}
    finally:
        reg.close()


def test_enrol_three_revoke_one_mid_run_and_restart(tmp_path: Path, tls_mosquitto: Callable[..., Any]) -> None:
    b = tls_mosquitto(FED, ["spare"])
    _scenario(tmp_path, b)


def _scenario(tmp_path: Path, b: Any) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text(
        f"min_clients = 2\n[model]\nconv_filters = {CONV_FILTERS}\ndense_units = {DENSE_UNITS}\n"
        "[timing]\nround_timeout_s = 60\nstatus_refresh_s = 5\n[training]\nlocal_epochs = 1\n"
        f'[server]\nname = "home-test"\nbroker_dir = "{b.out}"\npublic_host = "127.0.0.1"\nhttp_port = 0\nkeep_versions = 5\n'
        "[schedule]\nmin_clients = 2\nmin_round_interval_s = 1\n"
    )
    # enrol: broker account + bundle + QR code, the password in the files only
    for name in DEVICES:
        r = _cli("enrol", name, "--owner", "Anna", "--data", str(data))
        assert r.returncode == 0, r.stderr
        bundle = json.loads((data / "enrolment" / f"{name}.json").read_text())
        assert bundle["client_id"] == name and bundle["port"] == b.tls_port and bundle["coordinator"] == "home-test"
        assert bundle["password"] not in r.stdout + r.stderr
        for ext in ("json", "png"):
            assert stat.S_IMODE((data / "enrolment" / f"{name}.{ext}").stat().st_mode) == 0o600
        assert f"{name} enrolled" in r.stdout and "▀" in r.stdout + "▄█"  # the terminal QR code
    r = _cli("enroll", "dev-a", "--data", str(data))
    assert r.returncode == 2 and "already enrolled" in r.stderr

    serve_log = tmp_path / "serve.log"
    logs = [serve_log, *(tmp_path / f"{n}.log" for n in DEVICES)]
    clients: dict[str, subprocess.Popen[bytes]] = {}
    with processes() as procs:
        for i, name in enumerate(DEVICES):
            cmd = [sys.executable, "-m", "edge_client.cli", "--enrolment", str(data / "enrolment" / f"{name}.json"),
                   "--source", f"hapt:{HAPT}/user{i + 1:02d}.npz", "--state-dir", str(tmp_path / f"s-{name}"),
                   "--threads", "1"]  # fmt: skip
            with open(tmp_path / f"{name}.log", "ab") as out:
                clients[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            procs.append(clients[name])

        def serve() -> subprocess.Popen[bytes]:
            with open(serve_log, "ab") as out:
                p = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data)],
                                     stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip
            procs.append(p)
            return p

        first = serve()
        wait_for(lambda: bool(_took(data, "dev-c")) and _newest(data) >= 2, 300, "a round with all three devices", logs)
        r = _cli("revoke", "dev-c", "--data", str(data))
        assert r.returncode == 0, r.stderr
        assert "dev-c's broker account and ACL removed" in r.stdout
        assert "the running server cleared dev-c's retained status and models" in r.stdout  # through its own session
        revoked_at = _newest(data)
        # refused by the broker: the reload closed its session and its password no longer logs in
        assert clients["dev-c"].wait(90) == 4
        assert "not authori" in (tmp_path / "dev-c.log").read_text().lower()
        wait_for(lambda: "model chunk(s) of dev-c" in serve_log.read_text(), 30, "serve clearing dev-c", logs)
        # a late retained status of dev-c, published after the revocation (by the coordinator's account, the only one that
        # may write there: its login disconnects the running serve for a moment, which reconnects and gets the status)
        link = MqttLink(BrokerConfig.parse(f"127.0.0.1:{b.port}", username="coordinator", password=b.password("coordinator")),
                        "test-late-messages", subscriptions=[])  # fmt: skip
        assert link.start(wait_s=15)
        t = Topics(FED)
        late = ClientStatus("dev-c", "online", label_set="hapt6", n_train=100, sent_unix=time.time(), refresh_s=30.0)
        link.publish(t.client_status("dev-c"), late.to_bytes(), retain=True)
        link.stop()
        wait_for(lambda: _newest(data) >= revoked_at + 3, 240, "three more rounds after the revocation", logs)
        text = serve_log.read_text()
        assert text.count("ignoring the status of revoked device dev-c") >= 1
        took_c = _took(data, "dev-c")
        report = json.loads((data / "run" / "report.json").read_text())
        after = [r for r in report["rounds"] if r["round"] > max(took_c)]
        assert len(after) >= 2
        for rec in after[1:]:  # the round open at the revocation may have selected it; none later does
            assert rec["selected"] == 2 and set(rec["personalisation_clients"]) == {"dev-a", "dev-b"}
        # the late status was cleared again by serve: a monitor that subscribes now finds none
        seen: list[bytes] = []
        mon = MqttLink(BrokerConfig.parse(f"127.0.0.1:{b.port}", username="monitor", password=b.password("monitor")),
                       "test-monitor", subscriptions=[(t.client_status("+"), 1)])  # fmt: skip
        assert mon.start(wait_s=15)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                topic, payload, _ = mon.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if topic == t.client_status("dev-c"):
                seen.append(payload)
        mon.stop()
        assert all(p == b"" for p in seen), seen
        # devices: enrolled / online / revoked
        r = _cli("devices", "--data", str(data), "--json")
        assert r.returncode == 0, r.stderr
        rows = {d["name"]: d for d in json.loads(r.stdout)}
        assert rows["dev-c"]["state"] == "revoked" and rows["dev-c"]["online"] == "no"
        assert rows["dev-a"]["state"] == "enrolled" and rows["dev-a"]["online"] == "yes" and rows["dev-a"]["owner"] == "Anna"
        # SIGKILL and start again without --resume: the next round follows the newest version, in epoch 2
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        newest = kept_versions(data)[-1]
        second = serve()
        wait_for(lambda: _newest(data) >= newest[0] + 2, 240, "two more rounds after the restart", logs)
        wait_for(lambda: all("epoch 1 -> 2" in (tmp_path / f"{n}.log").read_text() for n in ("dev-a", "dev-b")), 30,
              "the clients noticing the new epoch", logs)  # fmt: skip
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    text = serve_log.read_text()
    # a SIGKILL between a round's commit and its version file: the restart keeps that round as a version first
    assert "epoch 2, run " in text
    assert f"continuing after round {newest[1]} " in text or f"continuing after round {newest[1] + 1} " in text
    kept = [r for _, r in kept_versions(data)]
    assert kept == list(range(kept[0], kept[0] + len(kept)))  # no round without its version
    report = json.loads((data / "run" / "report.json").read_text())
    rounds = [r["round"] for r in report["rounds"]]
    assert rounds == list(range(len(rounds)))
    # forget: dev-c's rows and files go, the name stays refused
    r = _cli("forget", "dev-c", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert _took(data, "dev-c") == set() and not (data / "enrolment" / "dev-c.json").exists()
    assert not list((data / "run" / "models").glob("r*/personal/dev-c.safetensors"))
    r = _cli("enroll", "dev-c", "--data", str(data))
    assert r.returncode == 2 and "enrol it under a new name" in r.stderr
