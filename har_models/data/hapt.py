"""Reader for the committed HAPT recordings (``datasets/hapt/userXX.npz``).

HAPT (Reyes-Ortiz et al., "Transition-Aware Human Activity Recognition Using
Smartphones", Neurocomputing 171, 2016; CC BY 4.0): 30 subjects, a waist-worn phone,
accelerometer (g) and gyroscope (rad/s) at 50 Hz with per-sample labels. Each file holds
one subject's sessions; see ``datasets/hapt/README.md``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from har_models.data.labels import HAPT_LABELS
from har_models.data.pipeline import windows_from_recording
from har_models.data.recording import LabelTrack, Recording, SensorStream
from har_models.data.resample import PERIOD_50HZ_NS
from har_models.data.windowing import WindowSet

STANDARD_GRAVITY = 9.80665
"""m/s^2 per g (the HAPT accelerometer is in g)."""

_KEYS = {"acc": 2, "gyro": 2, "label": 1, "exp": 1, "sample": 1}


def hapt_subject_ids(root: Path) -> list[str]:
    """Subject ids (``"01"`` .. ``"30"``) of the ``userXX.npz`` files under ``root``.

    Raises
    ------
    FileNotFoundError
        If ``root`` holds no ``userXX.npz`` file.
    """
    ids = sorted(p.stem[4:] for p in Path(root).glob("user[0-9][0-9].npz"))
    if not ids:
        raise FileNotFoundError(f"no HAPT files (userXX.npz) in {root}; expected the folder datasets/hapt of this project")
    return ids


def read_hapt_recordings(path: Path) -> list[Recording]:
    """One :class:`Recording` per session (``exp``) of one HAPT subject file.

    Accelerometer converted from g to m/s^2; labels 1..6 become class indices 0..5 of
    :data:`~har_models.data.labels.HAPT_LABELS`; unlabelled samples (-1) and postural
    transitions (7..12) become -1. Timestamps are ``sample * 20 ms``.

    Parameters
    ----------
    path : Path
        A ``userXX.npz`` file.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not a readable npz, lacks a key, or has inconsistent shapes; the
        message names the file and what was expected.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"HAPT file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as d:
            arrays = {k: np.asarray(d[k]) for k in _KEYS if k in d.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"HAPT file {path} is not a readable .npz archive ({exc}); restore it from the repository") from None
    missing = [k for k in _KEYS if k not in arrays]
    if missing:
        raise ValueError(f"HAPT file {path} lacks keys {missing}; expected {sorted(_KEYS)}")
    n = arrays["label"].shape[0]
    for k, ndim in _KEYS.items():
        a = arrays[k]
        if a.ndim != ndim or a.shape[0] != n or (ndim == 2 and a.shape[1] != 3):
            raise ValueError(f"HAPT file {path}: key {k!r} has shape {a.shape}, expected ({n}{', 3' if ndim == 2 else ''})")
    label = arrays["label"].astype(np.int64)
    cls = np.where((label >= 1) & (label <= 6), label - 1, -1)
    subject = f"hapt-{path.stem[4:]}" if path.stem.startswith("user") else path.stem
    recs = []
    for e in np.unique(arrays["exp"]):
        m = arrays["exp"] == e
        t = arrays["sample"][m].astype(np.int64) * PERIOD_50HZ_NS
        recs.append(
            Recording(
                subject=subject,
                session=f"exp{int(e)}",
                acc=SensorStream(t, arrays["acc"][m] * STANDARD_GRAVITY),
                gyro=SensorStream(t, arrays["gyro"][m]),
                labels=LabelTrack.from_samples(t, cls[m]),
            )
        )
    return recs


def load_hapt_subject(path: Path) -> WindowSet:
    """All windows of one HAPT subject, sessions in order, through the sensor pipeline.

    Returns
    -------
    WindowSet
        x (N, 6, 128) float32 (acc m/s^2, gyro rad/s), y (N,) in 0..5.
    """
    parts = [windows_from_recording(r, HAPT_LABELS) for r in read_hapt_recordings(path)]
    return WindowSet.concat(parts, HAPT_LABELS)
