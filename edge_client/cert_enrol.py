"""A device asks for its client certificate: own key, request left on the broker, certificate fetched and checked.

:func:`prepare` makes the key and request and returns the code and key fingerprint to show;
:func:`request_certificate` leaves the request on the broker with the invitation's enrolment
account, waits for ``fedhar-coordinator approve`` and writes the certificate only if it holds the
device's own key and name. The folder then holds ``ca.crt`` (pinned by the invitation),
``device.key`` (mode 0600, never sent) and ``device.crt`` (:func:`device_broker`). The flow and
what each step protects against: docs/protocol.md, "Enrolment by certificate".
"""

from __future__ import annotations

import logging
import os
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
from har_io.refusal_words import certificate_refused
from har_models.files import atomic_write_bytes
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.enrol")

KEY_NAME, CERT_NAME, CA_NAME = "device.key", "device.crt", "ca.crt"


class EnrolmentNotApproved(RuntimeError):
    """The certificate did not come: not approved in time, refused by the operator, or not the device's; the message says which."""


@dataclass(frozen=True)
class Prepared:
    """A device's key and request, ready to be sent: its folder, the name asked for, the enrolment code to show
    (``ABCDE-FGHJK``), the public key's SHA-256 (the operator compares it) and the request."""

    folder: Path
    client_id: str
    code: str
    fingerprint: str
    csr_pem: str


