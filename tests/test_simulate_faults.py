"""The simulation launcher under faults a new user meets: clients with nothing to train on, another working folder."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest
from support.realworld_synth import build
from support.small_federation import simulate_args

from edge_client.store import ClientStore
from har_models.data.labels import HAPT_LABELS
from simulation import simulate

pytestmark = pytest.mark.slow  # simulations with broken clients and data

ROOT = Path(__file__).resolve().parents[1]
# The smallest CNN (4 filters, 8 units), one round; --clients is each test's own.
SMALL = [*simulate_args(clients=None, conv_filters=4, dense_units=8, start_timeout_s=300, generalisation_every=0), "--rounds", "1"]


def _without_accelerometer(archive: Path, subjects: set[int]) -> Path:
    """Rewrite the synthetic archive so that ``subjects`` hold only gyroscope recordings."""
    src = zipfile.ZipFile(io.BytesIO(archive.read_bytes()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name in src.namelist():
            subject = int(name.split("/")[0].removeprefix("proband"))
            if subject in subjects and "/acc_" in name:
                continue
            z.writestr(name, src.read(name))
    archive.write_bytes(out.getvalue())
    return archive


def test_a_client_with_no_windows_is_dropped_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    archive = _without_accelerometer(build(tmp_path / "rw", subjects=3, seconds=20.0), {3})
    run_dir = tmp_path / "run"
    rc = simulate.main(["--dataset", "realworld", "--data", str(archive), *SMALL, "--run-dir", str(run_dir), "--run-id", "nowin"])
    assert rc == 0
    doc = json.loads((run_dir / "report.json").read_text())
    assert doc["clients"] == 2
    assert doc["rounds"][0]["selected"] == 2 and doc["rounds"][0]["updates"] == 2
    assert "client proband3 dropped at start: its data gives no labelled windows" in caplog.text
    assert not (run_dir / "logs" / "proband3.log").exists()  # never started, so never waited for


def test_when_every_client_exits_the_simulation_stops_with_their_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Another client holds both state folders, so each client process refuses to start (exit 6).
    run_dir = tmp_path / "run"
    held = [ClientStore(run_dir / "clients" / cid, HAPT_LABELS, owner="squatter") for cid in ("hapt-01", "hapt-02")]
    try:
        rc = simulate.main(["--clients", "2", *SMALL, "--run-dir", str(run_dir)])
    finally:
        for st in held:
            st.close()
    assert rc == 5
    err = capsys.readouterr().err
    assert "every client process exited (exit codes [6])" in err
    assert "is in use by a running fedhar client" in err and "client id squatter" in err


def test_relative_paths_work_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    data = os.path.relpath(ROOT / "datasets" / "hapt", elsewhere)
    rc = simulate.main(["--data", data, "--clients", "2", *SMALL, "--run-dir", "run", "--run-id", "rel"])
    assert rc == 0
    doc = json.loads((elsewhere / "run" / "report.json").read_text())
    assert doc["rounds"][0]["updates"] == 2
