"""benchmarks/bench_vs_flower.py: its memory monitor and comparison, and a small comparison run against Flower.

The small run needs Flower's venv (``bench-flower`` and ``client`` extras; Flower is no dependency
of fedhar): ``FEDHAR_FLOWER_PYTHON`` names its Python, else the benchmark's default venv
``~/.cache/fedhar/bench-flower-venv`` is used when it exists (``python benchmarks/bench_vs_flower.py``
makes it on first use). Without either the run is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_vs_flower.py"


def _bench() -> Any:
    return load_script(BENCH)


def _flower_python() -> Path | None:
    given = os.environ.get("FEDHAR_FLOWER_PYTHON")
    if given:
        return Path(given)
    py = _bench().DEFAULT_VENV / "bin" / "python"
    return py if py.exists() else None


def test_compare_gives_the_final_and_the_largest_round_difference() -> None:
    bench = _bench()

    def run(side: str, figures: list[tuple[float, float]]) -> Any:
        rounds = [{"round": i, "global": {"accuracy": a, "macro_f1": f}, "seconds": 1.0} for i, (a, f) in enumerate(figures)]
        return bench.RunResult(side, 0, 1.0, 1.0, 1.0, 1, 0.0, rounds)

    a = run("fedhar", [(0.5, 0.40), (0.75, 0.70)])
    b = run("flower", [(0.5, 0.25), (0.5, 0.625)])
    d_final, d_any = bench.compare(a, b)
    assert d_final == pytest.approx(0.075)
    assert d_any == pytest.approx(0.25)  # round 1's accuracy
    with pytest.raises(bench.BenchError, match="cannot be compared"):
        bench.compare(a, run("flower", [(0.5, 0.4)]))


@pytest.mark.slow
def test_small_comparison_gives_ratios_and_the_same_figures_in_the_project_s_order(tmp_path: Path) -> None:
    """4 clients, 2 rounds, a small CNN: both sides run, the check run in the project's order matches fedhar exactly."""
    py = _flower_python()
    if py is None or not py.exists():
        pytest.skip("no Flower venv: set FEDHAR_FLOWER_PYTHON or run `python benchmarks/bench_vs_flower.py` once to make "
                    f"{_bench().DEFAULT_VENV}")  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCH), "--clients", "4", "--rounds", "2", "--conv-filters", "8", "--dense-units", "32",
         "--flower-python", str(py), "--keep", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    wall = re.fullmatch(r"fedhar_vs_flower_wall=([0-9.]+)", lines[-2])
    mem = re.fullmatch(r"fedhar_vs_flower_peak_memory=([0-9.]+)", lines[-1])
    assert wall and mem, lines[-4:]
    assert 0 < float(wall.group(1)) < 100 and 0 < float(mem.group(1)) < 100
    # Same windows, split, CNN, seeds and training, averaged in client-id order in float64: the same arithmetic.
    assert "flower_project_order_max_final_macro_f1_diff=0" in lines
    assert (tmp_path / "fedhar-0" / "report.json").exists() and (tmp_path / "flower-0.json").exists()
