"""A stretch of a real HAPT session for the device-side tests that sense: the first seconds of subject 1's first session."""

from __future__ import annotations

from pathlib import Path

from har_models.data.hapt import read_hapt_recordings
from har_models.data.recording import Recording, SensorStream

ROOT = Path(__file__).resolve().parents[2]


def first_seconds(rec: Recording, seconds: float) -> Recording:
    """The recording's first ``seconds`` of both streams (from the earlier of their first stamps)."""

    def cut(s: SensorStream, t0: int) -> SensorStream:
        keep = s.t_ns < t0 + int(seconds * 1e9)
        return SensorStream(s.t_ns[keep], s.xyz[keep])

    t0 = min(int(rec.acc.t_ns.min()), int(rec.gyro.t_ns.min()))
    return Recording(rec.subject, rec.session, cut(rec.acc, t0), cut(rec.gyro, t0), rec.labels)


def hapt_day(seconds: float) -> Recording:
    """The first ``seconds`` of HAPT subject 1, session exp0 (50 Hz accelerometer and gyroscope, committed in datasets/hapt)."""
    return first_seconds(read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0], seconds)
