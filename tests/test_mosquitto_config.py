"""firmware_scripts/mosquitto_config.py (the wrapper of :mod:`coordinator.broker`) writes a Mosquitto configuration that a real
Mosquitto enforces.

Every check runs real MQTT 3.1.1 traffic (paho-mqtt 2.x) through a Mosquitto started on a free
loopback port with the generated files. Mosquitto drops an ACL-denied publish silently (the
publisher still gets its PUBACK), so "not delivered" is asserted after a positive control
message, published later on the same path, has arrived: QoS 1 messages from one publisher
reach a subscriber in order.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.mqtt_peer import QUIET_S, WAIT_S
from support.mqtt_peer import MqttPeer as Peer
from support.small_federation import run_simulation

from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from simulation.broker import free_port, free_ports, stop_process, wait_for_port

pytestmark = pytest.mark.mosquitto  # a generated Mosquitto configuration run by a real Mosquitto

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "firmware_scripts" / "mosquitto_config.py"
FED = "acltest"
P = f"fedhar/v1/{FED}"
# Started as root, Mosquitto switches to its `user` account, which cannot enter pytest's private
# tmp folders; naming the account the tests run as keeps the broker on it.
ME = pwd.getpwuid(os.geteuid()).pw_name


def _tool(name: str, *extra: str) -> str:
    """Path of a Mosquitto binary; skip (or fail under FEDHAR_REQUIRE_MOSQUITTO=1) when it is missing."""
    found = shutil.which(name) or next((p for p in extra if os.access(p, os.X_OK)), None)
    if found is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail(f"{name} is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip(f"{name} not installed (apt-get install mosquitto)")
    return found


def _mosquitto() -> str:
    _tool("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
    return _tool("mosquitto", "/usr/sbin/mosquitto")


def generate(out: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the generator as an operator would (``--json`` output)."""
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--broker-user", ME, "--public-host", "127.0.0.1", "--json", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@dataclass
class Broker:
    """A running Mosquitto on the generated configuration in ``out``."""

    out: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def password(self, user: str) -> str:
        return (self.out / "credentials" / f"{user}.password").read_text().strip()

    def reload(self) -> None:
        """SIGHUP (re-read passwd and acl) and wait until the broker says so."""
        before = self.log.read_text().count("Reloading config")
        self.proc.send_signal(signal.SIGHUP)
        end = time.monotonic() + WAIT_S
        while self.log.read_text().count("Reloading config") == before:
            assert time.monotonic() < end, "mosquitto did not reload"
            time.sleep(0.05)


@contextmanager
def running(out: Path, *ports: int) -> Iterator[Broker]:
    """Start Mosquitto on ``out/mosquitto.conf``; wait until every port in ``ports`` accepts connections."""
    exe = _mosquitto()
    log = out.parent / f"{out.name}-mosquitto.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([exe, "-c", str(out / "mosquitto.conf")], stdout=sink, stderr=subprocess.STDOUT)
    try:
        for port in ports:
            if not wait_for_port("127.0.0.1", port, 10):
                pytest.fail(f"mosquitto did not listen on {port}; log:\n{log.read_text()}")
        yield Broker(out, ports[0], proc, log)
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """Federation ``acltest`` with devices hapt-01 and hapt-02 on a generated, running Mosquitto."""
    _mosquitto()
    out = tmp_path_factory.mktemp("mosq") / "broker"
    port = free_port()
    generate(out, "--federation", FED, "--clients", "hapt-01,hapt-02", "--port", str(port), "--bind", "127.0.0.1")
    with running(out, port) as b:
        yield b


@pytest.fixture
def peer(broker: Broker) -> Iterator[Callable[..., Peer]]:
    """Connected sessions on :func:`broker` as a user (its own password unless given); closed after the test."""
    made: list[Peer] = []

    def connect(user: str, password: str | None = None, **kw: Any) -> Peer:
        p = Peer(broker.port, user, broker.password(user) if password is None else password, **kw)
        made.append(p)
        assert p.joins(), f"{user} could not log in"
        return p

    yield connect
    for p in made:
        p.close()


