"""fedhar against Flower on the same job: the main job's work in Flower's simulation engine, then the main job.

Both sides run the README's first command's work with the same settings (default: 30 HAPT
clients, 15 rounds, seed 1, the ``blocks`` split, the paper CNN, E = 1, lr 0.1, batch 32,
FedAvgM with the main job's server lr (``FEDAVGM_ETA``, 3 since the second search) and momentum 0.5,
uploads in the main job's encoding (``DEFAULT_CLIENT_UPDATE_ENCODING``, int8_delta: Flower's clients
encode and decode their trained model with the project's functions, so both sides average the same
tensors); ``--clients/--rounds/--conv-filters/--dense-units/--update-encoding/...`` change them for both):

- **Flower**: ``benchmarks/flower_job.py`` in Flower 1.42's simulation engine (Ray backend,
  ``--actors`` client actors of ``--actor-cpus`` CPU, ``--threads`` PyTorch threads each), its
  built-in FedAvgM, this project's windows, split, CNN, :func:`har_models.nn.training.train_local`
  and metrics; every model moves in memory. It runs in a venv of its own (``--flower-python``;
  Flower is no dependency of fedhar and its pins clash with the coordinator extra: see the
  ``bench-flower`` extra in pyproject.toml). Without ``--flower-python`` the venv at
  ``--flower-venv`` (default ``~/.cache/fedhar/bench-flower-venv``) is used, and created first
  when it is missing: this checkout installed editable with the ``bench-flower`` and ``client``
  extras (a few minutes; PyPI must be reachable). Either way Flower's side imports this
  checkout's code (``PYTHONPATH``), whichever checkout the venv was installed from;
- **fedhar**: ``fedhar-simulate`` (``python -m simulation.simulate`` of this checkout, the
  default workers engine and embedded broker) with the same settings and a run folder under
  the temporary folder, models moving by ``--transport``: ``mqtt`` (default; every model and
  update in chunks through the broker) or ``blobs`` (``fedhar-simulate --transport blobs``:
  models and updates as content-addressed objects in the run folder's store, fetched and
  uploaded over HTTP on loopback, the broker carrying control only; docs/scale.md, "Blob
  transport"). Flower's side is the same for both.

Each repeat runs both, alternating which goes first (Flower first in repeats 0, 2, ...; fedhar
first in 1, 3, ...), one at a time. Per run it measures the wall time (start of the process to
its end, start-up included) and the peak PSS of the whole process tree (the process and every
descendant: Ray's GCS, raylet and actor workers; fedhar's broker and worker processes), sampled
every ``--sample-s`` seconds by ``fedhar-simulate``'s own monitor (:class:`simulation.simulate.MemoryMonitor`
on the run's root process). It also shows the 1-minute load
average before each run, so a run that shared the machine is visible.

The check (left out with ``--no-check``): one more Flower run whose FedAvgM averages in this
project's order (replies sorted by client id, float64 accumulation with
:func:`coordinator.aggregation.weighted_average`; the server step stays Flower's), compared
with the fedhar runs' report: it prints the largest difference of the final global macro-F1 and
of any round's global accuracy and macro-F1. 0 means the two did the same arithmetic. The timed
Flower runs use Flower's own averaging (float32, in reply order), whose final figure is shown
against fedhar's too.

The last two lines are ``fedhar_vs_flower_wall=<ratio>`` (fedhar's wall time over Flower's in each
alternated pair, the median over the pairs) and ``fedhar_vs_flower_peak_memory=<ratio>`` (peak PSS,
the same way); the lines before them give the load average around each run and whether the ratios
count for a goal (not when it exceeded the core count); with
``--transport blobs`` they are ``fedhar_blobs_vs_flower_wall=`` and ``fedhar_blobs_vs_flower_peak_memory=``.

    python benchmarks/bench_vs_flower.py [--repeats 1] [--transport mqtt|blobs] [--flower-python PATH] [--no-check] [--keep DIR]
        [--clients 30 --rounds 15 --conv-filters 196 --dense-units 1024 --local-epochs 1 --lr 0.1 --batch-size 32 --seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.round import DEFAULT_CLIENT_UPDATE_ENCODING
from coordinator.strategies.fedavgm import FEDAVGM_ETA
from simulation.simulate import MemoryMonitor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine_load import LoadLog  # noqa: E402

FLOWER_JOB = ROOT / "benchmarks" / "flower_job.py"
DEFAULT_VENV = Path.home() / ".cache" / "fedhar" / "bench-flower-venv"
"""Where the Flower venv is made when neither ``--flower-python`` nor ``--flower-venv`` says otherwise."""
FLOWER_EXTRAS = "bench-flower,client"
TRANSPORTS = ("mqtt", "blobs")
"""fedhar's transports (``fedhar-simulate --transport``); the ratio lines name any but the default ``mqtt``."""

