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


def _result(bench: Any, side: str, wall_s: float, peak_pss_mb: float, repeat: int = 0) -> Any:
    return bench.RunResult(side, repeat, wall_s, peak_pss_mb, peak_pss_mb, 1, 0.0, [])


def test_ratio_lines_are_the_median_of_the_pairs_ratios_and_name_the_transport() -> None:
    bench = _bench()
    fedhar = [_result(bench, "fedhar", 300.0, 3000.0, 0), _result(bench, "fedhar", 200.0, 2000.0, 1),
              _result(bench, "fedhar", 240.0, 2400.0, 2)]  # fmt: skip
    flower = [_result(bench, "flower", 200.0, 5000.0, 0), _result(bench, "flower", 250.0, 4000.0, 1),
              _result(bench, "flower", 200.0, 6000.0, 2)]  # fmt: skip
    # pairs: 300/200 = 1.5, 200/250 = 0.8, 240/200 = 1.2 -> median 1.2; memory 0.6, 0.5, 0.4 -> 0.5.
    # (Mean over mean would give 740/650 = 1.14.) Over MQTT the keys of the earlier docs stay.
    assert bench.ratio_lines("mqtt", fedhar, flower) == ["fedhar_vs_flower_wall=1.20", "fedhar_vs_flower_peak_memory=0.50"]
    assert bench.ratio_lines("blobs", fedhar, flower) == [
        "fedhar_blobs_vs_flower_wall=1.20",
        "fedhar_blobs_vs_flower_peak_memory=0.50",
    ]
    with pytest.raises(bench.BenchError, match="runs of both sides"):
        bench.ratio_lines("mqtt", fedhar, [])
    with pytest.raises(bench.BenchError, match="both sides of each repeat"):
        bench.ratio_lines("mqtt", fedhar, flower[:2])
    with pytest.raises(bench.BenchError, match="not one of mqtt, blobs"):
        bench.ratio_lines("s3", fedhar, flower)


@pytest.mark.parametrize("transport", ["mqtt", "blobs"])
def test_fedhar_side_is_the_main_job_with_the_chosen_transport(transport: str, tmp_path: Path) -> None:
    """fedhar's command line, read back by fedhar-simulate's own parser: the job's settings and the transport."""
    from simulation.simulate import build_parser

    bench = _bench()
    cmd = bench.fedhar_cmd(dict(bench.JOB_OPTIONS), tmp_path / "run", "vsflower0", transport)
    assert cmd[:3] == [sys.executable, "-m", "simulation.simulate"]
    ns = build_parser().parse_args(cmd[3:])
    assert getattr(ns, "transport.kind") == transport
    assert (ns.clients, ns.rounds, ns.aggregation, getattr(ns, "strategies.server_opt.momentum")) == (30, 15, "fedavgm", 0.5)
    assert getattr(ns, "training.update_encoding") == bench.JOB_OPTIONS["update_encoding"]
    with pytest.raises(bench.BenchError, match="pass --transport mqtt or blobs"):
        bench.fedhar_cmd(dict(bench.JOB_OPTIONS), tmp_path / "run", "vsflower0", "s3")


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["mqtt", "blobs"])
def test_small_comparison_gives_ratios_and_the_same_figures_in_the_project_s_order(transport: str, tmp_path: Path) -> None:
    """4 clients, 2 rounds, a small CNN: both sides run, the check run in the project's order matches fedhar exactly.

    In blob mode fedhar gives the figures of MQTT, so Flower's check run matches it to the digit too.
    """
    py = _flower_python()
    if py is None or not py.exists():
        pytest.skip("no Flower venv: set FEDHAR_FLOWER_PYTHON or run `python benchmarks/bench_vs_flower.py` once to make "
                    f"{_bench().DEFAULT_VENV}")  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCH), "--clients", "4", "--rounds", "2", "--conv-filters", "8", "--dense-units", "32",
         "--transport", transport, "--flower-python", str(py), "--keep", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    key = "fedhar" if transport == "mqtt" else "fedhar_blobs"
    wall = re.fullmatch(key + r"_vs_flower_wall=([0-9.]+)", lines[-2])
    mem = re.fullmatch(key + r"_vs_flower_peak_memory=([0-9.]+)", lines[-1])
    assert wall and mem, lines[-4:]
    assert 0 < float(wall.group(1)) < 100 and 0 < float(mem.group(1)) < 100
    # Same windows, split, CNN, seeds and training, averaged in client-id order in float64: the same arithmetic.
    assert "flower_project_order_max_final_macro_f1_diff=0" in lines
    assert (tmp_path / "fedhar-0" / "report.json").exists() and (tmp_path / "flower-0.json").exists()
