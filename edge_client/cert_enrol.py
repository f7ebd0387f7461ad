"""A device asks for its client certificate: own key, request left on the broker, certificate fetched and checked.

:func:`prepare` makes the device's key and request in its folder and returns the enrolment
code and key fingerprint to show; :func:`request_certificate` leaves the request on the broker
with the invitation's enrolment account and waits for the operator's ``fedhar-coordinator
approve``; it writes the certificate only after checking it holds the device's own public key
and name. The folder then holds everything to log in (:func:`device_broker`):

* ``ca.crt``: the CA the broker is trusted by, as pinned by the invitation's fingerprint;
* ``device.key``: the private key (mode 0600; made here, never sent anywhere);
* ``device.crt``: the client certificate, once approved.

docs/protocol.md, "Enrolment by certificate", has the flow and what each step protects against.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from pathlib import Path

from har_io.broker_config import BrokerConfig
from har_io.cert_enrolment import EnrolmentMessageError, EnrolReply, EnrolRequest, Invitation
from har_io.device_key import (
    DeviceKeyError,
    certificate_public_key,
    certificate_subject_cn,
    code_topic_level,
    enrolment_code,
    key_fingerprint,
    key_public_der,
    make_csr,
    make_key,
)
from har_io.enrolment import pem_fingerprints
from har_io.mqtt_link import MqttLink
from har_models.files import atomic_write_bytes
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.enrol")

KEY_NAME, CERT_NAME, CA_NAME = "device.key", "device.crt", "ca.crt"


class EnrolmentNotApproved(RuntimeError):
    """The certificate did not come: not approved in time, refused by the operator, or not the device's; the message says which."""


@dataclass(frozen=True)
class Prepared:
    """A device's key and request, ready to be sent.

    Attributes
    ----------
    folder : Path
        Where ``device.key`` (and later ``device.crt``) are.
    client_id : str
        The name asked for.
    code : str
        The enrolment code to show (``ABCDE-FGHJK``).
    fingerprint : str
        SHA-256 of the public key, to show beside the code (the operator compares it).
    csr_pem : str
        The certificate request.
    """

    folder: Path
    client_id: str
    code: str
    fingerprint: str
    csr_pem: str


def prepare(folder: Path, client_id: str, invitation: Invitation) -> Prepared:
    """Pin the invitation's CA into ``folder/ca.crt``, make the key unless it exists, and the request.

    A key already in ``folder`` is kept (asking again after a restart shows the same code).

    Raises
    ------
    ValueError
        If ``client_id`` is invalid, or the invitation carries no CA and ``folder/ca.crt`` is
        missing or is not the pinned one.
    DeviceKeyError
        If openssl is missing or fails.
    """
    check_client_id(client_id)
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = folder / CA_NAME
    if invitation.tls_ca_pem is not None:
        atomic_write_bytes(ca, invitation.tls_ca_pem, mode=0o644)
    elif not ca.is_file():
        raise ValueError(f"the invitation carries only the CA's fingerprint: copy the server's ca.crt to {ca} and ask again")
    if invitation.tls_ca_sha256 not in pem_fingerprints(ca.read_text(), str(ca)):
        raise ValueError(f"{ca} is not the CA the invitation pins (SHA-256 {invitation.tls_ca_sha256}); copy the server's ca.crt again")
    key = folder / KEY_NAME
    if not key.exists():
        make_key(key)
    spki = key_public_der(key)
    return Prepared(folder, client_id, enrolment_code(spki), key_fingerprint(spki), make_csr(key, client_id))


def _enrol_broker(invitation: Invitation, folder: Path) -> BrokerConfig:
    return BrokerConfig.parse(f"{invitation.host}:{invitation.port}", username=invitation.enrol_user,
                              password=invitation.enrol_password, tls_ca=str(folder / CA_NAME))  # fmt: skip