# The job's settings and their defaults: the main job's (README's first command). Both sides get every one.
JOB_OPTIONS: dict[str, Any] = {
    "clients": 30,
    "rounds": 15,
    "conv_filters": 196,
    "dense_units": 1024,
    "local_epochs": 1,
    "lr": 0.1,
    "batch_size": 32,
    "seed": 1,
    "split": "blocks",
    "split_seed": 1,
    "server_lr": FEDAVGM_ETA,  # the main job's FedAvgM, whatever its default is now
    "server_momentum": 0.5,
    "generalisation_every": 5,
    "update_encoding": DEFAULT_CLIENT_UPDATE_ENCODING,  # what the main job's clients upload
}


class BenchError(RuntimeError):
    """The benchmark cannot go on (a side failed, the Flower venv is unusable); the message names the fix."""


@dataclass
class RunResult:
    """One timed run of one side."""

    side: str  # "flower", "flower-project-order" or "fedhar"
    repeat: int
    wall_s: float
    peak_pss_mb: float
    peak_rss_mb: float
    procs: int
    load_before: float
    rounds: list[dict[str, Any]]  # per 0-based round: "round", "global" {accuracy, macro_f1, ...}, "seconds", "generalisation"?
    note: str = ""

    @property
    def final(self) -> dict[str, float]:
        return dict(self.rounds[-1]["global"])

    def ordinary_round_s(self) -> float:
        """Mean seconds of the rounds >= 1 that measure no generalisation (nan if none)."""
        quiet = [r["seconds"] for r in self.rounds if r["round"] >= 1 and r.get("generalisation") is None and r.get("seconds")]
        return sum(quiet) / len(quiet) if quiet else float("nan")


def run_measured(cmd: list[str], log_file: Path, env: dict[str, str] | None, sample_s: float) -> tuple[float, MemoryMonitor, int]:
    """Run ``cmd`` (cwd: the checkout; output to ``log_file``) under a :class:`MemoryMonitor`; ``(wall s, monitor, exit status)``."""
    with log_file.open("w") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        mon = MemoryMonitor(interval_s=sample_s, pid=proc.pid)
        mon.start()
        try:
            rc = proc.wait()
        finally:
            wall = time.monotonic() - t0
            mon.stop()
            if proc.poll() is None:
                proc.kill()
    return wall, mon, rc


def _tail(path: Path, n: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-n:]


def flower_cmd(python: Path, job: dict[str, Any], order: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The ``flower_job.py`` command line for the job's settings."""
    cmd = [str(python), str(FLOWER_JOB)]
    for k, v in job.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    return [*cmd, "--actors", str(args.actors), "--actor-cpus", str(args.actor_cpus), "--threads", str(args.threads),
            "--order", order, "--out", str(out)]  # fmt: skip


def fedhar_cmd(job: dict[str, Any], run_dir: Path, run_id: str, transport: str = "mqtt") -> list[str]:
    """``fedhar-simulate`` (this checkout's module) with the job's settings, FedAvgM, no progress bar, ``transport``.

    Raises
    ------
    BenchError
        If ``transport`` is not one of :data:`TRANSPORTS`.
    """
    if transport not in TRANSPORTS:
        raise BenchError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}; pass --transport mqtt or blobs")
    return [
        sys.executable, "-m", "simulation.simulate",
        "--clients", str(job["clients"]), "--rounds", str(job["rounds"]),
        "--conv-filters", str(job["conv_filters"]), "--dense-units", str(job["dense_units"]),
        "--local-epochs", str(job["local_epochs"]), "--lr", str(job["lr"]), "--batch-size", str(job["batch_size"]),
        "--seed", str(job["seed"]), "--split", str(job["split"]), "--split-seed", str(job["split_seed"]),
        "--aggregation", "fedavgm", "--server-lr", str(job["server_lr"]), "--server-momentum", str(job["server_momentum"]),
        "--generalisation-every", str(job["generalisation_every"]), "--update-encoding", str(job["update_encoding"]),
        "--transport", transport, "--no-progress", "--run-dir", str(run_dir), "--run-id", run_id,
    ]  # fmt: skip


