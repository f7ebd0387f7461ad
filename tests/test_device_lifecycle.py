"""A device's life after enrolment (coordinator/server/lifecycle.py, devices_cli): reissue, rename, forget, bundles.

Against a real Mosquitto (TLS, ACL, one account per device, reloaded by its PID file) and real
SQLite files: a re-issued device's old password is refused at once, a renamed device keeps its
participation under its new account, a forgotten device leaves no trace in the run's records
(the raw bytes of state.sqlite, report.json and report.md), bundles go when no longer needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.upgrade_fixture import mqtt_login

from coordinator.record import Evaluation, FedDwaWeights, Metrics, Participation, Rejection, RoundRecord, records
from coordinator.report import write_report
from coordinator.server import device_commands as devices_cli
from coordinator.server.audit import read_audit
from coordinator.server.folder_side import FolderSide
from coordinator.server.lifecycle import prune_bundles, scrub_record
from coordinator.server.registry import Registry
from coordinator.server.settings import read_serve_file
from coordinator.state import RunState

ROOT = Path(__file__).resolve().parents[1]
FED = "life"


def _data(tmp_path: Path, b: Any) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text(f'[server]\nname = "home-test"\nbroker_dir = "{b.out}"\npublic_host = "127.0.0.1"\nhttp_port = 0\n')
    return data


def _round(i: int, a: str, b: str) -> dict[str, Any]:
    m = Metrics(accuracy=0.8, macro_f1=0.7)
    rec = RoundRecord(
        round=i,
        participation=Participation(
            selected=2, updates=1, rejected=1, missing=(b,), failures={b: "stale_round"}, rejections=(Rejection(b, "stale_round", 1),)
        ),
        feddwa_weights=FedDwaWeights((a, b), ((0.6, 0.4), (0.25, 0.75))),
        evaluation=Evaluation(personalisation=m, personalisation_clients={a: m, b: Metrics(accuracy=0.5, macro_f1=0.4)}),
    )
    return rec.to_json()


def test_scrub_record_removes_every_entry_of_the_device_and_keeps_a_valid_record() -> None:
    rec = _round(3, "dev-a", "dev-b")
    out = scrub_record(rec, "dev-b")
    assert "dev-b" not in json.dumps(out)
    back = RoundRecord.from_json(out)
    assert back.participation.selected == 2 and back.participation.updates == 1  # anonymous counts stay
    assert back.participation.missing == () and dict(back.participation.failures) == {}
    assert back.feddwa_weights == FedDwaWeights(("dev-a",), ((0.6,),))
    assert set(back.evaluation.personalisation_clients) == {"dev-a"}
    assert scrub_record(rec, "nobody") == rec


@pytest.mark.slow
def test_reissue_rename_forget_and_bundles_with_a_real_broker(tmp_path: Path, tls_mosquitto: Callable[..., Any]) -> None:
    b = tls_mosquitto(FED, ["spare"])
    data = _data(tmp_path, b)
    file = read_serve_file(data / "server.toml")
    for name in ("dev-a", "dev-b", "dev-c"):
        devices_cli.enrol(data, file, name, "Anna")

    def pw(name: str) -> str:
        return str(json.loads((data / "enrolment" / f"{name}.json").read_text())["password"])

    # --- reissue: through the command line, as an operator runs it
    old = pw("dev-a")
    assert mqtt_login(b.port, "dev-a", old) == 0
    reg = Registry(data)
    reg.note_participation(0, "dev-a", 0.8, 0.7)
    reg.close()
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "reissue", "dev-a", "--data", str(data)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    new = pw("dev-a")
    assert new != old and new not in r.stdout + r.stderr and "re-issued" in r.stdout
    assert mqtt_login(b.port, "dev-a", old) in (4, 5, 134, 135)  # refused at once: bad user name or password / not authorised
    assert mqtt_login(b.port, "dev-a", new) == 0
    reg = Registry(data)
    assert [p.round for p in reg.participation("dev-a")] == [0] and reg.is_enrolled("dev-a")  # same history
    reg.close()
    with pytest.raises(ValueError, match="is not enrolled"):
        devices_cli.reissue(data, file, "never-seen")

    # --- rename: new account and ACL, the old one refused, participation and models kept under the new name
    personal = data / "run" / "models" / "r0000" / "personal"
    personal.mkdir(parents=True)
    (personal / "dev-a.safetensors").write_bytes(b"model of dev-a")
    done, bundle = devices_cli.rename(data, file, "dev-a", "phone-anna", FolderSide(data, file))
    assert bundle is not None  # enrolled by password: a bundle under the new name
    js = bundle[0]
    assert js == data / "enrolment" / "phone-anna.json" and not (data / "enrolment" / "dev-a.json").exists()
    assert any("broker account and ACL removed" in line for line in done)
    assert mqtt_login(b.port, "dev-a", new) in (4, 5, 134, 135)
    assert mqtt_login(b.port, "phone-anna", pw("phone-anna")) == 0
    acl = (b.out / "acl").read_text()
    assert "user phone-anna" in acl and "user dev-a\n" not in acl
    assert (personal / "phone-anna.safetensors").read_bytes() == b"model of dev-a" and not (personal / "dev-a.safetensors").exists()
    reg = Registry(data)
    rows = {d.name: d for d in reg.devices()}
    assert rows["phone-anna"].state == "enrolled" and rows["phone-anna"].owner == "Anna"
    assert rows["phone-anna"].enrolled_unix == rows["dev-a"].enrolled_unix
    assert rows["dev-a"].state == "revoked" and rows["dev-a"].renamed_to == "phone-anna"
    assert [p.round for p in reg.participation("phone-anna")] == [0] and reg.participation("dev-a") == []
    reg.close()
    with pytest.raises(ValueError, match="taken already"):
        devices_cli.rename(data, file, "dev-b", "dev-a", FolderSide(data, file))

    # --- forget: the run's records, reports and API lose the device
    run = data / "run"
    state = RunState(run)
    with state._db:
        for i in range(3):
            state._db.execute("INSERT INTO rounds (round, completed, summary) VALUES (?, ?, ?)",
                              (i, time.time(), json.dumps(_round(i, "phone-anna", "dev-b"))))  # fmt: skip
    state.event(1, "dev-b", "rejected", "stale_round")
    version_before = state.rounds_version()
    write_report(run, {"run_id": "home", "clients": ["phone-anna", "dev-b"]}, records(state.rounds()), plot=False)
    state.close()
    assert "dev-b" in (run / "report.md").read_text()
    (run / "spill" / "r0002").mkdir(parents=True)
    (run / "spill" / "r0002" / "dev-b.safetensors").write_bytes(b"x")
    lines = devices_cli.forget(data, file, "dev-b", FolderSide(data, file))
    assert any("removed dev-b from 3 round record(s)" in line for line in lines)
    for path in (run / "state.sqlite", run / "report.json", run / "report.md"):
        assert b"dev-b" not in path.read_bytes(), path
    state = RunState(run)
    assert state.rounds_version()[0] > version_before[0]  # a running page reads the rounds again
    assert all(set(r["personalisation_clients"]) == {"phone-anna"} and r["selected"] == 2 for r in state.rounds())
    assert state.events() == []
    state.close()
    assert not (run / "spill" / "r0002" / "dev-b.safetensors").exists()
    assert json.loads((run / "report.json").read_text())["clients"] == ["phone-anna"]

    # --- bundles: revoked at once; joined or old ones by prune_bundles (devices)
    assert (data / "enrolment" / "dev-c.json").exists()
    devices_cli.revoke(data, file, "dev-c", FolderSide(data, file))
    assert not (data / "enrolment" / "dev-c.json").exists() and not (data / "enrolment" / "dev-c.png").exists()
    devices_cli.enrol(data, file, "dev-d", None)
    devices_cli.enrol(data, file, "dev-e", None)
    # phone-anna's bundle (from the rename) is newer than its last contribution: kept until the device uses it
    assert prune_bundles(data) == [] and (data / "enrolment" / "phone-anna.json").exists()
    reg = Registry(data)
    reg.note_participation(5, "phone-anna", 0.8, 0.7)  # it took part with the new bundle: it has joined
    reg.close()
    assert prune_bundles(data) == ["phone-anna"]
    assert prune_bundles(data, joined={"dev-d"}) == ["dev-d"]
    js = data / "enrolment" / "dev-e.json"
    os.utime(js, (time.time() - 8 * 86400, time.time() - 8 * 86400))
    assert prune_bundles(data) == ["dev-e"] and sorted(os.listdir(data / "enrolment")) == []

    actions = [(e.action, e.device) for e in read_audit(data)]
    assert actions == [("enrol", "dev-a"), ("enrol", "dev-b"), ("enrol", "dev-c"), ("reissue", "dev-a"),
                       ("rename", "phone-anna"), ("revoke", "dev-b"), ("forget", "dev-b"), ("revoke", "dev-c"),
                       ("enrol", "dev-d"), ("enrol", "dev-e")]  # fmt: skip


@pytest.mark.slow
def test_devices_without_a_registry_creates_no_database(tmp_path: Path) -> None:
    data = tmp_path / "nothing-here"
    for cmd in ("devices", "versions"):
        r = subprocess.run([sys.executable, "-m", "coordinator.cli", cmd, "--data", str(data)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
        assert r.returncode == 2 and "does not exist: no device was enrolled" in r.stderr and "--data" in r.stderr
    assert not data.exists()


@pytest.mark.slow
def test_a_bundle_being_enrolled_survives_a_round_ending_at_that_moment(
    tmp_path: Path, tls_mosquitto: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running serve prunes bundles at the end of every round; one ending while ``enrol`` writes the bundle keeps it."""
    b = tls_mosquitto(FED, ["spare"])
    data = _data(tmp_path, b)
    file = read_serve_file(data / "server.toml")
    written = devices_cli.write_bundle
    pruned: list[list[str]] = []

    def write_then_round_ends(*args: Any) -> Any:
        out = written(*args)
        pruned.append(prune_bundles(data))  # what serve does when a round ends at this moment
        return out

    monkeypatch.setattr(devices_cli, "write_bundle", write_then_round_ends)
    js, png, _ = devices_cli.enrol(data, file, "dev-new", None)
    assert pruned == [[]]
    assert js.exists() and png.exists()
    assert json.loads(js.read_text())["client_id"] == "dev-new"