def request_certificate(prepared: Prepared, invitation: Invitation, wait_s: float = 600.0, broker: BrokerConfig | None = None) -> Path:
    """Leave the request on the broker and wait up to ``wait_s`` seconds for the certificate; returns ``device.crt``.

    The request is left retained, so the operator may approve it while the device waits, or
    after it has given up (asking again fetches the waiting certificate). The connection checks
    the broker's certificate against the pinned CA.

    Parameters
    ----------
    prepared : Prepared
        From :func:`prepare`.
    invitation : Invitation
    wait_s : float
        Seconds to wait for the approval.
    broker : BrokerConfig, optional
        How to reach the broker with the enrolment account (default: the invitation's host and port).

    Raises
    ------
    EnrolmentNotApproved
        If no reply came in time, the operator refused the name, or the certificate is not for
        this key and name (nothing is written then).
    har_io.mqtt_link.BrokerRefused
        If the broker refused the enrolment account or its certificate did not verify.
    """
    topics = Topics(invitation.federation)
    level = code_topic_level(prepared.code)
    cfg = broker or _enrol_broker(invitation, prepared.folder)
    link = MqttLink(cfg, f"{invitation.enrol_user}-{level}", subscriptions=[(topics.enrol_reply(level), 1)])
    reply: EnrolReply | None = None
    try:
        if not link.start(wait_s=min(30.0, wait_s)):
            if link.fatal is not None:
                raise link.fatal
            raise EnrolmentNotApproved(f"the broker at {cfg.address} could not be reached: {link.connect_error}")
        link.publish(topics.enrol_request(level), EnrolRequest(prepared.client_id, prepared.csr_pem).to_bytes(), retain=True, timeout=30.0)
        log.info("%s: request left under code %s; waiting for its approval", prepared.client_id, prepared.code)
        end = time.monotonic() + wait_s
        while reply is None and time.monotonic() < end:
            try:
                _, payload, _ = link.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if not payload:
                continue
            try:
                reply = EnrolReply.from_bytes(payload)
            except EnrolmentMessageError as exc:
                log.warning("%s: unreadable reply ignored: %s", prepared.client_id, exc)
    finally:
        link.stop()
    if reply is None:
        raise EnrolmentNotApproved(f"not approved within {wait_s:.0f} s: on the server, run fedhar-coordinator approve {prepared.code}")
    return store_certificate(prepared, reply)


def store_certificate(prepared: Prepared, reply: EnrolReply) -> Path:
    """Check the reply's certificate holds this device's key and name, and write it as ``device.crt`` (mode 0644).

    Raises
    ------
    EnrolmentNotApproved
        If the reply is a refusal, or its certificate is for another key or name.
    """
    if reply.certificate_pem is None:
        hints = {"name_taken": "the name is another device's", "name_revoked": "the name was revoked for good"}
        hint = hints.get(str(reply.refused), "refused")
        raise EnrolmentNotApproved(f"the server refused {prepared.client_id!r}: {hint}; ask again under another name")
    try:
        same_key = certificate_public_key(reply.certificate_pem) == key_public_der(prepared.folder / KEY_NAME)
        name = certificate_subject_cn(reply.certificate_pem)
    except DeviceKeyError as exc:
        raise EnrolmentNotApproved(f"the reply's certificate cannot be read: {exc}") from None
    if not same_key or name != prepared.client_id or reply.client_id != prepared.client_id:
        raise EnrolmentNotApproved(f"the reply's certificate is not this device's (name {name!r}, own key: {same_key}); nothing written")
    path = prepared.folder / CERT_NAME
    atomic_write_bytes(path, reply.certificate_pem, mode=0o644)
    return path


def device_broker(folder: Path, invitation: Invitation, client_id: str) -> BrokerConfig:
    """How the enrolled device logs in: the device-certificate listener, its certificate and key, the pinned CA.

    Raises
    ------
    ValueError
        If ``device.crt`` is missing (not approved yet) or another option is invalid.
    """
    folder = Path(folder)
    if not (folder / CERT_NAME).is_file():
        raise ValueError(f"{folder / CERT_NAME} does not exist: the device is not approved yet (fedhar-coordinator approve CODE)")
    return BrokerConfig.parse(f"{invitation.host}:{invitation.device_port}", username=client_id, tls_ca=str(folder / CA_NAME),
                              tls_cert=str(folder / CERT_NAME), tls_key=str(folder / KEY_NAME))  # fmt: skip
