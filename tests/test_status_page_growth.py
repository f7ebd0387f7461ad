"""The status page over months: charts keep a bounded size however many rounds there are, the page and
/metrics read only what is new in the run's database, with figures equal to a fold over every record, and a
stopped broker or a stalled federation is said in words on the page, in /healthz and in /metrics."""

from __future__ import annotations

import math
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from coordinator.record import RoundRecord
from coordinator.server import charts
from coordinator.server.metrics import RoundTotals
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.web import ServerView, make_app
from coordinator.state import RunState
from har_io.broker_config import BrokerConfig
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.topics import Topics
from simulation.broker import LocalMosquitto, find_mosquitto

NS = {"s": "http://www.w3.org/2000/svg"}
SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def test_downsample_buckets_have_known_means_and_extremes() -> None:
    pts: list[tuple[float, float | None]] = [(0, 1.0), (1, 3.0), (2, None), (3, 8.0), (4, math.nan), (5, 2.0), (6, None)]
    got = charts.downsample(pts, max_points=3)  # ceil(7 / 3) = 3 points a bucket
    assert [(b.x, b.y, b.lo, b.hi, b.n) for b in got] == [
        (1.0, 2.0, 1.0, 3.0, 3),  # rounds 0-2: mean of 1 and 3, the gap left out
        (4.0, 5.0, 2.0, 8.0, 3),  # rounds 3-5
        (6.0, None, None, None, 1),  # round 6: a gap only
    ]
    assert [(b.y, b.n) for b in charts.downsample(pts[:2], max_points=5)] == [(1.0, 1), (3.0, 1)]
    with pytest.raises(ValueError, match="at least 1"):
        charts.downsample(pts, max_points=0)


def test_a_long_series_is_drawn_in_a_bounded_number_of_buckets_with_its_extremes() -> None:
    n = 100_000
    pts = [(float(i), 0.5 + 0.4 * math.sin(i / 500)) for i in range(n)]
    pts[73_210] = (73_210.0, 0.01)  # one collapsed round must stay visible
    svg = charts.line_chart([charts.Series("personalisation", pts)], title="F1", x_label="round", y_label="F1",
                            y_range=(0, 1), max_points=200)  # fmt: skip
    root = ET.fromstring(svg)
    circles = root.findall(".//s:circle", NS)
    assert len(circles) == 200 and len(svg) < 60_000
    size = math.ceil(n / 200)
    lows = [float(c.get("data-lo") or "nan") for c in circles]
    assert min(lows) == 0.01 and lows.index(0.01) == 73_210 // size
    assert [int(c.get("data-n") or 0) for c in circles] == [size] * 200
    first = [y for _, y in pts[:size]]
    assert float(circles[0].get("data-y") or "nan") == pytest.approx(sum(first) / size, rel=1e-12)
    assert len(root.findall(".//s:polygon[@class='band']", NS)) == 1
    note = root.find(".//s:text[@class='note']", NS)
    assert note is not None and f"mean of up to {size} rounds" in (note.text or "")


def test_the_legend_names_only_series_that_have_data() -> None:
    never = charts.Series("global", [(0, None), (1, None)])  # a deployment has no global test set
    svg = charts.line_chart([never, charts.Series("personalisation", [(0, 0.5), (1, 0.6)])], title="F1", x_label="round",
                            y_label="F1")  # fmt: skip
    assert [t.text for t in ET.fromstring(svg).iterfind(".//s:g[@class='legend']/s:text", NS)] == []  # one line: no legend
    both = charts.line_chart([never, charts.Series("p", [(0, 0.5)]), charts.Series("q", [(0, 0.7)])], title="F1",
                             x_label="round", y_label="F1")  # fmt: skip
    assert [t.text for t in ET.fromstring(both).iterfind(".//s:g[@class='legend']/s:text", NS)] == ["p", "q"]


