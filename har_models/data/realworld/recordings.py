"""Acc and gyro CSVs paired into :class:`~har_models.data.recording.Recording` objects, and their windows.

Acc and gyro of one (activity, position, part) are paired by those keys, never by file name.
Each pair is checked for duplicated, out-of-order and gapped stamps, different rates (the
chest gyroscope has up to 3.8 times the accelerometer's rows: both are resampled onto one
50 Hz grid, where FedDist drops them) and different spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from har_models.data.labels import REALWORLD_LABELS
from har_models.data.pipeline import windows_from_recording
from har_models.data.realworld.anomalies import Anomaly, Report, stamp_problems
from har_models.data.realworld.config import ACTIVITIES, CSV_COLUMNS, POSITIONS, SENSORS, RealWorldConfig
from har_models.data.realworld.csvfile import parse_realworld_csv, read_realworld_csv
from har_models.data.realworld.layout import SensorFiles, open_dataset, read_sensor_archive, subject_data
from har_models.data.recording import LabelTrack, Recording, SensorStream
from har_models.data.windowing import N_CHANNELS, WindowSet

RATE_MISMATCH_RATIO = 1.2
"""Acc and gyro sampling rates (from the median spacing) differing by more than this factor are reported."""

SPAN_MISMATCH_SHARE = 0.9
"""A common acc/gyro time span shorter than this share of the longer stream's span is reported."""


@dataclass(frozen=True)
class RealWorldSubject:
    """The recordings of one subject k and the anomalies met reading them (in the order met).

    One recording per activity x position x part, in that order; sessions are named
    ``walking/shin`` or ``climbingup/chest/part2``.
    """

    subject: int
    recordings: tuple[Recording, ...]
    anomalies: tuple[Anomaly, ...]


def read_realworld_subject(root: Path, subject: int, config: RealWorldConfig | None = None) -> RealWorldSubject:
    """Read all recordings of one subject from the raw archive (acc m/s^2, gyro rad/s, Unix-epoch ns, one label each).

    Every anomaly is handled, logged once and recorded; ``config`` (default: all positions, 50 Hz)
    describes what resampling will do. FileNotFoundError if ``root`` or the subject is missing
    (listing the subjects present); ValueError for a file that is not a readable zip.
    """
    config = config or RealWorldConfig()
    report = Report()
    recordings: list[Recording] = []
    with open_dataset(Path(root)) as top:
        data = subject_data(top, int(subject), root)
        for activity in ACTIVITIES:
            sensors = {s: read_sensor_archive(data, int(subject), activity, s, config, report) for s in SENSORS}
            recordings += pair_recordings(int(subject), activity, sensors, config, report)
    return RealWorldSubject(int(subject), tuple(recordings), tuple(report.anomalies))


def realworld_subject_windows(data: RealWorldSubject, config: RealWorldConfig | None = None) -> WindowSet:
    """All windows of one subject, each recording through :func:`~har_models.data.pipeline.windows_from_recording`.

    x (N, 6, T) float32, y (N,) of ``REALWORLD_LABELS``, t_start_ns (N,) Unix-epoch ns, in
    ``data.recordings`` order; no window spans a gap, a part boundary or two positions.
    """
    return windows_with_sessions(data, config or RealWorldConfig())[0]


def recording_from_csv_files(
    acc_csv: Path,
    gyro_csv: Path,
    subject: int,
    activity: str,
    position: str,
    config: RealWorldConfig | None = None,
) -> tuple[Recording, list[Anomaly]]:
    """One recording (session ``{activity}/{position}``) and its anomalies from a loose pair of CSV files (``datasets/realworld/sample``).

    Raises
    ------
    FileNotFoundError
        If a file is missing.
    KeyError
        If ``activity`` is not a REALWORLD activity.
    ValueError
        An unknown ``position``, a file without usable rows (or a time column of uncertain unit),
        or no shared time span; the message names the file.
    """
    config = config or RealWorldConfig()
    label = REALWORLD_LABELS.index(activity)
    if position not in POSITIONS:
        raise ValueError(f"position {position!r} is not a REALWORLD position; known: {', '.join(POSITIONS)}")
    where = f"proband{int(subject)}/{activity}/{position}"
    report = Report()
    streams = {}
    for sensor, path in (("acc", Path(acc_csv)), ("gyro", Path(gyro_csv))):
        stream, problems = read_realworld_csv(path)
        for kind, action in problems:
            report.add(kind, where, str(path), action)
        if len(stream) == 0:
            why = "; ".join(action for kind, action in problems if kind == "bad_time_unit")
            raise ValueError(why or f"REALWORLD CSV {path} holds no usable {sensor} rows; expected columns {','.join(CSV_COLUMNS)}")
        streams[sensor] = (stream, str(path))
    rec = build_recording(int(subject), activity, label, where, streams, config, report)
    if rec is None:
        raise ValueError(f"REALWORLD CSVs {acc_csv} and {gyro_csv} share no time span; they are not one recording")
    return rec, report.anomalies


def windows_with_sessions(data: RealWorldSubject, config: RealWorldConfig) -> tuple[WindowSet, np.ndarray]:
    """Windows of every recording and, per window, its recording's index (N,) int32; an empty set keeps T = ``config.window``."""
    parts = [windows_from_recording(rec, REALWORLD_LABELS, **config.pipeline_kwargs()) for rec in data.recordings]
    index = [np.full(len(p), i, np.int32) for i, p in enumerate(parts)]
    windows = WindowSet.concat(parts, REALWORLD_LABELS)
    if len(windows) == 0:  # keep the configured window length on an empty set
        windows = WindowSet(np.empty((0, N_CHANNELS, config.window), np.float32), np.empty(0, np.int64), REALWORLD_LABELS)
    return windows, (np.concatenate(index) if index else np.empty(0, np.int32))


