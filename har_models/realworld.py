"""Reader for the raw REALWORLD archive (RealWorld HAR 2016, University of Mannheim).

REALWORLD (T. Sztyler and H. Stuckenschmidt, "On-body Localization of Wearable Devices: An
Investigation of Position-Aware Activity Recognition", IEEE PerCom 2016,
doi:10.1109/PERCOM.2016.7456521): 15 subjects ``proband1`` .. ``proband15``, 8 activities,
7 body positions, phone accelerometer (m/s^2, gravity included) and gyroscope (rad/s) at a
nominal 50 Hz. Users download ``realworld2016_dataset.zip`` (``datasets/fetch_realworld.py``)
and point the loader at the zip or at the folder it was extracted to; the data never ships
with the project (``datasets/realworld/README.md``).

Layout of the archive::

    proband{k}/data/{acc,gyr}_{activity}_csv.zip      one archive per sensor and activity
        acc_{activity}_{position}.csv                 columns id,attr_time,attr_x,attr_y,attr_z
        Gyroscope_{activity}_{position}.csv           attr_time: Unix epoch milliseconds
        readMe                                        sampling notes (ignored)

Anomalies of the real archive, each handled here, recorded as an :class:`Anomaly` in the
result and logged once (kind names in brackets):

* zip-in-zip multi-part recordings (probands 4, 7, 14 climbing): the outer archive holds
  one inner archive per part; acc part 1 is ``acc_{act}_1_csv.zip`` but gyro part 1 is
  ``gyr_{act}_csv.zip``, parts 2-3 ``{st}_{act}_{i}_csv.zip``; CSVs may carry the part infix
  (``acc_{act}_2_{pos}.csv``). Acc and gyro are paired by (activity, position, part index),
  never by file name; each part is its own recording ``{act}/{pos}/part{i}`` [multipart];
* ``_2`` file names of single recordings (``acc_walking_2_shin.csv``) [odd_name]; several
  CSVs for one position [ambiguous_csv];
* missing archives [missing_archive], recordings [missing_recording] and one-sensor
  recordings [missing_sensor] (proband2 climbingup forearm, proband6 jumping thigh);
* gyroscope files with up to 3.8x more rows than the accelerometer: both streams are
  resampled onto one 50 Hz grid over their common span instead of being dropped as in
  FedDist [rate_mismatch]; streams covering different times: only the common span is
  used [span_mismatch], and none at all [no_overlap];
* duplicated [duplicate_stamps] and out-of-order [out_of_order] timestamps and gaps up to
  1.5 s [gaps], handled by :class:`~har_models.resample.Resampler` (first arrival wins; late
  samples beyond the reorder horizon dropped; no grid point or window inside a gap);
* truncated or malformed rows [malformed_rows], a missing [no_header] or unusable
  [bad_header] header line, files without valid rows [empty], corrupt archives
  [corrupt_archive] and unreadable members [corrupt_member]: the row, file or archive is
  skipped, the rest of the subject loads;
* other members [unexpected_member] are ignored (``readMe``, hidden files and macOS
  ``__MACOSX`` folders silently).

Sources: the layout and the anomalies as found by the FedDist authors' preprocessing
(getalp/PerCom2021-FL, ``DATA_REALWORLD_SPLITSUB.ipynb``) and other public REALWORLD
loaders, summarised with references in ``datasets/realworld/README.md``; the FedDist
preprocessing this loader departs from (Ek et al., PerCom 2021) windows rows by index and
drops recordings whose acc and gyro lengths differ.
"""

from __future__ import annotations

import io
import logging
import re
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from har_models.dataset_cache import cache_file, default_cache_dir, load_cached, save_cached
from har_models.labels import REALWORLD_LABELS
from har_models.pipeline import windows_from_recording
from har_models.recording import LabelTrack, Recording, SensorStream
from har_models.resample import PERIOD_50HZ_NS
from har_models.windowing import N_CHANNELS, STEP, WINDOW, WindowSet

log = logging.getLogger(__name__)

ACTIVITIES: tuple[str, ...] = REALWORLD_LABELS.names
"""The 8 activities, in class-index order of :data:`~har_models.labels.REALWORLD_LABELS`."""

POSITIONS: tuple[str, ...] = ("chest", "forearm", "head", "shin", "thigh", "upperarm", "waist")
"""The 7 body positions of the phones."""

SENSORS: tuple[str, ...] = ("acc", "gyro")
"""Sensors read, as named by :class:`~har_models.resample.Resampler`."""

ARCHIVE_PREFIX = {"acc": "acc", "gyro": "gyr"}
"""Sensor prefix of the per-activity archives (``acc_walking_csv.zip``, ``gyr_walking_csv.zip``)."""

CSV_PREFIX = {"acc": "acc", "gyro": "Gyroscope"}
"""Sensor prefix of the CSV files inside them (``acc_walking_shin.csv``, ``Gyroscope_walking_shin.csv``)."""

CSV_COLUMNS = ("id", "attr_time", "attr_x", "attr_y", "attr_z")
"""Columns of every CSV file; ``attr_time`` is Unix epoch milliseconds."""

REALWORLD_CACHE_FORMAT = 1
"""Version of what this module stores in the cache; bump it when preparation changes."""

