"""Recording labelled windows from a sensor source into the device's window log and store."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edge_client.recorder import Recorder, sync_to_store
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore
from edge_client.window_log import WindowLog
from har_models.data.labels import HAPT_LABELS
from har_models.data.recording import LabelTrack, Recording, SensorStream

P = 20_000_000
T0 = 500 * 10**9  # a multiple of the 20 ms grid: every sample lies on it


def _recording(seconds: int = 60) -> Recording:
    n = seconds * 50
    t = T0 + np.arange(n, dtype=np.int64) * P
    k = np.arange(n, dtype=np.float64)
    acc = np.stack([np.sin(k / 7), np.cos(k / 11), 9.8 + 0 * k], axis=1)
    gyr = np.stack([k / 1000, -k / 2000, np.sin(k / 3)], axis=1)
    return Recording("me", "s1", SensorStream(t, acc), SensorStream(t, gyr), LabelTrack.constant(0))


def _expected_starts(c_on: int, c_off: int, t_first: int = T0) -> list[int]:
    """Windows every 64 samples from the run's first sample, wholly within [c_on, c_off)."""
    starts = t_first + np.arange(0, 3000, 64, dtype=np.int64) * P
    return [int(s) for s in starts if s >= c_on and s + 127 * P < c_off]


def test_windows_between_start_and_stop_are_labelled_and_kept(tmp_path):
    rec = _recording()
    lg = WindowLog(tmp_path / "w.log", HAPT_LABELS)
    r = Recorder(lg)
    newest, marks = -1, {}
    for chunk in ReplaySensor(rec, speed=None).chunks(threading.Event()):
        r.push(chunk)
        newest = max(newest, int(chunk[1].max()))
        if "on" not in marks and newest >= T0 + 10 * 10**9:
            r.start("walking")
            marks["on"] = newest + 1
        if "off" not in marks and newest >= T0 + 40 * 10**9:
            r.stop()
            marks["off"] = newest + 1
    r.flush()
    starts = _expected_starts(marks["on"], marks["off"])
    assert len(starts) >= 20
    got = lg.read()
    assert got.t_start_ns.tolist() == starts
    assert set(got.y.tolist()) == {0}
    first = int((starts[0] - T0) // P)
    np.testing.assert_array_equal(got.x[0, :3], rec.acc.xyz[first : first + 128].T.astype(np.float32))
    np.testing.assert_array_equal(got.x[0, 3:], rec.gyro.xyz[first : first + 128].T.astype(np.float32))
    assert r.counts() == {"walking": len(starts), **{n: 0 for n in HAPT_LABELS.names if n != "walking"}}
    assert not r.recording


def test_counts_accumulate_over_sessions_and_survive_a_restart(tmp_path):
    rec = _recording(20)
    lg = WindowLog(tmp_path / "w.log", HAPT_LABELS)
    r = Recorder(lg)
    r.start("sitting")
    for chunk in ReplaySensor(rec, speed=None).chunks(threading.Event()):
        r.push(chunk)
    r.flush()
    n_sit = r.counts()["sitting"]
    assert n_sit == (1000 - 128) // 64 + 1  # the whole 20 s run is "sitting"
    r.start("laying")  # a new session: time restarts later on the same clock
    shifted = Recording(
        "me", "s2", SensorStream(rec.acc.t_ns + 10**11, rec.acc.xyz), SensorStream(rec.gyro.t_ns + 10**11, rec.gyro.xyz), rec.labels
    )
    for chunk in ReplaySensor(shifted, speed=None).chunks(threading.Event()):
        r.push(chunk)
    r.stop()
    r.flush()
    again = Recorder(WindowLog(tmp_path / "w.log", HAPT_LABELS))
    assert again.counts()["sitting"] == n_sit and again.counts()["laying"] == n_sit

    store = ClientStore(tmp_path / "state", HAPT_LABELS)
    n_train, n_test = sync_to_store(again.log, store)
    assert (n_train, n_test) == (len(store.windows("train")), len(store.windows("test")))
    assert n_train + n_test == 2 * n_sit and n_test == round(0.2 * n_sit) * 2
    assert sync_to_store(again.log, store) == (n_train, n_test)  # unchanged log: nothing rewritten
    store.close()


def test_unknown_activity_names_the_known_ones(tmp_path):
    r = Recorder(WindowLog(tmp_path / "w.log", HAPT_LABELS))
    with pytest.raises(KeyError, match=r"juggling.*walking"):
        r.start("juggling")
    assert not r.recording
