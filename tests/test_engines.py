"""Virtual clients in worker processes: the same federation as one process per client, and robust to a dead worker."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from support.small_federation import assert_upload_bytes_close, round_figures, simulate_args

from simulation import simulate

pytestmark = pytest.mark.slow  # federations in worker processes, one killed mid-run

SMALL = simulate_args()  # 3 clients, the 8-filter / 32-unit CNN, 120 s deadlines, generalisation every round


def test_workers_and_processes_give_the_same_figures_to_the_last_digit(small_simulation: Callable[..., dict]) -> None:
    docs = {}
    for engine in ("processes", "workers"):
        docs[engine] = small_simulation("--rounds", "3", "--engine", engine, "--workers", "2", name=engine, run_id="same")
    assert docs["workers"]["engine"] == "workers (2 processes)"
    assert round_figures(docs["workers"]) == round_figures(docs["processes"])
    assert_upload_bytes_close(docs["workers"], docs["processes"])  # three metadata texts of a few digits each


def _kill_worker_when_round_opens(run_dir: Path, round_: int, stop: threading.Event) -> None:
    """SIGKILL worker-0 as round ``round_`` opens (the report is rewritten just before the next round is announced)."""
    me = psutil.Process()
    while not stop.is_set():
        report = run_dir / "report.json"
        try:
            done = len(json.loads(report.read_text())["rounds"]) if report.exists() else 0
        except (ValueError, KeyError):  # not a report yet: look again
            done = 0
        if done >= round_:
            for p in me.children(recursive=True):
                try:
                    if "worker-0.clients.json" in " ".join(p.cmdline()):
                        p.kill()
                        return
                except psutil.NoSuchProcess:
                    continue
        time.sleep(0.05)


def test_a_killed_worker_costs_its_clients_one_round_and_they_come_back(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stop = threading.Event()
    killer = threading.Thread(target=_kill_worker_when_round_opens, args=(run, 1, stop), daemon=True)
    killer.start()
    try:
        # 30 local epochs make each client train for about a second, so the kill lands while round 1 trains.
        # The main job's server step (FedAvgM eta 3, chosen for E = 1) on 30-epoch updates, one client's alone
        # in the round of the kill, sent the clients' training to NaN in round 2: eta 1 keeps this run about the kill.
        argv = [*SMALL, "--rounds", "12", "--local-epochs", "30", "--server-lr", "1", "--workers", "2", "--min-clients", "1",
                "--run-dir", str(run)]  # fmt: skip
        rc = simulate.main([*argv, "--run-id", "kill"])
    finally:
        stop.set()
        killer.join(10)
    assert rc == 0
    rounds = json.loads((run / "report.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == list(range(12))
    # worker-0 hosted hapt-01 and hapt-03 (round-robin): they missed the round the kill fell in, hapt-02 carried it.
    hit = [r for r in rounds if r["updates"] < 3]
    # At most the round the kill fell in (none when the restarted clients still answered it: on a loaded machine the
    # survivor's training can outlast the restart); the rounds after wait for the restarted clients.
    assert len(hit) <= 1 and all(set(r["missing"]) <= {"hapt-01", "hapt-03"} for r in hit), [r["updates"] for r in rounds]
    assert rounds[-1]["updates"] == 3, [r["updates"] for r in rounds]  # the restarted worker's clients are back
    assert "restarting it (1/3)" in (run / "logs" / "coordinator.log").read_text()
