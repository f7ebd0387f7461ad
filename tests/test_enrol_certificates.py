"""Enrolment by certificate against a real Mosquitto: request, pending, approve, login by certificate, revocation.

The broker is the generated one (``tests/support/secured_broker.py`` with ``--device-cert-port``):
TLS, ACL, the device CA and its revocation list. The device side is :mod:`edge_client.cert_enrol`,
the operator's :mod:`coordinator.server.enrol_desk` and ``revoke`` (which also closes a live session by certificate).
"""

from __future__ import annotations

import json
import queue
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from coordinator.server import devices_cli, enrol_desk
from coordinator.server.audit import read_audit
from coordinator.server.qr import invitation_payload
from coordinator.server.registry import Registry
from coordinator.server.settings import read_serve_file
from edge_client import cert_enrol
from har_io.broker_config import BrokerConfig
from har_io.cert_enrolment import EnrolRequest, Invitation
from har_io.device_key import code_topic_level, make_csr, make_key
from har_io.mqtt_link import MqttLink, PacketRejected
from har_models.wire.messages import ClientStatus
from har_models.wire.topics import Topics

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]

T = Topics("home")


def _server(tmp_path: Path, b: Any) -> tuple[Path, Any]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text(f'[server]\nname = "home-test"\nbroker_dir = "{b.out}"\npublic_host = "127.0.0.1"\nhttp_port = 0\n')
    return data, read_serve_file(data / "server.toml")


def _wait_pending(file: Any, code: str, timeout_s: float = 20.0) -> enrol_desk.PendingRequest:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = [r for r in enrol_desk.pending(file) if r.code == code]
        if found:
            return found[0]
    raise AssertionError(f"the request under {code} never showed in pending")


def _cert_login(cfg: BrokerConfig) -> tuple[bool, str]:
    """(connected, why not): one connection attempt with ``cfg``'s certificate, bounded to 5 s."""
    got: queue.Queue[Any] = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=str(cfg.username))
    ctx = ssl.create_default_context(cafile=cfg.tls_ca)
    ctx.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
    c.tls_set_context(ctx)
    c.on_connect = lambda client, u, f, rc, p=None: got.put(rc)
    try:
        c.connect(cfg.host, cfg.port, keepalive=10)
        c.loop_start()
        rc = got.get(timeout=5)
        return (not rc.is_failure, str(rc))
    except (OSError, ssl.SSLError, queue.Empty) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        c.disconnect()
        c.loop_stop()