def _token() -> bytes:
    return uuid.uuid4().hex.encode()


# ------------------------------------------------------------------------------------- the files
def test_generated_files_hash_passwords_and_keep_them_private(broker):
    out = broker.out
    users = ["coordinator", "hapt-01", "hapt-02", "monitor"]  # passwd is sorted by user name
    passwd = (out / "passwd").read_text().splitlines()
    assert [ln.split(":", 1)[0] for ln in passwd] == users
    for user, line in zip(users, passwd, strict=True):
        assert line.split(":", 1)[1].startswith("$"), "mosquitto_passwd hashes every password"
        assert broker.password(user) not in line
        assert len(broker.password(user)) >= 32
        assert (out / "credentials" / f"{user}.password").stat().st_mode & 0o777 == 0o600
    assert (out / "credentials").stat().st_mode & 0o777 == 0o700
    conf = (out / "mosquitto.conf").read_text().splitlines()
    for line in ("allow_anonymous false", "per_listener_settings false", f"password_file {out / 'passwd'}",
                 f"acl_file {out / 'acl'}", "max_packet_size 1065536", f"persistence_location {out / 'data'}/",
                 f"listener {broker.port} 127.0.0.1", "use_username_as_clientid true"):  # fmt: skip
        assert line in conf
    # No listener the configuration does not name (an option in the wrong place opens one on 1883).
    opened = {ln.rsplit("port ", 1)[1].rstrip(".") for ln in broker.log.read_text().splitlines() if "listen socket on port" in ln}
    assert opened == {str(broker.port)}
    warnings = [ln for ln in broker.log.read_text().splitlines() if "Warning" in ln and "run as root" not in ln]
    assert warnings == [], "e.g. an ACL line or an option Mosquitto does not accept"