def test_a_bundle_reissued_while_a_round_was_open_stays_until_a_later_round(tmp_path: Path) -> None:
    """serve notes a round's participation with the time the round opened: an update sent with the old
    password in the round open during ``reissue`` is not taken as the device having loaded its new bundle."""
    data = tmp_path / "data"
    reg = Registry(data)
    reg.enrol("dev-a", "Anna")
    js = data / "enrolment" / "dev-a.json"
    js.parent.mkdir(parents=True)
    js.write_text("{}")
    written = js.stat().st_mtime
    reg.note_participation(4, "dev-a", 0.5, 0.4, t=written - 30.0)  # the round opened 30 s before the reissue, ended after it
    assert reg.participation_summary()["dev-a"].last_t == written - 30.0
    assert prune_bundles(data) == [] and js.exists()
    reg.note_participation(5, "dev-a", 0.6, 0.5, t=written + 1.0)  # a round opened after: only the new password got it in
    assert prune_bundles(data) == ["dev-a"] and not js.exists()
    reg.close()


def test_a_renamed_device_keeps_one_history_and_the_page_says_renamed(tmp_path: Path) -> None:
    """An update under the old name in the round open during ``rename`` counts under the new name; the old
    name's row on the page says where it went, with no rounds of its own (they are counted once, under the new name)."""
    from coordinator.server.schedule import not_eligible as _not_eligible
    from coordinator.server.web import ServerView, render_page

    data = tmp_path / "data"
    reg = Registry(data)
    reg.enrol("dev-b", "Ben")
    for r in range(3):
        reg.note_participation(r, "dev-b", 0.5, 0.4)
    reg.rename("dev-b", "kitchen-pi")
    reg.note_participation(3, "dev-b", 0.7, 0.6)  # the round open during the rename ends after it
    assert [p.round for p in reg.participation("kitchen-pi")] == [0, 1, 2, 3] and reg.participation("dev-b") == []
    view = ServerView(name="home", registry=reg)
    rows = {d["name"]: d for d in view.devices()}
    assert rows["dev-b"]["renamed_to"] == "kitchen-pi" and rows["dev-b"]["rounds"] == 0 and rows["dev-b"]["state"] == "revoked"
    assert rows["kitchen-pi"]["rounds"] == 4 and rows["kitchen-pi"]["renamed_to"] is None and rows["kitchen-pi"]["last_round"] == 3
    page = render_page(view)
    assert '<td class="presence revoked">renamed to kitchen-pi</td>' in page
    reg.close()
    # the waiting line names the devices that could take part and cannot: never a revoked (or forgotten) one
    assert _not_eligible({"dev-a": "revoked", "pi": "offline"}) == "; not eligible: pi (offline)"
    assert _not_eligible({"dev-a": "revoked"}) == ""


