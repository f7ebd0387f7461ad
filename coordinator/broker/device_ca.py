"""The federation's device CA: it signs the client certificates of devices enrolled by certificate, and revokes them.

In ``tls/`` of a folder with ``--device-cert-port``: ``devices-ca.crt``/``.key``, an EC P-256 CA made
here (10 years; key mode 0600) that only the device-certificate listener trusts, so its online key
cannot make a certificate devices would take for the broker's (that is the operator's offline CA);
``devices.crl``, its revocation list (RFC 5280, section 5), refused in the TLS handshake after a
reload; ``devices/``, openssl's CA database and ``issued/<name>.crt``. Every operation is ``openssl
ca`` (1.1.1 or 3.x) under the folder's lock.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from pathlib import Path

from coordinator.broker.certificates import _openssl
from coordinator.broker.settings import MANIFEST_NAME, TLS_DIR, SetupError, checked_id, read_settings
from har_models.files import atomic_write_bytes

CA_DAYS = 3650
"""Validity of the device CA (days): ten years, the life of a home server's hardware."""

CERT_DAYS = 825
"""Validity of a device certificate (days), as the server certificate's of the openssl recipe."""

CRL_DAYS = 3650
"""Validity of the revocation list (days): an expired list makes OpenSSL refuse every device certificate."""

_CNF = """\
# openssl ca configuration of the fedhar device CA (written by fedhar-coordinator broker; do not edit)
[ ca ]
default_ca = devices

[ devices ]
dir = {db}
database = $dir/index.txt
serial = $dir/serial
crlnumber = $dir/crlnumber
new_certs_dir = $dir/new
default_md = sha256
default_crl_days = {crl_days}
policy = policy_cn
unique_subject = no
copy_extensions = none
email_in_dn = no

[ policy_cn ]
commonName = supplied

[ device_cert ]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
"""


def paths(out: Path) -> dict[str, Path]:
    """The device CA's files in the broker folder ``out``: ``crt``, ``key``, ``crl``, ``db`` (folder), ``cnf``, ``issued`` (folder)."""
    tls = Path(out).expanduser().resolve() / TLS_DIR
    db = tls / "devices"
    return {"crt": tls / "devices-ca.crt", "key": tls / "devices-ca.key", "crl": tls / "devices.crl", "db": db,
            "cnf": db / "ca.cnf", "issued": db / "issued"}  # fmt: skip


