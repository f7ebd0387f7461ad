"""A regional broker bridged to the coordinator's (issue 31, item 2): the rendered files, the command, two real Mosquittos.

The rendering tests read the text of the bridge section and the bridge account's ACL; the
command test writes both folders as an operator would; the broker tests start the two
generated Mosquittos on loopback (upstream: the coordinator's, regional: the devices') and
show what crosses the bridge, what the bridge account may not do, the same over TLS, and a
small federation round with the coordinator on one broker and its two clients on the other.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from support.mqtt_peer import MqttPeer
from support.secured_broker import make_pki
from support.small_federation import coordinator_args, processes, wait_or_stop

from coordinator.broker.bridge import bridge_user, init_bridge
from coordinator.broker.cli import main as broker_main
from coordinator.broker.render import acl_text, bridge_text, bridge_topics, config_text
from coordinator.broker.settings import UPSTREAM_SECRET, BrokerSettings, SetupError, read_settings
from har_models.wire.topics import Topics
from simulation.broker import free_port, free_ports, stop_process, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
ME = pwd.getpwuid(os.geteuid()).pw_name  # started as root, Mosquitto would switch to an account that cannot read tmp
P = "fedhar/v1/fx"


# ------------------------------------------------------------------------------------- rendering (pure)
def test_the_bridged_topics_are_the_protocols_in_their_direction_and_nothing_else() -> None:
    assert bridge_topics(Topics("fx")) == [
        (f"{P}/coordinator/status", "in"),
        (f"{P}/coordinator/outlook", "in"),
        (f"{P}/round", "in"),
        (f"{P}/progress", "in"),
        (f"{P}/model/global/+", "in"),
        (f"{P}/client/+/model/+", "in"),
        (f"{P}/client/+/receipt", "in"),
        (f"{P}/client/+/grant", "in"),
        (f"{P}/client/+/programs/+", "in"),
        (f"{P}/client/+/status", "out"),
        (f"{P}/client/+/update/+", "out"),
        (f"{P}/client/+/program_request", "out"),
    ]


def test_the_bridge_account_reads_what_comes_in_and_writes_what_goes_out() -> None:
    s = BrokerSettings("fx", bridge_users=("bridge-north",))
    text = acl_text(s, ["dev-1"])
    section = text[text.index("user bridge-north") :].strip().splitlines()
    assert section == [
        "user bridge-north",
        f"topic read {P}/coordinator/status",
        f"topic read {P}/coordinator/outlook",
        f"topic read {P}/round",
        f"topic read {P}/progress",
        f"topic read {P}/model/global/+",
        f"topic read {P}/client/+/model/+",
        f"topic read {P}/client/+/receipt",
        f"topic read {P}/client/+/grant",
        f"topic read {P}/client/+/programs/+",
        f"topic write {P}/client/+/status",
        f"topic write {P}/client/+/update/+",
        f"topic write {P}/client/+/program_request",
    ]
    assert "bridge" not in acl_text(BrokerSettings("fx"), ["dev-1"])  # a broker without bridges has no such section
    assert s.service_users == ["coordinator", "monitor", "bridge-north"]


def test_the_bridge_section_of_a_regional_brokers_configuration() -> None:
    s = BrokerSettings("fx", upstream="broker.example.org:8883", upstream_user="bridge-north")
    lines = bridge_text(s, "s3cret").strip().splitlines()
    settings = [ln for ln in lines if ln and not ln.startswith(("#", "topic "))]
    assert settings == [
        "connection fedhar-bridge-north",
        "address broker.example.org:8883",
        "bridge_protocol_version mqttv311",
        "try_private true",
        "cleansession false",
        "remote_clientid bridge-north",
        "remote_username bridge-north",
        "remote_password s3cret",
        "notifications false",
        "keepalive_interval 30",
        "restart_timeout 1 30",
    ]
    assert [ln for ln in lines if ln.startswith("topic ")] == [f"topic {t} {way} 1" for t, way in bridge_topics(Topics("fx"))]
    tls = bridge_text(replace(s, upstream_ca="/etc/fedhar/regional/tls/upstream-ca.crt"), "s3cret")
    assert "bridge_cafile /etc/fedhar/regional/tls/upstream-ca.crt\nbridge_insecure false\nbridge_tls_version tlsv1.2\n" in tls
    conf = config_text(s, Path("/r"), "s3cret")
    assert conf.index("listener 1883") < conf.index("connection fedhar-bridge-north")  # the bridge section comes last
    assert "\nconnection " not in config_text(BrokerSettings("fx"), Path("/r"))


def test_rendering_refuses_a_bridge_without_its_address_or_password() -> None:
    with pytest.raises(ValueError, match=r"settings\.upstream and settings\.upstream_user are required"):
        bridge_text(BrokerSettings("fx"), "pw")
    s = BrokerSettings("fx", upstream="h:1883", upstream_user="bridge-a")
    with pytest.raises(ValueError, match="one non-empty line"):
        bridge_text(s, "pw\nconnection evil")
    with pytest.raises(ValueError, match="needs its bridge password"):
        config_text(s, Path("/r"))
    with pytest.raises(ValueError, match="needs its bridge password"):
        config_text(BrokerSettings("fx"), Path("/r"), "pw")
    with pytest.raises(SetupError, match="expected HOST:PORT"):
        _ = BrokerSettings("fx", upstream="h:99999", upstream_user="bridge-a").upstream_address
    assert BrokerSettings("fx", upstream="[::1]:1883", upstream_user="bridge-a").upstream_address == ("::1", 1883)


# ------------------------------------------------------------------------------------- the command
def _mosquitto_tools() -> str:
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None)
    if exe is None or not (shutil.which("mosquitto_passwd") or os.access("/usr/bin/mosquitto_passwd", os.X_OK)):
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    return exe


def _pair(tmp: Path, clients: str = "hapt-01,hapt-02", *extra: str, upstream_tls: bool = False) -> tuple[Path, Path, int, int]:
    """Write the upstream folder (``broker init``) and the regional one (``broker bridge init``); (up, reg, up port, reg port)."""
    up, reg = tmp / "upstream", tmp / "regional"
    up_port, reg_port = free_ports(2)
    init = ["init", "--out", str(up), "--federation", "fx", "--port", str(up_port), "--bind", "127.0.0.1", "--broker-user", ME]
    upstream = f"127.0.0.1:{up_port}"
    bridge_tls: list[str] = []
    if upstream_tls:
        ca, crt, key, _ = make_pki(tmp / "pki")
        tls_port = free_port()
        init += ["--tls-cert", str(crt), "--tls-key", str(key), "--tls-ca", str(ca), "--tls-port", str(tls_port), "--tls-bind", "127.0.0.1"]
        upstream, bridge_tls = f"127.0.0.1:{tls_port}", ["--upstream-ca", str(ca)]
    assert broker_main(init) == 0
    assert broker_main(["bridge", "init", "--out", str(reg), "--upstream-dir", str(up), "--upstream", upstream, "--name", "north",
                        *bridge_tls, "--clients", clients, "--port", str(reg_port), "--bind", "127.0.0.1", "--broker-user", ME,
                        *extra]) == 0  # fmt: skip
    return up, reg, up_port, reg_port


def _password(folder: Path, user: str) -> str:
    return (folder / "credentials" / f"{user}.password").read_text().strip()


def test_bridge_init_writes_the_account_upstream_and_the_regional_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _mosquitto_tools()
    up, reg, up_port, _ = _pair(tmp_path)
    assert "bridge account bridge-north (new)" in capsys.readouterr().out
    assert read_settings(up).bridge_users == ("bridge-north",)
    assert "bridge-north:" in (up / "passwd").read_text()
    password = _password(up, "bridge-north")
    conf = reg / "mosquitto.conf"
    assert f"remote_password {password}\n" in conf.read_text() and f"address 127.0.0.1:{up_port}\n" in conf.read_text()
    assert conf.stat().st_mode & 0o777 == 0o600  # it holds a password
    assert (reg / UPSTREAM_SECRET).read_text().strip() == password
    regional = read_settings(reg)
    assert (regional.federation, regional.upstream_user, regional.upstream) == ("fx", "bridge-north", f"127.0.0.1:{up_port}")
    assert json.loads((reg / "fedhar-broker.json").read_text())["clients"] == ["hapt-01", "hapt-02"]
    assert "hapt-01" not in (up / "passwd").read_text()  # devices have accounts on their regional broker only

    # The regional folder is managed like any other: a device added there keeps the bridge.
    assert broker_main(["add", "--out", str(reg), "hapt-03"]) == 0
    assert f"remote_password {password}\n" in conf.read_text() and "hapt-03:" in (reg / "passwd").read_text()
    # A re-run keeps the bridge's password; a rotated one upstream reaches the regional folder on the next run.
    init_bridge(reg, up, f"127.0.0.1:{up_port}", "north", {}, [])
    assert _password(up, "bridge-north") == password
    assert broker_main(["rotate", "--out", str(up), "bridge-north"]) == 0
    fresh = _password(up, "bridge-north")
    assert fresh != password
    init_bridge(reg, up, f"127.0.0.1:{up_port}", "north", {}, [])
    assert f"remote_password {fresh}\n" in conf.read_text()


def test_bridge_init_refuses_what_cannot_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _mosquitto_tools()
    with pytest.raises(SetupError, match=r"holds no fedhar-broker\.json|does not exist"):
        init_bridge(tmp_path / "r", tmp_path / "nothing", "127.0.0.1:1883", "north", {}, [])
    up, reg, up_port, _ = _pair(tmp_path)
    with pytest.raises(SetupError, match="the upstream broker serves federation 'fx'"):
        init_bridge(reg, up, f"127.0.0.1:{up_port}", "north", {"federation": "other"}, [])
    with pytest.raises(SetupError, match="the regional broker needs its own folder"):
        init_bridge(up, up, f"127.0.0.1:{up_port}", "north", {}, [])
    with pytest.raises(SetupError, match="expected HOST:PORT"):
        init_bridge(tmp_path / "r2", up, "no-port", "south", {}, [])
    with pytest.raises(SetupError, match="--name"):
        bridge_user("bad/name")
    assert broker_main(["add", "--out", str(up), "bridge-north"]) == 2  # a device may not take the bridge's name upstream
    assert "'bridge-north' is a regional broker's bridge account" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- two real Mosquittos
@contextmanager
def _running(folder: Path, *ports: int) -> Iterator[Path]:
    """Mosquitto on the generated ``folder``'s configuration until the block ends; yields its log."""
    exe = _mosquitto_tools()
    log = folder.parent / f"{folder.name}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([exe, "-c", str(folder / "mosquitto.conf"), "-v"], stdout=sink, stderr=subprocess.STDOUT)
    try:
        for port in ports:
            assert wait_for_port("127.0.0.1", port, 10), log.read_text()
        yield log
    finally:
        stop_process(proc)


