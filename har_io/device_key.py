"""A device's own key pair for certificate enrolment: made, asked to be certified, and recognised again, with openssl.

The device makes an EC P-256 key that never leaves it (:func:`make_key`), a request naming its
client id (:func:`make_csr`), and shows the *enrolment code* (:func:`enrolment_code`): the first
50 bits of its public key's SHA-256, ``ABCDE-FGHJK``. The code is bound to the key: the server
checks the request's signature (:func:`csr_public_key`) and recomputes the code, and the operator
compares the key fingerprint (:func:`key_fingerprint`). Every operation runs ``openssl`` (1.1.1 or
3.x; no cryptography package); public keys are DER ``SubjectPublicKeyInfo`` (RFC 5280, 4.1).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from har_models.wire.topics import check_client_id

CODE_CHARS = 10
"""Characters of an enrolment code: 10 base32 characters, 50 bits of the key's SHA-256."""

P256_SPKI_PREFIX = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200")
"""The DER bytes every EC P-256 SubjectPublicKeyInfo starts with (id-ecPublicKey, prime256v1, a 66-byte
BIT STRING); an uncompressed point (0x04, x, y) follows, 91 bytes in all (RFC 5480, section 2)."""

_CODE_RE = re.compile(rf"^[A-Z2-7]{{{CODE_CHARS}}}$")
_PEM_KEY_RE = re.compile(r"-----BEGIN PUBLIC KEY-----\s*(.*?)\s*-----END PUBLIC KEY-----", re.DOTALL)
MAX_CSR_BYTES = 4096
"""Largest request accepted (bytes of PEM); a P-256 request naming one client id is about 400."""


class DeviceKeyError(ValueError):
    """A key, request or certificate that cannot be used; the message names it and the fix."""


def _openssl() -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise DeviceKeyError("openssl is not installed: apt-get install openssl (it makes and checks the device's key)")
    return exe


def _run(args: list[str], data: bytes | None = None, what: str = "openssl") -> subprocess.CompletedProcess[bytes]:
    r = subprocess.run([_openssl(), *args], input=data, capture_output=True, timeout=60)
    if r.returncode != 0:
        why = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
        raise DeviceKeyError(f"{what}: openssl {args[0]} failed ({why[0] if why else 'no message'})")
    return r


def make_key(path: Path) -> Path:
    """Make a new EC P-256 private key at ``path`` (PEM, PKCS#8, mode 0600); returns ``path``.

    Raises DeviceKeyError if ``path`` exists (a key is never overwritten: its certificate would stop
    matching) or openssl is missing or fails.
    """
    path = Path(path)
    if path.exists():
        raise DeviceKeyError(f"{path} exists already; a device key is never replaced: remove it first to enrol anew")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 before openssl writes into it, so the key is never readable by others, not even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        _run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)], what=f"key {path}")
    except DeviceKeyError:
        path.unlink(missing_ok=True)
        raise
    os.chmod(path, 0o600)
    return path


def make_csr(key: Path, client_id: str) -> str:
    """A PEM certificate signing request (PKCS#10, SHA-256) for ``key``, subject ``CN=<client_id>``.

    Raises ValueError for an invalid client id, DeviceKeyError if the key cannot be read or openssl fails.
    """
    check_client_id(client_id)
    r = _run(["req", "-new", "-sha256", "-key", str(key), "-subj", f"/CN={client_id}"], what=f"request for key {key}")
    return r.stdout.decode()


