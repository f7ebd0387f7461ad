"""A synthetic REALWORLD archive in the official layout, for end-to-end tests.

15 subjects, a few activities at one body position each, learnable signals (each
activity has its own frequency and amplitude, each subject its own offset) and some of
the archive's known irregularities: a gyroscope at a higher rate than the accelerometer,
a ``_2`` file name and jittered timestamps.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

ACTS = ("walking", "sitting", "running")
FREQ = {"walking": 1.8, "sitting": 0.0, "running": 3.0}
AMP = {"walking": 3.0, "sitting": 0.2, "running": 7.0}


def _csv(prefix_row: str, t_ms: np.ndarray, xyz: np.ndarray) -> bytes:
    rows = ["id,attr_time,attr_x,attr_y,attr_z"]
    rows += [
        f"{i + 1},{t},{x:.5f},{y:.5f},{z:.5f}" for i, (t, (x, y, z)) in enumerate(zip(t_ms.tolist(), xyz.tolist(), strict=True))
    ]
    return ("\n".join(rows) + "\n").encode()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def build(path: Path, subjects: int = 15, seconds: float = 30.0, position: str = "waist", seed: int = 0) -> Path:
    """Write ``realworld2016_dataset.zip`` under ``path``; return its path."""
    rng = np.random.default_rng(seed)
    outer: dict[str, bytes] = {}
    for k in range(1, subjects + 1):
        offset = rng.normal(0, 0.3, size=3)
        for a_i, act in enumerate(ACTS):
            start = 1_435_000_000_000 + 3_600_000 * k + 600_000 * a_i
            for sensor, rate in (("acc", 50.0), ("gyr", 50.0 * (3.0 if k == 2 else 1.0))):
                n = int(seconds * rate)
                t = start + np.round(np.arange(n) * 1000.0 / rate + rng.normal(0, 1.0, n)).astype(np.int64)
                t = np.maximum.accumulate(t)
                s = (t - start) / 1000.0
                wave = AMP[act] * np.sin(2 * np.pi * FREQ[act] * s)
                if sensor == "acc":
                    xyz = np.stack([wave, 9.81 + 0.5 * wave, 0.3 * wave], 1) + offset
                else:
                    xyz = np.stack([0.2 * wave, 0.1 * wave, 0.05 * np.cos(s)], 1) + offset / 10
                xyz = xyz + rng.normal(0, 0.3, size=xyz.shape)
                prefix = "acc" if sensor == "acc" else "Gyroscope"
                infix = f"{act}_2" if (k == 4 and act == "walking") else act
                csv_name = f"{prefix}_{infix}_{position}.csv"
                outer[f"proband{k}/data/{sensor}_{act}_csv.zip"] = _zip(
                    {csv_name: _csv(prefix, t, xyz), "readMe": f"{csv_name}\nfrequency: {rate} Hz\n".encode()}
                )
    path.mkdir(parents=True, exist_ok=True)
    out = path / "realworld2016_dataset.zip"
    out.write_bytes(_zip(outer))
    return out