def _bridged(log: Path, timeout: float = 15.0) -> None:
    """Wait until the upstream broker's ``log`` shows the bridge connected (the regional broker retries every 1-30 s)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if "New bridge connected" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"the bridge did not connect within {timeout} s:\n{log.read_text()[-3000:]}")


def _crossing(up_port: int, reg_port: int, up: Path, reg: Path) -> None:
    """A device's status and update reach the coordinator; its round, model and receipt reach the device; others do not."""
    coord = MqttPeer(up_port, "coordinator", _password(up, "coordinator"))
    dev = MqttPeer(reg_port, "hapt-01", _password(reg, "hapt-01"))
    try:
        coord.connect()
        dev.connect()
        coord.subscribe(f"{P}/#")
        coord.publish(f"{P}/round", b"round 0", retain=True)
        coord.publish(f"{P}/model/global/0", b"chunk 0", retain=True)
        coord.publish(f"{P}/unbridged", b"stays upstream", retain=True)
        time.sleep(0.5)
        dev.subscribe(f"{P}/round", f"{P}/model/global/+", f"{P}/client/hapt-01/receipt")
        dev.expect(f"{P}/round", b"round 0")  # retained, with its retain flag kept by the bridge
        dev.expect(f"{P}/model/global/0", b"chunk 0")
        dev.publish(f"{P}/client/hapt-01/status", b'{"state": "online"}', retain=True)
        dev.publish(f"{P}/client/hapt-01/update/0", b"update chunk 0")
        coord.expect(f"{P}/client/hapt-01/status", b'{"state": "online"}')
        coord.expect(f"{P}/client/hapt-01/update/0", b"update chunk 0")
        coord.publish(f"{P}/client/hapt-01/receipt", b"counted")
        dev.expect(f"{P}/client/hapt-01/receipt", b"counted")
    finally:
        coord.close()
        dev.close()
    # A device that joins later finds the retained round on its regional broker; the unbridged topic never arrived there.
    late = MqttPeer(reg_port, "monitor", _password(reg, "monitor"))
    try:
        late.connect()
        late.subscribe(f"{P}/#")
        seen = dict(late.settle())
        assert seen.get(f"{P}/round") == b"round 0" and f"{P}/unbridged" not in seen
    finally:
        late.close()