def test_acl_rules_are_exactly_these(broker):
    rules = [ln for ln in (broker.out / "acl").read_text().splitlines() if ln and not ln.startswith("#")]

    def device(cid: str) -> list[str]:
        c = f"{P}/client/{cid}"
        return [
            f"user {cid}", f"topic read {P}/round", f"topic read {P}/coordinator/status", f"topic read {P}/coordinator/outlook",
            f"topic read {P}/model/global/+",
            f"topic read {c}/model/+", f"topic read {c}/receipt", f"topic read {c}/grant", f"topic readwrite {c}/status",
            f"topic write {c}/update/+",
            f"topic write {c}/program_request", f"topic read {c}/programs/+",
        ]  # fmt: skip

    # No `pattern` line: it would apply to the monitor too (a writable {P}/client/monitor/status).
    assert rules == [
        "user coordinator", f"topic readwrite {P}/#",
        "user monitor", f"topic read {P}/#",
        *device("hapt-01"),
        *device("hapt-02"),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------- authentication
def test_anonymous_unknown_and_wrong_password_are_refused(broker):
    assert not Peer(broker.port, None, None).joins()
    assert not Peer(broker.port, "hapt-01", "wrong-password").joins()
    assert not Peer(broker.port, "hapt-01", broker.password("hapt-02")).joins()
    assert not Peer(broker.port, "hapt-99", broker.password("hapt-01")).joins()


# ------------------------------------------------------------------------------------- what a device may do
def test_device_publishes_its_status_and_update_and_the_coordinator_receives_them(peer):
    coord = peer("coordinator")
    coord.subscribe(f"{P}/client/+/status", f"{P}/client/+/update/+")
    dev = peer("hapt-01", client_id="fedhar-client-hapt-01")
    status, chunk = _token(), _token()
    dev.publish(f"{P}/client/hapt-01/status", status, retain=True)
    dev.publish(f"{P}/client/hapt-01/update/0", chunk)
    coord.expect(f"{P}/client/hapt-01/status", status)
    coord.expect(f"{P}/client/hapt-01/update/0", chunk)


def test_device_reads_round_coordinator_status_global_model_and_its_own_model(peer):
    coord = peer("coordinator")
    t = _token()
    allowed = [f"{P}/round", f"{P}/coordinator/status", f"{P}/model/global/0", f"{P}/client/hapt-01/model/0"]
    for topic in allowed:
        coord.publish(topic, t + topic.encode(), retain=True)
    dev = peer("hapt-01")
    # The filters the edge client subscribes to (edge_client/agent.py), plus the coordinator's presence.
    dev.subscribe(f"{P}/round", f"{P}/model/global/+", f"{P}/client/hapt-01/model/+", f"{P}/coordinator/status")
    for topic in allowed:
        dev.expect(topic, t + topic.encode())


def test_a_device_cannot_publish_under_another_id_or_as_the_coordinator(peer):
    coord = peer("coordinator")
    coord.subscribe(f"{P}/#")
    dev = peer("hapt-01")
    denied = _token()
    forbidden = [
        f"{P}/client/hapt-02/update/0",
        f"{P}/client/hapt-02/status",
        f"{P}/round",
        f"{P}/model/global/0",
        f"{P}/coordinator/status",
        f"{P}/client/hapt-01/model/0",  # its own personalised model is the coordinator's to write
        f"{P}/client/hapt-01/other",
        "fedhar/v1/otherfed/client/hapt-01/update/0",
    ]
    for topic in forbidden:
        dev.publish(topic, denied)
    control = _token()
    dev.publish(f"{P}/client/hapt-01/update/1", control)
    coord.expect(f"{P}/client/hapt-01/update/1", control)
    leaked = [topic for topic, payload in coord.settle() if payload == denied]
    assert leaked == []
    # A retained forgery would also reach later subscribers; none was stored.
    late = peer("hapt-02")
    late.subscribe(f"{P}/client/hapt-02/#", f"{P}/round", f"{P}/model/global/+")
    assert [m for m in late.settle() if m[1] == denied] == []


def test_a_device_cannot_read_another_devices_model_status_or_updates(peer):
    coord = peer("coordinator")
    theirs, mine, status = _token(), _token(), _token()
    coord.publish(f"{P}/client/hapt-02/model/0", theirs, retain=True)
    coord.publish(f"{P}/client/hapt-01/model/0", mine, retain=True)
    other = peer("hapt-02")
    other.publish(f"{P}/client/hapt-02/status", status, retain=True)
    other.subscribe(f"{P}/client/hapt-02/model/#")
    other.expect(f"{P}/client/hapt-02/model/0", theirs)  # the owner does receive it

    dev = peer("hapt-01")
    dev.subscribe(f"{P}/client/hapt-02/model/#", f"{P}/client/+/status", f"{P}/client/hapt-02/#", f"{P}/#")
    dev.subscribe(f"{P}/client/hapt-01/model/+")
    dev.expect(f"{P}/client/hapt-01/model/0", mine)
    update = _token()
    other.publish(f"{P}/client/hapt-02/update/0", update)
    control = _token()
    coord.publish(f"{P}/client/hapt-01/model/1", control)
    dev.expect(f"{P}/client/hapt-01/model/1", control)
    got = {payload for _, payload in dev.settle()}
    assert theirs not in got and status not in got and update not in got


def test_a_device_asks_for_programs_and_reads_only_its_own(peer):
    coord = peer("coordinator")
    coord.subscribe(f"{P}/client/+/program_request")
    dev = peer("hapt-01")
    dev.subscribe(f"{P}/client/hapt-01/programs/+")
    other = peer("hapt-02")
    other.subscribe(f"{P}/client/hapt-01/programs/+", f"{P}/client/hapt-02/programs/+")
    ask, forged = _token(), _token()
    dev.publish(f"{P}/client/hapt-01/program_request", ask)
    other.publish(f"{P}/client/hapt-01/program_request", forged)  # asking in another device's name is denied
    coord.expect(f"{P}/client/hapt-01/program_request", ask)
    mine, control = _token(), _token()
    coord.publish(f"{P}/client/hapt-01/programs/0", mine)
    coord.publish(f"{P}/client/hapt-02/programs/0", control)
    dev.expect(f"{P}/client/hapt-01/programs/0", mine)
    other.expect(f"{P}/client/hapt-02/programs/0", control)
    assert mine not in {payload for _, payload in other.settle()}  # another device's programs never reach it
    assert forged not in {payload for _, payload in coord.settle()}


def test_a_forged_last_will_is_not_delivered(peer, broker):
    coord = peer("coordinator")
    coord.subscribe(f"{P}/client/+/status")
    forged, own = _token(), _token()
    liar = Peer(broker.port, "hapt-01", broker.password("hapt-01"))
    if liar.joins(will=(f"{P}/client/hapt-02/status", forged), background=False):  # Mosquitto 2.0 accepts it, drops the will
        liar.vanish()
    honest = Peer(broker.port, "hapt-01", broker.password("hapt-01"))
    assert honest.joins(will=(f"{P}/client/hapt-01/status", own), background=False)
    honest.vanish()
    coord.expect(f"{P}/client/hapt-01/status", own)
    assert forged not in {payload for _, payload in coord.settle()}


def test_a_device_cannot_take_over_another_devices_session(peer):
    coord = peer("coordinator")
    coord.subscribe(f"{P}/client/+/status")
    victim = peer("hapt-02", client_id="fedhar-client-hapt-02")
    peer("hapt-01", client_id="fedhar-client-hapt-02")  # claims the victim's MQTT client id
    assert not victim.dropped.wait(QUIET_S)
    alive = _token()
    victim.publish(f"{P}/client/hapt-02/status", alive, retain=True)
    coord.expect(f"{P}/client/hapt-02/status", alive)


def test_packets_up_to_fedhars_chunk_size_pass_and_larger_ones_are_cut(peer):
    coord = peer("coordinator")
    coord.subscribe(f"{P}/client/+/update/+")
    dev = peer("hapt-01")
    chunk = os.urandom(1_000_000)  # the programs' default --max-message-bytes
    dev.publish(f"{P}/client/hapt-01/update/0", chunk)
    coord.expect(f"{P}/client/hapt-01/update/0", chunk)
    dev.client.publish(f"{P}/client/hapt-01/update/1", os.urandom(1_065_537), qos=1)
    assert dev.dropped.wait(WAIT_S), "the broker disconnects a client that sends a packet over max_packet_size"
    assert all(topic != f"{P}/client/hapt-01/update/1" for topic, _ in coord.settle())


# ------------------------------------------------------------------------------------- re-running the generator
def test_rerun_adds_devices_keeps_passwords_and_settings_rotates_and_revokes(tmp_path):
    out = tmp_path / "broker"
    port = free_port()
    first = json.loads(generate(out, "--federation", "home", "--clients", "hapt-01", "--port", str(port), "--bind", "127.0.0.1").stdout)
    assert first["added"] == ["coordinator", "monitor", "hapt-01"]
    before = {u: Path(f).read_text() for u, f in first["password_files"].items()}
    with running(out, port) as b:
        (tmp_path / "more.txt").write_text("# kitchen devices\nhapt-02, hapt-03\n\n")
        second = json.loads(generate(out, "--clients-file", str(tmp_path / "more.txt")).stdout)
        assert second["added"] == ["hapt-02", "hapt-03"] and second["kept"] == ["coordinator", "monitor", "hapt-01"]
        assert second["settings"]["port"] == port and second["settings"]["federation"] == "home"
        assert {u: Path(second["password_files"][u]).read_text() for u in before} == before
        assert not Peer(port, "hapt-02", b.password("hapt-02")).joins(), "not before the broker reloads"
        b.reload()
        for user in ("coordinator", "hapt-01", "hapt-02", "hapt-03"):
            p = Peer(port, user, b.password(user))
            assert p.joins(), user
            p.close()

        old = b.password("hapt-01")
        third = json.loads(generate(out, "--rotate", "hapt-01").stdout)
        assert third["rotated"] == ["hapt-01"] and b.password("hapt-01") != old
        assert b.password("coordinator") == before["coordinator"].strip()
        b.reload()
        assert not Peer(port, "hapt-01", old).joins()
        assert Peer(port, "hapt-01", b.password("hapt-01")).joins()

        revoked_pw = b.password("hapt-02")
        fourth = json.loads(generate(out, "--revoke", "hapt-02").stdout)
        assert fourth["revoked"] == ["hapt-02"] and fourth["clients"] == ["hapt-01", "hapt-03"]
        assert not (out / "credentials" / "hapt-02.password").exists()
        assert "user hapt-02" not in (out / "acl").read_text()
        b.reload()
        assert not Peer(port, "hapt-02", revoked_pw).joins()


def test_clear_errors(tmp_path, monkeypatch):
    r = generate(tmp_path / "a", "--federation", "home", "--clients", "ok-1,bad/id", check=False)
    assert r.returncode == 2 and "'bad/id'" in r.stderr and "letters, digits" in r.stderr
    r = generate(tmp_path / "a", "--clients", "x", check=False)
    assert r.returncode == 2 and "--federation is required" in r.stderr
    r = generate(tmp_path / "a", "--federation", "home", "--tls-cert", str(tmp_path / "none.crt"), check=False)
    assert r.returncode == 2 and "--tls-key" in r.stderr
    r = generate(tmp_path / "a", "--federation", "home", "--tls-cert", "no.crt", "--tls-key", "no.key", check=False)
    assert r.returncode == 2 and "no.crt" in r.stderr and "openssl" in r.stderr
    assert not (tmp_path / "a").exists(), "nothing is written when the arguments are wrong"

    # mosquitto_passwd is missing: say how to get it.
    from coordinator.broker import passwords as mod
    monkeypatch.setattr(mod.shutil, "which", lambda *_a, **_k: None)
    monkeypatch.setattr(mod.os, "access", lambda *_a, **_k: False)
    with pytest.raises(mod.SetupError, match=r"install Mosquitto.*apt-get install mosquitto") as err:
        mod.find_mosquitto_passwd()
    assert err.value.exit_code == 3
    monkeypatch.undo()

    _mosquitto()
    generate(tmp_path / "b", "--federation", "home", "--clients", "hapt-01")
    r = generate(tmp_path / "b", "--federation", "work", check=False)
    assert r.returncode == 2 and "'home'" in r.stderr and "'work'" in r.stderr
    r = generate(tmp_path / "b", "--clients", "coordinator", check=False)
    assert r.returncode == 2 and "coordinator's user name" in r.stderr
    r = generate(tmp_path / "b", "--revoke", "hapt-77", check=False)
    assert r.returncode == 2 and "hapt-77" in r.stderr


def test_the_printed_commands_use_the_generated_credentials(tmp_path):
    _mosquitto()
    doc = json.loads(generate(tmp_path / "c", "--federation", "home", "--clients", "hapt-01", "--port", "1999").stdout)
    cmd = doc["commands"]
    assert cmd["broker"] == f"mosquitto -c {tmp_path / 'c' / 'mosquitto.conf'}"
    assert f"--username coordinator --password-file {tmp_path / 'c' / 'credentials' / 'coordinator.password'}" in cmd["coordinator"]
    assert "--broker 127.0.0.1:1999" in cmd["clients"]["hapt-01"] and "--username hapt-01" in cmd["clients"]["hapt-01"]
    text = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "c")], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and cmd["coordinator"] in text.stdout and "no TLS" in text.stderr


