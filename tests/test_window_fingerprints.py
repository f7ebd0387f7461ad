"""The windows and the 80/20 split that HAPT and REALWORLD subjects produce are frozen.

The main job's numbers depend on every window's values, their order, their labels and
which of them fall in the test split. ``tests/fixtures/window_fingerprints.json`` holds
SHA-256 digests of the train and test :class:`~har_models.data.windowing.WindowSet` of three
HAPT subjects, of the committed REALWORLD sample recording and of two 50 Hz subjects of
the synthetic REALWORLD archive, recorded before the data layer was reorganised (REALWORLD
package, anti-alias filter, split objects). Each is computed along every path a client or
the coordinator takes: the dataset readers with the subjects' split, and the client's
store after ingesting the source. Any change of a single bit fails here.

Regenerate (only when a change of the windows is intended, and say why in the commit)::

    python tests/test_window_fingerprints.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.realworld_synth import build  # noqa: E402

from edge_client.sources import ingest_source  # noqa: E402
from edge_client.store import ClientStore  # noqa: E402
from har_models.data.labels import REALWORLD_LABELS  # noqa: E402
from har_models.data.pipeline import windows_from_recording  # noqa: E402
from har_models.data.realworld import load_realworld_subject, recording_from_csv_files  # noqa: E402
from har_models.data.subjects import load_windows, parse_source, split  # noqa: E402
from har_models.data.windowing import WindowSet  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "window_fingerprints.json"
HAPT = ROOT / "datasets" / "hapt"
SAMPLE = ROOT / "datasets" / "realworld" / "sample" / "proband1"
HAPT_SUBJECTS = ("01", "05", "17")
SYNTH_SUBJECTS = (1, 4)  # 50 Hz streams; proband4 carries the "_2" file name anomaly


def digest(ws: WindowSet) -> str:
    """SHA-256 of shape, values (float32), labels (int64) and start times (int64), in order."""
    h = hashlib.sha256()
    h.update(repr((ws.x.shape, ws.x.dtype.str, ws.labels.name)).encode())
    h.update(np.ascontiguousarray(ws.x, "<f4").tobytes())
    h.update(np.ascontiguousarray(ws.y, "<i8").tobytes())
    assert ws.t_start_ns is not None
    h.update(np.ascontiguousarray(ws.t_start_ns, "<i8").tobytes())
    return h.hexdigest()


def pair(train: WindowSet, test: WindowSet) -> dict[str, object]:
    return {"train": digest(train), "test": digest(test), "n_train": len(train), "n_test": len(test)}


def via_store(tmp: Path, source_text: str) -> dict[str, object]:
    src = parse_source(source_text)
    store = ClientStore(tmp, src.labels)
    try:
        ingest_source(store, src)
        return pair(store.windows("train"), store.windows("test"))
    finally:
        store.close()


def compute(tmp: Path) -> dict[str, dict[str, object]]:
    """Every fingerprint, keyed by what was computed and along which path."""
    out: dict[str, dict[str, object]] = {}
    for sid in HAPT_SUBJECTS:
        text = f"hapt:{HAPT / f'user{sid}.npz'}"
        out[f"hapt-{sid}/subjects"] = pair(*split(load_windows(parse_source(text)), seed=1))
        out[f"hapt-{sid}/store"] = via_store(tmp / f"store-hapt-{sid}", text)
    rec, _ = recording_from_csv_files(SAMPLE / "acc_walking_shin.csv", SAMPLE / "Gyroscope_walking_shin.csv", 1, "walking", "shin")
    out["realworld-sample/recording"] = pair(*split(windows_from_recording(rec, REALWORLD_LABELS), seed=1))
    archive = build(tmp / "synth", subjects=max(SYNTH_SUBJECTS))
    for k in SYNTH_SUBJECTS:
        prepared = load_realworld_subject(archive, k, use_cache=False)
        out[f"realworld-synth-proband{k}/loader"] = pair(*split(prepared.windows, seed=1))
        out[f"realworld-synth-proband{k}/store"] = via_store(tmp / f"store-synth-{k}", f"realworld:{archive}:proband{k}")
    return out


@pytest.mark.slow
def test_windows_and_split_are_bit_identical_to_the_recorded_fingerprints(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHAR_CACHE_DIR", str(tmp_path / "cache"))
    want = json.loads(FIXTURE.read_text())
    got = compute(tmp_path)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key
    # the two paths (evaluation harness, client store) agree with each other
    for sid in HAPT_SUBJECTS:
        assert got[f"hapt-{sid}/subjects"] == got[f"hapt-{sid}/store"]
    for k in SYNTH_SUBJECTS:
        assert got[f"realworld-synth-proband{k}/loader"] == got[f"realworld-synth-proband{k}/store"]


if __name__ == "__main__":
    import os
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_window_fingerprints.py --write")
    with tempfile.TemporaryDirectory() as d:
        os.environ["FEDHAR_CACHE_DIR"] = str(Path(d) / "cache")
        result = compute(Path(d))
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(result)} fingerprints to {FIXTURE}")
