"""Windows of a REALWORLD subject, ready for training, kept in a per-subject cache.

Parsing all CSVs of a subject takes tens of seconds; the prepared windows, their sessions
and the anomaly report are cached (``.npz``, no pickle) under a key made of the settings,
the label set, :data:`REALWORLD_CACHE_FORMAT` and a fingerprint of the subject's source
files, so any change means a fresh read.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from har_models.data.dataset_cache import cache_file, default_cache_dir, load_cached, save_cached
from har_models.data.labels import REALWORLD_LABELS
from har_models.data.realworld.anomalies import Anomaly, log
from har_models.data.realworld.config import RealWorldConfig
from har_models.data.realworld.layout import open_dataset, subject_data
from har_models.data.realworld.recordings import read_realworld_subject, windows_with_sessions
from har_models.data.windowing import WindowSet

REALWORLD_CACHE_FORMAT = 2
"""Version of what this package stores in the cache; bump it when preparation changes.

2: streams faster than 62.5 Hz (chest gyroscopes) are low-passed before decimation, and
time columns in seconds, microseconds or nanoseconds are converted or rejected.
"""


@dataclass(frozen=True)
class PreparedSubject:
    """Windows of one subject, ready for training, fresh or from the cache.

    Parameters
    ----------
    subject : int
        Subject number k of ``proband{k}``.
    windows : WindowSet
        x (N, 6, T) float32 (acc m/s^2, gyro rad/s), y (N,) class indices of
        :data:`~har_models.data.labels.REALWORLD_LABELS`, t_start_ns (N,) Unix-epoch ns.
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
        Cache folder; default :func:`~har_models.data.dataset_cache.default_cache_dir`
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
    with open_dataset(Path(root)) as top:
        fingerprint = [
            entry
            for entry in subject_data(top, subject, root).fingerprint()
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


def _prepare(root: Path, subject: int, config: RealWorldConfig) -> PreparedSubject:
    data = read_realworld_subject(root, subject, config)
    windows, session_index = windows_with_sessions(data, config)
    sessions = tuple(r.session for r in data.recordings)
    log.info("REALWORLD proband%d: %d recordings, %d windows, %d anomalies", subject, len(sessions), len(windows), len(data.anomalies))
    return PreparedSubject(subject, windows, sessions, session_index, data.anomalies, from_cache=False)


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
