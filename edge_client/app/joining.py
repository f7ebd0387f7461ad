"""Joining a federation from the app: the settings typed or read from an enrolment bundle, checked and stored.

:func:`federation_fields` is the one entry for the Federation screen's fields, typed by hand or
filled by :func:`enrol` from a bundle; the password goes to the app's private folder
(:func:`store_password`), never into the settings.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from edge_client.app.config import ACCEPTED_MARK, APP_BACKENDS, CREDENTIALS_DIR, ENROLLED_MARK, PASSWORD_FILE
from har_io.enrolment import EnrolmentBundle, read_bundle
from har_models.files import atomic_write_bytes
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.app")


def enrolled(state_dir: Path) -> bool:
    """Whether the stored password came from an enrolment bundle (:data:`ENROLLED_MARK`)."""
    return (state_dir / ENROLLED_MARK).is_file()


def note_accepted(state_dir: Path) -> None:
    """Mark that the broker accepted the stored password (:data:`~edge_client.app.config.ACCEPTED_MARK`); once is enough."""
    mark = state_dir / ACCEPTED_MARK
    if mark.parent.is_dir() and not mark.exists():
        mark.write_text("the broker accepted the password stored in this folder\n")


def accepted_before(state_dir: Path) -> bool:
    """Whether the broker accepted the stored password before (:func:`note_accepted`)."""
    return (state_dir / ACCEPTED_MARK).is_file()


def federation_fields(state_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Check the Federation settings typed or imported and turn them into :class:`AppConfig` fields.

    The one entry for settings typed by hand and from an enrolment bundle. ``fields``: any of
    ``client_id``, ``broker`` (``HOST:PORT``), ``federation`` (client-id rules), ``username`` (""
    or None: anonymous), ``password`` ("" removes the stored one; stored by :func:`store_password`
    and given back as ``password_file``), ``enrolled`` (that password came from a bundle),
    ``password_file``, ``tls_ca`` (an existing CA file; "" or None: no TLS), ``backend``
    (:data:`APP_BACKENDS`). Raises ValueError for an unknown key or an invalid value, naming the fix.
    """
    known = {"client_id", "broker", "federation", "username", "password", "password_file", "tls_ca", "backend", "enrolled"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown federation setting(s) {unknown}; known: {sorted(known)}")
    out: dict[str, Any] = {}
    if "client_id" in fields:
        out["client_id"] = check_client_id(str(fields["client_id"]).strip())
    if "broker" in fields:
        out["broker"] = parse_broker(str(fields["broker"]))
    if "federation" in fields:
        fed = str(fields["federation"]).strip()
        try:
            out["federation"] = check_client_id(fed)
        except ValueError:
            raise ValueError(f"federation name {fed!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'") from None
    if "username" in fields:
        user = str(fields["username"] or "").strip()
        if any(c.isspace() for c in user) or len(user) > 128:
            raise ValueError(f"user name {user!r} is invalid: no spaces, at most 128 characters")
        out["username"] = user or None
    if "tls_ca" in fields:
        ca = str(fields["tls_ca"] or "").strip()
        if ca and not Path(ca).is_file():
            raise ValueError(f"CA certificate {ca}: no such file; give the path of the CA certificate (.crt, PEM)")
        out["tls_ca"] = Path(ca) if ca else None
    if "backend" in fields:
        backend = str(fields["backend"] or "auto")
        if backend not in APP_BACKENDS:
            raise ValueError(f"training backend {backend!r} is unknown; use one of {', '.join(APP_BACKENDS)}")
        out["backend"] = backend
    if "password_file" in fields:
        out["password_file"] = Path(fields["password_file"]) if fields["password_file"] else None
    if "password" in fields and fields["password"] is not None:
        out["password_file"] = store_password(state_dir, str(fields["password"]))
        (state_dir / ACCEPTED_MARK).unlink(missing_ok=True)  # a new password: not accepted by the broker yet
        mark = state_dir / ENROLLED_MARK
        if fields.get("enrolled"):
            mark.write_text("the password in this folder came from an enrolment bundle\n")
        else:  # typed by hand: a refused login is the typist's to check
            mark.unlink(missing_ok=True)
    return out


def enrol(controller: Any, source: str | Path, ca_file: str | Path | None = None) -> EnrolmentBundle:
    """:meth:`DeviceController.enrol` for any controller with ``cfg`` and ``set_federation`` (the Android UI's too)."""
    bundle, fields = enrolment_fields(controller.cfg.state_dir, source, ca_file if ca_file is not None else controller.cfg.tls_ca)
    controller.set_federation(**fields)
    log.info("enrolled: client %s of federation %s (coordinator %r) at %s", bundle.client_id, bundle.federation,
             bundle.coordinator, fields["broker"])  # fmt: skip
    return bundle


def enrolment_fields(state_dir: Path, source: str | Path, ca_file: str | Path | None = None) -> tuple[EnrolmentBundle, dict[str, Any]]:
    """Read an enrolment bundle (file or JSON text) and give the bundle and the Federation fields it sets.

    An inline CA is written to ``<state_dir>/credentials/`` (0600); a fingerprint-only bundle takes
    ``ca_file``, which must match it. The user name is the client id; the password is stored as a
    typed one. Raises ``EnrolmentRefused`` (its reason named) or OSError (file unreadable, CA unwritable).
    """
    bundle = read_bundle(source)
    if bundle.tls_ca_pem is not None:
        ca_file = None  # the bundle's own CA wins over one set by hand
    broker = bundle.broker_config(state_dir / CREDENTIALS_DIR, ca_file=ca_file)
    if (state_dir / CREDENTIALS_DIR).is_dir():
        os.chmod(state_dir / CREDENTIALS_DIR, 0o700)
    fields: dict[str, Any] = {"client_id": bundle.client_id, "broker": broker.address, "federation": bundle.federation,
                              "username": bundle.username, "password": bundle.password, "tls_ca": broker.tls_ca or "", "enrolled": True}
    return bundle, fields


def store_password(state_dir: Path, password: str) -> Path | None:
    """Keep the broker password at :data:`PASSWORD_FILE` under ``state_dir`` (folder 0700, file 0600, atomically; never
    logged); an empty one removes the file (None). ValueError for a line break (the file holds one line)."""
    path = state_dir / PASSWORD_FILE
    if not password:
        path.unlink(missing_ok=True)
        return None
    if "\n" in password or "\r" in password:
        raise ValueError("the password must be one line (no line breaks)")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    atomic_write_bytes(path, password.encode(), mode=0o600)  # its temporary file is private too (mkstemp: 0600)
    return path


def parse_broker(host_port: str) -> str:
    """``"host:port"`` normalised; ValueError unless ``host:port`` with a port in 1..65535."""
    host, sep, port = host_port.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"broker address {host_port!r} is not HOST:PORT (e.g. 192.168.1.10:1883)")
    return f"{host}:{int(port)}"