@pytest.mark.mosquitto
def test_messages_cross_the_bridge_in_their_direction_only(tmp_path: Path) -> None:
    up, reg, up_port, reg_port = _pair(tmp_path)
    with _running(up, up_port) as up_log, _running(reg, reg_port):
        _bridged(up_log)
        _crossing(up_port, reg_port, up, reg)


@pytest.mark.mosquitto
def test_the_bridge_account_may_only_forward(tmp_path: Path) -> None:
    """Logged in upstream as the bridge (the regional broker is not running: one session per user name), it can
    neither announce a round nor speak for the coordinator nor read the updates of devices it does not carry."""
    up, _reg, up_port, _ = _pair(tmp_path)
    with _running(up, up_port):
        bridge = MqttPeer(up_port, "bridge-north", _password(up, "bridge-north"))
        coord = MqttPeer(up_port, "coordinator", _password(up, "coordinator"))
        try:
            bridge.connect()
            coord.connect()
            coord.subscribe(f"{P}/#")
            bridge.subscribe(f"{P}/client/+/update/+", f"{P}/client/+/status")
            bridge.publish(f"{P}/round", b"forged round", retain=True)  # Mosquitto acknowledges and drops
            bridge.publish(f"{P}/coordinator/status", b"offline")
            bridge.publish(f"{P}/client/hapt-01/status", b"online")  # allowed: what a device's status crossing looks like
            coord.publish(f"{P}/client/hapt-02/update/0", b"not for the bridge")
            coord.publish(f"{P}/client/hapt-02/status", b"not for the bridge either")
            coord.expect(f"{P}/client/hapt-01/status", b"online")
            got = coord.settle()
            assert (f"{P}/round", b"forged round") not in got and (f"{P}/coordinator/status", b"offline") not in got
            assert bridge.settle() == []
        finally:
            bridge.close()
            coord.close()


