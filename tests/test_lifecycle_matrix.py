"""The matrix: every device life-cycle event against every transport and round policy, with the invariants after each.

One served federation per column (MQTT, folder blobs, S3 blobs x synchronous, cohort, buffered rounds): ``serve`` in
this process over a real Mosquitto, devices as in-process agents with a 2-filter CNN (tests/support/served_federation.py).
A script of life-cycle events runs on it round after round (the rows): a device enrolled while serving, restarted,
frozen with its update made and thawed, re-issued, renamed with its update waiting under the old name, a coordinator
restart, a backup taken while serving and restored after the devices went ahead, a revocation with the device's update
waiting, a device leaving from its app (and one more enrolled), and forget. After each event, once a round completed:

* nothing is counted from a device that may not send (revoked, renamed away, left, forgotten);
* every update a device set out to send while it could is counted (in its round, or later as a stale buffered update)
  or named in the records with a reason (its round's failure, a rejection): no silent loss;
* no upload slot of an exchange closed before the last completed round (its staleness bound when buffered) is left
  in the blob store; with serve stopped, one model object per start of serve at most;
* the page's JSON (``/api/rounds``, ``/api/devices``) and ``/metrics`` say what the records and the registry say.

The fast loop runs the MQTT x synchronous column: one cell of each row. The other columns are slow; the S3 ones share
one SeaweedFS and skip without it unless FEDHAR_REQUIRE_S3=1. Two faults this matrix found have their own tests at the
end: a buffered update sent while serve restarts, and the model objects a restart of serve left in the store. Every cell
runs every row (:data:`KNOWN` says what the blob x buffered cells once left out).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.served_federation import FED, Device, Served, until

from coordinator.server.backup import backup
from coordinator.server.lifecycle import leave_requests
from coordinator.server.registry import Registry
from coordinator.server.restore import restore
from coordinator.state import RunState
from edge_client.leave import announce_leaving
from har_io.broker_config import BrokerConfig

pytestmark = pytest.mark.mosquitto

POLICIES = {
    "synchronous": "",
    "cohort": "[cohort]\ngoal = 2\noverselect = 0.5\n",  # 3 selected of 3, closed at 2: the third is not needed
    "buffered": "[buffer]\nsize = 2\nmax_staleness = 2\n",  # closed at 2 updates; the third folds in later, stale
}
LATE = {"synchronous": 0, "cohort": 0, "buffered": 2}  # rounds a closed exchange's slots stay open (the staleness bound)
BUCKET = "fedhar-matrix"
Record = dict[str, Any]

@pytest.fixture(autouse=True)
def no_report_plot(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve redraws the run's metrics.png after every round: half of this module's CPU, and nothing it checks."""
    monkeypatch.setattr("coordinator.report._plot", lambda *args: None)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SeaweedFS for the S3 columns (each under its own key prefix): (``weed mini``, boto3 client), with the
    credentials in the environment as tests/test_blob_s3.py sets them."""
    from test_blob_s3 import _seaweed

    tmp = tmp_path_factory.mktemp("s3")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        for name, value in (("AWS_ACCESS_KEY_ID", "fedhar-test"), ("AWS_SECRET_ACCESS_KEY", "fedhar-test-secret"),
                            ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_CONFIG_FILE", str(tmp / "none")),
                            ("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "none")), ("AWS_EC2_METADATA_DISABLED", "true")):  # fmt: skip
            mp.setenv(name, value)
        with _seaweed(tmp, BUCKET) as found:
            yield found


def counted(rec: Record, name: str) -> bool:
    """Whether round record ``rec`` counts an update of ``name`` (fresh, or stale from an earlier version)."""
    return name in rec.get("personalisation_clients", {}) or name in rec.get("stale", {})


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


# ---------------------------------------------------------------------------------------------- a column and its invariants
class Column:
    """One column's federation, its devices (by state folder) and what the script did to them."""

    def __init__(self, tmp: Path, port: int, transport: str, policy: str, s3: Any = None):
        self.transport, self.policy, self.s3, self.prefix = transport, policy, s3, f"{policy}/"
        store = {"mqtt": "", "folder": '[transport]\nkind = "blobs"\n'}.get(transport, "")
        if transport == "s3":
            store = (f'[transport]\nkind = "blobs"\nstore = "s3"\ns3_endpoint = "{s3[0].endpoint}"\ns3_bucket = "{BUCKET}"\n'
                     f's3_prefix = "{self.prefix}"\n')  # fmt: skip
        self.served = Served(tmp, port, POLICIES[policy] + store)
        self.devices: dict[str, Device] = {}
        self.barred: dict[str, tuple[int, float]] = {}  # name -> (the last round that may count it, since when)
        self.forgotten: set[str] = set()
        self.excused: list[tuple[int, float]] = []  # (restored round, when): updates of later rounds sent before, undone
        self.undone: set[tuple[str, int]] = set()  # (device, round) of stale updates counted in rounds a restore took back

    def start(self, folder: str, name: str | None = None) -> Device:
        """Start the device of state folder ``folder`` as ``name`` (default: the folder's name) with its bundle's password."""
        if folder not in self.devices:
            self.devices[folder] = Device(folder, self.served.tmp / folder, self.served.port, seed=len(self.devices))
        dev = self.devices[folder]
        dev.start(self.served.passwords[name or folder], name)
        return dev

    def bar(self, name: str, grace: int = 0) -> None:
        """``name`` may not send from now: no round after the last completed one (+ ``grace``) may count it."""
        self.barred[name] = (self.served.last_round() + grace, time.time())

    def store_keys(self, what: str) -> list[str]:
        """Keys under ``objects/`` or ``uploads/`` of the column's blob store ([] over MQTT)."""
        if self.transport == "folder":
            root = self.served.data / "run" / "blobs" / what  # os.walk passes over what the server deletes meanwhile
            return sorted(str((Path(d) / f).relative_to(root)) for d, _, files in os.walk(root) for f in files)
        if self.transport == "s3":
            got = self.s3[1].list_objects_v2(Bucket=BUCKET, Prefix=f"{self.prefix}{what}/").get("Contents", [])
            return sorted(o["Key"][len(f"{self.prefix}{what}/") :] for o in got)
        return []

    def check(self, event: str) -> None:
        """Every invariant of the module docstring, after ``event``."""
        recs = self.served.records()
        for name, (last, _) in self.barred.items():
            late = [r["round"] for r in recs if r["round"] > last and counted(r, name)]
            assert not late, f"after {event}: rounds {late} counted {name}, which may not send since round {last}"
        give_up = time.time() + 20.0  # an update on its way (a device's re-send after a restart) gets there meanwhile
        while True:
            try:
                self.no_loss(event, self.served.records(), self.served.events())
                break
            except AssertionError:
                if time.time() > give_up:
                    raise
                time.sleep(0.2)
        recs = self.served.records()
        slots = {key.split("/")[1] for key in self.store_keys("uploads")}  # {run}/r0007-s0/{client}
        closed = sorted(s for s in slots if recs and int(s[1:5]) < recs[-1]["round"] - LATE[self.policy])
        assert not closed, f"after {event}: upload slots of closed exchanges are left in the blob store: {closed}"
        self.page_says_the_records(event)

    def no_loss(self, event: str, recs: list[Record], events: list[tuple[Any, ...]]) -> None:
        """Each update a device set out to send while it could is counted or named, once two rounds completed after it."""
        done = {r["round"]: r for r in recs}
        state = RunState(self.served.data / "run")
        try:
            completed, run_id = [state.completed_unix(r["round"]) or 0.0 for r in recs], state.get("run_id")
        finally:
            state.close()
        for dev in self.devices.values():
            for (name, run, rnd, _), t in dict(dev.sent).items():
                if run != run_id or name in self.forgotten or any(rnd > b and t < at for b, at in self.excused):
                    continue  # forgotten on request; or a round the restore took back
                if (name, rnd) in self.undone:
                    continue  # an earlier version's update a round the restore took back had counted
                if sum(c > t for c in completed) < 2 or (name in self.barred and t > self.barred[name][1]):
                    continue  # on its way to a record still; or sent when it could not (checked above)
                rec = done.get(rnd, {})
                why = rec.get("failures", {}).get(name)  # still_training promises a later count: no reason by itself
                ok = counted(rec, name) or why not in (None, "still_training")
                ok = ok or any(r.get("stale", {}).get(name) == r["round"] - rnd for r in recs)
                ok = ok or any(c == name and kind == "rejected" and r is not None and r >= rnd for r, c, kind, _ in events)
                assert ok, f"after {event}: the update {name} sent for round {rnd} is neither counted nor named: {rec}"

    def _registry(self) -> tuple[Counter[str], dict[str, int], int]:
        """Devices by state, rounds taken part in by name, and the newest version's round, as the registry holds them."""
        reg = Registry(self.served.data)
        try:
            newest = reg.versions(newest=1)
            return (Counter(d.state for d in reg.devices()), {n: p.rounds for n, p in reg.participation_summary().items()},
                    newest[-1].round if newest else -1)  # fmt: skip
        finally:
            reg.close()

    def page_says_the_records(self, event: str) -> None:
        """/api/rounds, /api/devices and /metrics against the run's records and the registry, read between two rounds."""
        for _ in range(50):  # until a look falls between two rounds, after the last one's version was kept
            recs, registry = self.served.records(), self._registry()
            api, devs = _json(self.served.page + "/api/rounds"), _json(self.served.page + "/api/devices")
            metrics = _samples(self.served.page + "/metrics")
            if registry[2] == (recs[-1]["round"] if recs else -1) and (recs, registry) == (self.served.records(), self._registry()):
                break
            time.sleep(0.05)
        states, took, _ = registry
        assert [(r["round"], r["updates"], r["rejected"]) for r in api] == [(r["round"], r["updates"], r["rejected"]) for r in recs]
        assert metrics[("fedhar_rounds_completed_total", ())] == len(recs), event
        assert metrics[("fedhar_updates_accepted_total", ())] == sum(r["updates"] for r in recs), event
        reasons: Counter[str] = Counter()
        for r in recs:  # forget takes the device's rejections out of a record and keeps the count: "unspecified" then
            for _, reason, n in r.get("rejections", []):
                reasons[reason] += n
            reasons["unspecified"] += r["rejected"] - sum(n for _, _, n in r.get("rejections", []))
        said = {dict(k[1])["reason"]: v for k, v in metrics.items() if k[0] == "fedhar_updates_rejected_total" and v}
        assert said == +reasons, event
        for state in ("enrolled", "revoked", "forgotten"):
            assert metrics[("fedhar_devices", (("state", state),))] == states[state], (event, state)
        assert {d["name"]: d["rounds"] for d in devs} == {d["name"]: took.get(d["name"], 0) for d in devs}, event
        for name in self.forgotten:
            assert name not in json.dumps([api, recs]), f"after {event}: {name} is still in the records or the page's rounds"


