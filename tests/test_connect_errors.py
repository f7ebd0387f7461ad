"""Why a connection failed, in words: the link's ``connect_error``, the agent's ``connection``, fedhar-client's log.

Against a real Mosquitto on 127.0.0.1 configured by ``firmware_scripts/mosquitto_config.py``
(per-device passwords, ACL, a TLS listener with a certificate of a CA made here): a wrong
password, a wrong CA, a wrong host name and an unreachable port each give their cause, once
per attempt; a connection that succeeds clears it. Every wait is bounded.
"""

from __future__ import annotations

import errno
import itertools
import os
import pwd
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from edge_client.agent import EXIT_BROKER_REFUSED, ClientConfig, EdgeAgent
from edge_client.store import ClientStore
from har_io.broker_config import BrokerConfig
from har_io.link_status import LinkStatus, describe_connect_failure, describe_early_close, describe_refusal
from har_io.mqtt_link import MqttLink
from har_models.data.labels import LABEL_SETS
from simulation.broker import LocalMosquitto, find_mosquitto, free_port, free_ports, stop_process, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
WAIT_S = 10.0
ME = pwd.getpwuid(os.geteuid()).pw_name


# ------------------------------------------------------------------------------------- the words alone
def test_words_for_each_kind_of_failure() -> None:
    assert describe_connect_failure(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "10.0.0.5", 1883) == (
        "broker unreachable: connection refused at 10.0.0.5:1883"
    )
    assert describe_connect_failure(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "hub.lan", 1883) == (
        "DNS: unknown host 'hub.lan'"
    )
    assert describe_connect_failure(TimeoutError("timed out"), "10.0.0.5", 1883, timeout_s=5.0) == (
        "broker unreachable: no answer from 10.0.0.5:1883 within 5 s"
    )
    assert describe_connect_failure(OSError(errno.ENETUNREACH, "Network is unreachable"), "10.0.0.5", 1883) == (
        "broker unreachable: network is unreachable (10.0.0.5:1883)"
    )
    assert describe_connect_failure(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "h", 1883, tls=True) == (
        "TLS: the broker at h:1883 reset the connection in the handshake (a plain MQTT port?)"
    )
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    assert describe_connect_failure(verify, "h", 8883) == "TLS: certificate verify failed (wrong CA?)"
    verify.verify_message = "Hostname mismatch, certificate is not valid for 'h'."
    assert describe_connect_failure(verify, "h", 8883) == "TLS: the broker's certificate is not valid for 'h' (wrong host name?)"
    assert describe_refusal("Bad user name or password") == "login refused: bad user name or password"
    assert describe_refusal("Not authorized") == "login refused: not authorised (check the user name and password)"
    assert describe_refusal("Server unavailable") == "broker refused the connection: server unavailable"
    assert describe_early_close("h", 8883, "Unspecified error", tls=False) == (
        "the broker at h:8883 closed the connection before accepting it; a TLS port? then give --tls-ca"
    )


# ------------------------------------------------------------------------------------- a secured broker
@dataclass
class Secured:
    """A running Mosquitto on the generated configuration: plain and TLS listeners, and the files of its PKI."""

    out: Path
    pki: Path
    port: int
    tls_port: int

    def password(self, user: str) -> str:
        return (self.out / "credentials" / f"{user}.password").read_text().strip()


