"""Enrolment by certificate: the invitation a device scans, its request, and the server's reply (JSON, never pickle).

The flow (docs/protocol.md, "Enrolment by certificate"): the operator shows the federation's
:class:`Invitation` (broker, pinned CA, the shared enrolment account that may only leave requests
and read replies); the device makes its own key (:mod:`har_io.device_key`) and leaves an
:class:`EnrolRequest` retained at ``fedhar/v1/<fed>/enrol/<CODE>``, CODE bound to its public key;
the operator compares code and fingerprint and approves; the server leaves an :class:`EnrolReply`
at ``.../enrol/<CODE>/reply``; the device checks the certificate holds its key and name. Every
reader raises :class:`EnrolmentMessageError` naming the defect. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from har_io.enrolment import normalise_fingerprint, pem_fingerprints
from har_models.wire.topics import FEDERATION_RE, check_client_id

REQUEST_FORMAT = "fedhar-enrol-request"
REPLY_FORMAT = "fedhar-enrol-reply"
INVITATION_FORMAT = "fedhar-invitation"
VERSION = 1
MAX_MESSAGE_BYTES = 16 * 1024
"""Largest request, reply or invitation read (bytes of UTF-8 JSON); a real one is under 3 kB."""

REFUSALS = ("name_taken", "name_revoked", "refused")
"""Values of :attr:`EnrolReply.refused`: the name is another device's, was revoked for good, or the operator refused."""


class EnrolmentMessageError(ValueError):
    """A request, reply or invitation that cannot be used; the message names the field and the fix."""


def _load(data: bytes | str, fmt: str) -> dict[str, Any]:
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_MESSAGE_BYTES:
        raise EnrolmentMessageError(f"{fmt}: {len(raw)} bytes, more than the {MAX_MESSAGE_BYTES} a real one needs")
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EnrolmentMessageError(f"{fmt}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise EnrolmentMessageError(f"not a {fmt} message (its 'format' is not {fmt!r})")
    if doc.get("version") != VERSION:
        raise EnrolmentMessageError(f"{fmt} version {doc.get('version')!r}: this release reads version {VERSION}; update fedhar")
    return doc


def _dump(fmt: str, doc: dict[str, Any]) -> str:
    return json.dumps({"format": fmt, "version": VERSION, **doc}, separators=(",", ":"))


def _str(doc: dict[str, Any], key: str, fmt: str, optional: bool = False) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise EnrolmentMessageError(f"{fmt}: '{key}' must be a non-empty string")
    return value


def _client_id(value: str | None, fmt: str) -> str:
    try:
        return check_client_id(str(value))
    except ValueError as exc:
        raise EnrolmentMessageError(f"{fmt}: {exc}") from None


@dataclass(frozen=True)
class EnrolRequest:
    """A device's request for a certificate for ``client_id`` (its MQTT user name once approved): a PEM request for
    its own key (:func:`har_io.device_key.make_csr`)."""

    client_id: str
    csr_pem: str

    def to_bytes(self) -> bytes:
        """Compact JSON (UTF-8) with ``format`` and ``version``."""
        return _dump(REQUEST_FORMAT, asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes | str) -> EnrolRequest:
        """Read a request; EnrolmentMessageError if too large, not JSON, of another format or version, or a field is
        invalid (the signature and code are the server's to check, :mod:`har_io.device_key`)."""
        doc = _load(data, REQUEST_FORMAT)
        return cls(_client_id(_str(doc, "client_id", REQUEST_FORMAT), REQUEST_FORMAT), str(_str(doc, "csr_pem", REQUEST_FORMAT)))


@dataclass(frozen=True)
class EnrolReply:
    """The server's answer to one request: the certificate for ``client_id`` (PEM), or ``refused`` (:data:`REFUSALS`)."""

    client_id: str
    certificate_pem: str | None = None
    refused: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate_pem is None) == (self.refused is None):
            raise EnrolmentMessageError(f"{REPLY_FORMAT}: exactly one of certificate_pem and refused")
        if self.refused is not None and self.refused not in REFUSALS:
            raise EnrolmentMessageError(f"{REPLY_FORMAT}: refused {self.refused!r} is not one of {', '.join(REFUSALS)}")

    def to_bytes(self) -> bytes:
        """Compact JSON (UTF-8) with ``format`` and ``version``."""
        return _dump(REPLY_FORMAT, {k: v for k, v in asdict(self).items() if v is not None}).encode()

    @classmethod
    def from_bytes(cls, data: bytes | str) -> EnrolReply:
        """Read a reply; EnrolmentMessageError if too large, not JSON, of another format or version, or a field is invalid."""
        doc = _load(data, REPLY_FORMAT)
        cid = _client_id(_str(doc, "client_id", REPLY_FORMAT), REPLY_FORMAT)
        return cls(cid, _str(doc, "certificate_pem", REPLY_FORMAT, optional=True), _str(doc, "refused", REPLY_FORMAT, optional=True))


