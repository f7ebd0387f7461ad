"""The federation's device CA: it signs the client certificates of devices enrolled by certificate, and revokes them.

A broker folder with a device-certificate listener (``--device-cert-port``) holds, in ``tls/``:

* ``devices-ca.crt`` and ``devices-ca.key``: an EC P-256 CA made here, valid 10 years. It signs
  only device certificates, and the device-certificate listener trusts only it (its ``cafile``),
  so its key, which must stay on the server to sign online, cannot make a certificate the
  devices would take for the broker's: that is the operator's own CA (``ca.key``, kept offline).
  The key is mode 0600 of the account that made it (root, or the server's account).
* ``devices.crl``: its certificate revocation list (RFC 5280, section 5), the listener's
  ``crlfile``: a revoked device's certificate is refused in the TLS handshake once the broker
  has reloaded. It is valid for :data:`CRL_DAYS` and re-signed at every revocation.
* ``devices/``: openssl's CA database (``index.txt``, serial numbers) and the issued
  certificates, ``devices/issued/<name>.crt``.

Every operation is the ``openssl ca`` command (OpenSSL 1.1.1 or 3.x), as the rest of the
broker tooling uses openssl; they run under the folder's lock.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from pathlib import Path

from coordinator.broker.certificates import _openssl
from coordinator.broker.settings import MANIFEST_NAME, TLS_DIR, SetupError, read_settings
from har_models.files import atomic_write_bytes
from har_models.wire.topics import check_client_id

CA_DAYS = 3650
"""Validity of the device CA (days): ten years, the life of a home server's hardware."""

CERT_DAYS = 825
"""Validity of a device certificate (days), as the server certificate's of the openssl recipe."""

CRL_DAYS = 3650
"""Validity of the revocation list (days). An expired list makes OpenSSL refuse every device certificate, so it is
long; each revocation writes a new one."""

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

    Raises
    ------
    SetupError
        If openssl is missing or fails.
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
    """Sign the request ``csr_pem`` as the client certificate of ``client_id``; returns the certificate (PEM).

    The subject is ``CN=<client_id>`` whatever the request asked for (the broker takes the CN
    as the user name, ``use_identity_as_username``), with the extensions of a TLS client only
    (no CA, ``clientAuth``). The certificate is recorded in the CA's database (for
    :func:`revoke_device`) and kept as ``devices/issued/<client_id>.crt``.

    Parameters
    ----------
    out : Path
        A broker folder with a device CA (:func:`ensure_device_ca`).
    csr_pem : str
        A PEM certificate request whose signature has been checked (:func:`har_io.device_key.csr_public_key`).
    client_id : str
        The device's name.
    days : int
        Validity (1..825 days).

    Raises
    ------
    SetupError
        If the folder has no device CA, the name or ``days`` is invalid, the name is a service
        account's (the coordinator's, the monitor's, ...: a certificate with that CN would log in
        as it), or openssl fails.
    """
    try:
        check_client_id(client_id)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
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
    """Let an enrolled device ``client_id`` be signed once more, for a key it makes anew (``reissue``, ``rename``).

    An enrolled name is otherwise refused by the enrolment desk (taken). The marker goes when
    :func:`sign_device` signs a certificate for the name.

    Raises
    ------
    SetupError
        If the name is invalid or ``out`` has no device CA.
    """
    try:
        check_client_id(client_id)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
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
    """Revoke the certificate issued to ``client_id`` and write a new revocation list; False if it had none.

    The broker refuses the certificate from its next reload (it re-reads ``crlfile`` then;
    tests/test_enrol_certificates.py measures it with Mosquitto 2.0.11). The issued file is
    kept as ``<name>.crt.revoked``, so a later certificate under the same name is told apart.

    Raises
    ------
    SetupError
        If openssl fails (the list is then unchanged).
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