# ---------------------------------------------------------------------------------------------- the rows
def _held(col: Column, folder: str, what: str) -> Device:
    """Freeze device ``folder`` and wait until it holds an update made for a round."""
    dev = col.devices[folder]
    dev.freeze()
    until(dev.held.is_set, what)
    return dev


def enrol(col: Column) -> None:  # a device enrolled while serving takes part
    col.served.enrol("dev-c")
    col.start("dev-c")
    col.served.round_after("a round counting the newly enrolled dev-c", lambda r: counted(r, "dev-c"))


def restart(col: Column) -> None:  # the device's process stops (its update sent on its way out) and starts again
    col.devices["dev-a"].stop()
    col.start("dev-a")
    col.served.round_after("a round counting dev-a after its restart", lambda r: counted(r, "dev-a"))


def freeze(col: Column) -> None:  # rounds go on without the frozen device; thawed, its late update is counted or named
    b = _held(col, "dev-b", "dev-b selected and frozen with its update")
    col.served.round_after("a round closed while dev-b is frozen", lambda r: not counted(r, "dev-b"))
    b.thaw.set()
    col.served.round_after("a round counting dev-b after the thaw", lambda r: counted(r, "dev-b"))


def reissue(col: Column) -> None:  # a new password; the device starts again with its new bundle, same name and history
    col.served.command("reissue", name="dev-a")
    col.devices["dev-a"].stop()
    col.start("dev-a")
    col.served.round_after("a round counting the re-issued dev-a", lambda r: counted(r, "dev-a"))