# ------------------------------------------------------------------------------------- TLS
@pytest.mark.slow
def test_tls_listener_with_openssl_made_certificates(tmp_path):
    _mosquitto()
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path / "pki"
    d.mkdir()

    def openssl(*args: str) -> None:
        r = subprocess.run(["openssl", *args], cwd=d, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr

    # The recipe from the generator's --help, for the broker's name 127.0.0.1.
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=fedhar CA",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr")
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "30",
        "-extfile", "server.ext", "-out", "server.crt")  # fmt: skip
    out, (port, tls_port) = tmp_path / "broker", free_ports(2)
    generate(out, "--federation", FED, "--clients", "hapt-01", "--port", str(port), "--tls-port", str(tls_port),
             "--tls-bind", "127.0.0.1", "--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key"),
             "--tls-ca", str(d / "ca.crt"))  # fmt: skip
    conf = (out / "mosquitto.conf").read_text().splitlines()
    assert f"listener {port} 127.0.0.1" in conf, "with TLS the plain listener stays on loopback"
    # The broker reads copies in out/tls/ (where it may read them), not the files where they were made.
    tls = out.resolve() / "tls"
    assert [ln for ln in conf if ln.split(" ")[0] in ("certfile", "keyfile", "cafile")] == [
        f"certfile {tls / 'server.crt'}", f"keyfile {tls / 'server.key'}", f"cafile {tls / 'ca.crt'}"
    ]
    for name in ("server.crt", "server.key", "ca.crt"):
        assert (tls / name).read_bytes() == (d / name).read_bytes()
    assert (tls / "server.key").stat().st_mode & 0o777 in (0o640, 0o600) and (tls / "ca.crt").stat().st_mode & 0o777 == 0o644
    (d / "server.key").unlink()  # the operator deletes the key where it was made; the broker keeps working
    generate(out, "--clients", "hapt-02")  # a re-run without the TLS options keeps the copies
    assert f"keyfile {tls / 'server.key'}" in (out / "mosquitto.conf").read_text().splitlines()
    assert json.loads((out / "fedhar-broker.json").read_text())["settings"]["tls_key"] == str(tls / "server.key")
    # Strict X.509 checks, as Python 3.13 makes the default, so the recipe keeps working there.
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    with running(out, port, tls_port) as b:
        coord = Peer(port, "coordinator", b.password("coordinator"))
        assert coord.joins()
        coord.subscribe(f"{P}/client/+/status")
        dev = Peer(tls_port, "hapt-01", b.password("hapt-01"), tls=ctx)
        assert dev.joins()
        hello = _token()
        dev.publish(f"{P}/client/hapt-01/status", hello)
        coord.expect(f"{P}/client/hapt-01/status", hello)
        assert not Peer(tls_port, "hapt-01", "wrong", tls=ctx).joins()
        dev.close()
        # The programs' own adapter, configured as `fedhar-client --tls-ca ca.crt` configures it.
        link = MqttLink(BrokerConfig(port=tls_port, username="hapt-01", password=b.password("hapt-01"), tls_ca=str(d / "ca.crt")),
                        "fedhar-client-hapt-01")  # fmt: skip
        assert link.start(wait_s=WAIT_S)
        again = _token()
        link.publish(f"{P}/client/hapt-01/status", again, timeout=WAIT_S)
        coord.expect(f"{P}/client/hapt-01/status", again)
        link.stop()
        coord.close()


# ------------------------------------------------------------------------------------- a federation round
@pytest.mark.slow
def test_a_simulation_runs_on_the_generated_broker_with_per_device_accounts(tmp_path):
    """``fedhar-simulate --broker ... --credentials-dir`` logs every client in as its own id."""
    _mosquitto()
    out, port = tmp_path / "broker", free_port()
    generate(out, "--federation", "e2e", "--clients", "hapt-01,hapt-02", "--port", str(port), "--bind", "127.0.0.1")
    with running(out, port):
        doc = run_simulation(tmp_path / "run", "--broker", f"127.0.0.1:{port}", "--credentials-dir", str(out / "credentials"),
                             "--federation", "e2e", "--rounds", "1", run_id="acl-e2e", clients=2, dense_units=16,
                             start_timeout_s=60, round_timeout_s=60, generalisation_every=None)  # fmt: skip
    assert [(r["round"], r["updates"], r["rejected"]) for r in doc["rounds"]] == [(0, 2, 0)]
    logs = "".join(f.read_text() for f in (tmp_path / "run" / "logs").glob("*.log"))  # one log per worker process
    for cid in ("hapt-01", "hapt-02"):
        assert f"[{cid}] stopped after 1 round(s)" in logs