def test_request_pending_approve_login_by_certificate_then_revoked(tls_mosquitto: Any, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    b = tls_mosquitto("home", [], device_certs=True)
    data, file = _server(tmp_path, b)
    inv = enrol_desk.invitation(file)
    assert (inv.host, inv.port, inv.device_port, inv.enrol_user) == ("127.0.0.1", b.tls_port, b.device_cert_port, "enrol")
    folder = tmp_path / "phone"
    prep = cert_enrol.prepare(folder, "phone-anna", inv)
    assert oct((folder / "device.key").stat().st_mode & 0o777) == "0o600"

    result: dict[str, Any] = {}

    def ask() -> None:
        try:
            result["crt"] = cert_enrol.request_certificate(prep, inv, wait_s=60.0)
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    req = _wait_pending(file, prep.code)
    # What the operator compares with the device's screen.
    assert (req.client_id, req.fingerprint, req.problem) == ("phone-anna", prep.fingerprint, None)

    # A code nobody asked under is refused, and nothing is enrolled.
    with pytest.raises(enrol_desk.EnrolDeskError, match="no request waits under code"):
        enrol_desk.approve(data, file, "AAAAA-AAAAA")

    done = enrol_desk.approve(data, file, prep.code.lower(), owner="anna")
    assert done[0].startswith("phone-anna approved")
    asker.join(60)
    assert "error" not in result, result.get("error")
    assert result["crt"] == folder / "device.crt"
    reg = Registry(data)
    try:
        assert reg.is_enrolled("phone-anna")
    finally:
        reg.close()
    assert [e.action for e in read_audit(data)] == ["enrol"]
    # The request is gone from the broker: approving it twice is refused.
    assert [r.code for r in enrol_desk.pending(file)] == []
    with pytest.raises(enrol_desk.EnrolDeskError, match="no request waits"):
        enrol_desk.approve(data, file, prep.code)

    # The device logs in by certificate (no password) and publishes its status; the coordinator reads it.
    coord = MqttLink(BrokerConfig.parse(f"127.0.0.1:{b.port}", username="coordinator", password=b.password("coordinator")),
                     "coordinator", subscriptions=[(T.client_status("+"), 1)])  # fmt: skip
    device = MqttLink(cert_enrol.device_broker(folder, inv, "phone-anna"), "phone-anna")
    try:
        assert coord.start(wait_s=10)
        assert device.start(wait_s=10), device.connect_error
        device.publish(T.client_status("phone-anna"), ClientStatus("phone-anna", "idle").to_bytes(), retain=True, timeout=10)
        # The ACL is the CN's: another device's status topic is not its to write.
        with pytest.raises(PacketRejected, match="Not authorized"):
            device.publish(T.client_status("phone-bob"), ClientStatus("phone-bob", "idle").to_bytes(), timeout=10)
        seen: list[tuple[str, str]] = []
        end = time.monotonic() + 5
        while time.monotonic() < end and not seen:
            try:
                topic, payload, _ = coord.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            seen.append((topic, ClientStatus.from_bytes(payload).state))
        time.sleep(0.5)
        while not coord.inbox.empty():
            topic, payload, _ = coord.inbox.get()
            seen.append((topic, "more"))
        assert seen == [(T.client_status("phone-anna"), "idle")]
    finally:
        device.stop()
        coord.stop()

    # A live session by certificate: a broker reload keeps it (the password file is not asked of it); revoke closes it.
    closed = threading.Event()
    live = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="phone-anna")
    cfg = cert_enrol.device_broker(folder, inv, "phone-anna")
    ctx = ssl.create_default_context(cafile=cfg.tls_ca)
    ctx.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
    live.tls_set_context(ctx)
    up = threading.Event()
    live.on_connect = lambda client, u, f, rc, p=None: up.set()
    live.on_disconnect = lambda client, u, f, rc, p=None: closed.set()
    live.connect(cfg.host, cfg.port, keepalive=10)
    live.loop_start()
    try:
        assert up.wait(10)
        # Revoked: the certificate goes on the revocation list, the broker reloads, its session is closed, and the
        # same certificate is refused.
        assert devices_cli.main("revoke", ["phone-anna", "--data", str(data)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert "phone-anna's certificate put on the device CA's revocation list" in lines
        assert "phone-anna's live connection closed (its certificate is refused from now on)" in lines
        assert closed.wait(10), "the revoked device's live session stayed open"
    finally:
        live.disconnect()
        live.loop_stop()
    before = len(b.log.read_text())
    ok, _ = _cert_login(cert_enrol.device_broker(folder, inv, "phone-anna"))
    assert not ok, "a revoked certificate still logs in"
    assert "certificate verify failed" in b.log.read_text()[before:]


def test_unapproved_forged_and_self_made_certificates_are_refused(tls_mosquitto: Any, tmp_path: Path) -> None:
    b = tls_mosquitto("home", ["phone-bob"], device_certs=True)  # phone-bob: an account made with the broker tooling
    data, file = _server(tmp_path, b)
    inv = enrol_desk.invitation(file)
    prep = cert_enrol.prepare(tmp_path / "phone", "phone-anna", inv)

    # Not approved: the device waits, gets nothing, and has no certificate to log in with.
    with pytest.raises(cert_enrol.EnrolmentNotApproved, match=f"approve {prep.code}"):
        cert_enrol.request_certificate(prep, inv, wait_s=1.0)
    with pytest.raises(ValueError, match="not approved yet"):
        cert_enrol.device_broker(tmp_path / "phone", inv, "phone-anna")

    # Someone with the enrolment account overwrites the request under the device's code with another key:
    # pending names the problem and approve refuses it.
    key = make_key(tmp_path / "other" / "device.key")
    forged = EnrolRequest("phone-anna", make_csr(key, "phone-anna")).to_bytes()
    enrol = MqttLink(BrokerConfig.parse(f"127.0.0.1:{b.tls_port}", username="enrol", password=inv.enrol_password,
                                        tls_ca=str(b.ca)), "enrol")  # fmt: skip
    try:
        assert enrol.start(wait_s=10), enrol.connect_error
        enrol.publish(T.enrol_request(code_topic_level(prep.code)), forged, retain=True, timeout=10)
        # The enrolment account cannot write a reply (the ACL lets it only ask).
        with pytest.raises(PacketRejected, match="Not authorized"):
            enrol.publish(T.enrol_reply(code_topic_level(prep.code)), b"{}", retain=True, timeout=10)
    finally:
        enrol.stop()
    req = _wait_pending(file, prep.code)
    assert req.problem is not None and "not the device's" in req.problem
    with pytest.raises(enrol_desk.EnrolDeskError, match="cannot be approved"):
        enrol_desk.approve(data, file, prep.code)
    reg = Registry(data)
    try:
        assert not reg.is_enrolled("phone-anna")
    finally:
        reg.close()

    # A name that already has a broker account is refused, and the device is told why.
    bob = cert_enrol.prepare(tmp_path / "bob", "phone-bob", inv)
    with pytest.raises(cert_enrol.EnrolmentNotApproved):
        cert_enrol.request_certificate(bob, inv, wait_s=0.5)
    with pytest.raises(enrol_desk.EnrolDeskError, match="asks for the name 'phone-bob', which is taken"):
        enrol_desk.approve(data, file, bob.code)
    with pytest.raises(cert_enrol.EnrolmentNotApproved, match="the name is enrolled already"):
        cert_enrol.request_certificate(bob, inv, wait_s=10.0)
    assert not (tmp_path / "bob" / "device.crt").exists()

    # A certificate the device made itself (not signed by the device CA) is refused in the handshake.
    import subprocess

    self_made = tmp_path / "phone" / "device.crt"
    subprocess.run(["openssl", "req", "-x509", "-new", "-key", str(tmp_path / "phone" / "device.key"), "-subj", "/CN=phone-anna",
                    "-days", "1", "-out", str(self_made)], check=True, capture_output=True, timeout=30)  # fmt: skip
    before = len(b.log.read_text())
    ok, _ = _cert_login(cert_enrol.device_broker(tmp_path / "phone", inv, "phone-anna"))
    assert not ok
    assert "certificate verify failed" in b.log.read_text()[before:]


def test_the_commands_invite_pending_approve_and_request_certificate(tls_mosquitto: Any, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The operator's and the device's command lines, with an invitation whose code holds only the CA's fingerprint."""
    b = tls_mosquitto("home", [], device_certs=True)
    data, file = _server(tmp_path, b)
    assert devices_cli.main("invite", ["--data", str(data)]) == 0
    said = capsys.readouterr().out
    inv = Invitation.from_json((data / "enrolment" / "invitation.json").read_text())
    assert inv.tls_ca_pem == b.ca.read_text()  # the file has the CA ...
    payload = invitation_payload(inv)  # ... the QR code (an RSA-2048 CA does not fit) only its fingerprint
    assert "tls_ca_pem" not in payload and inv.tls_ca_sha256 in payload
    assert f"fingerprint (SHA-256 {inv.tls_ca_sha256}); the CA is also on the broker" in said
    assert oct((data / "enrolment" / "invitation.png").stat().st_mode & 0o777) == "0o600"

    folder = tmp_path / "board"
    status: dict[str, int] = {}
    asker = threading.Thread(target=lambda: status.update(rc=cert_enrol.main(
        ["--invitation", payload, "--client-id", "board-1", "--folder", str(folder), "--wait", "60"])), daemon=True)  # fmt: skip
    asker.start()
    end = time.monotonic() + 20
    reqs: list[enrol_desk.PendingRequest] = []
    while not reqs and time.monotonic() < end:
        reqs = enrol_desk.pending(file)
    assert [r.client_id for r in reqs] == ["board-1"]
    # The CA was fetched over the unverified connection and kept because its fingerprint is the pinned one.
    assert (folder / "ca.crt").read_text() == b.ca.read_text()
    shown = capsys.readouterr().out  # what the device printed while it waits
    assert devices_cli.main("pending", ["--data", str(data), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["code"], r["client_id"], r["problem"]) for r in listed] == [(reqs[0].code, "board-1", None)]
    assert devices_cli.main("approve", ["not-a-code", "--data", str(data)]) == 2
    assert "expected 10 letters" in capsys.readouterr().err
    assert devices_cli.main("approve", [reqs[0].code, "--data", str(data)]) == 0
    asker.join(60)
    out = capsys.readouterr().out
    assert status == {"rc": 0}
    assert f"enrolment code:  {reqs[0].code}" in shown and f"key fingerprint: {reqs[0].fingerprint}" in shown
    assert f"--broker 127.0.0.1:{b.device_cert_port}" in out and f"--tls-cert {folder / 'device.crt'}" in out
    ok, why = _cert_login(cert_enrol.device_broker(folder, inv, "board-1"))
    assert ok, why
    # Re-issued: the certificate is refused from that reload on, and no password bundle is made for a device
    # enrolled by certificate; it asks again with a new key of its own, which approve accepts for its name.
    assert devices_cli.main("reissue", ["board-1", "--data", str(data)]) == 0
    said = capsys.readouterr().out
    assert "gets no bundle" in said and "--client-id board-1 --new-key" in said
    assert not (data / "enrolment" / "board-1.json").exists()
    ok, _ = _cert_login(cert_enrol.device_broker(folder, inv, "board-1"))
    assert not ok
    old_key = (folder / "device.key").read_bytes()
    _ask_and_approve(capsys, data, file, payload, "board-1", folder)
    assert (folder / "device.key").read_bytes() != old_key  # a new key, not the one of the revoked certificate
    ok, why = _cert_login(cert_enrol.device_broker(folder, inv, "board-1"))
    assert ok, why
    # Renamed: the same, under the new name; the old name's certificate is refused.
    assert devices_cli.main("rename", ["board-1", "board-2", "--data", str(data)]) == 0
    said = capsys.readouterr().out
    assert "gets no bundle" in said and "--client-id board-2 --new-key" in said
    assert not list((data / "enrolment").glob("board-*.json"))
    _ask_and_approve(capsys, data, file, payload, "board-2", folder)
    ok, why = _cert_login(cert_enrol.device_broker(folder, inv, "board-2"))
    assert ok, why
    reg = Registry(data)
    try:
        assert [(d.name, d.state) for d in reg.devices()] == [("board-1", "revoked"), ("board-2", "enrolled")]
    finally:
        reg.close()
    assert [(e.action, e.device) for e in read_audit(data)] == [("invite", None),
        ("enrol", "board-1"), ("reissue", "board-1"), ("reissue", "board-1"), ("rename", "board-2"), ("reissue", "board-2")]
    # A new key is signed once: another request for the enrolled name is refused as taken again.
    other = cert_enrol.prepare(tmp_path / "intruder", "board-2", inv)
    told: list[str] = []

    def intrude() -> None:
        try:
            cert_enrol.request_certificate(other, inv, wait_s=30)
        except Exception as exc:  # what the device is told, asserted below
            told.append(str(exc))

    intruder = threading.Thread(target=intrude, daemon=True)
    intruder.start()
    _wait_pending(file, other.code)
    with pytest.raises(enrol_desk.EnrolDeskError, match="is taken"):
        enrol_desk.approve(data, file, other.code)
    intruder.join(30)
    assert len(told) == 1 and told[0].startswith("the server refused 'board-2': the name is enrolled already")


def _ask_and_approve(capsys: pytest.CaptureFixture[str], data: Path, file: Any, payload: str, name: str, folder: Path) -> None:
    """The device asks with ``--new-key`` under ``name``; the operator approves the code it shows."""
    status: dict[str, int] = {}
    asker = threading.Thread(target=lambda: status.update(rc=cert_enrol.main(
        ["--invitation", payload, "--client-id", name, "--folder", str(folder), "--wait", "60", "--new-key"])), daemon=True)  # fmt: skip
    asker.start()
    end = time.monotonic() + 20
    reqs: list[enrol_desk.PendingRequest] = []
    while not reqs and time.monotonic() < end:
        reqs = [r for r in enrol_desk.pending(file) if r.client_id == name]
    assert reqs, f"no request of {name} showed in pending"
    assert devices_cli.main("approve", [reqs[0].code, "--data", str(data)]) == 0
    asker.join(60)
    assert status == {"rc": 0}
    capsys.readouterr()
