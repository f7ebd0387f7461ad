"""``fedhar-simulate --dataset realworld`` end to end on a synthetic 15-subject archive."""

from __future__ import annotations

import json
import math

from realworld_synth import build

from simulation import simulate


def test_fifteen_subjects_from_the_raw_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHAR_CACHE_DIR", str(tmp_path / "cache"))
    archive = build(tmp_path / "data")
    run_dir = tmp_path / "run"
    rc = simulate.main(
        [
            "--dataset",
            "realworld",
            "--data",
            str(archive),
            "--rounds",
            "2",
            "--conv-filters",
            "8",
            "--dense-units",
            "32",
            "--no-progress",
            "--run-dir",
            str(run_dir),
            "--run-id",
            "rw",
            "--start-timeout",
            "180",
            "--round-timeout",
            "180",
            "--lr",
            "0.05",
        ]
    )
    assert rc == 0
    doc = json.loads((run_dir / "report.json").read_text())
    assert doc["clients"] == 15 and doc["label_set"] == "realworld8"
    assert [r["updates"] for r in doc["rounds"]] == [15, 15]
    g = doc["rounds"][-1]["global"]
    assert math.isfinite(g["macro_f1"]) and 0 <= g["macro_f1"] <= 1
    assert "union of the 15 subjects' test splits" in doc["evaluation_set"]
    # A second client start reuses the cache rather than re-parsing the CSVs.
    assert any((tmp_path / "cache").rglob("*.npz"))