def rename(col: Column) -> None:  # dev-c becomes dev-d while its update waits: sent under the old name, it does not count
    c = _held(col, "dev-c", "dev-c selected and frozen with its update")
    col.served.command("rename", old="dev-c", new="dev-d")
    col.bar("dev-c")
    c.thaw.set()
    col.served.round_after("a round after the rename")
    c.stop()
    col.start("dev-c", "dev-d")
    col.served.round_after("a round counting the renamed dev-d", lambda r: counted(r, "dev-d"))


def _two_of_three(r: Record) -> bool:
    return sum(counted(r, n) for n in ("dev-a", "dev-b", "dev-d")) >= 2


def coordinator_restart(col: Column) -> None:  # serve stops and starts again on its folder, in a new epoch
    col.served.stop()
    assert len(col.store_keys("objects")) <= 1, f"objects left with serve stopped: {col.store_keys('objects')}"
    col.served.start()
    col.served.round_after("a round after the coordinator restart", _two_of_three)


def restore_backup(col: Column) -> None:  # a backup taken while serving; the devices go two rounds ahead; it comes back
    fed = col.served
    backup(fed.data, fed.tmp / "backup", fed.data / "server.toml", fed.broker_dir)
    fed.round_after("a round after the backup")
    fed.round_after("a second round after the backup")
    fed.stop()
    before = fed.records()
    restore(fed.tmp / "backup", fed.data, force=True)
    col.excused.append((fed.last_round(), time.time()))
    col.undone |= {(name, r["round"] - tau) for r in before if r["round"] > fed.last_round() for name, tau in r.get("stale", {}).items()}
    fed.start()
    fed.round_after("a round after the restore", _two_of_three)


