"""A short run of the soak benchmark (benchmarks/soak_serve.py): a served federation survives a frozen device,
a broker restart and a device whose update is finite but 100x too large, without a stall; the quality guard
clips the oversized update (or rolls back the version it spoiled).

The benchmark runs as a program, as an operator runs it: ``serve``, Mosquitto with TLS and an ACL,
three enrolled ``fedhar-client`` processes with HAPT sources, on 127.0.0.1 only. Its last line
of figures is what is checked; every wait inside it is bounded (``--max-minutes``).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from simulation.broker import find_mosquitto

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]

ROOT = Path(__file__).resolve().parents[1]


def figures(line: str) -> dict[str, str]:
    """The benchmark's last line ``k=v k=v ...`` as a mapping."""
    return dict(part.split("=", 1) for part in line.split())


def test_a_short_soak_has_no_stall_and_the_guard_bounds_the_oversized_update(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    rounds = 8
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak_serve.py"), "--rounds", str(rounds), "--seed", "3",
           "--faults", "oversized,freeze,broker", "--churn-every", "0", "--oversized-rounds", "1", "--deadline", "15",
           "--devices-start", "3", "--max-minutes", "6", "--out", str(tmp_path / "soak")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=480)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout.strip().splitlines()
    got = figures(out[-1])
    # the plan's faults happened, in its order
    notes = "\n".join(out[:-1])
    for text in ("dev-oversized joins", "frozen (SIGSTOP)", "runs again (SIGCONT)", "Mosquitto stopped", "Mosquitto started again"):
        assert text in notes, notes
    assert int(got["rounds_completed"]) >= rounds  # more when the oversized device was still on at the last
    assert int(got["stalls"]) == 0, got
    # the oversized update was counted, and the guard clipped it (or rolled back the version it spoiled)
    assert int(got["oversized_counted"]) >= 1, got
    assert int(got["oversized_clipped"]) >= 1 or int(got["rollbacks"]) >= 1, got
    assert math.isfinite(float(got["pers_f1_final"])) and 0 <= float(got["pers_f1_final"]) <= 100
    assert float(got["longest_gap_s"]) <= float(got["stall_limit_s"]) + float(got["deadline_s"]), got
    assert float(got["coordinator_peak_rss_mib"]) > 0 and float(got["data_mib"]) > 0


def test_in_buffered_rounds_a_frozen_device_does_not_hold_a_round_until_its_deadline(tmp_path: Path) -> None:
    # Synchronous rounds wait for the device frozen mid-round until the deadline (15 s: longest_gap_s=15.2 in a run
    # with the same options but --buffer-size); a buffered round closes at its K = 2 other updates and goes on.
    if find_mosquitto() is None:
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak_serve.py"), "--rounds", "10", "--seed", "3", "--faults", "freeze",
           "--churn-every", "0", "--deadline", "15", "--devices-start", "3", "--max-minutes", "4", "--buffer-size", "2",
           "--out", str(tmp_path / "soak")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=360)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout.strip().splitlines()
    got = figures(out[-1])
    assert "frozen (SIGSTOP)" in "\n".join(out[:-1])
    assert "[buffer]\nsize = 2" in (tmp_path / "soak" / "data" / "server.toml").read_text()
    assert int(got["rounds_completed"]) >= 10 and int(got["stalls"]) == 0, got
    assert float(got["longest_gap_s"]) < float(got["deadline_s"]) / 2, got
    assert int(got["rounds_without_quorum"]) == 0, got
