"""The broker's TLS files: the openssl recipe that makes them, and the copies in ``tls/`` that the broker reads."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from coordinator.broker.files import broker_account
from coordinator.broker.settings import TLS_DIR, BrokerSettings, SetupError
from har_models.files import atomic_write

OPENSSL_HELP = """\
TLS certificates (once, on the operator's machine; keep ca.key offline). Replace homeserver and
the address with the names and addresses devices use to reach the broker:

  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 -subj "/CN=fedhar CA" \\
      -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout ca.key -out ca.crt
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=homeserver" -keyout server.key -out server.csr
  printf '%s\\n' "subjectAltName=DNS:homeserver,DNS:homeserver.local,IP:192.168.1.10" \\
      "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" \\
      "authorityKeyIdentifier=keyid,issuer" > server.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \\
      -extfile server.ext -out server.crt

then pass --tls-cert server.crt --tls-key server.key --tls-ca ca.crt, and copy ca.crt (never a
key) to every device (fedhar-client --tls-ca ca.crt). The three files are copied into the output
folder's tls/ (the key readable by the broker's account only), so the broker never reads them
where they were made; run the same command again with the three options after renewing them.
EC P-256 keeps the CA small enough (about 600 bytes) to travel inside an enrolment QR code.
"""


def install_tls_files(out: Path, settings: BrokerSettings) -> BrokerSettings:
    """Copy the TLS certificate, key and CA of checked ``settings`` into ``out/tls/``; return settings naming the copies.

    Mosquitto started as root loads its certificates after switching to ``broker_user``, so a key left
    where it was made (mode 0600 of root) stops it at start. Copies: ``server.crt`` and ``ca.crt`` (0644),
    ``server.key`` (0640 with ``broker_user``'s group as root, else 0600), each atomic; a file that is
    already the copy stays. Raises SetupError if ``broker_user`` does not exist when run as root.
    """
    if not settings.tls:
        return settings
    tls = out / TLS_DIR
    tls.mkdir(mode=0o751, exist_ok=True)
    gid = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        gid = broker_account(settings).pw_gid
        os.chown(tls, 0, gid)
    # Others may pass, not list: the certificates (0644) are public and read by the home server for their expiry; the
    # key is 0640 (the broker's group) or 0600.
    os.chmod(tls, 0o751 if gid is not None else 0o711)
    copies: dict[str, str | None] = {}
    for key, name, secret in (("tls_cert", "server.crt", False), ("tls_key", "server.key", True), ("tls_ca", "ca.crt", False)):
        src = getattr(settings, key)
        if src is None:
            copies[key] = None
            continue
        dst = tls / name
        if Path(src) != dst:
            data = Path(src).read_bytes()

            def write(tmp: Path, data: bytes = data, secret: bool = secret) -> None:
                tmp.write_bytes(data)
                if secret and gid is not None:
                    os.chown(tmp, 0, gid)
                os.chmod(tmp, (0o640 if gid is not None else 0o600) if secret else 0o644)

            atomic_write(dst, write, mode=None)
        copies[key] = str(dst)
    return replace(settings, **copies)  # type: ignore[arg-type]  # the keys are the three str | None TLS fields


EXPIRY_WARNING_S = 30 * 24 * 3600.0
"""How long (s) before a certificate expires the server warns (log, page): 30 days to renew by hand."""


@dataclass(frozen=True)
class CertificateExpiry:
    """When one of the broker's certificates (``which``: "server" or "ca") stops being valid (UNIX s, its notAfter)."""

    which: str
    path: Path
    not_after_unix: float

    def seconds_left(self, now: float) -> float:
        """Seconds from ``now`` (UNIX s) until it expires (negative: expired)."""
        return self.not_after_unix - now


def _openssl() -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise SetupError("openssl is not installed: apt-get install openssl (it reads and makes the broker's certificates)")
    return exe


def certificate_not_after(path: Path) -> float:
    """The notAfter of the PEM certificate ``path`` (UNIX s); SetupError naming the file if openssl or the file fails."""
    r = subprocess.run([_openssl(), "x509", "-noout", "-enddate", "-in", str(path)], capture_output=True, text=True, timeout=30)
    text = r.stdout.strip()
    if r.returncode != 0 or not text.startswith("notAfter="):
        why = (r.stderr.strip().splitlines() or ["no notAfter"])[0]
        raise SetupError(f"certificate {path}: cannot be read ({why}); give a PEM certificate")
    when = " ".join(text.partition("=")[2].split())  # "Dec 1 22:25:23 2027 GMT"
    try:
        dt = datetime.datetime.strptime(when, "%b %d %H:%M:%S %Y GMT").replace(tzinfo=datetime.UTC)
    except ValueError:
        raise SetupError(f"certificate {path}: notAfter {when!r} is not a date openssl writes") from None
    return dt.timestamp()


def certificate_expiry(settings: BrokerSettings) -> list[CertificateExpiry]:
    """The expiry of the broker's server certificate and CA in ``settings`` (none without TLS); SetupError as above."""
    out = []
    for which, path in (("server", settings.tls_cert), ("ca", settings.tls_ca)):
        if path:
            out.append(CertificateExpiry(which, Path(path), certificate_not_after(Path(path))))
    return out


def renew_server_certificate(out: Path, ca_key: Path, days: int = 825) -> CertificateExpiry:
    """Issue a new server certificate for the broker folder ``out`` from its CA, valid ``days`` (1..825) days.

    Keeps the server key, subject and extensions of ``tls/server.crt`` and signs with ``tls/ca.crt`` and
    ``ca_key``, so devices keep connecting; verified against the CA before it replaces the old file
    atomically (mode and group kept). A broker reload serves it (Mosquitto 2.0.11). Raises SetupError
    without TLS files, for ``days`` out of range, or when openssl fails (its message; nothing replaced).
    """
    if not 1 <= int(days) <= 825:
        raise SetupError(f"--days {days}: give 1 to 825 days")
    tls = Path(out).expanduser().resolve() / TLS_DIR
    crt, key, ca = tls / "server.crt", tls / "server.key", tls / "ca.crt"
    for p in (crt, key, ca):
        if not p.is_file():
            raise SetupError(
                f"{p} does not exist: {out} has no TLS files; run fedhar-coordinator broker init with --tls-cert/--tls-key/--tls-ca"
            )
    if not Path(ca_key).is_file():
        raise SetupError(f"--ca-key {ca_key}: no such file; name the CA's private key (ca.key of the openssl recipe)")
    exe = _openssl()
    with tempfile.TemporaryDirectory(prefix="fedhar-renew-") as tmp:
        csr, new = Path(tmp) / "server.csr", Path(tmp) / "server.crt"

        def run(*args: str) -> None:
            r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise SetupError(f"openssl {args[0]} failed: {(r.stderr or r.stdout).strip()[:400]}; nothing was replaced")

        run("x509", "-x509toreq", "-in", str(crt), "-signkey", str(key), "-copy_extensions", "copyall", "-out", str(csr))
        run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-CAserial",
            str(Path(tmp) / "ca.srl"), "-days", str(int(days)), "-copy_extensions", "copyall", "-out", str(new))  # fmt: skip
        run("verify", "-CAfile", str(ca), str(new))
        data = new.read_bytes()
    st = crt.stat()

    def write(tmp: Path) -> None:
        tmp.write_bytes(data)
        os.chmod(tmp, st.st_mode & 0o777)
        if st.st_gid != os.stat(tmp).st_gid:
            os.chown(tmp, -1, st.st_gid)

    atomic_write(crt, write, mode=None)
    return CertificateExpiry("server", crt, certificate_not_after(crt))