@dataclass(frozen=True)
class Invitation:
    """What a device needs to ask for a certificate: the broker, the CA it is trusted by, the enrolment account.

    ``host`` as in the broker's certificate; ``port`` its TLS listener for password accounts (the
    enrolment account's); ``device_port`` its device-certificate listener; the enrolment account may
    only write ``.../enrol/<code>`` and read its reply (docs/protocol.md); ``tls_ca_sha256`` pins the
    CA; ``tls_ca_pem`` is the CA itself when it fits the QR code, else the device has ``ca.crt``.
    """

    coordinator: str
    federation: str
    host: str
    port: int
    device_port: int
    enrol_user: str
    enrol_password: str
    tls_ca_sha256: str
    tls_ca_pem: str | None = None

    def __post_init__(self) -> None:
        if not FEDERATION_RE.match(self.federation):
            raise EnrolmentMessageError(f"{INVITATION_FORMAT}: federation {self.federation!r} is not a federation name")
        for key in ("port", "device_port"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 65536:
                raise EnrolmentMessageError(f"{INVITATION_FORMAT}: {key} {v!r} is not a TCP port (1..65535)")
        try:
            pin = normalise_fingerprint(self.tls_ca_sha256)
        except ValueError as exc:
            raise EnrolmentMessageError(f"{INVITATION_FORMAT}: {exc}") from None
        object.__setattr__(self, "tls_ca_sha256", pin)
        if self.tls_ca_pem is not None:
            try:
                prints = pem_fingerprints(self.tls_ca_pem)
            except ValueError as exc:
                raise EnrolmentMessageError(f"{INVITATION_FORMAT}: {exc}") from None
            if pin not in prints:
                raise EnrolmentMessageError(f"{INVITATION_FORMAT}: tls_ca_pem is not the CA of tls_ca_sha256; re-create the invitation")

    def __repr__(self) -> str:
        return f"Invitation(coordinator={self.coordinator!r}, federation={self.federation!r}, host={self.host!r}, port={self.port})"

    def to_json(self, compact: bool = False) -> str:
        """Compact JSON with ``format`` and ``version`` (the CA left out when None; ``compact``: the pin of an inline CA
        too, for a QR code)."""
        doc = {k: v for k, v in asdict(self).items() if v is not None}
        if compact and self.tls_ca_pem is not None:
            del doc["tls_ca_sha256"]
        return _dump(INVITATION_FORMAT, doc)

    @classmethod
    def from_json(cls, data: bytes | str) -> Invitation:
        """Read an invitation (a QR code's text or a file's); EnrolmentMessageError if too large, not JSON, of another
        format or version, or a field is missing or invalid."""
        doc = _load(data, INVITATION_FORMAT)
        keys = ("coordinator", "federation", "host", "enrol_user", "enrol_password")
        s = {k: _str(doc, k, INVITATION_FORMAT) for k in keys}
        ports = {k: doc.get(k) for k in ("port", "device_port")}
        pem = _str(doc, "tls_ca_pem", INVITATION_FORMAT, optional=True)
        pin = _str(doc, "tls_ca_sha256", INVITATION_FORMAT, optional=pem is not None)
        if pin is None:  # the compact form (a QR code) leaves out the pin of an inline CA: it is the CA's own
            try:
                pin = pem_fingerprints(str(pem))[0]
            except ValueError as exc:
                raise EnrolmentMessageError(f"{INVITATION_FORMAT}: {exc}") from None
        return cls(**s, **ports, tls_ca_sha256=pin, tls_ca_pem=pem)  # type: ignore[arg-type]
