"""Per-device accuracy and participation in each round's log line and in report.md; report.json unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator.record import RoundRecord
from coordinator.report import device_rows, write_report
from coordinator.round import device_summary, summary_line

ROUNDS = [
    {"round": 0, "selected": 3, "updates": 2, "rejected": 0, "missing": ["c"], "seconds": 2.0,
     "personalisation": {"accuracy": 0.7, "macro_f1": 0.6},
     "personalisation_clients": {"a": {"accuracy": 0.8, "macro_f1": 0.75}, "b": {"accuracy": 0.6, "macro_f1": 0.45}},
     "bytes_up": 1000, "bytes_down": 2000, "failures": {"c": "offline"}},
    {"round": 1, "selected": 3, "updates": 3, "rejected": 0, "missing": [], "seconds": 3.0,
     "personalisation": {"accuracy": 0.8, "macro_f1": 0.7},
     "personalisation_clients": {"a": {"accuracy": 0.75, "macro_f1": 0.7}, "b": {"accuracy": 0.9, "macro_f1": 0.85},
                                 "c": {"accuracy": 0.755, "macro_f1": 0.55}},
     "bytes_up": 1500, "bytes_down": 2000},
]  # fmt: skip


def test_the_log_line_keeps_its_fields_and_ends_with_each_device() -> None:
    r0, r1 = (RoundRecord.from_json(d) for d in ROUNDS)
    assert summary_line(r0) == (
        "round 0: 3 selected, 2 updates, 0 rejected, 0 missed the deadline, 1 went offline, 2.0 s; global acc n/a F1 n/a, "
        "personalisation acc 70.0% F1 60.0%; up 0.0 MB, down 0.0 MB; devices: a 80.0%, b 60.0%, c missed (offline)"
    )
    assert device_summary(r1) == "a 75.0%, b 90.0%, c 75.5%"
    assert summary_line(RoundRecord(round=4)).endswith("down 0.0 MB")  # nobody named: nothing appended


def test_report_md_has_a_device_table_and_report_json_is_as_before(tmp_path: Path) -> None:
    rows = device_rows([RoundRecord.from_json(d) for d in ROUNDS])
    assert [(d["client"], d["took_part"], d["missed"], d["last_round"], d["best_round"]) for d in rows] == [
        ("a", 2, {}, 1, 0), ("b", 2, {}, 1, 1), ("c", 1, {"offline": 1}, 1, 1)]  # fmt: skip
    doc = write_report(tmp_path, {"run_id": "r"}, [RoundRecord.from_json(d) for d in ROUNDS], plot=False)
    md = (tmp_path / "report.md").read_text()
    assert "## Devices" in md
    assert "| a | 2/2 | 0 | 1 | 75.0 | 70.0 | 80.0 (0) |" in md
    assert "| c | 1/2 | 1 offline | 1 | 75.5 | 55.0 | 75.5 (1) |" in md
    # report.json: the per-round objects exactly as the records write them, no key added
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved == json.loads(json.dumps(doc))
    assert list(saved) == ["run_id", "models_evaluated", "rounds", "final", "best"]
    assert saved["rounds"] == [RoundRecord.from_json(d).to_json() for d in ROUNDS]
