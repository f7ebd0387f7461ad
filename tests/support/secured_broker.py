"""A Mosquitto as a federation really runs it, for the app's tests: TLS, an ACL and one account per device.

The configuration is written by ``firmware_scripts/mosquitto_config.py`` (as an operator
would run it); the certificates by openssl with the recipe of its ``--help``. A second,
unrelated CA is made too, to show what a device configured with the wrong CA sees.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from simulation.broker import free_ports, stop_process, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "firmware_scripts" / "mosquitto_config.py"


class Missing(RuntimeError):
    """A program the secured broker needs (mosquitto, mosquitto_passwd, openssl) is not installed."""


@dataclass
class SecuredBroker:
    """A running Mosquitto: plain listener on loopback (the coordinator), TLS listener (the devices)."""

    out: Path
    port: int
    tls_port: int
    ca: Path
    wrong_ca: Path
    log: Path
    device_cert_port: int | None = None

    def password(self, user: str) -> str:
        """The generated password of ``user``."""
        return (self.out / "credentials" / f"{user}.password").read_text().strip()

    def password_file(self, user: str) -> Path:
        return self.out / "credentials" / f"{user}.password"


def _tool(name: str, *extra: str) -> str:
    found = shutil.which(name) or next((p for p in extra if os.access(p, os.X_OK)), None)
    if found is None:
        raise Missing(f"{name} is not installed (apt-get install mosquitto openssl)")
    return found


def _openssl(d: Path, *args: str) -> None:
    r = subprocess.run([_tool("openssl"), *args], cwd=d, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {r.stderr}")


def make_pki(d: Path) -> tuple[Path, Path, Path, Path]:
    """CA, server certificate (for 127.0.0.1 and localhost) and key, and an unrelated CA: (ca, crt, key, wrong_ca)."""
    d.mkdir(parents=True, exist_ok=True)
    for name in ("ca", "other-ca"):
        _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", f"/CN=fedhar {name}",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", f"{name}.key", "-out", f"{name}.crt")  # fmt: skip
    _openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr")
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "30",
             "-extfile", "server.ext", "-out", "server.crt")  # fmt: skip
    return d / "ca.crt", d / "server.crt", d / "server.key", d / "other-ca.crt"


def configure(tmp: Path, federation: str, clients: list[str], device_certs: bool = False) -> SecuredBroker:
    """Certificates and the generated configuration for ``clients`` in ``tmp``; Mosquitto not started.

    With ``device_certs`` the folder also has the device-certificate listener (``--device-cert-port``,
    a free port) with its device CA and enrolment accounts.

    Raises
    ------
    Missing
        If mosquitto, mosquitto_passwd or openssl is not installed.
    RuntimeError
        If the generator fails.
    """
    _tool("mosquitto", "/usr/sbin/mosquitto")
    _tool("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
    ca, crt, key, wrong_ca = make_pki(tmp / "pki")
    ports = free_ports(3)
    out, port, tls_port = tmp / "broker", ports[0], ports[1]
    device_port = ports[2] if device_certs else None
    me = pwd.getpwuid(os.geteuid()).pw_name  # started as root, Mosquitto would switch to an account that cannot read tmp
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--broker-user", me, "--public-host", "127.0.0.1", "--json",
           "--federation", federation, "--clients", ",".join(clients), "--port", str(port), "--tls-port", str(tls_port),
           "--tls-bind", "127.0.0.1", "--tls-cert", str(crt), "--tls-key", str(key), "--tls-ca", str(ca)]  # fmt: skip
    if device_port is not None:
        cmd += ["--device-cert-port", str(device_port)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"mosquitto_config.py failed: {r.stderr}")
    return SecuredBroker(out, port, tls_port, ca, wrong_ca, tmp / "mosquitto.log", device_port)


def start(broker: SecuredBroker) -> subprocess.Popen[bytes]:
    """Run Mosquitto on ``broker``'s configuration (its log appended to ``broker.log``) once it listens on every port.

    Started again after a stop, it serves the same ports, accounts and persisted messages.

    Raises
    ------
    RuntimeError
        If Mosquitto does not listen on its ports within 10 s (it is stopped first).
    """
    with open(broker.log, "ab") as sink:
        proc = subprocess.Popen([_tool("mosquitto", "/usr/sbin/mosquitto"), "-c", str(broker.out / "mosquitto.conf"), "-v"],
                                stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    ports = (broker.port, broker.tls_port, *([broker.device_cert_port] if broker.device_cert_port else []))
    for p in ports:
        if not wait_for_port("127.0.0.1", p, 10):
            stop_process(proc)
            raise RuntimeError(f"mosquitto did not listen on {p}; log:\n{broker.log.read_text()[-3000:]}")
    return proc


@contextmanager
def secured_mosquitto(tmp: Path, federation: str, clients: list[str], device_certs: bool = False) -> Iterator[SecuredBroker]:
    """Generate the configuration for ``clients`` (:func:`configure`) and run Mosquitto on it until the block ends.

    Raises
    ------
    Missing
        If mosquitto, mosquitto_passwd or openssl is not installed.
    RuntimeError
        If the generator fails or Mosquitto does not listen within 10 s.
    """
    broker = configure(tmp, federation, clients, device_certs)
    proc = start(broker)
    try:
        yield broker
    finally:
        stop_process(proc)
