"""What taking part costs a device, measured as the device measures it (edge_client.cost): CPU of sensing and of a round.

**Sensing.** The app's own sensing path (:class:`edge_client.app.controller.DeviceController`:
resampling, windowing, classifying every window with the current model into the timeline)
replays HAPT subject 1's session exp0 (412 s at 50 Hz, committed in ``datasets/hapt``) as fast
as it goes; the sensor thread's CPU seconds over the replay's own span give CPU seconds per hour
of sensing (:meth:`edge_client.cost.CostMeter.sensing_cpu_s_per_h`). Baseline, in the same run:
the same replay with no model yet (no classification), so the ratio is what the timeline's
classification adds. One figure per predictor the device may use (``torch`` where PyTorch is
installed, else the ``numpy`` reference: a phone); the torch predictor runs on one intra-op
thread as on a device (:mod:`edge_client.torch_threads`), and once more at PyTorch's own count
(``torch, PyTorch's threads``), the setting it had before, as the baseline of that choice. The
predictor's runtime is imported before the replay: a device imports it once per process, and in
a 412 s replay the import of PyTorch (about 1.5 CPU s here) would add some 13 CPU s per hour.

**Rounds.** One client round (:meth:`edge_client.trainer.ClientTrainer.run_round`: initialise,
E local epochs, evaluate, encode) on subject 1's windows (both sessions, 80 % train) with each
installed backend, measured by :meth:`edge_client.cost.CostMeter.round` as the agent measures
it: process CPU seconds, every thread. A first round per backend warms up (ExecuTorch exports
its programs there, once per architecture and machine) and is not counted; the figure is the
median of ``--rounds`` rounds after it. Baseline: the ``torch`` backend (PyTorch eager), so the
ratios are backend / torch.

The sensor thread's CPU leaves out work a library hands to its own threads (PyTorch's intra-op
pool, a threaded BLAS); the last column, the whole process's CPU over the same replay per hour
(the supervisor and every worker thread included), bounds it from above.

The figures are this machine's (its CPU, its thread counts: ``--threads``), not a phone's; the
method is the device's own, so the app shows the phone's.

Run: ``python benchmarks/bench_device_cost.py`` (the paper's CNN, ArchSpec defaults; ``--small``
for 8 filters / 32 units). The last line is ``key=value`` pairs:
``cpu_s_per_hour_sensing=... cpu_s_per_hour_sensing_torch_all_threads=... cpu_s_per_round_<backend>=...``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_client.app.controller import AppConfig, DeviceController
from edge_client.app.predictor import load_predictor
from edge_client.backends import BackendOptions, available_backends
from edge_client.cost import CostMeter
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore
from edge_client.torch_threads import INFERENCE_THREADS
from edge_client.trainer import ClientTrainer
from har_models.data.hapt import read_hapt_recordings
from har_models.data.labels import HAPT_LABELS
from har_models.data.pipeline import windows_from_recording
from har_models.data.windowing import WindowSet
from har_models.nn.arch import ArchSpec
from har_models.wire.messages import RoundAnnouncement, TrainingPlan

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt" / "user01.npz"


def _initial_model(spec: ArchSpec) -> dict[str, np.ndarray]:
    from edge_client.backends.numpy_ref import init_weights

    return init_weights(spec, 0)


def sensing_cost(spec: ArchSpec | None, predictor: str, torch_threads: int | None = INFERENCE_THREADS) -> tuple[float, float, float, float]:
    """CPU s per hour of sensing, CPU s, sensed s of the app replaying session exp0, and the process's CPU s meanwhile.

    ``spec`` None: no model yet. The process's CPU (every thread: the supervisor, a library's
    worker threads) bounds the sensor thread's from above. ``torch_threads``: the torch
    predictor's intra-op threads (None: PyTorch's own count).
    """
    rec = read_hapt_recordings(HAPT)[0]
    with tempfile.TemporaryDirectory(prefix="fedhar-cost-") as folder:
        state = Path(folder)
        if spec is not None:
            store = ClientStore(state, HAPT_LABELS)
            store.save_local_model(spec.to_json(), _initial_model(spec))
            load_predictor(store, prefer=(predictor,))  # imports the runtime now, not inside the measured replay
            store.close()
        source = ReplaySensor(rec, speed=None, loop=False)
        cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="bench", broker="127.0.0.1:1")
        ctl = DeviceController(cfg, source, predictor_loader=lambda s: load_predictor(s, prefer=(predictor,), torch_threads=torch_threads),
                               charging=lambda: False, battery=lambda: None)  # fmt: skip
        try:
            p0 = time.process_time()
            ctl.start_sensing()
            while source.running:
                time.sleep(0.05)
            process_s = time.process_time() - p0
            per_h = ctl.cost.sensing_cpu_s_per_h()
            assert per_h is not None, "the replay sensed less than a minute"
            return per_h, ctl.cost.sensing_cpu_s(), ctl.cost.sensed_s(), process_s
        finally:
            ctl.close()


def round_costs(spec: ArchSpec, backend: str, rounds: int, epochs: int, lr: float, cache: str) -> tuple[list[float], list[float], int]:
    """CPU and wall seconds of ``rounds`` client rounds on ``backend`` (after one warm-up round), and the training windows."""
    ws = [windows_from_recording(r, HAPT_LABELS) for r in read_hapt_recordings(HAPT)]
    keep = [w for w in ws if len(w)]
    data = WindowSet(np.concatenate([w.x for w in keep]), np.concatenate([w.y for w in keep]), HAPT_LABELS)
    received = _initial_model(spec)
    cpu, wall = [], []
    with tempfile.TemporaryDirectory(prefix="fedhar-cost-") as folder:
        store = ClientStore(Path(folder), HAPT_LABELS)
        try:
            store.replace_windows("hapt-01", data, 0.2, seed=1)
            trainer = ClientTrainer(store, "bench", backend, BackendOptions(program_cache=cache))
            meter = CostMeter()
            for r in range(rounds + 1):
                ann = RoundAnnouncement(run_id="bench", round=r, state="training", arch=spec.to_dict(), label_set="hapt6",
                                        selected=("bench",), plan=TrainingPlan(local_epochs=epochs, lr=lr))  # fmt: skip
                with meter.round(r, lambda: trainer.backend_in_use):
                    trainer.run_round(ann, received)
            for rc in meter.rounds()[1:]:
                assert rc.backend == backend, f"the round ran on {rc.backend}, not {backend}"
                cpu.append(rc.cpu_s)
                wall.append(rc.wall_s)
            return cpu, wall, len(store.windows("train"))
        finally:
            store.close()


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark; print the table and the result line; return the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="8 filters, 32 hidden units instead of the paper's 196 / 1024")
    ap.add_argument("--rounds", type=int, default=3, help="counted rounds per backend, after one warm-up (3)")
    ap.add_argument("--epochs", type=int, default=1, help="local epochs E per round (1, the default plan)")
    ap.add_argument("--lr", type=float, default=0.01,
                    help="local learning rate (0.01, the FedDist protocol's: the default plan's 0.1 diverges here on raw windows)")
    ap.add_argument("--backends", default=",".join(available_backends()), help="backends to run a round on (default: all installed)")
    ap.add_argument("--predictors", default="torch,numpy", help="predictors to sense with (default torch,numpy)")
    ap.add_argument("--cache-dir", default=None, help="ExecuTorch program cache (default: a temporary folder)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    spec = ArchSpec(n_classes=6, conv_filters=8, dense_units=32) if args.small else ArchSpec(n_classes=6)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="fedhar-programs-")
    out: dict[str, float] = {}

    print(f"model: {spec.conv_filters} filters, {spec.dense_units} units; CPU seconds of this process (all threads)")
    print(f"{'sensing (HAPT exp0 replay)':<42} {'CPU s':>7} {'sensed s':>9} {'CPU s/h':>8} {'vs no model':>12} {'process CPU s/h':>16}")
    base, base_cpu, base_span, base_proc = sensing_cost(None, "numpy")
    print(f"{'no model yet (baseline)':<42} {base_cpu:7.2f} {base_span:9.1f} {base:8.1f} {1.0:12.2f} {base_proc / base_span * 3600:16.1f}")
    out["cpu_s_per_hour_sensing_no_model"] = base
    available = set(available_backends())
    predictors = [p for p in args.predictors.split(",") if p and (p != "torch" or "torch" in available)]
    runs: list[tuple[str, str, str, int | None]] = [(p, p, p, INFERENCE_THREADS) for p in predictors]  # (row, predictor, key, threads)
    if "torch" in predictors:  # the baseline of the one-thread choice: the torch predictor at PyTorch's own count
        runs.insert(predictors.index("torch") + 1, ("torch, PyTorch's threads", "torch", "torch_all_threads", None))
    for name, p, key, threads in runs:
        per_h, cpu, span, proc = sensing_cost(spec, p, threads)
        print(f"{'classifying with ' + name:<42} {cpu:7.2f} {span:9.1f} {per_h:8.1f} {per_h / base:12.2f} {proc / span * 3600:16.1f}")
        out[f"cpu_s_per_hour_sensing_{key}"] = per_h
    # The figure a device shows: with the predictor it would pick (torch where installed, else numpy).
    out["cpu_s_per_hour_sensing"] = out[f"cpu_s_per_hour_sensing_{predictors[0]}"]

    print(f"\n{'round (E=' + str(args.epochs) + ')':<20} {'train windows':>14} {'CPU s (median)':>15} {'wall s':>8} {'vs torch':>9}")
    rows = {}
    for b in [b for b in args.backends.split(",") if b]:
        cpus, walls, n = round_costs(spec, b, args.rounds, args.epochs, args.lr, cache)
        rows[b] = (statistics.median(cpus), statistics.median(walls), n)
    ref = rows.get("torch", (float("nan"),))[0]
    for b, (cpu_s, wall_s, n) in rows.items():
        print(f"{b:<20} {n:14d} {cpu_s:15.2f} {wall_s:8.2f} {cpu_s / ref:9.2f}")
        out[f"cpu_s_per_round_{b}"] = cpu_s
    print(" ".join(f"{k}={v:.2f}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