RATE_MISMATCH_RATIO = 1.2
"""Acc and gyro sampling rates (from the median spacing) differing by more than this factor are reported."""

SPAN_MISMATCH_SHARE = 0.9
"""A common acc/gyro time span shorter than this share of the longer stream's span is reported."""

MAX_TIME_SPREAD_MS = 86_400_000
"""Rows stamped more than a day from the file's median time are malformed (a recording lasts minutes)."""

WARNING_KINDS = frozenset(
    {
        "missing_archive",
        "missing_recording",
        "missing_sensor",
        "corrupt_archive",
        "corrupt_member",
        "bad_header",
        "malformed_rows",
        "empty",
        "no_overlap",
        "ambiguous_csv",
    }
)
"""Anomaly kinds that lose data; they are logged as warnings, the others as info."""

_IGNORED = re.compile(r"^(readme(\.txt)?|__macosx|\..*)$", re.IGNORECASE)
_NUM = r"[ \t]*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[ \t]*"


@dataclass(frozen=True)
class RealWorldConfig:
    """Preprocessing settings of a REALWORLD load (all of them enter the cache key).

    Parameters
    ----------
    positions : tuple of str
        Body positions to read, a subset of :data:`POSITIONS`. Default: all 7 pooled into
        the subject's data, as in FedDist (Ek et al., PerCom 2021).
    window, step : int
        Window length and step in grid samples (128 = 2.56 s and 64 at 50 Hz).
    period_ns : int
        Grid period, ns (20 ms = 50 Hz).
    max_gap_ns : int
        Longest spacing between two samples of one stream that is interpolated across, ns
        (100 ms); longer gaps split a recording into runs.
    reorder_ns : int
        How far back an out-of-order sample may be stamped and still be used, ns (200 ms).

    Raises
    ------
    ValueError
        On an unknown or repeated position, or a non-positive length.
    """

    positions: tuple[str, ...] = POSITIONS
    window: int = WINDOW
    step: int = STEP
    period_ns: int = PERIOD_50HZ_NS
    max_gap_ns: int = 100_000_000
    reorder_ns: int = 200_000_000

    def __post_init__(self) -> None:
        positions = (self.positions,) if isinstance(self.positions, str) else tuple(self.positions)
        unknown = [p for p in positions if p not in POSITIONS]
        if not positions or unknown or len(set(positions)) != len(positions):
            raise ValueError(
                f"RealWorldConfig: positions must be distinct names out of {', '.join(POSITIONS)}; got {positions!r}"
            )
        object.__setattr__(self, "positions", positions)
        for name in ("window", "step", "period_ns", "max_gap_ns"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"RealWorldConfig: {name} must be > 0, got {getattr(self, name)}")
        if self.reorder_ns < 0:
            raise ValueError(f"RealWorldConfig: reorder_ns must be >= 0, got {self.reorder_ns}")

    def pipeline_kwargs(self) -> dict[str, int]:
        """Keyword arguments for :class:`~har_models.pipeline.SensorPipeline` and ``windows_from_recording``."""
        return {
            "window": self.window,
            "step": self.step,
            "period_ns": self.period_ns,
            "max_gap_ns": self.max_gap_ns,
            "reorder_ns": self.reorder_ns,
        }


@dataclass(frozen=True)
class Anomaly:
    """One irregularity of the raw data met during a load, and what the loader did about it.

    Parameters
    ----------
    kind : str
        Category, e.g. ``"multipart"`` or ``"malformed_rows"`` (module docstring lists all).
    where : str
        ``proband{k}/{activity}[/{position}][/part{i}]``: what the anomaly concerns.
    file : str
        File relative to the dataset root; ``!`` separates an archive from a member, e.g.
        ``proband4/data/acc_climbingup_csv.zip!acc_climbingup_2_csv.zip!acc_climbingup_2_chest.csv``.
    action : str
        What was found and what was done, one sentence.
    """

    kind: str
    where: str
    file: str
    action: str

    def __str__(self) -> str:
        return f"REALWORLD {self.kind} at {self.where} ({self.file}): {self.action}"


@dataclass(frozen=True)
class RealWorldSubject:
    """The recordings of one subject and the anomalies met while reading them.

    Parameters
    ----------
    subject : int
        Subject number k of ``proband{k}``.
    recordings : tuple of Recording
        One per activity x position x part, in activity (class index), position (config
        order) and part order; sessions are named ``walking/shin`` or ``climbingup/chest/part2``.
    anomalies : tuple of Anomaly
        In the order met.
    """

    subject: int
    recordings: tuple[Recording, ...]
    anomalies: tuple[Anomaly, ...]


@dataclass(frozen=True)
class PreparedSubject:
    """Windows of one subject, ready for training, fresh or from the cache.

    Parameters
    ----------
    subject : int
        Subject number k of ``proband{k}``.
    windows : WindowSet
        x (N, 6, T) float32 (acc m/s^2, gyro rad/s), y (N,) class indices of
        :data:`~har_models.labels.REALWORLD_LABELS`, t_start_ns (N,) Unix-epoch ns.
    sessions : tuple of str
        Session names of the recordings, in load order.
    session_index : ndarray of shape (N,), int32
        Index into ``sessions`` of each window's recording.
    anomalies : tuple of Anomaly
        As met when the windows were prepared (also on a cache hit).
    from_cache : bool
        Whether the arrays were read from the cache.
    """

    subject: int
    windows: WindowSet
    sessions: tuple[str, ...]
    session_index: np.ndarray
    anomalies: tuple[Anomaly, ...]
    from_cache: bool = False