@pytest.mark.slow
@pytest.mark.mosquitto
def test_the_bridge_connects_over_tls_checked_with_the_upstream_ca(tmp_path: Path) -> None:
    up, reg, up_port, reg_port = _pair(tmp_path, upstream_tls=True)
    conf = (reg / "mosquitto.conf").read_text()
    assert f"bridge_cafile {reg / 'tls' / 'upstream-ca.crt'}\n" in conf
    tls_port = read_settings(up).tls_port
    with _running(up, up_port, tls_port) as up_log, _running(reg, reg_port):
        _bridged(up_log)
        lines = up_log.read_text().splitlines()
        bridged = next(i for i, ln in enumerate(lines) if "New bridge connected" in ln)
        came = [ln for ln in lines[:bridged] if "New connection from" in ln][-1]  # earlier ones: the port probes
        assert came.endswith(f"on port {tls_port}."), came  # the bridge came in over TLS
        _crossing(up_port, reg_port, up, reg)


@pytest.mark.slow
@pytest.mark.mosquitto
@pytest.mark.parametrize("transport", ["mqtt", "blobs"])
def test_a_federation_round_runs_across_the_bridge(tmp_path: Path, transport: str) -> None:
    """The coordinator on the upstream broker, two fedhar-client processes on the regional one: one round, both updates.

    In both transports: over blobs only the control messages cross the bridge (the grants
    included), and the clients fetch the model from and upload to the coordinator's store.
    """
    up, reg, up_port, reg_port = _pair(tmp_path)
    logs = {name: tmp_path / f"{name}.log" for name in ("coordinator", "hapt-01", "hapt-02")}
    with _running(up, up_port) as up_log, _running(reg, reg_port), processes() as procs:
        _bridged(up_log)
        for i, cid in enumerate(("hapt-01", "hapt-02")):
            cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", cid, "--source", f"hapt:{HAPT}/user{i + 1:02d}.npz",
                   "--state-dir", str(tmp_path / cid), "--broker", f"127.0.0.1:{reg_port}", "--federation", "fx",
                   "--username", cid, "--password-file", str(reg / "credentials" / f"{cid}.password"), "--threads", "1",
                   "--exit-after-run", "bridged", "--max-seconds", "300"]  # fmt: skip
            with open(logs[cid], "ab") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))
        cmd = [sys.executable, "-m", "coordinator.cli", "--run-id", "bridged", "--run-dir", str(tmp_path / "run"),
               "--broker", f"127.0.0.1:{up_port}", "--federation", "fx", "--username", "coordinator",
               "--password-file", str(up / "credentials" / "coordinator.password"), *coordinator_args(round_timeout_s=150),
               "--rounds", "1", "--local-epochs", "1", "--expected-clients", "2", "--transport", transport]  # fmt: skip
        with open(logs["coordinator"], "ab") as out:
            coord = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        procs.append(coord)
        assert wait_or_stop(coord, 300, logs["coordinator"]) == 0, logs["coordinator"].read_text()[-3000:]
        for p in procs[:2]:
            wait_or_stop(p, 60, logs["hapt-01"])
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [(r["round"], r["selected"], r["updates"], r["rejected"]) for r in doc["rounds"]] == [(0, 2, 2, 0)]
    for cid in ("hapt-01", "hapt-02"):
        assert "the coordinator confirmed the update" in logs[cid].read_text()
    assert doc["config"]["transport"]["kind"] == transport
    objects = tmp_path / "run" / "blobs" / "objects"
    assert (len(list(objects.iterdir())) if objects.is_dir() else 0) == (1 if transport == "blobs" else 0)