def _pem_public_key(text: str, what: str) -> bytes:
    m = _PEM_KEY_RE.search(text)
    if m is None:
        raise DeviceKeyError(f"{what}: openssl gave no public key")
    try:
        return base64.b64decode("".join(m.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        raise DeviceKeyError(f"{what}: the public key is not base64") from None


def _p256(spki: bytes, what: str) -> bytes:
    if len(spki) != 91 or not spki.startswith(P256_SPKI_PREFIX):
        raise DeviceKeyError(f"{what}: not an EC P-256 key; make it with openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256")
    return spki


def key_public_der(key: Path) -> bytes:
    """The DER SubjectPublicKeyInfo of the private key file ``key`` (91 bytes); DeviceKeyError unless EC P-256."""
    r = _run(["pkey", "-in", str(key), "-pubout", "-outform", "DER"], what=f"key {key}")
    return _p256(r.stdout, f"key {key}")


def csr_public_key(csr_pem: str) -> bytes:
    """The DER SubjectPublicKeyInfo of a request, after checking the request's own signature with it (PKCS#10,
    RFC 2986, section 3: made by the key's holder, not altered on the way).

    Raises DeviceKeyError if it is larger than :data:`MAX_CSR_BYTES`, not a PEM request, its signature
    does not verify, or its key is not EC P-256.
    """
    data = csr_pem.encode()
    if len(data) > MAX_CSR_BYTES or "-----BEGIN CERTIFICATE REQUEST-----" not in csr_pem:
        raise DeviceKeyError(f"the request is not a PEM certificate request of at most {MAX_CSR_BYTES} bytes")
    r = _run(["req", "-verify", "-noout", "-pubkey"], data=data, what="request")
    # OpenSSL 3.0 exits 0 when the signature does not verify; only its words tell ("...verify OK" / "...verify failure").
    said = (r.stderr + r.stdout).decode(errors="replace")
    if "verify OK" not in said or "failure" in said:
        raise DeviceKeyError("request: its signature does not verify with its own key (altered on the way, or not made by its holder)")
    return _p256(_pem_public_key(r.stdout.decode(), "request"), "request")


def certificate_public_key(cert_pem: str) -> bytes:
    """The DER SubjectPublicKeyInfo of a PEM certificate (DeviceKeyError if it is not one)."""
    r = _run(["x509", "-noout", "-pubkey"], data=cert_pem.encode(), what="certificate")
    return _pem_public_key(r.stdout.decode(), "certificate")


def certificate_subject_cn(cert_pem: str) -> str:
    """The common name (CN) of a PEM certificate's subject, e.g. the client id (DeviceKeyError without one)."""
    r = _run(["x509", "-noout", "-subject", "-nameopt", "RFC2253"], data=cert_pem.encode(), what="certificate")
    text = r.stdout.decode().strip().removeprefix("subject=").strip()
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        if key == "CN":
            return value
    raise DeviceKeyError(f"certificate subject {text!r} has no CN")


def key_fingerprint(spki: bytes) -> str:
    """SHA-256 of a DER SubjectPublicKeyInfo as 16 groups of 4 lowercase hex digits (what device and server show)."""
    h = hashlib.sha256(spki).hexdigest()
    return " ".join(h[i : i + 4] for i in range(0, 64, 4))


def enrolment_code(spki: bytes) -> str:
    """The enrolment code of a DER public key: the first 50 bits of its SHA-256 in base32 (RFC 4648), as ``ABCDE-FGHJK``."""
    c = base64.b32encode(hashlib.sha256(spki).digest()).decode()[:CODE_CHARS]
    return f"{c[:5]}-{c[5:]}"


def normalise_code(text: str) -> str:
    """An enrolment code as typed (any case, dashes or spaces, 0/1/8 for O/I/B) as ``ABCDE-FGHJK``; DeviceKeyError
    unless 10 base32 characters."""
    c = "".join(text.split()).replace("-", "").upper().translate(str.maketrans("018", "OIB"))
    if not _CODE_RE.match(c):
        raise DeviceKeyError(
            f"enrolment code {text[:40]!r}: expected 10 letters and digits 2-7 as the device shows them, e.g. ABCDE-FGHJK"
        )
    return f"{c[:5]}-{c[5:]}"


def code_topic_level(code: str) -> str:
    """The enrolment code as one MQTT topic level, without the dash (``ABCDEFGHJK``); errors as :func:`normalise_code`."""
    return normalise_code(code).replace("-", "")
