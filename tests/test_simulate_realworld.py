"""``fedhar-simulate --dataset realworld`` end to end on a synthetic 15-subject archive."""

from __future__ import annotations

import math

import pytest
from support.realworld_synth import build
from support.small_federation import run_simulation

pytestmark = pytest.mark.slow  # a federation of 15 clients


def test_fifteen_subjects_from_the_raw_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHAR_CACHE_DIR", str(tmp_path / "cache"))
    archive = build(tmp_path / "data")
    # Every subject of the archive (no --clients), the 8-filter / 32-unit CNN, 180 s deadlines for 15 client processes.
    doc = run_simulation(tmp_path / "run", "--dataset", "realworld", "--data", str(archive), "--rounds", "2", "--lr", "0.05",
                         run_id="rw", clients=None, generalisation_every=None, start_timeout_s=180, round_timeout_s=180)  # fmt: skip
    assert doc["clients"] == 15 and doc["label_set"] == "realworld8"
    assert [r["updates"] for r in doc["rounds"]] == [15, 15]
    g = doc["rounds"][-1]["global"]
    assert math.isfinite(g["macro_f1"]) and 0 <= g["macro_f1"] <= 1
    assert "union of the 15 subjects' test splits" in doc["evaluation_set"]
    # A second client start reuses the cache rather than re-parsing the CSVs.
    assert any((tmp_path / "cache").rglob("*.npz"))
