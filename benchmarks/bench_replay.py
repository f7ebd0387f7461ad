"""Replay pacing: how closely ReplaySource keeps to its schedule, and what the pipeline costs.

Replays the committed real REALWORLD recording (proband1, walking, shin; 640 s, ~64 000
acc + gyro events) through a SensorPipeline at several speeds and prints one row per
mode. Baseline: the schedule itself (event k due at start + (t_k - t_0) / speed on
time.monotonic) for the timing columns, and the offline windows_from_recording pass for
the windows (``same`` says whether the replay produced bit-identical windows; only
checked for runs that reach the end of the recording).

Columns: ``rec s`` recording seconds replayed, ``wall s`` elapsed, ``due s`` what the
schedule says that should take; ``end lag`` how late the last batch was delivered
relative to the due time of its oldest event (accumulated drift would show here),
``mean``/``p99``/``max lag`` over all batches, in milliseconds; ``batches`` wake-ups.

    python benchmarks/bench_replay.py [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_client.sensors.replay import ReplaySource  # noqa: E402
from har_models.data.labels import REALWORLD_LABELS  # noqa: E402
from har_models.data.pipeline import SensorPipeline, windows_from_recording  # noqa: E402
from har_models.data.realworld import recording_from_csv_files  # noqa: E402
from har_models.data.windowing import WindowSet  # noqa: E402

SAMPLE = ROOT / "datasets" / "realworld" / "sample" / "proband1"


def bench(rec, speed: float | None, max_wall_s: float | None, offline: WindowSet) -> dict[str, object]:
    source = ReplaySource(rec, speed)
    pipe = SensorPipeline(REALWORLD_LABELS, rec.labels)
    parts, lags = [], []
    batch = 0
    start = time.monotonic()
    for sensor, t, xyz in source.chunks(max_wall_s=max_wall_s):
        if speed is not None and source.progress.batches_delivered != batch:  # first chunk of a new batch
            batch = source.progress.batches_delivered
            lags.append(source.progress.lag_s)
        parts.append(pipe.push(sensor, t, xyz))
    parts.append(pipe.close())
    wall = time.monotonic() - start
    windows = WindowSet.concat(parts, REALWORLD_LABELS)
    p = source.progress
    lag_ms = np.asarray(lags) * 1e3 if lags else np.zeros(1)
    same = None
    if p.finished:
        assert windows.t_start_ns is not None and offline.t_start_ns is not None
        same = bool(np.array_equal(windows.x, offline.x) and np.array_equal(windows.t_start_ns, offline.t_start_ns))
    return {
        "mode": "as fast as possible" if speed is None else ("real time" if speed == 1.0 else f"{speed:g}x"),
        "rec_s": p.recording_s,
        "wall_s": wall,
        "due_s": None if speed is None else p.recording_s / speed,
        "end_lag_ms": None if speed is None else float(lag_ms[-1]),
        "mean_lag_ms": None if speed is None else float(lag_ms.mean()),
        "p99_lag_ms": None if speed is None else float(np.percentile(lag_ms, 99)),
        "max_lag_ms": None if speed is None else float(lag_ms.max()),
        "samples": p.samples_delivered,
        "batches": p.batches_delivered,
        "windows": len(windows),
        "same": same,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="wall-clock bound of the real-time and 10x runs")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)

    rec, _ = recording_from_csv_files(
        SAMPLE / "acc_walking_shin.csv", SAMPLE / "Gyroscope_walking_shin.csv", 1, "walking", "shin"
    )
    start = time.monotonic()
    offline = windows_from_recording(rec, REALWORLD_LABELS)
    offline_s = time.monotonic() - start
    rows = [
        bench(rec, 1.0, args.seconds, offline),
        bench(rec, 10.0, args.seconds, offline),
        bench(rec, 200.0, None, offline),
        bench(rec, 2000.0, None, offline),
        bench(rec, None, None, offline),
    ]
    if args.json:
        print(json.dumps({"offline_s": offline_s, "offline_windows": len(offline), "rows": rows}, indent=2))
        return 0

    def f(v: object, spec: str) -> str:
        return format("-", f">{spec.split('.')[0]}") if v is None else format(v, spec)

    print(f"baseline: offline windows_from_recording, {len(offline)} windows in {offline_s * 1e3:.0f} ms")
    header = f"{'mode':<20} {'rec s':>7} {'wall s':>7} {'due s':>7} {'end lag':>8} {'mean lag':>9} {'p99 lag':>8} {'max lag':>8}"
    header += f" {'samples':>8} {'batches':>7} {'windows':>7} {'same':>5}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['mode']:<20} {f(r['rec_s'], '7.2f')} {f(r['wall_s'], '7.3f')} {f(r['due_s'], '7.3f')} "
            f"{f(r['end_lag_ms'], '8.3f')} {f(r['mean_lag_ms'], '9.3f')} "
            f"{f(r['p99_lag_ms'], '8.3f')} {f(r['max_lag_ms'], '8.3f')} "
            f"{r['samples']:>8} {r['batches']:>7} {r['windows']:>7} {'-' if r['same'] is None else str(r['same']):>5}"
        )
    print("lags in ms: delivery time of a batch minus the due time of its oldest event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
