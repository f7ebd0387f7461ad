"""The status site's view model on known records and events: the shared model's quality per version, the versions' marks,
the guard's last decision with its evidence, each device's clipped/rejected/quarantine counts, the disk a federation needs,
and every reason /healthz gives; the page, the JSON API and /metrics say the same."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from coordinator.record import RoundRecord
from coordinator.server import model_request
from coordinator.server.audit import AuditEntry, audit
from coordinator.server.harm import DeviceHarm, device_harm, harm_by_device
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.version_marks import operator_versions, version_marks
from coordinator.server.web import ServerView, make_app, render_page
from coordinator.server.web import health as rules
from coordinator.server.web.fold import RoundFold
from coordinator.state import RunState
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.messages import CoordinatorStatus, RoundAnnouncement
from har_models.wire.topics import Topics

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
T = Topics("home")
NOW = 1_800_000_000.0


def _row(r: int, guard: dict | None = None, rejections: list | None = None) -> dict:
    """Round r of a two-device federation: start measure 0.6 + r/100 on 30 + 50 windows, personalisation 0.8 + r/100."""
    row = {"round": r, "selected": 2, "updates": 2, "rejected": sum(x[2] for x in rejections or []), "missing": [], "seconds": 5.0,
           "bytes_up": 100, "bytes_down": 200, "arch_version": 0, "conv_filters": 4, "dense_units": 8,
           "rejections": rejections or [],
           "personalisation": {"accuracy": 0.9, "macro_f1": 0.8 + r / 100},
           "personalisation_clients": {"a": {"accuracy": 0.9, "macro_f1": 0.8, "n": 30}, "b": {"accuracy": 0.9, "macro_f1": 0.8, "n": 50}},
           "start": {"accuracy": 0.7, "macro_f1": 0.6 + r / 100},
           "start_clients": {"a": {"accuracy": 0.7, "macro_f1": 0.6, "n": 30},
                             "b": {"accuracy": 0.7, "macro_f1": 0.6, "n": 50}}}  # fmt: skip
    if guard is not None:
        row["guard"] = guard
    return RoundRecord.from_json(row).to_json()


def _keep(r: int, best: int) -> dict:
    return {"action": "keep", "judged_round": r - 1, "to_round": best, "reason": f"judged {r - 1}"}


ROWS = [_row(0), _row(1, _keep(1, 0), [["b", "bad_shape", 2]]), _row(2, _keep(2, 1)),
        _row(3, {"action": "rollback", "judged_round": 2, "to_round": 1, "reason": "start macro-F1 fell 20 points"},
             [["b", "bad_shape", 1], ["b", "not_selected", 1], ["x", "not_selected", 4]]),
        _row(4, _keep(4, 1))]  # fmt: skip


@pytest.fixture
def view(tmp_path: Path) -> ServerView:
    data = tmp_path / "data"
    reg = Registry(data)
    for name in ("a", "b"):
        reg.enrol(name, None)
    state = RunState(data / "run")
    for row in ROWS:
        state.complete_round(row["round"], SPEC, init_state(SPEC, 0), {}, row)
        path = data / "versions" / f"v{row['round'] + 1:06d}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"m" * 1000)  # each version 1000 bytes
        reg.add_version(row["round"] + 1, row["round"], 0, path, {"personalisation_macro_f1": 0.8 + row["round"] / 100})
    state.event(1, "b", "clipped_update", "update norm 900 is more than 10 x the other updates' median 3")
    state.event(2, "b", "clipped_update", "update norm 800 is more than 10 x the other updates' median 3")
    state.event(3, "b", "quarantined", "clipped in 2 consecutive rounds")
    audit(data, "pin", None, "pin to version 2")
    return ServerView(name="home", run_state=state, registry=reg, wall=lambda: NOW, keep_versions=10)


def test_the_fold_gives_each_version_its_shared_quality_from_the_next_round() -> None:
    fold = RoundFold()
    for row in ROWS:
        fold.add(RoundRecord.from_json(row))
    q = fold.version_quality(2)
    assert q["shared"] is not None and (q["shared"].macro_f1, q["shared"].devices, q["shared"].windows) == (0.6 + 3 / 100, 2, 80)
    assert q["personalisation"] is not None and q["personalisation"].macro_f1 == 0.8 + 2 / 100 and q["global"] is None
    assert fold.version_quality(4)["shared"] is None  # round 5 has not run: the devices have not measured it yet
    assert fold.best_round() == 1 and fold.rolled_back == {2}
    g = fold.guard
    assert g is not None and (g.round, g.note.judged_round, g.devices, g.windows) == (4, 3, 2, 80)


def test_marks_follow_the_guard_the_audit_log_and_a_pending_request() -> None:
    entries = [AuditEntry(1.0, "pin", None, "op", "pin to version 2"),
               AuditEntry(2.0, "rollback", None, "op", "rollback to the best version"),
               AuditEntry(3.0, "rollback", None, "op", "rollback to version 4"),
               AuditEntry(4.0, "enrol", "a", "op", "to version 9")]
    assert operator_versions(entries) == {2: "pin", 4: "rollback"}
    rounds = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 1}  # version 6: round 1 again (a pin's round re-recorded)
    marks = version_marks(list(rounds), rounds, best_round=1, rolled_back={2}, pinned={2: "pin"}, requested=("rollback", 5))
    assert marks == {1: [], 2: ["pinned"], 3: ["rolled back"], 4: [], 5: ["rollback requested"], 6: ["newest", "best"]}
    assert version_marks([1], {1: 0}, None, set(), {}, None) == {1: ["newest"]}


def test_harm_counts_per_device_and_the_newest_quarantine_event_decides() -> None:
    events = [(1, "b", "clipped_update", "x"), (2, "b", "clipped_update", "y"), (2, "a", "round_failed", ""),
              (3, "b", "quarantined", "clipped twice"), (None, "b", "released", "operator"),
              (5, "c", "quarantined", "rejected 3 rounds"), (6, None, "clipped_update", "")]
    got = harm_by_device(events, {"b": {"bad_shape": 3}, "d": {"not_selected": 1}})
    assert got == {"b": DeviceHarm(2, {"bad_shape": 3}, None, None), "c": DeviceHarm(0, {}, "rejected 3 rounds", 5),
                   "d": DeviceHarm(0, {"not_selected": 1})}  # fmt: skip
    assert got["c"].to_json() == {"clipped": 0, "rejected": 0, "rejected_by_reason": {}, "quarantined": True,
                                  "quarantine_reason": "rejected 3 rounds", "quarantine_round": 5, "bad_objects": 0}  # fmt: skip


def test_damaged_objects_devices_report_are_counted_per_device_and_per_object_on_the_page_api_and_metrics(view: ServerView) -> None:
    sha1, sha2 = "1" * 64, "2" * 64
    assert view.run_state is not None
    for cid, sha, what in (("a", sha1, "written again"), ("b", sha1, "written again"), ("a", sha2, "not held by this exchange")):
        view.run_state.event(None, cid, "bad_object", f"{sha} {what}")
    assert view.damaged_objects() == {sha1: 2, sha2: 1}
    c = TestClient(make_app(view))
    devs = {d["name"]: d for d in c.get("/api/devices").json()}
    assert (devs["a"]["bad_objects"], devs["b"]["bad_objects"]) == (2, 1)
    page = c.get("/").text
    assert '<tr class="harm" data-name="a"><td>a</td><td>0</td><td>0</td><td>2</td><td>—</td></tr>' in page
    assert f"stored object {sha1[:12]} reached devices damaged (2 reports)" in page
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(c.get("/metrics").text)
           for s in f.samples}  # fmt: skip
    assert got[("fedhar_device_bad_object_reports_total", (("device", "a"),))] == 2
    assert got[("fedhar_store_object_damaged_reports_total", (("object", sha1),))] == 2
    assert got[("fedhar_store_object_damaged_reports_total", (("object", sha2),))] == 1


def test_the_api_page_and_metrics_show_quality_marks_guard_and_harm(view: ServerView) -> None:
    assert view.run_state is not None and view.data_dir is not None
    c = TestClient(make_app(view))
    versions = {v["version"]: v for v in c.get("/api/versions").json()}
    assert [versions[v]["marks"] for v in (5, 4, 3, 2, 1)] == [["newest"], [], ["rolled back"], ["best", "pinned"], []]
    assert versions[2]["quality"]["shared"] == {"accuracy": 0.7, "macro_f1": 0.6 + 2 / 100, "devices": 2, "windows": 80}
    assert versions[5]["quality"]["shared"] is None and versions[5]["quality"]["personalisation"]["macro_f1"] == 0.8 + 4 / 100
    devs = {d["name"]: d for d in c.get("/api/devices").json()}
    assert (devs["b"]["clipped"], devs["b"]["rejected"], devs["b"]["rejected_by_reason"]) == (2, 4, {"bad_shape": 3, "not_selected": 1})
    b = devs["b"]
    assert (b["quarantined"], b["quarantine_reason"], devs["a"]["quarantined"]) == (True, "clipped in 2 consecutive rounds", False)
    assert "x" not in devs and "x" not in view.harm()  # a sender known only by its rejections is no device
    assert device_harm(view.run_state) == {**view.harm(), "x": DeviceHarm(0, {"not_selected": 4})}  # `devices` counts the same
    page = c.get("/").text
    assert '<tr class="device" data-name="b" data-online="false" data-quarantined="true">' in page
    assert '<span class="fault quarantine">quarantined: clipped in 2 consecutive rounds</span>' in page
    assert '<td class="harm">2/4</td>' in page and '<span id="quarantined-count" class="rate-warn">1</span> quarantined' in page
    assert ('judged the version of round <span id="guard-judged">3</span> and kept it; best: round 1 (judged 3); resting on '
            '<span id="guard-devices">2</span> devices and <span id="guard-windows">80</span> test windows') in page
    assert '<tr class="version" data-version="3" data-marks="rolled back">' in page
    assert '<td class="shared">62.0% <span class="muted">(2 devices, 80 windows)</span></td>' in page
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(c.get("/metrics").text)
           for s in f.samples}  # fmt: skip
    assert got[("fedhar_device_updates_clipped_total", (("device", "b"),))] == 2
    assert got[("fedhar_device_messages_rejected_total", (("device", "b"),))] == 4
    assert got[("fedhar_device_quarantined", (("device", "b"),))] == 1
    assert got[("fedhar_build_info", (("version", view.release),))] == 1 and view.release != ""
    assert got[("fedhar_last_macro_f1", (("measure", "start"),))] == 0.6 + 4 / 100
    assert ("fedhar_device_messages_rejected_total", (("device", "x"),)) not in got
    model_request.write_request(view.data_dir, "pin", 1)
    assert {v["version"]: v["marks"] for v in view.versions()}[1] == ["pin requested"]
    view.registry.forget("b")  # type: ignore[union-attr]
    assert "b" not in view.harm() and 'device="b"' not in c.get("/metrics").text  # a forgotten name is named nowhere


def test_the_disk_budget_has_known_figures_and_says_when_it_runs_short(view: ServerView, monkeypatch: pytest.MonkeyPatch) -> None:
    d = view.disk()
    assert d is not None and (d.model, d.kept, d.kept_bytes, d.keep, d.updates) == (1000, 5, 5000, 10, 2)
    assert d.round_folder > 0 and d.per_round == d.round_folder + 2 * 1000 + 1000
    assert d.need == 10 * 1000 + d.per_round and d.need_until_full == 5 * 1000 + d.per_round
    usage = shutil.disk_usage(view.data_dir or ".")
    for free, problem, warning in ((d.need_until_full, False, False), (d.need_until_full - 1, False, True), (d.per_round - 1, True, False)):
        monkeypatch.setattr(rules.shutil, "disk_usage", lambda p, f=free: usage._replace(free=f))
        health, warnings = view.health(), view.warnings()
        assert (any(h.startswith("disk full: ") for h in health), bool(warnings)) == (problem, warning), free
    need = rules.size(d.per_round)
    assert health == [f"disk full: {view.data_dir}: {rules.size(d.per_round - 1)} free of the {need} the next round needs"]
    r = TestClient(make_app(view)).get("/healthz")
    assert r.status_code == 503 and r.json()["reasons"] == health
    assert "the federation needs about" in render_page(view)
    # before the first version the model's size is unknown: a floor for the databases and the first round's files
    first = rules.DiskBudget(Path("/srv/fedhar"), 1_000_000, 0, 50, 0, 0, 0, 0)
    assert not first.known and first.warning() is None
    assert first.problem() == "disk full: /srv/fedhar: 1.0 MB free of the 64.0 MB the next round needs"
    assert rules.DiskBudget(Path("/srv/fedhar"), rules.MIN_FREE_BYTES, 0, 50, 0, 0, 0, 0).problem() is None


def test_a_round_open_twice_its_deadline_is_stuck() -> None:
    assert rules.stuck_round(7, NOW, NOW + 300, NOW + 600) is None
    assert rules.stuck_round(7, NOW, NOW + 300, NOW + 601) == (
        "round 7 has been open for 10 min, more than 2 times its deadline (5 min): the coordinator does not close its rounds")
    assert rules.stuck_round(7, None, NOW + 300, NOW + 9999) is None and rules.stuck_round(7, NOW, 0.0, NOW + 9999) is None
    wall = [NOW]
    mon = Monitor(T, clock=lambda: 100.0, wall=lambda: wall[0])
    mon.handle(T.coordinator_status, CoordinatorStatus("online", "run-1", "a1", NOW, 30.0).to_bytes(), True)
    mon.handle(T.round, RoundAnnouncement("run-1", 7, "training", {}, "hapt6", selected=("a",), deadline_unix=NOW + 300).to_bytes(), True)
    view = ServerView(monitor=mon, wall=lambda: wall[0])
    wall[0] = NOW + 400
    mon.handle(T.round, RoundAnnouncement("run-1", 7, "training", {}, "hapt6", selected=("a",), deadline_unix=NOW + 300).to_bytes(), True)
    assert view.health() == []  # the same attempt again (a reconnect): open since its first arrival
    wall[0] = NOW + 601
    assert view.health() == ["round 7 has been open for 10 min, more than 2 times its deadline (5 min): the coordinator does not close "
                             "its rounds"]  # fmt: skip


def test_unreadable_broker_files_and_databases_are_reasons_with_their_fix(view: ServerView, tmp_path: Path) -> None:
    assert rules.unreadable(Path("/etc/fedhar/broker/fedhar-broker.json"), "Permission denied", ("fedhar", "fedhar")) == (
        "/etc/fedhar/broker/fedhar-broker.json cannot be read by the server (user fedhar): Permission denied; let its group read it: "
        "sudo chgrp fedhar /etc/fedhar/broker/fedhar-broker.json && sudo chmod g+r /etc/fedhar/broker/fedhar-broker.json "
        "(and o+x on the folders above it)")  # fmt: skip
    broker = tmp_path / "broker"
    (broker / "fedhar-broker.json").mkdir(parents=True)  # a manifest that cannot be read as a file (as root, modes do not stop reads)
    view.broker_dir = broker
    reasons = view.health()
    assert len(reasons) == 1 and reasons[0].startswith(f"{broker / 'fedhar-broker.json'} cannot be read by the server (user ")
    assert "sudo chgrp " in reasons[0] and view.certificates() == []
    view.broker_dir = None
    assert view.run_state is not None
    view.run_state.path.write_bytes(b"not a database" * 200)
    reasons = view.health()
    assert len(reasons) == 1 and reasons[0].startswith("a database cannot be read: ") and str(view.run_state.path) in reasons[0]
