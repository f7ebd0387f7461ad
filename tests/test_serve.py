"""``fedhar-coordinator serve`` against a real Mosquitto: rounds as devices are eligible, numbered versions,
a SIGKILL and a start without --resume that continues from the newest version in a new epoch the clients
notice; revoked devices refused by the coordinator. Plus the pieces that need no broker: the data folder's
settings refused at start, ``versions``, and the subcommand dispatch."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from support.registry_views import kept_versions
from support.small_federation import CONV_FILTERS, DENSE_UNITS, processes, wait_for

from coordinator.server.registry import Registry
from coordinator.state import load_state_file
from simulation.broker import free_port

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
FED = "servefed"


def _settings(data: Path, extra: str = "", http_port: int = 0) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "server.toml").write_text(
        f"min_clients = 2\n{extra}\n[model]\nconv_filters = {CONV_FILTERS}\ndense_units = {DENSE_UNITS}\n"
        f"[timing]\nround_timeout_s = 120\nstatus_refresh_s = 5\n[training]\nlocal_epochs = 1\n"
        f"[server]\nhttp_port = {http_port}\nkeep_versions = 3\n"
        "[schedule]\nmin_clients = 2\nmin_round_interval_s = 1\n"
    )


def _serve(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", f"127.0.0.1:{port}", "--federation", FED]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def _client(cid: str, user: int, state: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, "--source", f"hapt:{HAPT}/user{user:02d}.npz",
           "--state-dir", str(state), "--broker", f"127.0.0.1:{port}", "--federation", FED, "--threads", "1"]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def _newest(data: Path) -> int:
    got = kept_versions(data)
    return got[-1][0] if got else 0


@pytest.mark.slow
def test_serve_survives_a_sigkill_and_continues_from_the_newest_version_in_a_new_epoch(tmp_path: Path, mosquitto: int) -> None:
    data = tmp_path / "data"
    _settings(data)
    reg = Registry(data)
    for cid in ("dev-a", "dev-b"):
        reg.enrol(cid, "Anna")
    reg.enrol("dev-gone", None)
    reg.revoke("dev-gone")  # a revoked device that still has its old credentials
    reg.close()
    serve_log, logs = tmp_path / "serve.log", [tmp_path / "serve.log", tmp_path / "a.log", tmp_path / "b.log", tmp_path / "gone.log"]
    with processes() as procs:
        procs.append(_client("dev-a", 1, tmp_path / "sa", mosquitto, logs[1]))
        procs.append(_client("dev-b", 2, tmp_path / "sb", mosquitto, logs[2]))
        procs.append(_client("dev-gone", 3, tmp_path / "sg", mosquitto, logs[3]))
        first = _serve(data, mosquitto, serve_log)
        procs.append(first)
        wait_for(lambda: _newest(data) >= 2, 240, "two model versions", logs)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        before = kept_versions(data)
        last_round = before[-1][1]
        page = free_port()
        toml = data / "server.toml"
        toml.write_text(toml.read_text().replace("http_port = 0", f"http_port = {page}"))
        second = _serve(data, mosquitto, serve_log)
        procs.append(second)
        wait_for(lambda: _newest(data) >= before[-1][0] + 2, 240, "two more model versions after the restart", logs)
        wait_for(lambda: "epoch 1 -> 2" in logs[1].read_text() and "epoch 1 -> 2" in logs[2].read_text(), 30,
              "both clients noticing the new epoch", logs)  # fmt: skip
        # the status page of the running serve lists the enrolled devices
        wait_for(lambda: f"status page on http://127.0.0.1:{page}/" in serve_log.read_text(), 30, "the status page", logs)
        with urllib.request.urlopen(f"http://127.0.0.1:{page}/api/devices", timeout=10) as resp:
            listed = resp.read().decode()
        assert resp.status == 200 and "dev-a" in listed and "dev-b" in listed
        # SIGHUP (systemctl reload): the schedule is read again and what changed is logged
        toml.write_text(toml.read_text().replace("min_round_interval_s = 1", "min_round_interval_s = 2"))
        second.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload: [schedule] min_round_interval_s 1.0 -> 2.0" in serve_log.read_text(), 30, "the reload", logs)
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    text = serve_log.read_text()
    assert "serving federation 'servefed': epoch 1" in text and "no round yet" in text
    assert "serving federation 'servefed': epoch 2, run " in text
    # a SIGKILL between a round's commit and its version file: the restart keeps that round as a version first
    assert f"continuing after round {last_round} " in text or f"continuing after round {last_round + 1} " in text
    after = kept_versions(data)
    # versions count on and keep_versions = 3 keeps the newest three; their rounds follow without a gap or a repeat
    assert [v for v, _ in after] == list(range(after[-1][0] - 2, after[-1][0] + 1))
    assert [r for _, r in after] == list(range(after[0][1], after[0][1] + 3))
    assert after[-1][1] >= last_round + 2
    assert sorted((data / "versions").glob("v*.safetensors")) == [data / "versions" / f"v{v:06d}.safetensors" for v, _ in after]
    # the round after the restart started from the newest version: the run state's model of that round is the version file
    report = json.loads((data / "run" / "report.json").read_text())
    rounds = [r["round"] for r in report["rounds"]]
    assert rounds == list(range(len(rounds))) and rounds[-1] == after[-1][1]
    spec, newest = load_state_file(data / "versions" / f"v{after[-1][0]:06d}.safetensors")
    _, kept = load_state_file(data / "run" / "models" / f"r{after[-1][1]:04d}" / "global.safetensors")
    assert spec.conv_filters == CONV_FILTERS and all(torch.equal(newest[k], kept[k]) for k in newest)
    # the revoked device was never selected nor counted, its updates (if any) rejected
    for r in report["rounds"]:
        assert r["selected"] == 2 and r["updates"] == 2 and set(r["personalisation_clients"]) == {"dev-a", "dev-b"}
    assert "ignoring the status of revoked device dev-gone" in text
    assert "[dev-gone] round" not in logs[3].read_text()  # never trained
    # participation rows for both devices in each kept round
    reg = Registry(data)
    took = {(p.name, p.round) for p in reg.participation()}
    reg.close()
    assert {(n, r) for n in ("dev-a", "dev-b") for r in rounds} == took
    # fedhar-coordinator versions lists what the registry holds
    out = subprocess.run([sys.executable, "-m", "coordinator.cli", "versions", "--data", str(data), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [(v["version"], v["round"]) for v in json.loads(out.stdout)] == after


def test_reload_applies_the_tables_and_keeps_the_settings_in_force_on_a_bad_file(tmp_path: Path) -> None:
    from coordinator.server.serve import Server
    from har_io.broker_config import BrokerConfig

    data = tmp_path / "data"
    _settings(data)
    server = Server(data, BrokerConfig.parse("127.0.0.1:9"), FED)  # not started: no broker needed
    assert server.epoch == 1 and server.schedule.min_round_interval_s == 1.0
    toml = data / "server.toml"
    toml.write_text(toml.read_text().replace("min_clients = 2\nmin_round_interval_s = 1", 'min_clients = 3\nwindow = "22:00-06:00"'))
    assert server.reload() == ["[schedule] min_clients 2 -> 3", "[schedule] min_round_interval_s 1.0 -> 3600.0",
                               "[schedule] window None -> '22:00-06:00'"]  # fmt: skip
    assert server.schedule.min_clients == 3 and server.schedule.window == "22:00-06:00"
    toml.write_text(toml.read_text() + "[bogus]\n")
    assert server.reload() == [] and server.schedule.min_clients == 3  # refused: kept
    # the next start: after the last round's end plus the interval, moved into the window
    server.last_end = 1773093600.0  # 2026-03-10 00:00 at UTC+2 (the server's tz below)
    server.tz = dt.timezone(dt.timedelta(hours=2))
    assert server.next_start(1773093600.0) == 1773093600.0 + 3600.0  # 01:00, inside 22:00-06:00
    server.close()


@pytest.mark.slow
def test_a_status_page_off_loopback_without_a_token_is_refused_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _settings(data, http_port=8765)
    toml = data / "server.toml"
    toml.write_text(toml.read_text().replace("[server]\n", '[server]\nhttp_bind = "0.0.0.0"\n'))
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", "127.0.0.1:9"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "token" in r.stderr, r.stderr
    assert not (data / "server.sqlite").exists()  # refused before anything was written


@pytest.mark.slow
def test_serve_refuses_bad_settings_with_the_key_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _settings(data, extra="aggregatoin = 'fedavg'")
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", "127.0.0.1:9"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "unknown setting 'aggregatoin' (did you mean 'aggregation'?)" in r.stderr
    (data / "server.toml").write_text("min_clients = 3\n[schedule]\nmin_clients = 2\n")
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", "127.0.0.1:9"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "[schedule] min_clients = 2 is below the quorum min_clients = 3" in r.stderr


@pytest.mark.slow
def test_a_damaged_server_database_stops_serve_with_exit_6(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _settings(data)
    (data / "server.sqlite").write_bytes(b"")
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", "127.0.0.1:9"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert r.returncode == 6 and "server.sqlite is damaged (it is empty (0 bytes))" in r.stderr
    assert (data / "server.sqlite").stat().st_size == 0


@pytest.mark.slow
def test_versions_and_devices_of_an_empty_data_folder(tmp_path: Path) -> None:
    # A folder without a registry is the wrong folder (or no device was ever enrolled): said so, and no
    # stray database is left behind (an empty list read from it would look like a server without devices).
    data = tmp_path / "data"
    for cmd in (["versions"], ["devices"]):
        r = subprocess.run([sys.executable, "-m", "coordinator.cli", *cmd, "--data", str(data), "--json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
        assert r.returncode == 2 and r.stdout == "" and f"{data / 'server.sqlite'} does not exist" in r.stderr, r.stderr
    assert not data.exists()


def test_a_round_committed_without_its_version_is_kept_as_one_at_the_next_start(tmp_path: Path) -> None:
    """A SIGKILL between the run state's commit of a round and its version file: the next start keeps it."""
    from coordinator.record import Evaluation, Metrics, RoundRecord
    from coordinator.server.serve import Server
    from coordinator.state import RunState
    from har_io.broker_config import BrokerConfig
    from har_models.nn.model import ArchSpec, init_state

    data = tmp_path / "data"
    _settings(data)
    spec = ArchSpec(n_classes=6, conv_filters=CONV_FILTERS, dense_units=DENSE_UNITS)
    st = RunState(data / "run")
    st.put("run_id", "home-1")
    st.put("label_set", "hapt6")
    st.put("initial_spec", spec.to_json())
    one = Metrics(accuracy=0.5, macro_f1=0.25)
    rec = RoundRecord(round=0, evaluation=Evaluation(personalisation=one, personalisation_clients={"dev-a": one}))
    st.complete_round(0, spec, init_state(spec, 3), {}, rec.to_json())
    st.close()
    server = Server(data, BrokerConfig.parse("127.0.0.1:9"), FED)
    assert server.cfg.run_id == "home-1"  # the data folder's run is taken up
    last = server.runner.start(resume=True)
    server.versions.catch_up(last)
    assert kept_versions(data) == [(1, 0)]
    _, kept = load_state_file(data / "versions" / "v000001.safetensors")
    assert all(torch.equal(kept[k], v) for k, v in init_state(spec, 3).items())
    reg = Registry(data)
    assert [(p.name, p.round, p.accuracy, p.macro_f1) for p in reg.participation()] == [("dev-a", 0, 0.5, 0.25)]
    reg.close()
    server.versions.catch_up(last)  # a second look changes nothing
    assert kept_versions(data) == [(1, 0)]
    server.close()
