"""``fedhar-simulate`` stops on SIGINT and SIGTERM: clients and broker end, the exit status says so, and the run resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.small_federation import simulate_args

from coordinator.state import RunState
from simulation.simulate import Interrupted, StopSignals

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 4
SMALL = [*simulate_args(clients=2, conv_filters=4, dense_units=8, round_timeout_s=3600, start_timeout_s=300, generalisation_every=0),
         "--rounds", str(ROUNDS), "--local-epochs", "1", "--engine", "workers", "--workers", "2", "--threads-per-client", "1"]


def _simulate(run_dir: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "simulation.simulate", *SMALL, "--run-dir", str(run_dir), *extra]
    with open(out, "ab") as f:  # its own session: a signal for it never reaches pytest
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _completed_rounds(run_dir: Path) -> int:
    try:
        return len(json.loads((run_dir / "report.json").read_text())["rounds"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow  # a simulation stopped, then resumed
def test_a_signal_stops_a_stalled_simulation_and_its_processes_and_the_run_resumes(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "simulate.out"
    proc = _simulate(run_dir, out, "--run-id", "sig")
    try:
        deadline = time.monotonic() + 300
        while _completed_rounds(run_dir) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and _completed_rounds(run_dir) >= 1, out.read_text()[-3000:]
        children = psutil.Process(proc.pid).children(recursive=True)
        clients = [c for c in children if "simulation.worker" in " ".join(c.cmdline())]  # the workers hosting the clients
        assert len(clients) == 2 and len(children) >= 3  # two workers and the broker
        # Stall the round: the clients freeze, so the coordinator waits on a round that will never close.
        for c in clients:
            c.suspend()
        assert _completed_rounds(run_dir) < ROUNDS
        proc.send_signal(sig)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = out.read_text()
    assert rc == 128 + sig, log[-3000:]
    assert f"stopped by {sig.name}" in log and f"(exit {128 + sig})" in log
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.pid for p in alive]  # workers (even frozen ones) and the broker, none left behind

    # The state is consistent: the last completed round has intact models, and --resume continues from it.
    state = RunState(run_dir)
    done = state.last_completed_round()
    found = state.load_latest_intact()
    state.close()
    assert done >= 0 and found is not None and found[0] == done
    resumed = _simulate(run_dir, out, "--resume")
    try:
        assert resumed.wait(timeout=600) == 0, out.read_text()[-3000:]
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
            resumed.wait()
    doc = json.loads((run_dir / "report.json").read_text())
    assert [r["round"] for r in doc["rounds"]] == list(range(ROUNDS))
    assert all(r["updates"] == 2 for r in doc["rounds"])
    assert f"resuming run sig after round {done}" in out.read_text()


def test_the_first_signal_waits_for_a_safe_point_and_a_second_stops_at_once() -> None:
    with StopSignals(force_after_s=600) as stops:
        stops.check()  # no signal yet: nothing happens
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while stops.signum is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stops.signum == signal.SIGTERM and stops.requested.is_set()
        with pytest.raises(Interrupted) as exc:
            stops.check()
        assert exc.value.signum == signal.SIGTERM and isinstance(exc.value, KeyboardInterrupt)
    with StopSignals(force_after_s=600) as stops, pytest.raises(Interrupted) as exc:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert exc.value.signum == signal.SIGINT


def test_without_a_safe_point_the_main_thread_is_interrupted_where_it_is() -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as exc, StopSignals(force_after_s=0.2):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # busy elsewhere: never calls check()
            time.sleep(0.01)
    assert exc.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == handler  # the previous handler is back


def test_once_stopping_further_signals_are_only_recorded() -> None:
    with StopSignals(force_after_s=0.05) as stops:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 10
        while stops.signum is None and time.monotonic() < deadline:
            time.sleep(0.01)
        stops.hold()  # the clean-up has begun
        os.kill(os.getpid(), signal.SIGINT)
        end = time.monotonic() + 0.5  # past the forced stop: it was cancelled, so nothing is raised
        while time.monotonic() < end:
            time.sleep(0.01)
        stops.check()
    assert stops.signum == signal.SIGINT


def test_a_signal_during_the_clean_up_is_recorded_but_raises_nothing() -> None:
    with StopSignals(force_after_s=0.05) as stops:
        stops.hold()  # e.g. a finished run waiting for its clients to exit
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not stops.requested.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        stops.check()
    assert stops.signum == signal.SIGTERM  # the launcher ends the clean-up early and exits 143
