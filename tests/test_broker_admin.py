"""BrokerAdmin against a real Mosquitto: accounts added and removed one at a time, reloads, revocation, the monitor.

Each test generates a broker folder with ``firmware_scripts/mosquitto_config.py`` (as an
operator would), starts Mosquitto on it (the configuration names its ``pid_file``, which the
reload uses) and drives it with paho-mqtt 2.x sessions and the programs' own
:class:`har_io.mqtt_link.MqttLink`. Mosquitto drops an ACL-denied publish silently (the publisher
still gets its PUBACK); Mosquitto is single-threaded and hands a message to its subscribers
before it acknowledges it, so "not delivered" is asserted after a control message published
later has arrived, plus :data:`QUIET_S` for stragglers.

Measured here with Mosquitto 2.0.11: on SIGHUP after an account left ``passwd`` and ``acl``,
the broker closes that account's live session at once (without its last will), and a reconnect
with the old password gets CONNACK "Not authorized".
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.mqtt_peer import QUIET_S, WAIT_S
from support.mqtt_peer import MqttPeer as Peer

from coordinator.server.broker_admin import BrokerAdmin, BrokerAdminError, BrokerReloadFailed, clear_device_topics
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_models.wire.topics import Topics
from simulation.broker import free_port, stop_process, wait_for_port

pytestmark = pytest.mark.mosquitto

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "firmware_scripts" / "mosquitto_config.py"
FED = "admintest"
P = f"fedhar/v1/{FED}"
ME = pwd.getpwuid(os.geteuid()).pw_name  # started as root, Mosquitto would switch to an account that cannot read tmp


def _tool(name: str, *extra: str) -> str:
    found = shutil.which(name) or next((p for p in extra if os.access(p, os.X_OK)), None)
    if found is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail(f"{name} is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip(f"{name} not installed (apt-get install mosquitto)")
    return found


def generate(out: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the generator as an operator would (``--json``)."""
    _tool("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--broker-user", ME, "--public-host", "127.0.0.1", "--json", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@dataclass
class Broker:
    out: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def password(self, user: str) -> str:
        return (self.out / "credentials" / f"{user}.password").read_text().strip()

    def reloads(self) -> int:
        return self.log.read_text().count("Reloading config")


@contextmanager
def running(out: Path, port: int) -> Iterator[Broker]:
    """Mosquitto on ``out/mosquitto.conf``, once it listens and has written its PID file."""
    exe = _tool("mosquitto", "/usr/sbin/mosquitto")
    log = out.parent / f"{out.name}-mosquitto.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([exe, "-c", str(out / "mosquitto.conf")], stdout=sink, stderr=subprocess.STDOUT)
    try:
        if not wait_for_port("127.0.0.1", port, 10):
            pytest.fail(f"mosquitto did not listen on {port}; log:\n{log.read_text()}")
        end = time.monotonic() + WAIT_S
        while not (out / "data" / "mosquitto.pid").exists():
            assert time.monotonic() < end, "mosquitto wrote no PID file"
            time.sleep(0.05)
        yield Broker(out, port, proc, log)
    finally:
        stop_process(proc)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """Federation ``admintest`` with devices hapt-01 and hapt-02 (and the monitor) on a running Mosquitto."""
    out, port = tmp_path / "broker", free_port()
    generate(out, "--federation", FED, "--clients", "hapt-01,hapt-02", "--port", str(port), "--bind", "127.0.0.1")
    with running(out, port) as b:
        yield b


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for p in made:
        p.close()


def login(broker: Broker, peers: list[Peer], user: str, password: str | None = None, **kw: Any) -> Peer:
    p = Peer(broker.port, user, broker.password(user) if password is None else password, **kw)
    peers.append(p)
    rc = p.connect()
    assert not rc.is_failure, f"{user} could not log in: {rc}"
    return p


def _token() -> bytes:
    return uuid.uuid4().hex.encode()


def _wait_reloads(broker: Broker, n: int) -> None:
    end = time.monotonic() + WAIT_S
    while broker.reloads() < n:
        assert time.monotonic() < end, f"mosquitto did not reload; log:\n{broker.log.read_text()}"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------- reload via the PID file
@pytest.mark.parametrize("reload", ["pid", "auto"])
def test_an_added_device_logs_in_after_the_reload_through_the_pid_file(broker, peers, reload):
    setting = f"pid:{broker.out / 'data' / 'mosquitto.pid'}" if reload == "pid" else "auto"
    admin = BrokerAdmin(broker.out, reload=setting)
    assert admin.devices() == ["hapt-01", "hapt-02"]
    password = admin.add_device("hapt-03")
    assert password == broker.password("hapt-03") and len(password) >= 32
    assert admin.devices() == ["hapt-01", "hapt-02", "hapt-03"]
    _wait_reloads(broker, 1)
    first = login(broker, peers, "hapt-03", password)
    assert password not in broker.log.read_text()
    with pytest.raises(BrokerAdminError, match=r"'hapt-03' already has an account .* broker rotate --out .* hapt-03"):
        admin.add_device("hapt-03")
    renewed = admin.add_device("hapt-03", replace=True)
    assert renewed != password
    _wait_reloads(broker, 2)
    assert first.dropped.wait(WAIT_S), "a session logged in with the replaced password is closed on reload too"
    assert Peer(broker.port, "hapt-03", password).connect().is_failure
    login(broker, peers, "hapt-03", renewed)


def test_reload_via_a_stale_pid_file_after_the_broker_stopped(broker):
    admin = BrokerAdmin(broker.out, reload=f"pid:{broker.out / 'data' / 'mosquitto.pid'}")
    pid = int((broker.out / "data" / "mosquitto.pid").read_text())
    assert pid == broker.proc.pid
    admin.reload_broker()
    _wait_reloads(broker, 1)
    stop_process(broker.proc)
    (broker.out / "data" / "mosquitto.pid").write_text(f"{pid}\n")  # as if the broker had died without removing it
    with pytest.raises(BrokerAdminError, match=rf"stale PID file .*process {pid} is not running; start the broker \(mosquitto -c "):
        admin.reload_broker()
    with pytest.raises(BrokerReloadFailed, match=r"the account of 'hapt-09' was written, but the broker was not reloaded") as err:
        BrokerAdmin(broker.out).add_device("hapt-09")
    assert err.value.password == broker.password("hapt-09"), "the password is not lost when only the reload failed"
    assert err.value.password not in str(err.value) and err.value.password not in repr(err.value)


# ------------------------------------------------------------------------------------- revocation
def test_a_removed_device_is_disconnected_and_its_old_password_refused(broker, peers):
    coord = login(broker, peers, "coordinator")
    coord.subscribe(f"{P}/client/+/status")
    old = broker.password("hapt-01")
    dev = Peer(broker.port, "hapt-01", old, client_id="fedhar-client-hapt-01")
    peers.append(dev)
    assert not dev.connect(will=(f"{P}/client/hapt-01/status", b"offline")).is_failure
    online = _token()
    dev.publish(f"{P}/client/hapt-01/status", online, retain=True)
    coord.expect(f"{P}/client/hapt-01/status", online)
    other = login(broker, peers, "hapt-02")

    admin = BrokerAdmin(broker.out)
    start = time.monotonic()
    admin.remove_device("hapt-01")
    assert dev.dropped.wait(WAIT_S), "Mosquitto closes the removed account's live session on reload"
    assert dev.dropped_at is not None
    print(f"removed device's session closed {1000 * (dev.dropped_at - start):.0f} ms after remove_device began")
    assert admin.devices() == ["hapt-02"]
    assert not (broker.out / "credentials" / "hapt-01.password").exists()
    assert "hapt-01" not in (broker.out / "passwd").read_text() and "hapt-01" not in (broker.out / "acl").read_text()
    rc = Peer(broker.port, "hapt-01", old).connect()
    assert rc.is_failure and str(rc) == "Not authorized"
    assert not other.dropped.is_set(), "the other device keeps its session"
    # No last will: the retained status is still the device's own "online" until it is cleared.
    assert b"offline" not in {payload for _, payload in coord.settle()}
    with pytest.raises(BrokerAdminError, match=r"'hapt-01' has no account in .* \(devices: hapt-02\)"):
        admin.remove_device("hapt-01")


def test_the_devices_own_link_stops_for_good_after_revocation(broker):
    cfg = BrokerConfig(port=broker.port, username="hapt-02", password=broker.password("hapt-02"))
    link = MqttLink(cfg, "fedhar-client-hapt-02")
    assert link.start(wait_s=WAIT_S)
    try:
        BrokerAdmin(broker.out).remove_device("hapt-02")
        assert link.failed.wait(WAIT_S + 5), "the reconnect (after paho's 1 s back-off) is refused"
        assert link.fatal is not None and link.fatal.kind == "auth"
        assert "Not authorized" in str(link.fatal)
        assert not link.connected.is_set()
    finally:
        link.stop()


def test_clear_device_topics_empties_the_revoked_devices_status_and_models_only(broker, peers):
    dev = login(broker, peers, "hapt-01")
    dev.publish(f"{P}/client/hapt-01/status", b'{"state": "online"}', retain=True)
    keep = _token()
    coord_link = MqttLink(BrokerConfig(port=broker.port, username="coordinator", password=broker.password("coordinator")), "coord")
    assert coord_link.start(wait_s=WAIT_S)
    try:
        for i in range(3):
            coord_link.publish(f"{P}/client/hapt-01/model/{i}", _token(), retain=True, timeout=WAIT_S)
        coord_link.publish(f"{P}/client/hapt-02/model/0", keep, retain=True, timeout=WAIT_S)
        BrokerAdmin(broker.out).remove_device("hapt-01")
        assert dev.dropped.wait(WAIT_S)
        cleared = clear_device_topics(coord_link, Topics(FED), "hapt-01", timeout=WAIT_S)
    finally:
        coord_link.stop()
    assert cleared == [f"{P}/client/hapt-01/status", *(f"{P}/client/hapt-01/model/{i}" for i in range(3))]
    watcher = login(broker, peers, "monitor")
    watcher.subscribe(f"{P}/client/#")
    watcher.expect(f"{P}/client/hapt-02/model/0", keep)
    assert [t for t, _ in watcher.settle()] == [f"{P}/client/hapt-02/model/0"], "nothing of hapt-01 is retained"


# ------------------------------------------------------------------------------------- the monitor
def test_the_monitor_reads_statuses_and_progress_and_cannot_publish(broker, peers):
    admin = BrokerAdmin(broker.out)
    user, password = admin.monitor_credentials()
    assert user == "monitor" and password == broker.password("monitor")
    coord = login(broker, peers, "coordinator")
    coord.subscribe(f"{P}/#")
    dev = login(broker, peers, "hapt-01")
    status, progress = _token(), _token()
    dev.publish(f"{P}/client/hapt-01/status", status, retain=True)
    coord.publish(f"{P}/progress", progress, retain=True)
    mon = login(broker, peers, user, password)
    mon.subscribe(f"{P}/#")
    mon.expect(f"{P}/client/hapt-01/status", status)  # retained ones, on subscribing
    mon.expect(f"{P}/progress", progress)
    live = _token()
    dev.publish(f"{P}/client/hapt-01/status", live)
    mon.expect(f"{P}/client/hapt-01/status", live)

    denied = _token()
    forbidden = [
        f"{P}/round", f"{P}/progress", f"{P}/coordinator/status", f"{P}/model/global/0",
        f"{P}/client/hapt-01/status", f"{P}/client/hapt-01/update/0", f"{P}/client/hapt-01/model/0",
        f"{P}/client/monitor/status", f"{P}/client/monitor/update/0",  # where a %u pattern would have let it write
        "homeassistant/status", "fedhar/v1/other/round",
    ]  # fmt: skip
    for topic in forbidden:
        mon.publish(topic, denied, retain=True)
    control = _token()
    dev.publish(f"{P}/client/hapt-01/status", control)
    coord.expect(f"{P}/client/hapt-01/status", control)
    assert [t for t, payload in coord.settle() if payload == denied] == []
    late = login(broker, peers, "coordinator", client_id="late")  # replaces `coord`; sees what is retained
    late.subscribe(f"{P}/#", "homeassistant/#")
    assert [t for t, payload in late.settle() if payload == denied] == []


def test_logging_in_as_the_monitor_leaves_the_coordinators_session_alone(broker, peers):
    coord = login(broker, peers, "coordinator", client_id="fedhar-coordinator")
    coord.subscribe(f"{P}/client/+/status")
    user, password = BrokerAdmin(broker.out).monitor_credentials()
    for _ in range(2):  # a status page restarting: each login takes over the previous monitor session only
        login(broker, peers, user, password, client_id=f"status-page-{uuid.uuid4().hex[:6]}")
    assert not coord.dropped.wait(QUIET_S)
    alive = _token()
    login(broker, peers, "hapt-01").publish(f"{P}/client/hapt-01/status", alive)
    coord.expect(f"{P}/client/hapt-01/status", alive)
    # The control: the same check with the coordinator's own account does disconnect it (one session per user name).
    login(broker, peers, "coordinator", client_id="a-second-coordinator")
    assert coord.dropped.wait(WAIT_S)


# ------------------------------------------------------------------------------------- Home Assistant, removed
def test_a_folder_made_with_home_assistant_loses_its_account_and_the_option_says_it_was_removed(tmp_path):
    out = tmp_path / "broker"
    generate(out, "--federation", FED, "--clients", "hapt-01")
    # The folder as --home-assistant left it: the flag in the manifest, Home Assistant's password and passwd line.
    manifest = json.loads((out / "fedhar-broker.json").read_text())
    manifest["settings"]["home_assistant"] = True
    (out / "fedhar-broker.json").write_text(json.dumps(manifest))
    (out / "credentials" / "homeassistant.password").write_text("x" * 32 + "\n")
    r = generate(out, "--home-assistant", check=False)
    assert r.returncode == 2 and "--home-assistant was removed" in r.stderr and "Leave the option out" in r.stderr
    dropped = generate(out, "--no-home-assistant")  # asks for what every run now does: accepted
    doc = json.loads(dropped.stdout)
    assert "home_assistant" not in doc["settings"] and "homeassistant" not in doc["password_files"]
    assert doc["kept"] == ["coordinator", "monitor", "hapt-01"] and doc["clients"] == ["hapt-01"], "not taken for a device"
    assert "removing the account 'homeassistant' that --home-assistant made" in dropped.stderr
    assert not (out / "credentials" / "homeassistant.password").exists()
    assert "homeassistant" not in (out / "acl").read_text() and "homeassistant" not in (out / "passwd").read_text()
    assert "home_assistant" not in json.loads((out / "fedhar-broker.json").read_text())["settings"]


# ------------------------------------------------------------------------------------- the generator's edges
def test_an_old_folder_gains_the_monitor_account_and_keeps_everything_else(tmp_path):
    out = tmp_path / "broker"
    generate(out, "--federation", FED, "--clients", "hapt-01")
    before = {u: (out / "credentials" / f"{u}.password").read_text() for u in ("coordinator", "hapt-01")}
    # The folder as the generator wrote it before the monitor account existed.
    (out / "credentials" / "monitor.password").unlink()
    manifest = json.loads((out / "fedhar-broker.json").read_text())
    del manifest["settings"]["monitor_user"]
    (out / "fedhar-broker.json").write_text(json.dumps(manifest))
    doc = json.loads(generate(out).stdout)
    assert doc["added"] == ["monitor"] and doc["kept"] == ["coordinator", "hapt-01"] and doc["clients"] == ["hapt-01"]
    assert {u: (out / "credentials" / f"{u}.password").read_text() for u in before} == before
    assert "user monitor\ntopic read fedhar/v1/admintest/#\n" in (out / "acl").read_text()
    assert BrokerAdmin(out).monitor_credentials() == ("monitor", (out / "credentials" / "monitor.password").read_text().strip())


@pytest.mark.slow
def test_names_of_service_accounts_are_refused_for_devices(tmp_path):
    out = tmp_path / "broker"
    r = generate(out, "--federation", FED, "--clients", "monitor", check=False)
    assert r.returncode == 2 and "'monitor' is the monitor account's user name" in r.stderr and "--monitor-user" in r.stderr
    generate(out, "--federation", FED, "--clients", "hapt-01")
    with pytest.raises(BrokerAdminError, match="monitor account's user name"):
        BrokerAdmin(out, reload="none").add_device("monitor")
    with pytest.raises(BrokerAdminError, match="coordinator's user name"):
        BrokerAdmin(out, reload="none").add_device("coordinator")
    with pytest.raises(BrokerAdminError, match=r"client id 'bad/id' is invalid"):
        BrokerAdmin(out, reload="none").add_device("bad/id")
    r = generate(out, "--monitor-user", "watcher", check=False)
    assert r.returncode == 2 and "monitor-user 'monitor', not 'watcher'" in r.stderr
    # A folder from before the monitor account, with a device that happens to be called "monitor".
    old = tmp_path / "old"
    generate(old, "--federation", FED, "--clients", "monitor-x", "--monitor-user", "watcher")
    (old / "credentials" / "monitor-x.password").rename(old / "credentials" / "monitor.password")
    manifest = json.loads((old / "fedhar-broker.json").read_text())
    del manifest["settings"]["monitor_user"]
    manifest["clients"] = ["monitor"]
    (old / "fedhar-broker.json").write_text(json.dumps(manifest))
    r = generate(old, check=False)
    assert r.returncode == 2 and "a device named 'monitor'" in r.stderr and "--monitor-user fedhar-monitor" in r.stderr


def test_concurrent_additions_take_turns_on_the_folder(tmp_path):
    out = tmp_path / "broker"
    generate(out, "--federation", FED)
    admin = BrokerAdmin(out, reload="none")
    names = [f"hapt-{i:02d}" for i in range(1, 7)]
    passwords: dict[str, str] = {}
    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            passwords[name] = admin.add_device(name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert admin.devices() == names
    assert [ln.split(":", 1)[0] for ln in (out / "passwd").read_text().splitlines()] == ["coordinator", *names, "monitor"]
    assert {n: admin.password(n) for n in names} == passwords
    acl = (out / "acl").read_text()
    assert all(f"user {n}\n" in acl for n in names)


# ------------------------------------------------------------------------------------- a broker running as its own account
def test_replaced_passwd_and_acl_keep_the_group_the_broker_reads_them_through(tmp_path):
    others = [g for g in os.getgroups() if g != os.getegid()]
    gid = others[0] if others else (4242 if os.geteuid() == 0 else None)
    if gid is None:
        pytest.skip("needs a second group of this account (or root) to hand the files to")
    out = tmp_path / "broker"
    generate(out, "--federation", FED, "--clients", "hapt-01")
    for name in ("passwd", "acl"):
        os.chown(out / name, -1, gid)
        os.chmod(out / name, 0o640)
    admin = BrokerAdmin(out, reload="none")
    admin.add_device("hapt-02")
    admin.remove_device("hapt-01")
    for name in ("passwd", "acl"):
        st = (out / name).stat()
        assert (st.st_gid, st.st_mode & 0o777) == (gid, 0o640), name
    assert "hapt-02:" in (out / "passwd").read_text() and "user hapt-02" in (out / "acl").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="Mosquitto switches to its own account only when started as root")
def test_started_as_root_the_broker_writes_its_pid_file_and_reloads_as_its_own_account():
    """The Debian service's way: started as root, Mosquitto runs as ``mosquitto`` and writes its PID file as that account."""
    try:
        pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no 'mosquitto' account (it comes with Debian's mosquitto package)")
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="fedhar-broker-admin-"))  # pytest's folders are closed to other accounts
    try:
        top.chmod(0o755)
        out, port = top / "broker", free_port()
        _tool("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
        r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--federation", FED, "--clients", "hapt-01",
                            "--port", str(port), "--bind", "127.0.0.1"], capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
        assert r.returncode == 0, r.stderr
        with running(out, port) as b:
            pid_file = out / "data" / "mosquitto.pid"
            assert pid_file.stat().st_uid == pwd.getpwnam("mosquitto").pw_uid and int(pid_file.read_text()) == b.proc.pid
            admin = BrokerAdmin(out)
            password = admin.add_device("hapt-02")
            _wait_reloads(b, 1)
            p = Peer(port, "hapt-02", password)
            assert not p.connect().is_failure, "the broker's account can read the rewritten passwd"
            p.close()
            old = b.password("hapt-01")
            admin.remove_device("hapt-01")
            _wait_reloads(b, 2)
            assert str(Peer(port, "hapt-01", old).connect()) == "Not authorized"
        assert not pid_file.exists(), "Mosquitto removes its PID file when it stops"
    finally:
        shutil.rmtree(top, ignore_errors=True)
