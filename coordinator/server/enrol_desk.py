"""The operator's side of enrolment by certificate: ``fedhar-coordinator invite``, ``pending`` and ``approve``.

Devices leave requests retained on the broker (:mod:`har_io.cert_enrolment`); :func:`pending` reads
them as the desk account (loopback); :func:`approve` signs one with the device CA, gives the name its
ACL (an account whose password never leaves the broker folder), records it and leaves the certificate
as the retained reply. The device's private key never leaves it. A request is approvable only if its
signature verifies and its enrolment code is its key's (:func:`har_io.device_key.enrolment_code`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from coordinator.broker import device_ca
from coordinator.broker.files import folder_lock
from coordinator.broker.settings import ENROL_DESK_USER, ENROL_USER
from coordinator.server.audit import audit
from coordinator.server.broker_admin import BrokerAdmin, BrokerAdminError
from coordinator.server.broker_session import messages_for
from coordinator.server.registry import Registry
from coordinator.server.settings import ServeFile
from har_io.broker_config import BrokerConfig
from har_io.cert_enrolment import EnrolmentMessageError, EnrolReply, EnrolRequest, Invitation
from har_io.device_key import DeviceKeyError, code_topic_level, csr_public_key, enrolment_code, key_fingerprint, normalise_code
from har_io.enrolment import pem_fingerprints
from har_io.mqtt_link import MqttLink
from har_models.wire.topics import Topics

READ_WAIT_S = 2.0
"""How long (s) :func:`read_requests` waits for retained requests after subscribing (milliseconds on loopback; margin)."""


class EnrolDeskError(ValueError):
    """The desk cannot do what was asked (no such request, one that cannot be approved, no device CA); the message names the fix."""


class DeskUnreachable(RuntimeError):
    """The broker cannot be reached with the desk account; the message says why."""


@dataclass(frozen=True)
class PendingRequest:
    """One request waiting on the broker: its code (``ABCDE-FGHJK``), the name asked for, key fingerprint, CSR, and ``problem``.

    ``problem`` says why it cannot be approved (unreadable, bad signature, a code not its key's); None if it can.
    """

    code: str
    client_id: str | None
    fingerprint: str | None
    csr_pem: str | None
    problem: str | None = None


def check_request(level: str, payload: bytes) -> PendingRequest:
    """Read the request found under the topic level ``level`` (the code without its dash) and say whether it is approvable."""
    code = f"{level[:5]}-{level[5:]}"
    try:
        code = normalise_code(level)
        req = EnrolRequest.from_bytes(payload)
    except (DeviceKeyError, EnrolmentMessageError) as exc:
        return PendingRequest(code, None, None, None, f"unreadable: {exc}")
    try:
        spki = csr_public_key(req.csr_pem)
    except DeviceKeyError as exc:
        return PendingRequest(code, req.client_id, None, None, str(exc))
    fp = key_fingerprint(spki)
    if enrolment_code(spki) != code:
        return PendingRequest(code, req.client_id, fp, None, f"its key's code is {enrolment_code(spki)}, not {code}: not the device's")
    return PendingRequest(code, req.client_id, fp, req.csr_pem)


def _desk(file: ServeFile) -> tuple[BrokerAdmin, BrokerConfig, Topics]:
    if not file.server.broker_dir:
        raise EnrolDeskError("[server] broker_dir is not set: name the folder fedhar-coordinator broker init wrote (--out) in server.toml")
    admin = BrokerAdmin(Path(file.server.broker_dir), reload=file.server.broker_reload)
    try:
        s = admin.settings()
        if s.device_cert_port is None:
            raise EnrolDeskError(
                f"the broker folder {admin.broker_dir} has no device-certificate listener: run fedhar-coordinator broker init "
                f"--out {admin.broker_dir} --device-cert-port 8884 (then restart the broker)"
            )
        password = admin.password(ENROL_DESK_USER)
    except BrokerAdminError as exc:
        raise EnrolDeskError(f"[server] broker_dir: {exc}") from None
    return admin, BrokerConfig.parse(f"127.0.0.1:{int(s.port)}", username=ENROL_DESK_USER, password=password), Topics(s.federation)


def read_requests(broker: BrokerConfig, topics: Topics, level: str = "+", wait_s: float = READ_WAIT_S) -> list[PendingRequest]:
    """The retained requests under ``enrol/<level>`` (``+``: all), read as the desk account, sorted by code.

    Raises DeskUnreachable if the broker cannot be reached within 15 s.
    """
    found: dict[str, PendingRequest] = {}
    with _session(broker, [(topics.enrol_request(level), 1)]) as link:
        for topic, payload, _ in messages_for(link, wait_s):
            got = topic.rsplit("/", 1)[-1]
            if payload:  # an empty retained message is a cleared request
                found[got] = check_request(got, payload)
            else:
                found.pop(got, None)
    return [found[k] for k in sorted(found)]


def pending(file: ServeFile) -> list[PendingRequest]:
    """The requests waiting on the broker of ``[server] broker_dir``; EnrolDeskError or DeskUnreachable as :func:`_desk`."""
    _, broker, topics = _desk(file)
    return read_requests(broker, topics)


def _answer(broker: BrokerConfig, topics: Topics, level: str, reply: EnrolReply) -> None:
    with _session(broker) as link:
        link.publish(topics.enrol_reply(level), reply.to_bytes(), retain=True, timeout=30.0)
        link.clear_retained([topics.enrol_request(level)], timeout=30.0)


@contextlib.contextmanager
def _session(broker: BrokerConfig, subscriptions: list[tuple[str, int]] | None = None) -> Iterator[MqttLink]:
    """A session as the desk account, stopped on leaving; DeskUnreachable if none within 15 s."""
    link = MqttLink(broker, f"{ENROL_DESK_USER}-{os.getpid()}", subscriptions=subscriptions or [])
    try:
        if not link.start(wait_s=15.0):
            raise DeskUnreachable(f"the broker at {broker.address} cannot be reached as {ENROL_DESK_USER}: {link.connect_error}")
        yield link
    finally:
        link.stop()


def approve(data: Path, file: ServeFile, code: str, owner: str | None = None) -> list[str]:
    """Approve the request of enrolment ``code``: sign its certificate, give the device its ACL, record it, reply; the lines done.

    Raises DeviceKeyError if ``code`` is not an enrolment code; EnrolDeskError if no request waits under
    it or it cannot be approved; a name enrolled, with an account, a service account's or revoked is
    refused (the device told so), unless an enrolled name awaits a new key (``reissue``/``rename``);
    DeskUnreachable if the broker cannot be reached; BrokerAdminError if the account cannot be made.
    """
    code = normalise_code(code)
    level = code_topic_level(code)
    admin, broker, topics = _desk(file)
    found = read_requests(broker, topics, level)
    if not found:
        raise EnrolDeskError(f"no request waits under code {code}: check the code the device shows (fedhar-coordinator pending lists them)")
    req = found[0]
    if req.problem is not None or req.client_id is None or req.csr_pem is None:
        raise EnrolDeskError(f"the request under code {code} cannot be approved: {req.problem}; have the device ask again")
    name = req.client_id
    reg = Registry(data)
    try:
        out = admin.broker_dir
        # An enrolled device re-issued or renamed by the operator asks again with a new key: its name awaits one.
        rekey = reg.is_enrolled(name) and device_ca.awaits_new_key(out, name)
        # A service account's name would log in as that account; a broker account made outside the server is a device's.
        taken = reg.is_enrolled(name) or name in admin.settings().service_users or name in admin.devices()
        refusal = "name_revoked" if reg.is_revoked(name) else "name_taken" if taken and not rekey else None
        if refusal is not None:
            _answer(broker, topics, level, EnrolReply(name, refused=refusal))
            why = "was revoked (a revoked name is not used again)" if refusal == "name_revoked" else "is taken"
            raise EnrolDeskError(f"the request under code {code} asks for the name {name!r}, which {why}; the device was told so")
        with folder_lock(out):
            pem = device_ca.sign_device(out, req.csr_pem, name)
        if not rekey:
            admin.add_device(name)  # ACL and an account whose password never leaves the server
            reg.enrol(name, owner)
    finally:
        reg.close()
    _answer(broker, topics, level, EnrolReply(name, certificate_pem=pem))
    action, how = ("reissue", "new key by certificate") if rekey else ("enrol", "by certificate")
    audit(data, action, name, f"{how}, code {code}, key {req.fingerprint}" + (f", owner {owner}" if owner else ""))
    return [
        f"{name} approved: certificate signed by the device CA (key {req.fingerprint})",
        f"{name} keeps its ACL and history (a new key for an enrolled device)" if rekey
        else f"{name}'s ACL added; broker reloaded ({file.server.broker_reload})",
        f"the certificate waits for the device under code {code}; it logs in on port {admin.settings().device_cert_port}",
    ]


def invitation(file: ServeFile, host: str | None = None) -> Invitation:
    """The federation's invitation: broker address and ports, its CA (inline), the enrolment account.

    Raises EnrolDeskError without a broker folder with device certificates and TLS.
    """
    admin, _, topics = _desk(file)
    s = admin.settings()
    ca_pem = Path(s.tls_ca or "").read_text() if s.tls_ca else None
    if ca_pem is None:
        raise EnrolDeskError("the broker folder has no --tls-ca: devices need the CA that signed the broker's certificate")
    return Invitation(
        coordinator=file.server.name,
        federation=topics.federation,
        host=host or file.server.public_host or s.public_host or _hostname(),
        port=int(s.tls_port),
        device_port=int(s.device_cert_port or 0),
        enrol_user=ENROL_USER,
        enrol_password=admin.password(ENROL_USER),
        tls_ca_sha256=pem_fingerprints(ca_pem)[0],
        tls_ca_pem=ca_pem,
    )


def publish_ca(file: ServeFile, invitation: Invitation) -> None:
    """Leave the broker's CA certificate retained at ``fedhar/v1/<fed>/ca``, for codes that hold only its fingerprint."""
    _, broker, topics = _desk(file)
    with _session(broker) as link:
        link.publish(topics.ca, (invitation.tls_ca_pem or "").encode(), retain=True, timeout=30.0)


def _hostname() -> str:
    import socket

    return socket.gethostname()
