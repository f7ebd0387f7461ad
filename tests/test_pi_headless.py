"""A Raspberry-Pi-style headless device: record with fedhar-record, then the systemd unit's command joins a federation.

The unit file's ExecStart is run by hand (systemd specifiers and the variables of the
environment file that ``pi_setup.sh`` writes filled in), with the windows recorded on the
device (``--source recorded:hapt6``), against a real Mosquitto and coordinator. PyTorch is
blocked in the client's interpreter, as it is absent from the venv ``pi_setup.sh`` makes
(``fedhar[pi]``). A replayed HAPT session stands in for the MPU-6050 (whose driver is tested
against an emulated bus in test_mpu6050.py). The same path under a real systemd, on an arm64
board: tests/test_pi_board.py.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.small_federation import coordinator_args

from edge_client import record_cli
from edge_client.window_log import WindowLog
from har_models.data.labels import HAPT_LABELS
from simulation.broker import stop_process

pytestmark = pytest.mark.slow  # a federation through the systemd unit's command

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "firmware_scripts" / "systemd" / "fedhar-client@.service"
PI_SETUP = ROOT / "firmware_scripts" / "pi_setup.sh"


def _exec_start(env: dict[str, str], instance: str, state_root: Path, creds: Path) -> list[str]:
    line = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart="))
    line = line.removeprefix("ExecStart=").replace("%i", instance).replace("%d", str(creds)).replace("%S", str(state_root))
    for k, v in env.items():
        line = line.replace("${" + k + "}", v)
    argv = []
    for word in shlex.split(line):
        if word.startswith("$") and word[1:] in env:  # $VAR: split into words, as systemd does
            argv += shlex.split(env[word[1:]])
        else:
            argv.append(word)
    assert argv[0] == "/opt/fedhar/.venv/bin/fedhar-client"
    without_torch = "import sys; sys.modules['torch'] = None; from edge_client.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", without_torch, *argv[1:]]


def _pi_setup_client_args() -> str:
    """FEDHAR_CLIENT_ARGS of the environment file ``pi_setup.sh`` writes with its defaults."""
    r = subprocess.run(
        ["bash", str(PI_SETUP), "--client-id", "pi-kitchen", "--broker", "h:1", "--no-i2c", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return next(ln.strip().split("=", 1)[1] for ln in r.stdout.splitlines() if ln.strip().startswith("FEDHAR_CLIENT_ARGS="))


def test_recorded_windows_train_in_a_federation_through_the_unit_command(tmp_path, mosquitto, capsys):
    cid = "pi-kitchen"
    state_root = tmp_path / "var-lib"
    state = state_root / "fedhar" / cid
    replay = f"replay:hapt:{ROOT / 'datasets/hapt/user01.npz'}"
    for activity in ("walking", "sitting"):
        rc = record_cli.main(
            ["--state-dir", str(state), "--sensor", replay, "--replay-speed", "100", "--seconds", "1.5", "--activity", activity]
        )
        assert rc == 0
    printed = capsys.readouterr().out
    counts = WindowLog(state / "recorded_windows.log", HAPT_LABELS).counts()
    assert counts[0] >= 20 and counts[3] >= 20 and counts.sum() == counts[0] + counts[3]
    assert f"sitting: {counts[3]} new windows" in printed

    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "password").write_text("unused-on-an-anonymous-test-broker\n")
    env = {
        "FEDHAR_BROKER": f"127.0.0.1:{mosquitto}",
        "FEDHAR_FEDERATION": "pitest",
        "FEDHAR_SOURCE": "recorded:hapt6",
        "FEDHAR_CLIENT_ARGS": _pi_setup_client_args() + " --exit-after-run pitest",
    }
    client_cmd = _exec_start(env, cid, state_root, creds)
    coord_cmd = [sys.executable, "-m", "coordinator.cli", "--broker", f"127.0.0.1:{mosquitto}", "--federation", "pitest"]
    coord_cmd += ["--run-dir", str(tmp_path / "run"), "--run-id", "pitest", "--rounds", "1", "--min-clients", "1"]
    coord_cmd += ["--expected-clients", "1", *coordinator_args()]
    with open(tmp_path / "coordinator.log", "wb") as clog, open(tmp_path / "client.log", "wb") as dlog:
        coordinator = subprocess.Popen(coord_cmd, cwd=ROOT, stdout=clog, stderr=subprocess.STDOUT)
        client = subprocess.Popen(client_cmd, cwd=ROOT, stdout=dlog, stderr=subprocess.STDOUT)
        try:
            assert coordinator.wait(240) == 0, (tmp_path / "coordinator.log").read_text()[-3000:]
            assert client.wait(60) == 0, (tmp_path / "client.log").read_text()[-3000:]
        finally:
            stop_process(client)
            stop_process(coordinator)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [(r["round"], r["updates"], r["selected"]) for r in report["rounds"]] == [(0, 1, 1)]
    log_text = (tmp_path / "client.log").read_text()
    n_test = round(0.2 * counts[0]) + round(0.2 * counts[3])  # stratified 80/20 per activity
    assert f"[{cid}] {int(counts.sum()) - n_test} training and {n_test} test windows from recorded:hapt6" in log_text
    assert (state / "local_model.safetensors").exists()