def pair_recordings(
    subject: int, activity: str, sensors: dict[str, SensorFiles], config: RealWorldConfig, report: Report
) -> list[Recording]:
    """Recordings of one activity: acc and gyro CSVs paired by (position, part), parsed and checked.

    Reports [missing_recording] and [missing_sensor]; returned in position and part order.
    """
    acc, gyr = sensors["acc"], sensors["gyro"]
    multipart = acc.multipart or gyr.multipart
    base = f"proband{subject}/{activity}"
    rank = {p: i for i, p in enumerate(config.positions)}
    keys = sorted(set(acc.csv) | set(gyr.csv) | acc.failed | gyr.failed, key=lambda k: (rank[k[0]], k[1]))
    if acc.usable and gyr.usable:
        for position in config.positions:
            if not any(k[0] == position for k in keys):
                report.add(
                    "missing_recording",
                    f"{base}/{position}",
                    f"{acc.label} + {gyr.label}",
                    f"no acc and no gyro CSV for {activity}/{position} in any archive; nothing to load",
                )
    label = REALWORLD_LABELS.index(activity)
    recordings = []
    for key in keys:
        position, part = key
        where = f"{base}/{position}" + (f"/part{part}" if multipart else "")
        acc_csv, gyr_csv = acc.csv.get(key), gyr.csv.get(key)
        if acc_csv is None or gyr_csv is None:
            for name, files, found, other in (("acc", acc, acc_csv, gyr_csv), ("gyro", gyr, gyr_csv, acc_csv)):
                if found is None and other is not None and files.usable and key not in files.failed:
                    report.add(
                        "missing_sensor",
                        where,
                        other[1],
                        f"{'gyro' if name == 'acc' else 'acc'} CSV present but no {name} CSV for {activity}/{position}"
                        + (f" part {part}" if multipart else "")
                        + "; recording skipped",
                    )
            continue
        streams = {}
        for s, (raw, file) in (("acc", acc_csv), ("gyro", gyr_csv)):
            stream, problems = parse_realworld_csv(raw, file.rsplit("!", 1)[-1].rsplit("/", 1)[-1])
            for kind, action in problems:
                report.add(kind, where, file, action)
            streams[s] = (stream, file)
        if any(len(stream) == 0 for stream, _ in streams.values()):
            continue
        rec = build_recording(subject, activity, label, where, streams, config, report)
        if rec is not None:
            recordings.append(rec)
    return recordings


def build_recording(
    subject: int,
    activity: str,
    label: int,
    where: str,
    streams: dict[str, tuple[SensorStream, str]],
    config: RealWorldConfig,
    report: Report,
) -> Recording | None:
    """Check stamps, rates and overlap of a parsed acc/gyro pair; None if they share no time."""
    rates = {}
    for s, (stream, file) in streams.items():
        for kind, action in stamp_problems(stream.t_ns, config.reorder_ns, config.max_gap_ns):
            report.add(kind, where, file, f"{s}: {action}")
        # Median spacing: robust to gaps, which lower the mean rate of a stream without changing its sampling rate.
        spacing = np.diff(np.unique(stream.t_ns))
        rates[s] = 1e9 / float(np.median(spacing)) if spacing.size else 0.0
    (acc, acc_file), (gyr, gyr_file) = streams["acc"], streams["gyro"]
    lo = max(int(acc.t_ns.min()), int(gyr.t_ns.min()))
    hi = min(int(acc.t_ns.max()), int(gyr.t_ns.max()))
    if hi <= lo:
        report.add(
            "no_overlap",
            where,
            f"{acc_file} + {gyr_file}",
            f"acc and gyro share no time span (acc ends {(int(acc.t_ns.max()) - lo) / 1e9:+.1f} s from the later start); recording skipped",
        )
        return None
    spans = {s: (int(st.t_ns.max()) - int(st.t_ns.min())) / 1e9 for s, (st, _) in streams.items()}
    common = (hi - lo) / 1e9
    if common < SPAN_MISMATCH_SHARE * max(spans.values()):
        report.add(
            "span_mismatch",
            where,
            f"{acc_file} + {gyr_file}",
            f"acc spans {spans['acc']:.1f} s, gyro {spans['gyro']:.1f} s; only their common {common:.1f} s is windowed",
        )
    low, high = sorted(rates.values())
    if low <= 0 or high / low > RATE_MISMATCH_RATIO:
        report.add(
            "rate_mismatch",
            where,
            f"{acc_file} + {gyr_file}",
            f"acc {len(acc)} rows at {rates['acc']:.1f} Hz vs gyro {len(gyr)} rows at {rates['gyro']:.1f} Hz (median spacing); "
            f"both resampled onto the {1e9 / config.period_ns:g} Hz grid over their common {(hi - lo) / 1e9:.1f} s "
            "(FedDist drops such recordings)",
        )
    session = where.split("/", 1)[1]
    notes = tuple(f"{a.kind}: {a.action}" for a in report.anomalies if a.where == where)
    return Recording(f"proband{subject}", session, acc, gyr, LabelTrack.constant(label), notes)