def revoke(col: Column) -> None:  # revoked while its update waits: that update is refused, and nothing of it counts again
    d = _held(col, "dev-c", "dev-d selected and frozen with its update")
    col.served.command("revoke", name="dev-d")
    col.bar("dev-d")
    d.thaw.set()
    col.served.round_after("a round after the revocation")
    d.stop()


def leave(col: Column) -> None:  # dev-b leaves from its app and asks to be forgotten; dev-e is enrolled so rounds go on
    col.devices["dev-b"].stop()
    login = BrokerConfig(port=col.served.port, username="dev-b", password=col.served.passwords["dev-b"])
    assert announce_leaving(login, FED, "dev-b", True) is None
    until(lambda: "dev-b" in leave_requests(col.served.data), "the server noting dev-b's request to leave")
    col.bar("dev-b", grace=1)  # the round open as it left may count the update it sent on its way out
    col.served.enrol("dev-e")
    col.start("dev-e")
    col.served.round_after("a round counting dev-e after dev-b left", lambda r: counted(r, "dev-e") and counted(r, "dev-a"))


def forget(col: Column) -> None:  # the operator answers dev-b's request: gone from the records, the page and the metrics
    col.served.command("forget", name="dev-b")
    col.forgotten.add("dev-b")
    col.served.round_after("a round after forget")


KNOWN: dict[tuple[str, str], tuple[Callable[[Column], None], ...]] = {}
"""Rows a cell leaves out, with the fault they still show: none. The blob x buffered cells left out the restart and restore
rows until a device kept an update still owed a send beside its next one (edge_client.delivery.Delivery.earlier), with
its own upload grant: before, the next update took its place in the store and the earlier one was neither counted nor
named, when rounds came faster than the device's retry after the restart."""

ROWS: list[Callable[[Column], None]] = [enrol, restart, freeze, reissue, rename, coordinator_restart, restore_backup, revoke,
                                        leave, forget]  # fmt: skip


def _serving(col: Column, names: tuple[str, ...]) -> None:
    for name in names:
        col.served.enrol(name)
    col.served.start()
    for name in names:
        col.start(name)
    col.served.round_after("a first round", lambda r: all(counted(r, n) for n in names))


def _stop_all(col: Column) -> None:
    for dev in col.devices.values():
        dev.stop()
    col.served.stop()