# ---------------------------------------------------------------------------------------
# Public functions


def realworld_subject_ids(root: Path) -> list[int]:
    """Subject numbers k of the ``proband{k}/data`` folders present under ``root``.

    Parameters
    ----------
    root : Path
        ``realworld2016_dataset.zip`` or the folder it was extracted to (the ``proband*``
        folders may sit at the top or one folder down).

    Returns
    -------
    list of int, ascending

    Raises
    ------
    FileNotFoundError
        If ``root`` does not exist or holds no ``proband{k}/data`` folder.
    ValueError
        If ``root`` is a file but not a readable zip archive.
    """
    with _open_dataset(Path(root)) as top:
        subjects = _find_subjects(top)
    if not subjects:
        raise FileNotFoundError(
            f"no REALWORLD subject folders (proband<k>/data) in {root}; expected realworld2016_dataset.zip "
            "or the folder it was extracted to (download it with datasets/fetch_realworld.py)"
        )
    return sorted(subjects)


def read_realworld_subject(root: Path, subject: int, config: RealWorldConfig | None = None) -> RealWorldSubject:
    """Read all recordings of one subject from the raw archive.

    Every anomaly (module docstring) is handled, logged once through :mod:`logging` and
    recorded in the result; only a missing or unreadable dataset or subject raises.

    Parameters
    ----------
    root : Path
        ``realworld2016_dataset.zip`` or its extracted folder.
    subject : int
        k of ``proband{k}`` (1..15 in the official archive).
    config : RealWorldConfig, optional
        Positions to read and the resampling settings used to describe what will happen to
        duplicated, late and gapped samples (default: all positions, 50 Hz, 100 ms, 200 ms).

    Returns
    -------
    RealWorldSubject
        Recordings with acc in m/s^2 and gyro in rad/s, timestamps Unix-epoch ns, one
        constant activity label each; and the anomaly report.

    Raises
    ------
    FileNotFoundError
        If ``root`` or ``proband{subject}/data`` does not exist (the message lists the
        subjects present).
    ValueError
        If ``root`` is a file but not a readable zip archive.
    """
    config = config or RealWorldConfig()
    report = _Report()
    recordings: list[Recording] = []
    with _open_dataset(Path(root)) as top:
        data = _subject_data(top, int(subject), root)
        for activity in ACTIVITIES:
            sensors = {s: _read_sensor_archive(data, int(subject), activity, s, config, report) for s in SENSORS}
            recordings += _pair_recordings(int(subject), activity, sensors, config, report)
    return RealWorldSubject(int(subject), tuple(recordings), tuple(report.anomalies))


def realworld_subject_windows(data: RealWorldSubject, config: RealWorldConfig | None = None) -> WindowSet:
    """All windows of one subject, each recording through the device sensor pipeline.

    Each recording goes through :func:`~har_models.pipeline.windows_from_recording`
    (resampling onto the exact 50 Hz grid, labelling, 128/64 windowing within contiguous
    runs), so no window spans a gap, a part boundary or two positions.

    Parameters
    ----------
    data : RealWorldSubject
        From :func:`read_realworld_subject`.
    config : RealWorldConfig, optional
        Window, step and resampling settings (positions were chosen when reading).

    Returns
    -------
    WindowSet
        x (N, 6, T) float32, y (N,) int64 class indices of ``REALWORLD_LABELS``,
        t_start_ns (N,) int64 Unix-epoch ns; recordings in ``data.recordings`` order.
    """
    return _windows_with_sessions(data, config or RealWorldConfig())[0]


