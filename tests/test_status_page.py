"""The status page and its JSON API over a real registry, run database and monitor: routes, what each device
shows, the open round's progress, the bind rule and the token, and bad requests answered without a traceback."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from coordinator.record import RoundRecord
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.web import BindRefused, ServerView, WebServer, check_bind, make_app, start_status_page
from coordinator.state import RunState, StateDamaged
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.messages import ClientStatus, CoordinatorStatus, Receipt, RoundAnnouncement, RoundProgress
from har_models.wire.topics import Topics

T = Topics("home")
SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
NOW = 1_800_000_000.0
TOKEN = "0123456789abcdef0123"


def _rows() -> list[dict]:
    return [
        {"round": 0, "selected": 3, "updates": 2, "rejected": 0, "missing": ["pi-ben"], "failures": {"pi-ben": "offline"},
         "arch_version": 0, "conv_filters": 4, "dense_units": 8, "bytes_up": 1_000_000, "bytes_down": 2_000_000, "seconds": 30.0,
         "personalisation": {"accuracy": 0.6, "macro_f1": 0.5},
         "personalisation_clients": {"phone-anna": {"accuracy": 0.7, "macro_f1": 0.6}, "phone-carl": {"accuracy": 0.5, "macro_f1": 0.4}}},
        {"round": 1, "selected": 3, "updates": 3, "rejected": 0, "missing": [], "arch_version": 1, "conv_filters": 6,
         "dense_units": 8, "bytes_up": 1_500_000, "bytes_down": 2_000_000, "seconds": 40.0,
         "personalisation": {"accuracy": 0.7, "macro_f1": 0.6},
         "personalisation_clients": {"phone-anna": {"accuracy": 0.8, "macro_f1": 0.7}, "phone-carl": {"accuracy": 0.6, "macro_f1": 0.5},
                                     "pi-ben": {"accuracy": 0.65, "macro_f1": 0.55}},
         "feddwa_weights": {"clients": ["phone-anna", "phone-carl", "pi-ben"], "p": [[0.6, 0.2, 0.2], [0.3, 0.5, 0.2], [0.1, 0.1, 0.8]]}},
    ]  # fmt: skip


@pytest.fixture
def view(tmp_path: Path) -> ServerView:
    reg = Registry(tmp_path / "data")
    reg.enrol("phone-anna", "Anna")
    reg.enrol("pi-ben", "Ben")
    reg.enrol("phone-carl", None)
    reg.enrol("old-tab", "Dora")
    reg.revoke("old-tab")
    reg.note_participation(0, "phone-anna", 0.7, 0.6)
    reg.note_participation(1, "phone-anna", 0.8, 0.7)
    reg.add_version(1, 0, 0, tmp_path / "data/versions/v000001.safetensors", {"personalisation_accuracy": 0.6})
    reg.add_version(2, 1, 1, tmp_path / "data/versions/v000002.safetensors", {"personalisation_accuracy": 0.7})
    state = RunState(tmp_path / "data/run")
    for row in _rows():
        state.complete_round(row["round"], SPEC, init_state(SPEC, 0), {}, RoundRecord.from_json(row).to_json())
    clock = [100.0]
    mon = Monitor(T, clock=lambda: clock[0], wall=lambda: NOW)
    mon.handle(T.coordinator_status, CoordinatorStatus("online", "run-1", "a1", NOW, 30.0).to_bytes(), True)
    mon.handle(T.client_status("phone-anna"), ClientStatus("phone-anna", "idle", n_train=300, n_test=80, run_id="run-1",
               last_round=1, sent_unix=NOW - 5, refresh_s=30.0, sensing="live", charging=True).to_bytes(), True)  # fmt: skip
    mon.handle(T.client_status("pi-ben"), ClientStatus("pi-ben", "offline").to_bytes(), True)
    mon.handle(T.client_status("phone-carl"), ClientStatus("phone-carl", "training", run_id="run-1", last_round=1, sent_unix=NOW,
               refresh_s=30.0, sensing="paused").to_bytes(), False)  # fmt: skip
    mon.handle(T.client_status("old-tab"), ClientStatus("old-tab", "online", sent_unix=NOW, refresh_s=30.0).to_bytes(), False)
    ann = RoundAnnouncement("run-1", 2, "training", {}, "hapt6", selected=("phone-anna", "phone-carl", "pi-ben"), deadline_unix=NOW + 600)
    mon.handle(T.round, ann.to_bytes(), True)
    mon.handle(T.client_receipt("phone-anna"), Receipt("run-1", 2, 0, "0" * 64, "accepted").to_bytes())
    mon.handle(T.progress, RoundProgress("run-1", 1, 100, _rows()[1]).to_bytes(), True)
    return ServerView(name="home <test>", run_state=state, registry=reg, monitor=mon, next_start=lambda: NOW + 3600, wall=lambda: NOW)


def test_devices_merge_the_registry_the_records_and_presence(view: ServerView) -> None:
    c = TestClient(make_app(view))
    devs = {d["name"]: d for d in c.get("/api/devices").json()}
    assert sorted(devs) == ["old-tab", "phone-anna", "phone-carl", "pi-ben"]
    anna, ben, carl, tab = devs["phone-anna"], devs["pi-ben"], devs["phone-carl"], devs["old-tab"]
    assert (anna["owner"], anna["state"], anna["online"], anna["status"]) == ("Anna", "enrolled", True, "idle")
    assert anna["last_seen_unix"] == NOW - 5 and anna["n_train"] == 300
    # the registry's participation wins for a device it has rows for; the records give the others'
    assert (anna["rounds"], anna["last_round"], anna["last_accuracy"], anna["arch_version"]) == (2, 1, 0.8, 1)
    assert (carl["rounds"], carl["last_accuracy"], carl["online"]) == (2, 0.6, True)
    assert (ben["rounds"], ben["last_accuracy"], ben["online"], ben["status"]) == (1, 0.65, False, "offline")
    assert anna["sensing"] == {"state": "live", "target_hz": 50.0, "rate_hz": None, "acc_hz": None, "gyro_hz": None, "rate_ok": None,
                               "newest_window_age_s": None, "window_stream_stopped": None, "gaps": None, "late": None,
                               "charging": True}  # fmt: skip
    assert carl["sensing"]["state"] == "paused" and carl["sensing"]["charging"] is None
    assert (tab["state"], tab["online"]) == ("revoked", False)  # its status says online: a revoked device never is
    assert anna["refresh_s"] == 30.0 and ben["refresh_s"] is None
    assert anna["last_contribution_unix"] is not None and carl["last_contribution_unix"] is None  # the registry's rows only


def test_a_device_that_cannot_take_part_says_why_in_the_json_and_on_the_page(view: ServerView) -> None:
    assert view.monitor is not None
    fault = "state folder /var/lib/fedhar/phone-carl cannot be written (the local model: Read-only file system)"
    view.monitor.handle(T.client_status("phone-carl"), ClientStatus("phone-carl", "idle", n_train=30, sent_unix=NOW, refresh_s=30.0,
                                                                    fault=fault).to_bytes(), False)  # fmt: skip
    c = TestClient(make_app(view))
    devs = {d["name"]: d for d in c.get("/api/devices").json()}
    assert devs["phone-carl"]["fault"] == fault and devs["phone-anna"]["fault"] is None
    assert f'<span class="fault">cannot take part: {fault}</span>' in c.get("/").text


def test_presence_expires_by_the_coordinators_rule(view: ServerView) -> None:
    assert view.monitor is not None
    view.monitor._clock = lambda: 100.0 + 3 * 30.0 + 1  # three refresh periods later, nothing new arrived
    devs = {d["name"]: d for d in view.devices()}
    assert not devs["phone-carl"]["online"]  # a live status aged from its arrival
    assert not devs["phone-anna"]["online"]  # a retained one aged from the time it carries (5 s old at arrival)
    assert view.device_counts() == {"enrolled": 3, "online": 0, "revoked": 1, "forgotten": 0}


def test_the_open_round_and_its_progress(view: ServerView) -> None:
    cur = TestClient(make_app(view)).get("/api/round").json()
    assert cur["state"] == "training" and cur["round"] == 2 and cur["run_id"] == "run-1"
    assert cur["selected"] == ["phone-anna", "phone-carl", "pi-ben"]
    # anna has an accepted receipt for round 2; carl's status says its last update was round 1
    assert cur["answered"] == ["phone-anna"] and cur["missing"] == ["phone-carl", "pi-ben"]
    assert cur["deadline_unix"] == NOW + 600 and cur["deadline_in_s"] == 600
    assert cur["last_completed"] == 1 and cur["rounds_planned"] == 100 and cur["next_start_unix"] == NOW + 3600
    assert cur["coordinator"] == {"online": True, "state": "online", "run_id": "run-1"}


def test_answered_counts_only_this_attempts_updates_and_a_round_closed_without_quorum_shows_closed(view: ServerView) -> None:
    mon = view.monitor
    assert mon is not None
    c = TestClient(make_app(view))

    def ann(attempt: str) -> bytes:
        return RoundAnnouncement("run-1", 2, "training", {}, "hapt6", selected=("phone-anna", "phone-carl"), deadline_unix=NOW + 600,
                                 attempt=attempt, epoch=3).to_bytes()  # fmt: skip

    # A new attempt of round 2: anna's receipt came under the earlier announcement, so it is no answer to this one.
    mon.handle(T.round, ann("a1"))
    cur = c.get("/api/round").json()
    assert (cur["state"], cur["round"], cur["answered"], cur["missing"]) == ("training", 2, [], ["phone-anna", "phone-carl"])
    mon.handle(T.client_receipt("phone-carl"), Receipt("run-1", 2, 0, "c" * 64, "accepted").to_bytes())
    mon.handle(T.client_receipt("phone-anna"), Receipt("run-1", 1, 0, "d" * 64, "accepted").to_bytes())  # another round's
    mon.handle(T.client_receipt("phone-anna"), Receipt("run-1", 2, 1, "e" * 64, "accepted").to_bytes())  # another stage's
    assert c.get("/api/round").json()["answered"] == ["phone-carl"]
    # The attempt closes without quorum: its announcement is cleared, and the page shows no open round at once.
    mon.handle(T.round, b"")
    cur = c.get("/api/round").json()
    assert (cur["state"], cur["round"], cur["answered"], cur["missing"]) == ("idle", None, [], [])
    assert "no round open (idle)" in c.get("/").text
    # The re-run: nothing is answered until the coordinator counts an update in it, whatever the statuses say.
    mon.handle(T.client_status("phone-carl"), ClientStatus("phone-carl", "idle", n_train=30, run_id="run-1", last_round=2,
                                                           sent_unix=NOW, refresh_s=30.0).to_bytes())  # fmt: skip
    mon.handle(T.round, ann("a2"))
    cur = c.get("/api/round").json()
    assert (cur["answered"], cur["missing"]) == ([], ["phone-anna", "phone-carl"])
    assert "2 selected, 0 answered, 2 missing (phone-anna, phone-carl)" in c.get("/").text
    mon.handle(T.client_receipt("phone-carl"), Receipt("run-1", 2, 0, "c" * 64, "accepted").to_bytes())  # its stored update, counted
    cur = c.get("/api/round").json()
    assert (cur["answered"], cur["missing"]) == (["phone-carl"], ["phone-anna"])
    # The broker delivers the retained announcement again after a reconnect: the same attempt, its answers stand.
    mon.handle(T.round, ann("a2"), True)
    assert c.get("/api/round").json()["answered"] == ["phone-carl"]


def test_rounds_and_versions(view: ServerView) -> None:
    c = TestClient(make_app(view))
    rounds = c.get("/api/rounds").json()
    assert [r["round"] for r in rounds] == [0, 1] and rounds[1] == RoundRecord.from_json(_rows()[1]).to_json()
    assert [r["round"] for r in c.get("/api/rounds?since=1").json()] == [1]
    assert [r["round"] for r in c.get("/api/rounds?limit=1").json()] == [0]
    versions = c.get("/api/versions").json()
    assert [(v["version"], v["round"], v["arch_version"]) for v in versions] == [(2, 1, 1), (1, 0, 0)]
    assert versions[0]["figures"] == {"personalisation_accuracy": 0.7}
    assert c.get("/healthz").json() == {"status": "ok", "name": "home <test>"}


def test_the_page_shows_devices_round_charts_and_versions(view: ServerView) -> None:
    r = TestClient(make_app(view)).get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "<title>home &lt;test&gt; · fedhar</title>" in page and '<meta http-equiv="refresh" content="10">' in page
    assert '<span id="device-count">4</span>' in page and '<span id="online-count">2</span>' in page
    assert '<span id="round-index">2</span> is open' in page and "3 selected, 1 answered, 2 missing (phone-carl, pi-ben)" in page
    assert 'data-name="phone-anna" data-online="true"' in page and 'data-name="pi-ben" data-online="false"' in page
    assert "live, health not reported, charging" in page and '<td class="presence revoked">revoked</td>' in page
    assert "<script" not in page  # no JavaScript at all
    svgs = [page[i : page.index("</svg>", i) + 6] for i in range(len(page)) if page.startswith("<svg", i)]
    assert len(svgs) == 6  # accuracy, F1, traffic, duration, widths, FedDWA p_ij
    heat = ET.fromstring(svgs[-1])
    assert len(heat.findall(".//{http://www.w3.org/2000/svg}rect[@class='cell']")) == 9
    assert "FedDWA weights p_ij, round 1" in svgs[-1]
    assert '<table id="versions">' in page
    v1 = re.search(r'<tr class="version" data-version="1".*?</tr>', page, re.S)
    assert v1 is not None and "<td>50.0% <span class=\"muted\">(2 devices)</span></td>" in v1.group(0)  # round 0's personalisation
    assert 'class="shared"><span class="muted">not measured</span>' in v1.group(0)  # round 1 recorded no start measure


def test_forgotten_devices_are_shown_as_gone(view: ServerView) -> None:
    assert view.registry is not None
    view.registry.forget("pi-ben")  # type: ignore[attr-defined]
    ben = next(d for d in view.devices() if d["name"] == "pi-ben")
    assert (ben["state"], ben["online"], ben["rounds"], ben["owner"]) == ("forgotten", False, 0, None)
    assert "gone (forgotten)" in TestClient(make_app(view)).get("/").text


def test_bad_requests_get_a_message_not_a_traceback(view: ServerView) -> None:
    c = TestClient(make_app(view), raise_server_exceptions=False)
    for url, status, words in [("/api/rounds?limit=abc", 400, "is not an integer"), ("/api/rounds?since=-1", 400, "out of range"),
                               ("/api/rounds?limit=0", 400, "1 <= limit"), ("/nope", 404, "Not Found")]:  # fmt: skip
        r = c.get(url)
        assert r.status_code == status and words in r.json()["error"], (url, r.text)
    assert c.post("/api/devices").status_code == 405

    class Broken(ServerView):
        def records(self, since: int = 0, limit: int | None = None) -> list[RoundRecord]:
            raise RuntimeError("disk on fire at /secret/path")

    r = TestClient(make_app(Broken()), raise_server_exceptions=False).get("/api/rounds")
    assert r.status_code == 500 and r.json() == {"error": "internal error (RuntimeError); the server log has the details"}
    assert "Traceback" not in r.text and "/secret/path" not in r.text


def test_a_damaged_database_is_a_503_naming_the_file(view: ServerView) -> None:
    assert view.run_state is not None
    path = view.run_state.path
    path.write_bytes(b"this is not a database" * 100)  # overwritten under the open database
    with pytest.raises(StateDamaged):
        view.run_state.last_completed_round()
    r = TestClient(make_app(view), raise_server_exceptions=False).get("/api/devices")
    assert r.status_code == 503 and str(path) in r.json()["error"] and "Restore the file" in r.json()["error"]


def test_malformed_messages_are_counted_and_ignored(view: ServerView) -> None:
    mon = view.monitor
    assert mon is not None
    before = {d["name"]: d["status"] for d in view.devices()}
    mon.handle(T.client_status("phone-anna"), b"{not json")
    mon.handle(T.client_status("phone-anna"), json.dumps({"protocol": 1, "client_id": "pi-ben", "state": "online"}).encode())
    mon.handle(T.client_status("bad id!"), ClientStatus("phone-anna", "online").to_bytes())
    mon.handle(T.round, b"[]")
    mon.handle(T.progress, b"\xff" * 10)
    mon.handle(T.coordinator_status, b'{"protocol": 1, "state": "dancing"}')
    mon.handle(T.client_receipt("phone-anna"), b"{}")
    assert {d["name"]: d["status"] for d in view.devices()} == before
    assert view.malformed_counts() == {"status": 3, "round": 1, "progress": 1, "coordinator": 1, "receipt": 1}
    # a cleared retained status (a revoked or forgotten device) removes what the monitor held
    mon.handle(T.client_status("phone-carl"), b"", True)
    assert next(d for d in view.devices() if d["name"] == "phone-carl")["status"] is None


def test_a_token_guards_every_route(view: ServerView) -> None:
    c = TestClient(make_app(view, token=TOKEN))
    for url in ("/", "/api/devices", "/metrics", "/healthz"):
        r = c.get(url)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and "token" in r.json()["error"]
    assert c.get("/api/devices", headers={"Authorization": "Bearer wrong-token-of-some-length"}).status_code == 401
    assert c.get("/api/devices", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert c.get(f"/healthz?token={TOKEN}").status_code == 200  # scripts written before the cookie still work
    assert c.get("/healthz?token=").status_code == 401
    assert "?token=" not in c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).text  # links never carry it


def test_a_taken_port_is_a_clear_error(view: ServerView) -> None:
    first = WebServer(make_app(view), port=0)
    port = first.start()
    try:
        with pytest.raises(RuntimeError, match=f"did not start on 127.0.0.1:{port}: it could not bind.*http_port"):
            WebServer(make_app(view), port=port).start(timeout=5)
        with pytest.raises(BindRefused):
            WebServer(make_app(view), host="0.0.0.0", port=0)
        with pytest.raises(BindRefused, match="token"):
            start_status_page(view, host="0.0.0.0", port=0)
    finally:
        first.stop()


def test_a_network_address_needs_a_token() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        check_bind(host, None)
    for host in ("0.0.0.0", "192.168.1.20", "::", "nas.local"):
        with pytest.raises(BindRefused, match=r"set \[server\] token"):
            check_bind(host, None)
        check_bind(host, TOKEN)
    with pytest.raises(BindRefused, match="shorter than 16"):
        check_bind("0.0.0.0", "short")


def test_the_records_follow_the_database_and_skip_unreadable_rows(view: ServerView) -> None:
    assert view.run_state is not None
    assert [r.seconds for r in view.records()] == [30.0, 40.0]
    # round 1 recorded again with other figures (a restart that forgot it ran it again): the same last round
    view.run_state.complete_round(1, SPEC, init_state(SPEC, 0), {}, {**RoundRecord.from_json(_rows()[1]).to_json(), "seconds": 41.0})
    assert [r.seconds for r in view.records()] == [30.0, 41.0]
    view.run_state.complete_round(2, SPEC, init_state(SPEC, 0), {}, {"round": 2, "colour": "blue"})
    assert [r.round for r in view.records()] == [0, 1] and view.bad_rows == 1
    assert TestClient(make_app(view)).get("/api/rounds").status_code == 200


def test_a_served_federation_shows_no_round_budget_and_waits_for_devices(view: ServerView) -> None:
    from coordinator.server.serve import SERVE_ROUNDS

    assert view.monitor is not None
    view.monitor.handle(T.progress, RoundProgress("run-1", 1, SERVE_ROUNDS, _rows()[1]).to_bytes(), True)
    page = TestClient(make_app(view)).get("/").text
    assert '<span id="last-round">1</span> · next start: ' in page and f"of {SERVE_ROUNDS}" not in page
    # Too few eligible devices: serve's page_next_start gives None, and the page says what it waits for.
    waiting = dataclasses.replace(view, next_start=lambda: None)
    assert '<span id="next-start">when enough devices are eligible</span>' in TestClient(make_app(waiting)).get("/").text
    # A research run's planned rounds are still shown.
    view.monitor.handle(T.progress, RoundProgress("run-1", 1, 100, _rows()[1]).to_bytes(), True)
    assert '<span id="last-round">1</span> of 100 · next start: ' in TestClient(make_app(view)).get("/").text