def run_flower(python: Path, job: dict[str, Any], order: str, repeat: int, args: argparse.Namespace, work: Path) -> RunResult:
    """One Flower run; raises :class:`BenchError` if it fails."""
    side = "flower" if order == "flower" else "flower-project-order"
    out = work / f"{side}-{repeat}.json"
    log_file = work / f"{side}-{repeat}.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])  # this checkout's code
    load = os.getloadavg()[0]
    print(f"  {side} run {repeat}: started (log {log_file})", flush=True)
    wall, mon, rc = run_measured(flower_cmd(python, job, order, args, out), log_file, env, args.sample_s)
    if rc != 0 or not out.exists():
        raise BenchError(f"Flower's side failed (exit {rc}); its log {log_file} ends:\n{_tail(log_file)}")
    doc = json.loads(out.read_text())
    v = doc["versions"]
    return RunResult(side, repeat, wall, mon.peak_pss / 2**20, mon.peak_rss / 2**20, mon.peak_procs, load, doc["rounds"],
                     note=f"flwr {v['flwr']}, ray {v['ray']}, torch {v['torch']}")  # fmt: skip


def run_fedhar(job: dict[str, Any], repeat: int, args: argparse.Namespace, work: Path) -> RunResult:
    """One run of the main job; raises :class:`BenchError` if it fails."""
    run_dir = work / f"fedhar-{repeat}"
    log_file = work / f"fedhar-{repeat}.log"
    load = os.getloadavg()[0]
    print(f"  fedhar run {repeat}: started (log {log_file})", flush=True)
    cmd = fedhar_cmd(job, run_dir, f"vsflower{repeat}", args.transport)
    wall, mon, rc = run_measured(cmd, log_file, None, args.sample_s)
    report = run_dir / "report.json"
    if rc != 0 or not report.exists():
        raise BenchError(f"fedhar-simulate failed (exit {rc}); its log {log_file} ends:\n{_tail(log_file)}")
    doc = json.loads(report.read_text())
    own = doc.get("peak_memory", {}).get("peak_pss_mb")
    return RunResult("fedhar", repeat, wall, mon.peak_pss / 2**20, mon.peak_rss / 2**20, mon.peak_procs, load, doc["rounds"],
                     note=f"{args.transport}; its own report: {own} MB PSS, {doc.get('wall_seconds')} s")  # fmt: skip