def load_realworld_subject(
    root: Path,
    subject: int,
    config: RealWorldConfig | None = None,
    cache_dir: Path | None = None,
    use_cache: bool = True,
) -> PreparedSubject:
    """Windows of one subject, read from the per-subject cache when it is still valid.

    The cache entry (``.npz``, no pickle) is keyed by the settings in ``config``, the
    label set, :data:`REALWORLD_CACHE_FORMAT` and a fingerprint of the subject's source
    files: sizes and modification times of the files in an extracted folder, or names,
    CRC-32s and sizes of the members of the zip archive. Any change means a fresh read,
    which then replaces the entry (written atomically).

    Parameters
    ----------
    root : Path
        ``realworld2016_dataset.zip`` or its extracted folder.
    subject : int
        k of ``proband{k}``.
    config : RealWorldConfig, optional
    cache_dir : Path, optional
        Cache folder; default :func:`~har_models.dataset_cache.default_cache_dir`
        (``~/.cache/fedhar``) under ``realworld/``.
    use_cache : bool
        False: always read the raw files and leave the cache alone.

    Returns
    -------
    PreparedSubject

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`read_realworld_subject`. A cache folder that cannot be written is only
        logged.
    """
    config = config or RealWorldConfig()
    subject = int(subject)
    if not use_cache:
        return _prepare(root, subject, config)
    with _open_dataset(Path(root)) as top:
        fingerprint = [
            entry
            for entry in _subject_data(top, subject, root).fingerprint()
            if re.match(rf"proband{subject}/data/(acc|gyr)_", str(entry[0]))
        ]
    settings = {
        "loader_format": REALWORLD_CACHE_FORMAT,
        "labels": [REALWORLD_LABELS.name, *REALWORLD_LABELS.names],
        **asdict(config),
    }
    key = {"dataset": "realworld", "subject": subject, "settings": settings, "source": fingerprint}
    path = cache_file(
        Path(cache_dir) if cache_dir is not None else default_cache_dir() / "realworld",
        "realworld",
        f"proband{subject}",
        settings,
    )
    arrays = load_cached(path, key)
    if arrays is not None:
        prepared = _from_arrays(subject, arrays)
        log.info(
            "REALWORLD proband%d: %d windows from cache %s (%d anomalies recorded when prepared)",
            subject,
            len(prepared.windows),
            path,
            len(prepared.anomalies),
        )
        return prepared
    prepared = _prepare(root, subject, config)
    try:
        save_cached(path, key, _to_arrays(prepared))
    except OSError as exc:
        log.warning("REALWORLD proband%d: could not write cache %s (%s); continuing without it", subject, path, exc)
    return prepared


def parse_realworld_csv(data: bytes, name: str = "<csv>") -> tuple[SensorStream, list[tuple[str, str]]]:
    """Parse one REALWORLD sensor CSV, skipping what cannot be trusted.

    Rows must have exactly as many numeric fields as the header; rows that are truncated,
    non-numeric, non-finite, stamped with a non-integer, non-positive or implausible time
    (more than :data:`MAX_TIME_SPREAD_MS` from the file's median) are dropped and counted.

    Parameters
    ----------
    data : bytes
        File content (UTF-8; a byte-order mark is ignored).
    name : str
        File name, only for messages.

    Returns
    -------
    stream : SensorStream
        ``t_ns`` = attr_time (Unix epoch ms) * 10^6 in file order; ``xyz`` = attr_x,
        attr_y, attr_z in the file's unit (m/s^2 or rad/s). Empty if nothing is usable.
    problems : list of (kind, action)
        ``no_header``, ``bad_header``, ``malformed_rows`` or ``empty``, each with what was
        done; empty for a clean file.
    """
    text = data.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = text.splitlines()
    empty = SensorStream(np.empty(0, np.int64), np.empty((0, 3)))
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return empty, [("empty", f"{name} has no rows; recording skipped")]
    fields = [f.strip().strip('"').strip() for f in lines[first].split(",")]
    problems: list[tuple[str, str]] = []
    if all(c in fields for c in CSV_COLUMNS[1:]):
        cols = [fields.index(c) for c in CSV_COLUMNS[1:]]
        n_fields, body_start = len(fields), first + 1
    elif len(fields) == len(CSV_COLUMNS) and all(re.fullmatch(_NUM, f) for f in fields):
        problems.append(("no_header", f"{name} has no header line; columns read as {','.join(CSV_COLUMNS)}"))
        cols, n_fields, body_start = [1, 2, 3, 4], len(CSV_COLUMNS), first
    else:
        return empty, [("bad_header", f"{name} header {lines[first][:80]!r} lacks {', '.join(CSV_COLUMNS[1:])}; file skipped")]
    values, line_no, bad = _parse_rows(lines[body_start:], n_fields)
    line_no += body_start + 1  # 1-based line numbers in the file
    bad_lines = [body_start + 1 + i for i in bad]
    t_ms, xyz = values[:, cols[0]], values[:, cols[1:]]
    ok = np.isfinite(xyz).all(axis=1) & np.isfinite(t_ms) & (t_ms == np.floor(t_ms)) & (t_ms > 0)
    if ok.any():
        ok &= np.abs(t_ms - np.median(t_ms[ok])) <= MAX_TIME_SPREAD_MS
    bad_lines = sorted(bad_lines + line_no[~ok].tolist())
    if bad_lines:
        shown = ", ".join(str(i) for i in bad_lines[:5]) + (", ..." if len(bad_lines) > 5 else "")
        problems.append(
            (
                "malformed_rows",
                f"{len(bad_lines)} of {len(bad_lines) + int(ok.sum())} rows of {name} skipped "
                f"(truncated, non-numeric, non-finite or implausible time) at line {shown}",
            )
        )
    if not ok.any():
        problems.append(("empty", f"{name} has no valid rows; recording skipped"))
        return empty, problems
    return SensorStream(t_ms[ok].astype(np.int64) * 1_000_000, xyz[ok]), problems