def _tool(name: str, *extra: str) -> str:
    found = shutil.which(name) or next((p for p in extra if os.access(p, os.X_OK)), None)
    if found is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail(f"{name} is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto openssl")
        pytest.skip(f"{name} not installed (apt-get install mosquitto openssl)")
    return found


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    exe = _tool("mosquitto", "/usr/sbin/mosquitto")
    _tool("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
    _tool("openssl")
    tmp = tmp_path_factory.mktemp("secured")
    pki = tmp / "pki"
    pki.mkdir()

    def openssl(*args: str) -> None:
        r = subprocess.run(["openssl", *args], cwd=pki, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr

    for ca in ("ca", "otherca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", f"/CN={ca}",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr")
    (pki / "server.ext").write_text("subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "30",
            "-extfile", "server.ext", "-out", "server.crt")  # fmt: skip
    out, (port, tls_port) = tmp / "broker", free_ports(2)
    r = subprocess.run([sys.executable, str(ROOT / "firmware_scripts" / "mosquitto_config.py"), "--out", str(out), "--federation", "ce",
                        "--clients", "hapt-01", "--port", str(port), "--tls-port", str(tls_port), "--tls-bind", "127.0.0.1",
                        "--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"), "--tls-ca", str(pki / "ca.crt"),
                        "--broker-user", ME, "--public-host", "127.0.0.1", "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    with open(tmp / "mosquitto.log", "wb") as sink:
        proc = subprocess.Popen([exe, "-c", str(out / "mosquitto.conf")], stdout=sink, stderr=subprocess.STDOUT)
    try:
        for p in (port, tls_port):
            assert wait_for_port("127.0.0.1", p, WAIT_S), (tmp / "mosquitto.log").read_text()
        yield Secured(out, pki, port, tls_port)
    finally:
        stop_process(proc)


def _fails_with(cfg: BrokerConfig) -> MqttLink:
    link = MqttLink(cfg, "fedhar-client-hapt-01")
    try:
        assert not link.start(WAIT_S)
    finally:
        link.stop()
    return link


@pytest.mark.slow
def test_a_wrong_password_gives_the_refusal_and_no_retry(secured: Secured) -> None:
    link = _fails_with(BrokerConfig(port=secured.port, username="hapt-01", password="wrong"))
    assert link.connect_error == "login refused: not authorised (check the user name and password)"
    st = link.status()
    assert (st.connected, st.fatal, st.failures, st.retry_in_s) == (False, True, 1, None)
    assert link.attempts == 1


def test_a_wrong_ca_and_a_wrong_host_name_give_the_tls_cause(secured: Secured) -> None:
    pw = secured.password("hapt-01")
    link = _fails_with(BrokerConfig(host="localhost", port=secured.tls_port, username="hapt-01", password=pw,
                                    tls_ca=str(secured.pki / "otherca.crt")))  # fmt: skip
    assert link.connect_error == "TLS: certificate verify failed (wrong CA?)" and link.status().fatal
    link = _fails_with(BrokerConfig(host="127.0.0.1", port=secured.tls_port, username="hapt-01", password=pw,
                                    tls_ca=str(secured.pki / "ca.crt")))  # fmt: skip
    assert link.connect_error == "TLS: the broker's certificate is not valid for '127.0.0.1' (wrong host name?)"
    # The positive control: the right CA, name and password connect, and nothing is left to report.
    ok = MqttLink(BrokerConfig(host="localhost", port=secured.tls_port, username="hapt-01", password=pw,
                               tls_ca=str(secured.pki / "ca.crt")), "fedhar-client-hapt-01")  # fmt: skip
    try:
        assert ok.start(WAIT_S)
        assert ok.status() == LinkStatus(connected=True, error=None, failures=0, fatal=False, retry_in_s=None)
    finally:
        ok.stop()


def test_the_agent_shows_the_cause_in_its_connection_status(secured: Secured, tmp_path: Path) -> None:
    store = ClientStore(tmp_path / "state", LABEL_SETS["hapt6"], owner="hapt-01")
    cfg = ClientConfig(client_id="hapt-01", broker=BrokerConfig(port=secured.port, username="hapt-01", password="wrong"),
                       federation="ce", backend="numpy")  # fmt: skip
    try:
        agent = EdgeAgent(cfg, store)
        assert agent.connection.error is None and not agent.connection.connected  # nothing tried yet
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(agent.run(max_seconds=WAIT_S)))
        t.start()
        t.join(WAIT_S + 15)
        assert result == [EXIT_BROKER_REFUSED]
        st = agent.connection
        assert st.error == "login refused: not authorised (check the user name and password)" and st.fatal
    finally:
        store.close()


@pytest.mark.slow
def test_a_connection_that_succeeds_clears_the_cause(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto not installed")
    port = free_port()
    link = MqttLink(BrokerConfig(port=port), "t-later")
    try:
        assert not link.start(0.5)
        assert link.connect_error == f"broker unreachable: connection refused at 127.0.0.1:{port}"
        assert link.status().retry_in_s == 3.0  # paho's first failure: a wait of 1 s, then one of 2 s
        with LocalMosquitto(port=port, log_file=tmp_path / "mosquitto.log"):
            end = time.monotonic() + 15
            while not link.connected.is_set() and time.monotonic() < end:
                time.sleep(0.05)
            assert link.connected.is_set()
            assert link.status() == LinkStatus(connected=True, error=None, failures=0, fatal=False, retry_in_s=None)
    finally:
        link.stop()


_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING fedhar\.mqtt: fedhar-client-hapt-01: connection attempt (\d+) to "
    r"127\.0\.0\.1:(\d+) failed: (.*); trying again in (\d+) s$"
)


@pytest.mark.slow
def test_fedhar_client_logs_each_failed_attempt_once_with_its_cause_and_backs_off(tmp_path: Path) -> None:
    """An unreachable broker: one line per attempt, the waits double, and each line's wait is the real one."""
    port = free_port()
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "edge_client.cli", "--client-id", "hapt-01", "--source", f"hapt:{HAPT}/user01.npz",
                        "--state-dir", str(tmp_path / "s"), "--backend", "numpy", "--broker", f"127.0.0.1:{port}",
                        "--max-seconds", "12"], capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert time.monotonic() - t0 < 100
    lines = [m for ln in r.stderr.splitlines() if (m := _LINE.match(ln))]
    # Attempts at 0, 3, 7 and 15 s after the start of the link: 3 of them within its 12 s.
    assert [int(m[2]) for m in lines] == [1, 2, 3], r.stderr[-3000:]
    assert {m[4] for m in lines} == {f"broker unreachable: connection refused at 127.0.0.1:{port}"}
    assert {int(m[3]) for m in lines} == {port}
    waits = [int(m[5]) for m in lines]
    assert waits == [3, 4, 8]
    at = [datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f") for m in lines]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(at)]
    for gap, said in zip(gaps, waits, strict=False):
        assert abs(gap - said) < 1.0, (gaps, waits)  # the wait a line announces is the one that follows
    assert r.stderr.count("connection attempt") == 3  # and nothing else repeats the failure
