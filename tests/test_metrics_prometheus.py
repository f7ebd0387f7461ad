"""/metrics: the scraped counters equal the round records' sums (parsed with prometheus_client's own parser),
in a registry of its own; and the endpoint over real HTTP."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from coordinator.record import RoundRecord
from coordinator.server.metrics import make_registry, scrape
from coordinator.server.web import ServerView, WebServer, make_app, render_page
from coordinator.state import RunState
from har_models.nn.model import ArchSpec, init_state

ROWS = [
    {"round": 0, "selected": 3, "updates": 3, "rejected": 0, "missing": [], "seconds": 12.5, "bytes_up": 3000, "bytes_down": 6000,
     "global": {"accuracy": 0.5, "macro_f1": 0.4}, "personalisation": {"accuracy": 0.6, "macro_f1": 0.55}},
    {"round": 1, "selected": 3, "updates": 2, "rejected": 3, "missing": ["c"], "seconds": 20.0, "bytes_up": 2500,
     "bytes_down": 6000, "failures": {"c": "bad_shape"}, "rejections": [["c", "bad_shape", 2], ["d", "not_selected", 1]],
     "bytes_up_by_encoding": {"float32": 2000, "int8_delta": 500}, "personalisation": {"accuracy": 0.7, "macro_f1": 0.65},
     "attempts": 3},
    {"round": 2, "selected": 3, "updates": 3, "rejected": 1, "missing": [], "seconds": 7.5, "bytes_up": 900, "bytes_down": 6000,
     "rejections": [["d", "not_selected", 1]], "bytes_up_by_encoding": {"int8_delta": 900},
     "global": {"accuracy": 0.8, "macro_f1": float("nan")},
     "guard": {"action": "rollback", "judged_round": 1, "to_round": 0, "reason": "start macro-F1 fell"}},
]  # fmt: skip
RECORDS = [RoundRecord.from_json(r) for r in ROWS]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _check_against_records(got: dict) -> None:
    assert got[("fedhar_rounds_completed_total", ())] == 3
    assert got[("fedhar_updates_accepted_total", ())] == 3 + 2 + 3
    assert got[("fedhar_updates_rejected_total", (("reason", "bad_shape"),))] == 2
    assert got[("fedhar_updates_rejected_total", (("reason", "not_selected"),))] == 2
    assert ("fedhar_updates_rejected_total", (("reason", "unspecified"),)) not in got  # every rejection has its reason
    assert got[("fedhar_bytes_in_total", (("encoding", "float32"),))] == 3000 + 2000
    assert got[("fedhar_bytes_in_total", (("encoding", "int8_delta"),))] == 500 + 900
    assert got[("fedhar_bytes_out_total", (("encoding", "float32"),))] == 3 * 6000
    assert got[("fedhar_round_duration_seconds_count", ())] == 3
    assert got[("fedhar_round_duration_seconds_sum", ())] == 12.5 + 20.0 + 7.5
    assert got[("fedhar_last_round_duration_seconds", ())] == 7.5
    assert got[("fedhar_last_round", ())] == 2
    # round 1 took 3 exchanges (2 closed without quorum), the others 1; round 2's guard rolled back
    assert got[("fedhar_round_attempts_count", ())] == 3 and got[("fedhar_round_attempts_sum", ())] == 1 + 3 + 1
    assert got[("fedhar_rounds_without_quorum_total", ())] == 2
    assert got[("fedhar_rollbacks_total", ())] == 1
    # global macro-F1 of round 2 is NaN (an empty test set): the last measured one is round 0's
    assert got[("fedhar_last_macro_f1", (("measure", "global"),))] == 0.4
    assert got[("fedhar_last_accuracy", (("measure", "global"),))] == 0.8
    assert got[("fedhar_last_macro_f1", (("measure", "personalisation"),))] == 0.65


def test_scraped_counters_equal_the_records_sums() -> None:
    devices = {"enrolled": 3, "online": 2, "revoked": 1}
    reg = make_registry(lambda: RECORDS, lambda: devices, lambda: {"status": 4})
    got = _samples(scrape(reg).decode())
    _check_against_records(got)
    assert got[("fedhar_devices", (("state", "enrolled"),))] == 3
    assert got[("fedhar_devices", (("state", "online"),))] == 2
    assert got[("fedhar_devices", (("state", "revoked"),))] == 1
    assert got[("fedhar_devices", (("state", "forgotten"),))] == 0
    assert got[("fedhar_monitor_malformed_messages_total", (("kind", "status"),))] == 4
    # a registry of its own: nothing of fedhar in the process-wide one
    assert not any(name.startswith("fedhar_") for name in REGISTRY._names_to_collectors)


def test_a_record_without_reasons_counts_its_rejections_as_unspecified() -> None:
    rec = RoundRecord.from_json({"round": 0, "selected": 1, "updates": 1, "rejected": 5, "missing": [], "seconds": 1.0})
    got = _samples(scrape(make_registry(lambda: [rec])).decode())
    assert got[("fedhar_updates_rejected_total", (("reason", "unspecified"),))] == 5
    empty = _samples(scrape(make_registry(list)).decode())
    assert empty[("fedhar_rounds_completed_total", ())] == 0 and empty[("fedhar_last_round", ())] == -1


def test_metrics_over_http_follow_the_run_database(tmp_path: Path) -> None:
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    state = RunState(tmp_path / "run")
    for rec in RECORDS[:2]:
        state.complete_round(rec.round, spec, init_state(spec, 1), {}, rec.to_json())
    server = WebServer(make_app(ServerView(run_state=state)), port=0)
    port = server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
            got = _samples(resp.read().decode())
        assert got[("fedhar_rounds_completed_total", ())] == 2
        state.complete_round(2, spec, init_state(spec, 1), {}, RECORDS[2].to_json())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            _check_against_records(_samples(resp.read().decode()))  # the new round is there at the next scrape
    finally:
        server.stop()
        state.close()


def test_the_page_shows_attempts_rounds_without_quorum_and_the_last_rollback(tmp_path: Path) -> None:
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    state = RunState(tmp_path / "run")
    try:
        for rec in RECORDS:
            state.complete_round(rec.round, spec, init_state(spec, 1), {}, rec.to_json())
        page = render_page(ServerView(run_state=state))
    finally:
        state.close()
    # 5 exchanges over 3 rounds
    assert '<span id="attempts-per-round">1.67</span>' in page
    assert '<span id="rounds-without-quorum">2</span>' in page and '<span id="rollbacks">1</span>' in page
    assert 'last: round 2 went back to the version of round <span id="rollback-to">0</span>: start macro-F1 fell' in page


def test_exchanges_without_quorum_count_as_they_close_not_when_their_round_completes(tmp_path: Path) -> None:
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    state = RunState(tmp_path / "run")
    try:
        state.complete_round(0, spec, init_state(spec, 1), {}, RECORDS[0].to_json())
        view = ServerView(run_state=state)
        reg = make_registry(view.totals)
        assert _samples(scrape(reg).decode())[("fedhar_rounds_without_quorum_total", ())] == 0
        # Round 1 fails twice (the runner writes a round_failed event as each exchange closes) and has not completed.
        state.event(1, None, "round_failed", "1 update(s) with training windows, below the quorum of 2")
        state.event(1, None, "round_failed", "no update arrived (2 offline)")
        got = _samples(scrape(reg).decode())
        assert got[("fedhar_rounds_without_quorum_total", ())] == 2 and got[("fedhar_rounds_completed_total", ())] == 1
        assert '<span id="rounds-without-quorum">2</span>' in render_page(view)
        # Its third exchange completes it (attempts 3): the two are not counted again.
        state.complete_round(1, spec, init_state(spec, 1), {}, RECORDS[1].to_json())
        got = _samples(scrape(reg).decode())
        assert got[("fedhar_rounds_without_quorum_total", ())] == 2 and got[("fedhar_round_attempts_sum", ())] == 1 + 3
    finally:
        state.close()
