"""``fedhar-record``: record one labelled activity on a device without a screen (a Raspberry Pi over SSH).

The owner says what they are about to do, the command records it from the sensor until
the time is up or Ctrl-C, and the windows go into the device's window log, where
``fedhar-client --source recorded:<label set>`` (the systemd service) trains on them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from edge_client.recorder import RECORDED_LOG, Recorder
from edge_client.window_log import WindowLog
from har_io.cli import add_logging_arguments
from har_io.exit_codes import Exit, fail
from har_models.data.labels import LABEL_SETS

log = logging.getLogger("fedhar.record")


def build_parser() -> argparse.ArgumentParser:
    """Options of ``fedhar-record``."""
    ap = argparse.ArgumentParser(prog="fedhar-record", description="record one labelled activity into the device's window log")
    ap.add_argument("--state-dir", type=Path, required=True, help="the device's state folder (the client's --state-dir)")
    ap.add_argument("--labels", default="hapt6", choices=sorted(LABEL_SETS), help="label set (default %(default)s)")
    activities = "; ".join(f"{name}: {', '.join(ls.names)}" for name, ls in sorted(LABEL_SETS.items()))
    ap.add_argument("--activity", required=True, help=f"what you are about to do, one of the --labels set's activities ({activities})")
    ap.add_argument("--sensor", default="mpu6050:1:0x68", help="mpu6050[:BUS[:ADDRESS]] | android | replay:SOURCE (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to record, seconds (default %(default)s; Ctrl-C stops early)")
    ap.add_argument("--replay-speed", type=float, default=1.0, help="replay sources only: speed, 1 = real time")
    ap.add_argument("--max-windows", type=int, default=20_000, help="bound of the window log (default %(default)s)")
    add_logging_arguments(ap, progress=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 (recorded), 2 (bad options) or 3 (the sensor failed or is missing: one line, no traceback)."""
    from edge_client.sensors.base import SensorUnavailable
    from edge_client.sensors.factory import make_source

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    labels = LABEL_SETS[args.labels]
    try:
        labels.index(args.activity)
        if not args.seconds > 0:
            raise ValueError(f"--seconds must be > 0, got {args.seconds}")
        source = make_source(args.sensor, labels, args.replay_speed)
        window_log = WindowLog(args.state_dir / RECORDED_LOG, labels, max_windows=args.max_windows)
    except (KeyError, ValueError, OSError) as exc:
        return fail(f"fedhar-record: {exc}")
    try:
        source.open()  # a missing bus or driver is said here, before anything is recorded
    except SensorUnavailable as exc:
        return fail(f"fedhar-record: {exc}", Exit.DATA)
    recorder = Recorder(window_log)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    before = recorder.counts()[args.activity]
    recorder.start(args.activity)
    source.start(recorder.push, on_end=stop.set)
    stop.wait(args.seconds)
    recorder.stop()
    source.stop()
    recorder.flush()
    if source.error is not None:
        return fail(f"fedhar-record: the sensor failed: {source.error}", Exit.DATA)
    counts = recorder.counts()
    print(f"{args.activity}: {counts[args.activity] - before} new windows; log: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