def _run(*args: str, what: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([_openssl(), *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SetupError(f"{what}: openssl {args[0]} failed: {(r.stderr or r.stdout).strip()[:400]}")
    return r


def ensure_device_ca(out: Path, federation: str) -> bool:
    """Make the device CA, its database and an empty revocation list in ``out/tls/`` unless they exist; True if made.

    Raises SetupError if openssl is missing or fails.
    """
    p = paths(out)
    if p["crt"].is_file() and p["key"].is_file() and p["crl"].is_file():
        return False
    p["crt"].parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    for d in (p["db"], p["db"] / "new", p["issued"]):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    p["cnf"].write_text(_CNF.format(db=p["db"], crl_days=CRL_DAYS))
    (p["db"] / "index.txt").touch()
    (p["db"] / "serial").write_text(secrets.token_hex(16).upper() + "\n")  # random serials (RFC 5280, 4.1.2.2)
    (p["db"] / "crlnumber").write_text("01\n")
    fd = os.open(p["key"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others, even for a moment
    os.close(fd)
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", str(CA_DAYS),
         "-subj", f"/CN=fedhar {federation} device CA", "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", str(p["key"]), "-out", str(p["crt"]),
         what="device CA")  # fmt: skip
    os.chmod(p["key"], 0o600)
    os.chmod(p["crt"], 0o644)
    _write_crl(out)
    return True


def _write_crl(out: Path) -> None:
    p = paths(out)
    with tempfile.TemporaryDirectory(prefix="fedhar-crl-") as tmp:
        new = Path(tmp) / "devices.crl"
        _run("ca", "-config", str(p["cnf"]), "-gencrl", "-keyfile", str(p["key"]), "-cert", str(p["crt"]), "-out", str(new),
             what="device revocation list")  # fmt: skip
        atomic_write_bytes(p["crl"], new.read_bytes(), mode=0o644)  # public: the broker reads it


def sign_device(out: Path, csr_pem: str, client_id: str, days: int = CERT_DAYS) -> str:
    """Sign ``csr_pem`` (signature checked) as the client certificate of ``client_id``; the certificate (PEM).

    The subject is ``CN=<client_id>`` whatever was asked (the broker takes the CN as user name), with TLS
    client extensions only; recorded in the CA's database and kept as ``devices/issued/<client_id>.crt``.
    Raises SetupError without a device CA, for an invalid name or ``days`` (1..825), a service account's
    name (its CN would log in as it), or a failing openssl.
    """
    checked_id(client_id)
    services = read_settings(Path(out)).service_users if (Path(out) / MANIFEST_NAME).is_file() else []
    if client_id in services:
        raise SetupError(f"{client_id!r} is the name of a service account of {out}; a device certificate never carries it")
    if not 1 <= int(days) <= CERT_DAYS:
        raise SetupError(f"days {days}: give 1 to {CERT_DAYS}")
    p = paths(out)
    if not p["key"].is_file():
        raise SetupError(f"{p['key']} does not exist: the broker folder {out} has no device CA; run fedhar-coordinator broker init "
                         f"--out {out} --device-cert-port PORT")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="fedhar-sign-") as tmp:
        csr, crt = Path(tmp) / "device.csr", Path(tmp) / "device.crt"
        csr.write_text(csr_pem)
        _run("ca", "-batch", "-config", str(p["cnf"]), "-extensions", "device_cert", "-in", str(csr), "-subj", f"/CN={client_id}",
             "-days", str(int(days)), "-notext", "-keyfile", str(p["key"]), "-cert", str(p["crt"]), "-out", str(crt),
             what=f"certificate of {client_id}")  # fmt: skip
        pem = crt.read_text()
    atomic_write_bytes(p["issued"] / f"{client_id}.crt", pem, mode=0o644)
    (p["issued"] / f"{client_id}{NEW_KEY_SUFFIX}").unlink(missing_ok=True)  # the new key it waited for is signed
    return pem


NEW_KEY_SUFFIX = ".awaits-new-key"
"""Marker beside the issued certificates: ``devices/issued/<name>.awaits-new-key``."""


def await_new_key(out: Path, client_id: str) -> None:
    """Let enrolled device ``client_id`` be signed once more, for a new key (``reissue``, ``rename``); until :func:`sign_device`.

    Raises SetupError if the name is invalid or ``out`` has no device CA.
    """
    checked_id(client_id)
    p = paths(out)
    if not p["key"].is_file():
        raise SetupError(f"the broker folder {out} has no device CA")
    atomic_write_bytes(p["issued"] / f"{client_id}{NEW_KEY_SUFFIX}", b"", mode=0o644)


def awaits_new_key(out: Path, client_id: str) -> bool:
    """Whether enrolled device ``client_id`` may be signed for a new key (:func:`await_new_key`, not signed since)."""
    return (paths(out)["issued"] / f"{client_id}{NEW_KEY_SUFFIX}").is_file()


def enrolled_by_certificate(out: Path, client_id: str) -> bool:
    """Whether ``client_id`` holds, or last held, a certificate of this device CA (issued, revoked, or awaiting a new key)."""
    issued_dir = paths(out)["issued"]
    return any((issued_dir / f"{client_id}{end}").is_file() for end in (".crt", ".crt.revoked", NEW_KEY_SUFFIX))


def issued(out: Path, client_id: str) -> Path | None:
    """The certificate last issued to ``client_id`` in ``out`` (``devices/issued/<name>.crt``), or None."""
    path = paths(out)["issued"] / f"{client_id}.crt"
    return path if path.is_file() else None


def revoke_device(out: Path, client_id: str) -> bool:
    """Revoke ``client_id``'s certificate and write a new revocation list; False if it had none.

    The broker refuses it from its next reload; the file is kept as ``<name>.crt.revoked``. Raises
    SetupError if openssl fails (the list unchanged).
    """
    cert = issued(out, client_id)
    if cert is None:
        return False
    p = paths(out)
    r = subprocess.run([_openssl(), "ca", "-config", str(p["cnf"]), "-revoke", str(cert), "-keyfile", str(p["key"]), "-cert",
                        str(p["crt"])], capture_output=True, text=True, timeout=60)  # fmt: skip
    if r.returncode != 0 and "Already revoked" not in (r.stderr + r.stdout):
        raise SetupError(f"revoking the certificate of {client_id}: openssl ca failed: {(r.stderr or r.stdout).strip()[:400]}")
    _write_crl(out)
    cert.replace(cert.with_name(cert.name + ".revoked"))
    return True