def read_realworld_csv(path: Path) -> tuple[SensorStream, list[tuple[str, str]]]:
    """:func:`parse_realworld_csv` of a CSV file on disk (e.g. the committed sample).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"REALWORLD CSV {path} does not exist")
    return parse_realworld_csv(path.read_bytes(), path.name)


def recording_from_csv_files(
    acc_csv: Path,
    gyro_csv: Path,
    subject: int,
    activity: str,
    position: str,
    config: RealWorldConfig | None = None,
) -> tuple[Recording, list[Anomaly]]:
    """One recording from a loose pair of CSV files (as in ``datasets/realworld/sample``).

    Parameters
    ----------
    acc_csv, gyro_csv : Path
        ``acc_{activity}_{position}.csv`` (m/s^2) and ``Gyroscope_{activity}_{position}.csv`` (rad/s).
    subject : int
        k of ``proband{k}``.
    activity : str
        One of :data:`ACTIVITIES`; sets the label.
    position : str
        One of :data:`POSITIONS`; part of the session name.
    config : RealWorldConfig, optional
        Settings used to describe duplicated, late and gapped samples.

    Returns
    -------
    recording : Recording
        Session ``{activity}/{position}``.
    anomalies : list of Anomaly
        Everything met, as in :func:`read_realworld_subject`.

    Raises
    ------
    FileNotFoundError
        If a file is missing.
    KeyError
        If ``activity`` is not a REALWORLD activity.
    ValueError
        If ``position`` is unknown, or a file has no usable rows or the two files share no
        time span (the message names the file).
    """
    config = config or RealWorldConfig()
    label = REALWORLD_LABELS.index(activity)
    if position not in POSITIONS:
        raise ValueError(f"position {position!r} is not a REALWORLD position; known: {', '.join(POSITIONS)}")
    where = f"proband{int(subject)}/{activity}/{position}"
    report = _Report()
    streams = {}
    for sensor, path in (("acc", Path(acc_csv)), ("gyro", Path(gyro_csv))):
        stream, problems = read_realworld_csv(path)
        for kind, action in problems:
            report.add(kind, where, str(path), action)
        if len(stream) == 0:
            raise ValueError(f"REALWORLD CSV {path} holds no usable {sensor} rows; expected columns {','.join(CSV_COLUMNS)}")
        streams[sensor] = (stream, str(path))
    rec = _build_recording(int(subject), activity, label, where, streams, config, report)
    if rec is None:
        raise ValueError(f"REALWORLD CSVs {acc_csv} and {gyro_csv} share no time span; they are not one recording")
    return rec, report.anomalies


# ---------------------------------------------------------------------------------------
# Preparation and cache arrays


def _prepare(root: Path, subject: int, config: RealWorldConfig) -> PreparedSubject:
    data = read_realworld_subject(root, subject, config)
    windows, session_index = _windows_with_sessions(data, config)
    sessions = tuple(r.session for r in data.recordings)
    log.info(
        "REALWORLD proband%d: %d recordings, %d windows, %d anomalies", subject, len(sessions), len(windows), len(data.anomalies)
    )
    return PreparedSubject(subject, windows, sessions, session_index, data.anomalies, from_cache=False)


def _windows_with_sessions(data: RealWorldSubject, config: RealWorldConfig) -> tuple[WindowSet, np.ndarray]:
    parts = [windows_from_recording(rec, REALWORLD_LABELS, **config.pipeline_kwargs()) for rec in data.recordings]
    index = [np.full(len(p), i, np.int32) for i, p in enumerate(parts)]
    windows = WindowSet.concat(parts, REALWORLD_LABELS)
    if len(windows) == 0:  # keep the configured window length on an empty set
        windows = WindowSet(np.empty((0, N_CHANNELS, config.window), np.float32), np.empty(0, np.int64), REALWORLD_LABELS)
    return windows, (np.concatenate(index) if index else np.empty(0, np.int32))


def _to_arrays(p: PreparedSubject) -> dict[str, np.ndarray]:
    assert p.windows.t_start_ns is not None
    a = p.anomalies
    return {
        "x": p.windows.x,
        "y": p.windows.y,
        "t_start_ns": p.windows.t_start_ns,
        "session_index": p.session_index,
        "sessions": np.array(p.sessions, dtype=str),
        "anomaly_kind": np.array([x.kind for x in a], dtype=str),
        "anomaly_where": np.array([x.where for x in a], dtype=str),
        "anomaly_file": np.array([x.file for x in a], dtype=str),
        "anomaly_action": np.array([x.action for x in a], dtype=str),
    }


def _from_arrays(subject: int, d: dict[str, np.ndarray]) -> PreparedSubject:
    anomalies = tuple(
        Anomaly(str(k), str(w), str(f), str(a))
        for k, w, f, a in zip(d["anomaly_kind"], d["anomaly_where"], d["anomaly_file"], d["anomaly_action"], strict=True)
    )
    windows = WindowSet(d["x"], d["y"], REALWORLD_LABELS, d["t_start_ns"])
    sessions = tuple(str(s) for s in d["sessions"])
    return PreparedSubject(subject, windows, sessions, d["session_index"].astype(np.int32), anomalies, from_cache=True)


# ---------------------------------------------------------------------------------------
# Anomaly report


@dataclass
class _Report:
    """Collects anomalies; logs each (kind, where, file) once."""

    anomalies: list[Anomaly] = field(default_factory=list)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)

    def add(self, kind: str, where: str, file: str, action: str) -> None:
        if (kind, where, file) in self._seen:
            return
        self._seen.add((kind, where, file))
        a = Anomaly(kind, where, file, action)
        self.anomalies.append(a)
        log.log(logging.WARNING if kind in WARNING_KINDS else logging.INFO, "%s", a)


# ---------------------------------------------------------------------------------------
# Reading archives: a folder, a zip file, or a zip inside a zip, behind one small interface


class _UnreadableError(Exception):
    """A file or archive that exists but cannot be read (message: why)."""


class _Container:
    """A folder-like thing: a directory, a zip archive, or a folder inside a zip."""

    label: str  # path relative to the dataset root, for messages and fingerprints

    def files(self) -> list[str]:
        raise NotImplementedError

    def dirs(self) -> list[str]:
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        raise NotImplementedError

    def child(self, name: str) -> _Container:
        raise NotImplementedError

    def fingerprint(self) -> list[list[object]]:
        raise NotImplementedError

    def member_label(self, name: str) -> str:
        raise NotImplementedError

    def relabel(self, label: str) -> _Container:
        raise NotImplementedError


class _DirContainer(_Container):
    def __init__(self, path: Path, label: str) -> None:
        self.path, self.label = path, label

    def _entries(self, want_dir: bool) -> list[str]:
        try:
            return sorted(p.name for p in self.path.iterdir() if p.is_dir() == want_dir and not p.name.startswith("."))
        except OSError as exc:
            raise _UnreadableError(f"cannot list {self.path}: {exc}") from None

    def files(self) -> list[str]:
        return self._entries(False)

    def dirs(self) -> list[str]:
        return self._entries(True)

    def read(self, name: str) -> bytes:
        try:
            return (self.path / name).read_bytes()
        except OSError as exc:
            raise _UnreadableError(f"cannot read {self.path / name}: {exc}") from None

    def child(self, name: str) -> _Container:
        if (self.path / name).is_dir():
            return _DirContainer(self.path / name, self.member_label(name))
        return _zip_from_bytes(self.read(name), self.member_label(name))

    def fingerprint(self) -> list[list[object]]:
        out: list[list[object]] = []
        for p in sorted(self.path.rglob("*")):
            if p.is_file():
                st = p.stat()
                out.append([self.member_label(p.relative_to(self.path).as_posix()), st.st_size, st.st_mtime_ns])
        return out

    def member_label(self, name: str) -> str:
        return f"{self.label}/{name}" if self.label else name

    def relabel(self, label: str) -> _Container:
        return _DirContainer(self.path, label)


class _ZipContainer(_Container):
    """The folder ``prefix`` of an open zip archive (``prefix`` "" is its top)."""

    def __init__(self, zf: zipfile.ZipFile, prefix: str, label: str, nested: bool) -> None:
        self.zf, self.prefix, self.label = zf, prefix, label
        self.nested = nested  # the archive itself is a member of another archive: members are "label!name"
        self._files: list[str] = []
        dirs = set()
        for name in zf.namelist():
            if not name.startswith(prefix) or name == prefix:
                continue
            head, sep, _ = name[len(prefix) :].partition("/")
            if head.startswith(".") or head.lower() == "__macosx":
                continue
            if sep:
                dirs.add(head)
            elif head:
                self._files.append(head)
        self._files.sort()
        self._dirs = sorted(dirs)

    def files(self) -> list[str]:
        return self._files

    def dirs(self) -> list[str]:
        return self._dirs

    def read(self, name: str) -> bytes:
        try:
            return self.zf.read(self.prefix + name)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, KeyError) as exc:
            raise _UnreadableError(f"member {name} cannot be read ({exc})") from None

    def child(self, name: str) -> _Container:
        if name in self._dirs:
            return _ZipContainer(self.zf, f"{self.prefix}{name}/", self.member_label(name), self.nested)
        return _zip_from_bytes(self.read(name), self.member_label(name))

    def fingerprint(self) -> list[list[object]]:
        return [
            [self.member_label(info.filename[len(self.prefix) :]), info.CRC, info.file_size]
            for info in sorted(self.zf.infolist(), key=lambda i: i.filename)
            if info.filename.startswith(self.prefix) and not info.is_dir()
        ]

    def member_label(self, name: str) -> str:
        if not self.label:
            return name
        return f"{self.label}!{name}" if self.nested and not self.prefix else f"{self.label}/{name}"

    def relabel(self, label: str) -> _Container:
        return _ZipContainer(self.zf, self.prefix, label, self.nested)


def _zip_from_bytes(data: bytes, label: str) -> _Container:
    try:
        return _ZipContainer(zipfile.ZipFile(io.BytesIO(data)), "", label, nested=True)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise _UnreadableError(f"not a readable zip archive ({exc})") from None


@contextmanager
def _open_dataset(root: Path) -> Iterator[_Container]:
    if root.is_dir():
        yield _DirContainer(root, "")
        return
    if not root.is_file():
        raise FileNotFoundError(
            f"REALWORLD data not found at {root}; pass realworld2016_dataset.zip or the folder it was extracted to "
            "(download it with datasets/fetch_realworld.py)"
        )
    try:
        zf = zipfile.ZipFile(root)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(
            f"REALWORLD archive {root} is not a readable zip file ({exc}); download it again with datasets/fetch_realworld.py"
        ) from None
    with zf:
        yield _ZipContainer(zf, "", "", nested=False)


def _find_subjects(top: _Container) -> dict[int, _Container]:
    """``proband{k}/data`` folders at the top or one folder down, labelled ``proband{k}/data``."""
    found = _subjects_in(top)
    for d in [] if found else top.dirs():
        try:
            found = _subjects_in(top.child(d))
        except _UnreadableError as exc:
            log.warning("REALWORLD: skipping unreadable folder %s (%s)", d, exc)
        if found:
            break
    return found


def _subjects_in(folder: _Container) -> dict[int, _Container]:
    found: dict[int, _Container] = {}
    for d in folder.dirs():
        m = re.fullmatch(r"proband(\d+)", d)
        if m and int(m[1]) not in found:
            subject = folder.child(d)
            if "data" in subject.dirs():
                found[int(m[1])] = subject.child("data").relabel(f"{d}/data")
    return found


def _subject_data(top: _Container, subject: int, root: Path) -> _Container:
    subjects = _find_subjects(top)
    if subject not in subjects:
        present = ", ".join(str(k) for k in sorted(subjects)) or "none"
        raise FileNotFoundError(f"REALWORLD subject proband{subject} has no data folder in {root} (subjects present: {present})")
    return subjects[subject]


# ---------------------------------------------------------------------------------------
# One sensor archive of one activity


@dataclass
class _SensorFiles:
    """CSV contents of one sensor and activity, by (position, part index)."""

    usable: bool  # False: archive missing or unreadable (already reported)
    label: str
    multipart: bool = False
    csv: dict[tuple[str, int], tuple[bytes, str]] = field(default_factory=dict)
    failed: set[tuple[str, int]] = field(default_factory=set)  # found but unreadable (already reported)


def _read_sensor_archive(
    data: _Container, subject: int, activity: str, sensor: str, config: RealWorldConfig, report: _Report
) -> _SensorFiles:
    st = ARCHIVE_PREFIX[sensor]
    base = f"proband{subject}/{activity}"
    zip_name, dir_name = f"{st}_{activity}_csv.zip", f"{st}_{activity}_csv"
    if zip_name in data.files():
        name = zip_name
    elif dir_name in data.dirs():
        name = dir_name
    else:
        report.add(
            "missing_archive",
            base,
            data.member_label(zip_name),
            f"no {sensor} archive {zip_name} for {activity}; the {activity} recordings of proband{subject} are skipped",
        )
        return _SensorFiles(usable=False, label=data.member_label(zip_name))
    try:
        archive = data.child(name)
    except _UnreadableError as exc:
        report.add(
            "corrupt_archive",
            base,
            data.member_label(name),
            f"{exc}; expected a zip of {CSV_PREFIX[sensor]}_{activity}_<position>.csv files; "
            f"the {activity} recordings are skipped (download the dataset again)",
        )
        return _SensorFiles(usable=False, label=data.member_label(name))

    inner_rx = re.compile(rf"{st}_{activity}(?:_(\d+))?_csv(?:\.zip)?", re.IGNORECASE)
    inner = [n for n in archive.files() if n.lower().endswith(".zip")] + [d for d in archive.dirs() if inner_rx.fullmatch(d)]
    out = _SensorFiles(usable=True, label=archive.label, multipart=bool(inner))
    parts: dict[int, _Container] = {}
    if not inner:
        parts[1] = archive
    else:
        for name in sorted(inner):
            m = inner_rx.fullmatch(name)
            if m is None:
                report.add("unexpected_member", base, archive.member_label(name), f"{name} is not a part of {activity}; ignored")
                continue
            part = int(m[1] or 1)
            if part in parts:
                report.add(
                    "ambiguous_csv", f"{base}/part{part}", archive.member_label(name), f"second archive for part {part}; ignored"
                )
                continue
            try:
                parts[part] = archive.child(name)
            except _UnreadableError as exc:
                report.add(
                    "corrupt_archive",
                    f"{base}/part{part}",
                    archive.member_label(name),
                    f"{exc}; expected a zip of {sensor} CSVs of part {part}; part {part} skipped",
                )
                out.failed.update((p, part) for p in config.positions)
        report.add(
            "multipart",
            base,
            archive.label,
            f"{sensor} archive holds {len(inner)} inner archives (zip-in-zip); read as parts "
            f"{', '.join(str(p) for p in sorted(parts)) or 'none'}, each a recording of its own",
        )
        for name in archive.files():
            if not name.lower().endswith(".zip") and not _IGNORED.fullmatch(name):
                report.add("unexpected_member", base, archive.member_label(name), f"{name} beside the part archives; ignored")

    csv_rx = re.compile(rf"{CSV_PREFIX[sensor]}_{activity}(?:_(\d+))?_({'|'.join(POSITIONS)})\.csv", re.IGNORECASE)
    for part, container in sorted(parts.items()):
        candidates: dict[str, list[tuple[int, str]]] = {}
        for name in container.files():
            m = csv_rx.fullmatch(name)
            if m is None:
                if not _IGNORED.fullmatch(name):
                    where = f"{base}/part{part}" if out.multipart else base
                    report.add(
                        "unexpected_member",
                        where,
                        container.member_label(name),
                        f"{name} is not a {sensor} CSV of {activity}; ignored",
                    )
                continue
            position = m[2].lower()
            if position in config.positions:
                candidates.setdefault(position, []).append((int(m[1] or 0), name))
        for position, names in candidates.items():
            where = f"{base}/{position}" + (f"/part{part}" if out.multipart else "")
            names.sort()
            infix, name = names[0]
            if len(names) > 1:
                report.add(
                    "ambiguous_csv",
                    where,
                    container.member_label(name),
                    f"{len(names)} {sensor} CSVs for {position}: used {name}, ignored {', '.join(n for _, n in names[1:])}",
                )
            if infix and not out.multipart:
                report.add(
                    "odd_name",
                    where,
                    container.member_label(name),
                    f"{name} carries a part infix in a single recording; read as {activity}/{position}",
                )
            try:
                out.csv[(position, part)] = (container.read(name), container.member_label(name))
            except _UnreadableError as exc:
                report.add("corrupt_member", where, container.member_label(name), f"{exc}; {activity}/{position} skipped")
                out.failed.add((position, part))
    return out


# ---------------------------------------------------------------------------------------
# Pairing acc and gyro into recordings


def _pair_recordings(
    subject: int, activity: str, sensors: dict[str, _SensorFiles], config: RealWorldConfig, report: _Report
) -> list[Recording]:
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
        rec = _build_recording(subject, activity, label, where, streams, config, report)
        if rec is not None:
            recordings.append(rec)
    return recordings


def _build_recording(
    subject: int,
    activity: str,
    label: int,
    where: str,
    streams: dict[str, tuple[SensorStream, str]],
    config: RealWorldConfig,
    report: _Report,
) -> Recording | None:
    """Check stamps, rates and overlap of a parsed acc/gyro pair; None if they share no time."""
    rates = {}
    for s, (stream, file) in streams.items():
        for kind, action in _stamp_problems(stream.t_ns, config):
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
            f"acc and gyro share no time span (acc ends {(int(acc.t_ns.max()) - lo) / 1e9:+.1f} s from the later start); "
            "recording skipped",
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


def _stamp_problems(t_ns: np.ndarray, config: RealWorldConfig) -> list[tuple[str, str]]:
    """Duplicated, out-of-order and gapped stamps of one stream, as the resampler will treat them.

    Mirrors the rules of :class:`~har_models.resample.Resampler` for a stream pushed in file
    order: a sample stamped ``reorder_ns`` or more behind the newest earlier one is late
    and dropped; of the rest, the first of equal stamps is kept.
    """
    problems: list[tuple[str, str]] = []
    if t_ns.size < 2:
        return problems
    prev_max = np.maximum.accumulate(t_ns)[:-1]
    behind = np.r_[False, t_ns[1:] < prev_max]
    late = np.r_[False, t_ns[1:] + config.reorder_ns <= prev_max]
    kept = t_ns[~late]
    unique = np.unique(kept)
    n_dup = kept.size - unique.size
    n_behind, n_late = int(behind.sum()), int(late.sum())
    if n_dup:
        problems.append(("duplicate_stamps", f"{_n(n_dup, 'sample')} with a timestamp seen before; the first to arrive is kept"))
    if n_behind:
        problems.append(
            (
                "out_of_order",
                f"{_n(n_behind, 'sample')} stamped before an earlier row; {int((behind & ~late).sum())} re-sorted within the "
                f"{config.reorder_ns / 1e6:g} ms reorder horizon, {n_late} dropped as late",
            )
        )
    elif n_late:  # only equal stamps with reorder_ns == 0
        problems.append(
            ("out_of_order", f"{_n(n_late, 'sample')} with the newest stamp again and no reorder horizon; dropped as late")
        )
    gaps = np.diff(unique)
    big = gaps[gaps > config.max_gap_ns]
    if big.size:
        problems.append(
            (
                "gaps",
                f"{_n(big.size, 'gap')} longer than {config.max_gap_ns / 1e6:g} ms (longest {big.max() / 1e9:.2f} s, "
                f"{big.sum() / 1e9:.1f} s in all); not interpolated, no window spans them",
            )
        )
    return problems


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _parse_rows(lines: list[str], n_fields: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Numeric rows of ``lines``: values (m, n_fields), their line indices, indices of bad lines.

    Fast path: numpy's C parser on everything. If any row is malformed, each line is first
    checked against a strict number grammar (which accepts what that parser accepts except
    nan/inf, which are rejected afterwards anyway), so both paths keep the same rows.
    """
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    if not nonblank:
        return np.empty((0, n_fields)), np.empty(0, np.int64), []
    try:
        values = np.loadtxt(lines, delimiter=",", comments=None, dtype=np.float64, ndmin=2)
        if values.shape == (len(nonblank), n_fields):
            return values, np.asarray(nonblank, np.int64), []
    except ValueError:
        pass
    row = re.compile(_NUM + ("," + _NUM) * (n_fields - 1))
    good = [i for i in nonblank if row.fullmatch(lines[i])]
    good_set = set(good)
    bad = [i for i in nonblank if i not in good_set]
    if not good:
        return np.empty((0, n_fields)), np.empty(0, np.int64), bad
    values = np.loadtxt([lines[i] for i in good], delimiter=",", comments=None, dtype=np.float64, ndmin=2)
    return values, np.asarray(good, np.int64), bad