def prepare(folder: Path, client_id: str, invitation: Invitation, new_key: bool = False) -> Prepared:
    """Pin the invitation's CA into ``folder/ca.crt``, make the key unless it exists, and the request.

    A key waiting for its first certificate is kept (asking again shows the same code); with
    ``new_key`` one that has a certificate is replaced and the certificate deleted (a device the
    operator re-issued or renamed).

    Raises
    ------
    ValueError
        If ``client_id`` is invalid, or no CA that is the pinned one comes with the invitation, is in
        ``folder/ca.crt`` or can be fetched (:func:`fetch_ca`).
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
        fetch_ca(invitation, folder)
    if invitation.tls_ca_sha256 not in pem_fingerprints(ca.read_text(), str(ca)):
        raise ValueError(f"{ca} is not the CA the invitation pins (SHA-256 {invitation.tls_ca_sha256}); copy the server's ca.crt again")
    key = folder / KEY_NAME
    if new_key and key.exists() and (folder / CERT_NAME).exists():
        fresh = make_key(folder / f"{KEY_NAME}.new")
        os.replace(fresh, key)  # the old key is gone in one step; its certificate with it
        (folder / CERT_NAME).unlink()
    if not key.exists():
        make_key(key)
    spki = key_public_der(key)
    return Prepared(folder, client_id, enrolment_code(spki), key_fingerprint(spki), make_csr(key, client_id))


def fetch_ca(invitation: Invitation, folder: Path, wait_s: float = 15.0) -> Path:
    """Fetch the broker's CA from its retained ``fedhar/v1/<fed>/ca`` and keep it as ``folder/ca.crt`` only if it is the pinned one.

    For an invitation carrying only the CA's fingerprint; the unchecked connection logs in with the
    enrolment account only, whose password grants nothing but asking. Raises ValueError if nothing
    came within ``wait_s`` s (no ``fedhar-coordinator invite`` yet) or it is not the pinned CA.
    """
    import ssl

    import paho.mqtt.client as mqtt

    topics = Topics(invitation.federation)
    got: queue.Queue[bytes] = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=invitation.enrol_user)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # checked below by its fingerprint instead; nothing secret is sent
    c.tls_set_context(ctx)
    c.username_pw_set(invitation.enrol_user, invitation.enrol_password)
    c.on_connect = lambda client, u, f, rc, p=None: client.subscribe(topics.ca, 1)
    c.on_message = lambda client, u, msg: got.put(bytes(msg.payload))
    try:
        c.connect(invitation.host, invitation.port, keepalive=30)
        c.loop_start()
        pem = got.get(timeout=wait_s).decode(errors="replace")
    except (OSError, queue.Empty) as exc:
        raise ValueError(f"the CA could not be fetched from {invitation.host}:{invitation.port} ({type(exc).__name__}): on the "
                         "server, run fedhar-coordinator invite (it publishes it), or copy ca.crt to the device") from None  # fmt: skip
    finally:
        c.disconnect()
        c.loop_stop()
    try:
        ok = invitation.tls_ca_sha256 in pem_fingerprints(pem, "the fetched CA")
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"the CA the broker at {invitation.host} offers is not the one the invitation pins; nothing kept")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(folder / CA_NAME, pem, mode=0o644)
    return folder / CA_NAME


def _enrol_broker(invitation: Invitation, folder: Path) -> BrokerConfig:
    return BrokerConfig.parse(f"{invitation.host}:{invitation.port}", username=invitation.enrol_user,
                              password=invitation.enrol_password, tls_ca=str(folder / CA_NAME))  # fmt: skip


def request_certificate(prepared: Prepared, invitation: Invitation, wait_s: float = 600.0, broker: BrokerConfig | None = None) -> Path:
    """Leave the request on the broker (retained: it may be approved later) and wait up to ``wait_s`` s for the
    certificate; returns ``device.crt``. The connection checks the broker against the pinned CA; ``broker`` defaults
    to the invitation's host and port with the enrolment account.

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
    """Check the reply's certificate holds this device's key and name and write it as ``device.crt`` (mode 0644);
    EnrolmentNotApproved for a refusal or another key or name."""
    if reply.certificate_pem is None:
        raise EnrolmentNotApproved(certificate_refused(prepared.client_id, str(reply.refused)))
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

    Raises ValueError if ``device.crt`` is missing (not approved yet) or another option is invalid.
    """
    folder = Path(folder)
    if not (folder / CERT_NAME).is_file():
        raise ValueError(f"{folder / CERT_NAME} does not exist: the device is not approved yet (fedhar-coordinator approve CODE)")
    return BrokerConfig.parse(f"{invitation.host}:{invitation.device_port}", username=client_id, tls_ca=str(folder / CA_NAME),
                              tls_cert=str(folder / CERT_NAME), tls_key=str(folder / KEY_NAME))  # fmt: skip


def main(argv: list[str]) -> int:
    """``fedhar-client request-certificate --invitation FILE --client-id NAME [--folder DIR] [--wait S] [--new-key]``.

    Prints the code and key fingerprint, waits for the approval and prints the options that log in
    with the certificate. Returns 0 approved; 2 bad options or invitation, or not approved in time
    (the same key and code are kept); 4 the broker refused the enrolment account or its certificate.
    """
    import argparse
    import sys

    from har_io.exit_codes import Exit, fail
    from har_io.mqtt_link import BrokerRefused

    ap = argparse.ArgumentParser(prog="fedhar-client request-certificate", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--invitation", required=True, help="the invitation: a file (fedhar-coordinator invite writes it) or its scanned text")
    ap.add_argument("--client-id", required=True, help="the name to ask for (letters, digits, _ . -)")
    ap.add_argument("--folder", type=Path, default=None, help="where the key and certificate are kept (default ~/.fedhar/<id>/certificate)")
    ap.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the approval (default %(default)s)")
    ap.add_argument("--new-key", action="store_true",
                    help="replace a key that has a certificate with a new one (after the operator's reissue or rename)")
    args = ap.parse_args(argv)
    prog = "fedhar-client request-certificate"
    try:
        text = args.invitation
        if not text.lstrip().startswith("{"):
            text = Path(text).read_text()
        inv = Invitation.from_json(text)
        folder = args.folder or Path.home() / ".fedhar" / check_client_id(args.client_id) / "certificate"
        prep = prepare(folder, args.client_id, inv, new_key=args.new_key)
    except (ValueError, OSError) as exc:
        return fail(f"{prog}: {exc}")
    print(f"enrolment code:  {prep.code}")
    print(f"key fingerprint: {prep.fingerprint}")
    print(f"On the server: fedhar-coordinator pending (compare the fingerprint), then fedhar-coordinator approve {prep.code}")
    sys.stdout.flush()
    try:
        crt = request_certificate(prep, inv, wait_s=args.wait)
    except EnrolmentNotApproved as exc:
        return fail(f"{prog}: {exc}")
    except BrokerRefused as exc:
        return fail(f"{prog}: {exc}", Exit.BROKER_REFUSED)
    print(f"approved: {crt}. Log in with")
    print(f"  fedhar-client --broker {inv.host}:{inv.device_port} --federation {inv.federation} --client-id {args.client_id} "
          f"--tls-ca {folder / CA_NAME} --tls-cert {crt} --tls-key {folder / KEY_NAME} --source ...")  # fmt: skip
    return Exit.OK
