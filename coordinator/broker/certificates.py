"""The broker's TLS files: the openssl recipe that makes them, and the copies in ``tls/`` that the broker reads."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from coordinator.broker.settings import TLS_DIR, BrokerSettings, SetupError
from har_models.files import atomic_write

OPENSSL_HELP = """\
TLS certificates (once, on the operator's machine; keep ca.key offline). Replace homeserver and
the address with the names and addresses devices use to reach the broker:

  openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=fedhar CA" \\
      -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout ca.key -out ca.crt
  openssl req -newkey rsa:3072 -nodes -subj "/CN=homeserver" -keyout server.key -out server.csr
  printf '%s\\n' "subjectAltName=DNS:homeserver,DNS:homeserver.local,IP:192.168.1.10" \\
      "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \\
      "authorityKeyIdentifier=keyid,issuer" > server.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \\
      -extfile server.ext -out server.crt

then pass --tls-cert server.crt --tls-key server.key --tls-ca ca.crt, and copy ca.crt (never a
key) to every device (fedhar-client --tls-ca ca.crt). The three files are copied into the output
folder's tls/ (the key readable by the broker's account only), so the broker never reads them
where they were made; run the same command again with the three options after renewing them.
"""


def install_tls_files(out: Path, settings: BrokerSettings) -> BrokerSettings:
    """Copy the TLS certificate, key and CA of ``settings`` into ``out/tls/``; return settings naming the copies.

    Mosquitto started as root loads its certificates after switching to ``broker_user``, so a
    key left where it was made (``/root/server.key``, mode 0600) stops the broker at start
    ("Unable to load CA certificates", permission denied). The copies are ``server.crt`` and
    ``ca.crt`` (mode 0644) and ``server.key`` (mode 0640, group of ``broker_user`` when run as
    root, else 0600), each replaced atomically. A file that already is the copy is left alone,
    so a re-run without the TLS options keeps them.

    Parameters
    ----------
    out : Path
        The output folder (absolute, existing).
    settings : BrokerSettings
        Checked settings (:func:`check_settings`: absolute, readable TLS paths, or None).

    Returns
    -------
    BrokerSettings
        ``settings`` with ``tls_cert``, ``tls_key`` and ``tls_ca`` replaced by the copies' paths.

    Raises
    ------
    SetupError
        If ``broker_user`` does not exist when run as root.
    """
    if not settings.tls:
        return settings
    tls = out / TLS_DIR
    tls.mkdir(mode=0o750, exist_ok=True)
    gid = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        try:
            gid = pwd.getpwnam(settings.broker_user).pw_gid
        except KeyError:
            raise SetupError(
                f"--broker-user {settings.broker_user}: no such account; install mosquitto (it creates the 'mosquitto' account) "
                "or name the account the broker runs as"
            ) from None
        os.chown(tls, 0, gid)
    os.chmod(tls, 0o750 if gid is not None else 0o700)
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