def flower_python(args: argparse.Namespace) -> Path:
    """The Python of Flower's venv: ``--flower-python``, or the venv at ``--flower-venv``, made first if needed.

    Raises
    ------
    BenchError
        If the given Python cannot import flwr, ray and torch, or making the venv failed.
    """
    if args.flower_python is not None:
        py = Path(args.flower_python)
        if not _imports_flower(py):
            raise BenchError(f"--flower-python {py} cannot import flwr, ray and torch; install this checkout there with "
                             f"`{py} -m pip install -e '{ROOT}[{FLOWER_EXTRAS}]'` or leave the option out to use "
                             f"{DEFAULT_VENV}")  # fmt: skip
        return py
    venv = Path(args.flower_venv).expanduser()
    py = venv / "bin" / "python"
    if py.exists() and _imports_flower(py):
        return py
    if not py.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        print(f"bench_vs_flower: creating Flower's venv {venv} (with {base})", flush=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        _step([base, "-m", "venv", str(venv)], "python -m venv")
    print(f"bench_vs_flower: installing this checkout with the {FLOWER_EXTRAS} extras into {venv} "
          "(flwr[simulation] 1.42.0, ray 2.55.1, torch; about two minutes here)", flush=True)  # fmt: skip
    _step([str(py), "-m", "pip", "install", "--progress-bar", "off", "-e", f"{ROOT}[{FLOWER_EXTRAS}]"], "pip install")
    if not _imports_flower(py):
        raise BenchError(f"{py} still cannot import flwr, ray and torch after the install; remove {venv} and run again")
    print(f"bench_vs_flower: Flower's venv is ready ({py})", flush=True)
    return py


def _imports_flower(py: Path) -> bool:
    if not py.exists():
        return False
    done = subprocess.run([str(py), "-c", "import flwr, ray, torch"], capture_output=True, text=True)
    return done.returncode == 0


def _step(cmd: list[str], what: str) -> None:
    """Run one set-up command, its output going through with a prefix; :class:`BenchError` if it fails."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        direct = line.startswith("Collecting") and ("(from fedhar" in line or "(from" not in line)
        if direct or line.startswith(("Successfully built", "ERROR", "Installing collected")):  # the direct requirements only
            print(f"    {what}: {line.rstrip()[:120]}", flush=True)
    if proc.wait() != 0:
        raise BenchError(f"{what} failed (exit {proc.returncode}):\n{''.join(lines[-30:])}")


def compare(a: RunResult, b: RunResult) -> tuple[float, float]:
    """``(|final global macro-F1 difference|, largest |difference| of any round's global accuracy or macro-F1)``.

    Raises
    ------
    BenchError
        If the two runs have different numbers of rounds.
    """
    if len(a.rounds) != len(b.rounds):
        raise BenchError(f"{a.side} has {len(a.rounds)} rounds, {b.side} {len(b.rounds)}; they cannot be compared")
    worst = 0.0
    for ra, rb in zip(a.rounds, b.rounds, strict=True):
        for key in ("accuracy", "macro_f1"):
            worst = max(worst, abs(float(ra["global"][key]) - float(rb["global"][key])))
    return abs(a.final["macro_f1"] - b.final["macro_f1"]), worst


def ratio_lines(transport: str, fedhar: list[RunResult], flower: list[RunResult]) -> list[str]:
    """The benchmark's last two lines: wall time and peak PSS, fedhar's over Flower's, each the median over the repeats of
    the ratio within one alternated pair (the two runs of the same repeat).

    ``fedhar_vs_flower_wall=<ratio>`` and ``fedhar_vs_flower_peak_memory=<ratio>`` for ``mqtt``;
    for another transport the keys start with ``fedhar_<transport>_`` (``fedhar_blobs_vs_flower_wall=``).
    Ratios are rounded to 2 decimals.

    Raises
    ------
    BenchError
        If either list is empty, a repeat has no run of the other side, or ``transport`` is not one of :data:`TRANSPORTS`.
    """
    if transport not in TRANSPORTS:
        raise BenchError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    if not fedhar or not flower:
        raise BenchError(f"ratios need runs of both sides (fedhar: {len(fedhar)}, Flower: {len(flower)})")
    other = {r.repeat: r for r in flower}
    if {r.repeat for r in fedhar} != set(other):
        raise BenchError(f"ratios need both sides of each repeat (fedhar: {sorted(r.repeat for r in fedhar)}, "
                         f"Flower: {sorted(other)})")  # fmt: skip
    wall = statistics.median(r.wall_s / other[r.repeat].wall_s for r in fedhar)
    mem = statistics.median(r.peak_pss_mb / other[r.repeat].peak_pss_mb for r in fedhar)
    key = "fedhar" if transport == "mqtt" else f"fedhar_{transport}"
    return [f"{key}_vs_flower_wall={wall:.2f}", f"{key}_vs_flower_peak_memory={mem:.2f}"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    for name, default in JOB_OPTIONS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=f"both sides (default {default})")
    ap.add_argument("--repeats", type=int, default=1, help="timed pairs of runs (default 1)")
    ap.add_argument("--transport", choices=TRANSPORTS, default="mqtt",
                    help="how fedhar's models move: through the broker (mqtt) or as blobs over HTTP (blobs) (default mqtt)")  # fmt: skip
    ap.add_argument("--flower-python", type=Path, default=None, help="Python of a venv with flwr[simulation] and this checkout")
    ap.add_argument("--flower-venv", type=Path, default=DEFAULT_VENV, help="venv to use, made when missing (default %(default)s)")
    ap.add_argument("--actors", type=int, default=2, help="Flower's client actors (default 2)")
    ap.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs per Flower actor (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch threads per Flower client round (default 1; fedhar's clients use 1)")
    ap.add_argument("--no-check", action="store_true", help="skip the Flower run in the project's averaging order")
    ap.add_argument("--sample-s", type=float, default=0.5, help="seconds between memory samples (default 0.5)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the logs, Flower's figures and fedhar's run folders here")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 ok, 1 a side failed, 2 bad options."""
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.clients < 0 or args.rounds < 1 or args.actors < 1 or args.threads < 1 or args.sample_s <= 0:
        print("bench_vs_flower: need --repeats >= 1, --clients >= 0, --rounds >= 1, --actors >= 1, --threads >= 1 and "
              "--sample-s > 0", file=sys.stderr)  # fmt: skip
        return 2
    job = {k: getattr(args, k) for k in JOB_OPTIONS}
    work = (args.keep or Path(tempfile.mkdtemp(prefix="bench-vs-flower-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        py = flower_python(args)
        print(f"bench_vs_flower: {job['clients'] or 'all'} HAPT clients, {job['rounds']} rounds, CNN F={job['conv_filters']} "
              f"H={job['dense_units']}, E={job['local_epochs']}, lr {job['lr']}, batch {job['batch_size']}, seed {job['seed']}, "
              f"split {job['split']}; FedAvgM eta {job['server_lr']} beta {job['server_momentum']}; fedhar's transport "
              f"{args.transport}; {args.repeats} repeat(s); "
              f"cores {os.cpu_count()}; files in {work}", flush=True)  # fmt: skip
        results: list[RunResult] = []
        load = LoadLog()
        for i in range(args.repeats):
            sides = ("flower", "fedhar") if i % 2 == 0 else ("fedhar", "flower")
            for side in sides:
                with load.around(f"{side} run {i}"):
                    r = run_flower(py, job, "flower", i, args, work) if side == "flower" else run_fedhar(job, i, args, work)
                print(f"  {side} run {i}: {r.wall_s:.0f} s, peak {r.peak_pss_mb:.0f} MB PSS", flush=True)
                results.append(r)
        check = None if args.no_check else run_flower(py, job, "project", 0, args, work)
    except BenchError as exc:
        print(f"bench_vs_flower: {exc}", file=sys.stderr)
        return 1
    flower = [r for r in results if r.side == "flower"]
    fedhar = [r for r in results if r.side == "fedhar"]
    print(f"\n{'side':<22} {'run':>3} {'wall s':>7} {'peak PSS MB':>12} {'summed RSS MB':>14} {'procs':>5} {'load':>5} "
          f"{'round s':>8} {'global acc':>10} {'macro-F1':>9}  note")  # fmt: skip
    for r in [*results, *([check] if check else [])]:
        print(f"{r.side:<22} {r.repeat:>3} {r.wall_s:>7.1f} {r.peak_pss_mb:>12.0f} {r.peak_rss_mb:>14.0f} {r.procs:>5} "
              f"{r.load_before:>5.2f} {r.ordinary_round_s():>8.2f} {r.final['accuracy']:>10.4f} {r.final['macro_f1']:>9.4f}  {r.note}")
    print("(round s: mean of the rounds >= 1 that measure no generalisation; load: 1-minute load average before the run)")
    for f in flower:
        d_final, d_any = compare(fedhar[0], f)
        print(f"Flower's own averaging (float32, reply order), run {f.repeat}: |final global macro-F1 - fedhar's| = {d_final:.3g} "
              f"(any round, accuracy or macro-F1: {d_any:.3g})")  # fmt: skip
    if check is not None:
        diffs = [compare(h, check) for h in fedhar]
        d_final, d_any = max(d for d, _ in diffs), max(d for _, d in diffs)
        print(f"check, Flower averaging in the project's order (client-id order, float64): max |final global macro-F1 - "
              f"fedhar's| = {d_final:.3g} (any round, accuracy or macro-F1: {d_any:.3g})")  # fmt: skip
        print(f"flower_project_order_max_final_macro_f1_diff={d_final:.3g}")
    rnd_f = sum(r.ordinary_round_s() for r in flower) / len(flower)
    rnd_h = sum(r.ordinary_round_s() for r in fedhar) / len(fedhar)
    print(f"per ordinary round: fedhar ({args.transport}) {rnd_h:.2f} s, Flower {rnd_f:.2f} s, ratio {rnd_h / rnd_f:.2f}")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    for line in [*load.lines(), *ratio_lines(args.transport, fedhar, flower)]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