def _row(r: int, *, rejected: int = 0, seconds: float | None = None) -> dict:
    return {"round": r, "selected": 2, "updates": 2, "rejected": rejected, "missing": [], "seconds": seconds or 10.0 + r % 7,
            "bytes_up": 1000 + r, "bytes_down": 4000, "arch_version": r // 50, "conv_filters": 4, "dense_units": 8,
            "rejections": [["x", "bad_shape", rejected]] if rejected else [],
            "personalisation": {"accuracy": 0.5 + (r % 10) / 100, "macro_f1": 0.4 + (r % 10) / 100},
            "personalisation_clients": {"a": {"accuracy": 0.5, "macro_f1": 0.4},
                                        "b": {"accuracy": 0.6 + r / 1e4, "macro_f1": 0.5}}}  # fmt: skip


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_view_reads_only_new_rounds_and_its_totals_equal_a_fold_over_all(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    state = RunState(tmp_path / "run")
    view = ServerView(run_state=state)
    reads: list[int] = []
    real = state.rounds

    def counting(after: int = -1, limit: int | None = None) -> list[dict]:
        rows = real(after=after, limit=limit)
        reads.append(len(rows))
        return rows

    monkeypatch.setattr(state, "rounds", counting)
    g = init_state(SPEC, 0)
    for r in range(120):
        state.complete_round(r, SPEC, g, {}, RoundRecord.from_json(_row(r, rejected=r % 3)).to_json())
        if r % 40 == 39:
            view.totals()
    assert reads == [40, 40, 40]  # each read took only the rounds added since the last
    view.totals()
    view.charts()
    assert reads == [40, 40, 40]  # nothing new, nothing read
    recs = [RoundRecord.from_json(_row(r, rejected=r % 3)) for r in range(120)]
    assert view.totals() == RoundTotals.of(recs)
    got = _samples(TestClient(make_app(view)).get("/metrics").text)
    assert got[("fedhar_rounds_completed_total", ())] == 120
    assert got[("fedhar_updates_rejected_total", (("reason", "bad_shape"),))] == sum(r % 3 for r in range(120))
    assert got[("fedhar_bytes_in_total", (("encoding", "float32"),))] == sum(1000 + r for r in range(120))
    assert got[("fedhar_last_round_duration_seconds", ())] == 10.0 + 119 % 7
    # A round recorded again (a restart that forgot it) is a rewrite: everything is read once more.
    state.complete_round(60, SPEC, g, {}, RoundRecord.from_json(_row(60, seconds=99.0)).to_json())
    assert view.totals().rounds == 120 and reads[-1] == 120
    assert [r.seconds for r in view.records()][60] == 99.0
    assert [r.round for r in view.records(since=100, limit=5)] == [100, 101, 102, 103, 104]
    assert view.totals().seconds == pytest.approx(sum(10.0 + r % 7 for r in range(120) if r != 60) + 99.0)
    state.close()


@pytest.mark.slow
def test_the_page_stays_small_and_says_what_a_person_reads(tmp_path: Path) -> None:
    state = RunState(tmp_path / "run")
    reg = Registry(tmp_path / "data")
    reg.enrol("a", "Anna")
    g = init_state(SPEC, 0)
    for r in range(600):
        state.complete_round(r, SPEC, g, {}, RoundRecord.from_json(_row(r)).to_json())
    for v in range(1, 81):
        reg.add_version(v, v - 1, 0, tmp_path / f"data/versions/v{v:06d}.safetensors", {"personalization_macro_f1": 0.5})
    reg.note_participation(7, "a", 0.9, 0.8)
    reg.note_participation(3, "a", 0.1, 0.1)
    view = ServerView(run_state=state, registry=reg)
    c = TestClient(make_app(view))
    page = c.get("/").text
    assert '<span id="rounds-completed">600</span> rounds completed' in page
    assert "personalization_" not in page and c.get("/api/versions").json()[0]["figures"] == {"personalisation_macro_f1": 0.5}
    assert page.count('<tr class="version"') == 50  # the 50 newest versions, newest first
    assert '<tr class="version" data-version="80"' in page and 'data-version="30"' not in page
    dev = {d["name"]: d for d in view.devices()}["a"]
    assert (dev["rounds"], dev["last_round"], dev["last_accuracy"]) == (2, 7, 0.9)
    assert dev["arch_version"] == 7 // 50
    b = {d["name"]: d for d in view.devices()}["b"]  # not enrolled: its rounds come from the records
    assert (b["rounds"], b["last_round"], b["arch_version"]) == (600, 599, 599 // 50)
    small = TestClient(make_app(ServerView(run_state=RunState(tmp_path / "one")))).get("/").text
    assert '<span id="rounds-completed">0</span> rounds completed' in small
    state.close()


def test_a_stopped_broker_and_a_stalled_federation_are_unhealthy_in_words(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    state = RunState(tmp_path / "run")
    state.complete_round(0, SPEC, init_state(SPEC, 0), {}, RoundRecord.from_json(_row(0)).to_json())
    done = state.completed_unix(0)
    assert done is not None
    clock = [done + 30.0]
    with LocalMosquitto(log_file=tmp_path / "mosquitto.log", start_timeout_s=10) as broker:
        mon = Monitor(Topics("home"), BrokerConfig(port=broker.port))
        assert mon.start(10.0)
        view = ServerView(run_state=state, monitor=mon, next_start=lambda: clock[0], wall=lambda: clock[0], stall_after_s=600.0)
        c = TestClient(make_app(view))
        try:
            assert c.get("/healthz").status_code == 200
            got = _samples(c.get("/metrics").text)
            assert got[("fedhar_broker_link_up", ())] == 1 and got[("fedhar_seconds_since_last_round", ())] == 30.0
            assert '<span id="broker-link" class="online">up</span>' in c.get("/").text
            broker.stop()
            for _ in range(200):  # the link notices within paho's keepalive; bounded at 20 s
                if view.broker_link() is False:
                    break
                time.sleep(0.1)
            r = c.get("/healthz")
            assert r.status_code == 503 and r.json()["reasons"] == [
                "the broker cannot be reached: presence, the open round and the coordinator's state are unknown; "
                "what the page shows is the last known"]
            page = c.get("/").text
            assert '<span id="broker-link" class="offline">down</span>' in page
            assert "coordinator <span id=\"coordinator-state\" class=\"muted\">unknown (the broker cannot be reached)</span>" in page
            assert _samples(c.get("/metrics").text)[("fedhar_broker_link_up", ())] == 0
        finally:
            mon.stop()
    # Without a monitor link, a stall is the only reason: 11 min since round 0 while devices are eligible.
    clock[0] = done + 660.0
    stalled = ServerView(run_state=state, next_start=lambda: clock[0], wall=lambda: clock[0], stall_after_s=600.0)
    r = TestClient(make_app(stalled)).get("/healthz")
    assert r.status_code == 503 and r.json()["reasons"] == [
        "no round completed for 11 min (more than 10 min) while enough devices are eligible"]
    waiting = ServerView(run_state=state, next_start=lambda: None, wall=lambda: clock[0], stall_after_s=600.0)
    assert TestClient(make_app(waiting)).get("/healthz").status_code == 200  # too few devices: waiting, not stalled
    state.close()