@pytest.mark.parametrize(("transport", "policy"), [
    pytest.param(t, p, id=f"{t}-{p}", marks=[*([] if (t, p) == ("mqtt", "synchronous") else [pytest.mark.slow]),
                                             *([pytest.mark.s3] if t == "s3" else [])])
    for t in ("mqtt", "folder", "s3") for p in POLICIES
])  # fmt: skip
def test_every_life_cycle_event_keeps_the_invariants(transport: str, policy: str, tmp_path: Path, mosquitto: int,
                                                      request: pytest.FixtureRequest) -> None:  # fmt: skip
    col = Column(tmp_path, mosquitto, transport, policy, request.getfixturevalue("seaweed") if transport == "s3" else None)
    try:
        _serving(col, ("dev-a", "dev-b"))
        for row in ROWS:
            if row not in KNOWN.get((transport, policy), ()):
                row(col)
                col.check(row.__name__)
        for folder in ("dev-a", "dev-e"):
            col.devices[folder].stop()
        col.served.stop()
        # One exchange's object at a time, whatever the restarts and the restore (each start removes what the one before left).
        assert len(col.store_keys("objects")) <= 1, f"objects left with serve stopped: {col.store_keys('objects')}"
    finally:
        _stop_all(col)


def test_a_device_whose_update_waits_in_the_buffer_is_not_selected_for_that_version(tmp_path: Path) -> None:
    """Its fresh update would take the buffered one's place unrecorded: accepted with a receipt, then neither counted nor
    named (the buffered columns found it). It is selected again once the buffer was aggregated."""
    from coordinator.config import BufferSettings, CoordinatorConfig, ModelSettings
    from coordinator.rounds.buffered import BufferedRounds
    from coordinator.updates import ClientUpdate
    from har_models.nn.model import ArchSpec, init_state

    spec = ArchSpec(n_classes=6, conv_filters=2, dense_units=4)
    policy = BufferedRounds(CoordinatorConfig(run_dir=tmp_path, model=ModelSettings(conv_filters=2, dense_units=4),
                                              buffer=BufferSettings(size=2), aggregation="fedavg"))  # fmt: skip
    policy.in_flight.close(3, spec, init_state(spec, 1), ["dev-c"])  # round 3 closed while dev-c trained on
    late = policy.late("dev-c", 3, 0)
    assert late is not None and late.take is not None
    late.take(ClientUpdate("dev-c", 3, 0, 20, 4, init_state(spec, 1), None, size=100))
    devices = ["dev-a", "dev-b", "dev-c"]
    assert policy.training() == set() and policy.select(devices, 4) == ["dev-a", "dev-b"]
    policy.completed()
    assert policy.select(devices, 5) == devices


@pytest.mark.slow
def test_a_buffered_update_sent_while_serve_restarts_is_counted_or_named(tmp_path: Path, mosquitto: int) -> None:
    """dev-c's update of an earlier version goes to the broker while serve is down: the restarted serve waits for it
    (BufferedRounds.restore) and the device sends it again on the new epoch (Delivery.after_restart), so it counts."""
    col = Column(tmp_path, mosquitto, "mqtt", "buffered")
    try:
        _serving(col, ("dev-a", "dev-b", "dev-c"))
        c = _held(col, "dev-c", "dev-c selected and frozen with its update")
        col.served.round_after("a round closed while dev-c trains on", lambda r: r.get("failures", {}).get("dev-c") == "still_training")
        col.served.stop()
        thawed = time.time()
        c.thaw.set()  # its update goes to the broker while serve is down
        until(lambda: any(t > thawed for t in dict(c.sent).values()), "dev-c's update sent")
        col.served.start()
        col.served.round_after("a round after the restart")
        col.served.round_after("a second round after the restart")
        col.check("a restart of serve while dev-c's update was on its way")
    finally:
        _stop_all(col)


@pytest.mark.slow
def test_a_restarted_server_leaves_no_model_object_behind(tmp_path: Path, mosquitto: int) -> None:
    """Each start of serve removes the objects the one before noted (coordinator/transport/blobs.py, OBJECTS_NOTE)."""
    col = Column(tmp_path, mosquitto, "folder", "synchronous")
    try:
        _serving(col, ("dev-a", "dev-b"))
        col.served.stop()
        assert len(col.store_keys("objects")) == 1
        col.served.start()
        col.served.round_after("a round after the restart")
        _stop_all(col)
        assert len(col.store_keys("objects")) == 1, f"objects left with serve stopped: {col.store_keys('objects')}"
    finally:
        _stop_all(col)