def test_a_device_renamed_with_its_state_folder_does_not_send_the_update_its_old_id_made(tmp_path) -> None:
    # The state folder of 'dev-b' now serves 'kitchen-pi' (renamed); it holds dev-b's update of round 14. The coordinator
    # refuses an envelope naming another client (client_mismatch), so re-sending it to each new attempt stalled the
    # round (CI, tests/test_scripted_month.py): the renamed device must train the round again instead.
    import numpy as np

    from edge_client.agent import ClientConfig, EdgeAgent
    from edge_client.store import ClientStore
    from har_io.broker_config import BrokerConfig
    from har_models.data.labels import HAPT_LABELS
    from har_models.wire import codec

    store = ClientStore(tmp_path / "state", HAPT_LABELS)
    env = codec.encode({"w": np.zeros(3, np.float32)}, kind="update", round=14, arch_version=0, client_id="dev-b",
                       meta={"run_id": "home", "stage": 0})  # fmt: skip
    store.save_last_update("home", 14, 0, env)
    old = EdgeAgent(ClientConfig("dev-b", BrokerConfig(port=9), backend="numpy"), store)
    assert old.answers.holds(("home", 14, 0), "") and old.answers.envelope() == (("home", 14, 0), env)  # its own: sent again
    renamed = EdgeAgent(ClientConfig("kitchen-pi", BrokerConfig(port=9), backend="numpy"), store)
    assert not renamed.answers.holds(("home", 14, 0), "") and renamed.answers.envelope() is None  # trains round 14 again
