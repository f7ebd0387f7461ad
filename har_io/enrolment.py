"""Enrolment bundles: everything a device needs to join one federation, in one small JSON document.

``fedhar-coordinator enrol NAME`` writes one; ``fedhar-client --enrolment FILE``, the app and
``pi_setup.sh --enrolment FILE`` read it. Format ``fedhar-enrolment``, version 1::

    {"format": "fedhar-enrolment", "version": 1, "coordinator": "fedhar-home", "federation": "home",
     "client_id": "phone-anna", "password": "...", "host": "nuc.local", "port": 8883,
     "tls_ca_pem": "-----BEGIN CERTIFICATE-----\\n...", "tls_ca_sha256": "3f5a...e1"}

``tls_ca_pem`` is the CA that signed the broker's certificate, ``tls_ca_sha256`` the SHA-256 of its
DER bytes (instead of it, or next to it as a pin); neither: plain MQTT. The MQTT user name is the
client id; unknown extra keys are ignored. Everything is checked on reading; a refusal raises
:class:`EnrolmentRefused`. The password never appears in ``repr()``, logs or errors. Standard
library only (no PyTorch on a phone or board).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from har_io.broker_config import BrokerConfig
from har_io.exit_codes import Exit, fail
from har_io.install_hints import update_hint
from har_models.files import atomic_write_bytes
from har_models.wire.topics import FEDERATION_RE, check_client_id

BUNDLE_FORMAT = "fedhar-enrolment"
"""The ``format`` key every bundle carries."""

BUNDLE_VERSION = 1
"""The version this module writes."""

READABLE_VERSIONS = (1,)
"""Versions this module reads."""

MAX_BUNDLE_BYTES = 64 * 1024
"""Largest bundle read (bytes of UTF-8 JSON); a real one is about 1.5 kB with an inline RSA CA."""

REASONS = ("bad_json", "unknown_version", "missing_field", "wrong_federation", "wrong_coordinator", "ca_mismatch", "bad_value")
"""Values of :attr:`EnrolmentRefused.reason`."""

_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")
_PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL)
_HOST_RE = re.compile(r"^[A-Za-z0-9._:\[\]-]{1,253}$")  # DNS names, IPv4, bracketed or bare IPv6
_MAX_NAME = 64


class EnrolmentRefused(ValueError):
    """A bundle that cannot be used; ``reason`` is one of :data:`REASONS`; the message never holds the password."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise AssertionError(f"unknown refusal reason {reason!r}")
        super().__init__(f"enrolment bundle refused ({reason}): {message}")
        self.reason = reason


def normalise_fingerprint(text: str) -> str:
    """A SHA-256 fingerprint as 64 lowercase hex digits (accepts ``AB:CD:...``); ``bad_value`` if not 32 bytes of hex."""
    t = text.strip()
    if "=" in t:  # "sha256 Fingerprint=AB:CD:..."
        t = t.rpartition("=")[2]
    t = t.replace(":", "").lower()
    if not _FINGERPRINT_RE.match(t):
        raise EnrolmentRefused(
            "bad_value",
            "tls_ca_sha256 is not a SHA-256 fingerprint: give 64 hex digits (openssl x509 -in ca.crt -noout -fingerprint -sha256)",
        )
    return t


def pem_certificates(pem: str, what: str = "tls_ca_pem") -> list[bytes]:
    """The DER bytes of every certificate in PEM text, in order; ``bad_value`` if none, or one not base64 DER."""
    ders = []
    for body in _PEM_RE.findall(pem):
        try:
            der = base64.b64decode("".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            raise EnrolmentRefused("bad_value", f"{what}: a certificate's body is not base64; copy the CA file unchanged") from None
        if not der or der[0] != 0x30:  # every X.509 certificate is a DER SEQUENCE
            raise EnrolmentRefused("bad_value", f"{what}: a PEM block is not an X.509 certificate; give the CA certificate file")
        ders.append(der)
    if not ders:
        raise EnrolmentRefused("bad_value", f"{what}: no '-----BEGIN CERTIFICATE-----' block; give the CA certificate (PEM)")
    return ders


def pem_fingerprints(pem: str, what: str = "tls_ca_pem") -> list[str]:
    """SHA-256 (lowercase hex) of each certificate in ``pem``, in order; refusals as :func:`pem_certificates`."""
    return [hashlib.sha256(der).hexdigest() for der in pem_certificates(pem, what)]


def _name(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise EnrolmentRefused("bad_value", f"{key} must be a string, not {type(value).__name__}; re-create the bundle")
    if not value.strip() or len(value) > _MAX_NAME or any(not c.isprintable() for c in value):
        raise EnrolmentRefused("bad_value", f"{key} {value[:_MAX_NAME]!r} must be 1-{_MAX_NAME} printable characters; re-create the bundle")
    return value


@dataclass(frozen=True)
class EnrolmentBundle:
    """One device's enrolment in one federation.

    ``coordinator``: the server's ``[server] name``; ``federation``: the topic prefix
    ``fedhar/v1/<federation>``; ``client_id``: also the MQTT user name; ``password``: one line, never
    in ``repr()``; ``host``: as the device reaches the broker (named by its certificate);
    ``tls_ca_sha256``: normalised to lowercase hex.

    Raises
    ------
    EnrolmentRefused
        ``bad_value`` for a field of the wrong type or form; ``ca_mismatch`` if ``tls_ca_pem``
        holds no certificate with the fingerprint ``tls_ca_sha256``; ``unknown_version``.
    """

    coordinator: str
    federation: str
    client_id: str
    password: str = field(repr=False)
    host: str
    port: int
    tls_ca_pem: str | None = None
    tls_ca_sha256: str | None = None
    version: int = BUNDLE_VERSION

    def __post_init__(self) -> None:
        if self.version not in READABLE_VERSIONS:
            raise _unknown_version(self.version)
        _name(self.coordinator, "coordinator")
        if not isinstance(self.federation, str) or not FEDERATION_RE.match(self.federation):
            raise EnrolmentRefused("bad_value", f"federation {self.federation!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
        try:
            check_client_id(self.client_id)
        except ValueError as exc:
            raise EnrolmentRefused("bad_value", f"{exc}; enrol the device again under a valid name") from None
        if not isinstance(self.password, str) or not self.password:
            raise EnrolmentRefused("bad_value", "password must be a non-empty string; enrol the device again")
        if any(c in self.password for c in "\r\n\0"):
            raise EnrolmentRefused("bad_value", "password must be one line (no line break or NUL); enrol the device again")
        if not isinstance(self.host, str) or not _HOST_RE.match(self.host):
            raise EnrolmentRefused("bad_value", f"host {str(self.host)[:80]!r} is not a host name or address; set the server's public_host")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise EnrolmentRefused("bad_value", f"port {self.port!r} must be an integer in 1..65535")
        if self.tls_ca_pem is not None:
            if not isinstance(self.tls_ca_pem, str):
                raise EnrolmentRefused("bad_value", "tls_ca_pem must be the CA certificate as PEM text")
            prints = pem_fingerprints(self.tls_ca_pem)
        if self.tls_ca_sha256 is not None:
            if not isinstance(self.tls_ca_sha256, str):
                raise EnrolmentRefused("bad_value", "tls_ca_sha256 must be a string of 64 hex digits")
            object.__setattr__(self, "tls_ca_sha256", normalise_fingerprint(self.tls_ca_sha256))
            if self.tls_ca_pem is not None and self.tls_ca_sha256 not in prints:
                raise EnrolmentRefused(
                    "ca_mismatch",
                    f"the bundle's CA certificate has SHA-256 {prints[0]}, not the pinned {self.tls_ca_sha256}: "
                    f"the bundle was altered or mixed up; enrol the device again",
                )

    @property
    def username(self) -> str:
        """The MQTT user name: the client id (the generated ACL names each device's account so)."""
        return self.client_id

    @property
    def uses_tls(self) -> bool:
        """Whether the device connects with TLS (the bundle has a CA or its fingerprint)."""
        return self.tls_ca_pem is not None or self.tls_ca_sha256 is not None

    def ca_fingerprint(self) -> str | None:
        """SHA-256 (hex) of the CA the broker's certificate must chain to: the pin, else the inline CA's; None without TLS."""
        if self.tls_ca_sha256 is not None:
            return self.tls_ca_sha256
        if self.tls_ca_pem is not None:
            return pem_fingerprints(self.tls_ca_pem)[0]
        return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the bundle (with the password; optional keys left out when None)."""
        d: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "version": self.version,
            "coordinator": self.coordinator,
            "federation": self.federation,
            "client_id": self.client_id,
            "password": self.password,
            "host": self.host,
            "port": self.port,
        }
        if self.tls_ca_pem is not None:
            d["tls_ca_pem"] = self.tls_ca_pem
        if self.tls_ca_sha256 is not None:
            d["tls_ca_sha256"] = self.tls_ca_sha256
        return d

    def to_json(self, *, indent: int | None = 1) -> str:
        """The bundle as JSON text (``indent=None``: one compact line, as a QR code holds it)."""
        separators = (",", ":") if indent is None else None
        return json.dumps(self.to_dict(), indent=indent, separators=separators, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> EnrolmentBundle:
        """Read and check a bundle (UTF-8 JSON, at most :data:`MAX_BUNDLE_BYTES`).

        Raises
        ------
        EnrolmentRefused
            ``bad_json`` (not a JSON object, not UTF-8, too large), ``unknown_version`` (another
            format or version: update the app), ``missing_field``, ``bad_value``, ``ca_mismatch``.
        """
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if len(raw) > MAX_BUNDLE_BYTES:
            raise EnrolmentRefused(
                "bad_json", f"{len(raw)} bytes is more than a bundle's {MAX_BUNDLE_BYTES}; this is not an enrolment bundle"
            )
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise EnrolmentRefused("bad_json", "not UTF-8 text; give the .json file that fedhar-coordinator enrol wrote") from None
        except json.JSONDecodeError as exc:
            raise EnrolmentRefused(
                "bad_json",
                f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); give the .json file that fedhar-coordinator "
                f"enrol wrote, unchanged (a truncated copy or paste fails so)",
            ) from None
        if not isinstance(obj, dict):
            raise EnrolmentRefused("bad_json", f"a bundle is a JSON object, not a JSON {type(obj).__name__}")
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> EnrolmentBundle:
        """A bundle from its decoded JSON object (see :meth:`from_json`, which also lists the refusals)."""
        fmt = obj.get("format")
        if fmt != BUNDLE_FORMAT:
            raise EnrolmentRefused(
                "unknown_version",
                f"format {str(fmt)[:40]!r} is not {BUNDLE_FORMAT!r}: this is not a fedhar enrolment bundle "
                f"(or one from a newer fedhar: update this app or fedhar)",
            )
        if "version" not in obj:
            raise EnrolmentRefused("missing_field", "the bundle has no 'version'; re-create it with fedhar-coordinator enrol")
        version = obj["version"]
        if isinstance(version, bool) or not isinstance(version, int):
            raise EnrolmentRefused("bad_value", f"version {str(version)[:20]!r} must be an integer")
        if version not in READABLE_VERSIONS:
            raise _unknown_version(version)
        values: dict[str, Any] = {}
        for key, kinds in _FIELDS.items():
            if key not in obj or obj[key] is None:
                if key in _OPTIONAL:
                    continue
                raise EnrolmentRefused("missing_field", f"the bundle has no {key!r}; re-create it with fedhar-coordinator enrol")
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise EnrolmentRefused(
                    "bad_value",
                    f"{key} must be {' or '.join(k.__name__ for k in kinds)}, not {type(value).__name__}; re-create the bundle",
                )
            values[key] = value
        return cls(version=version, **values)

    def check(self, *, federation: str | None = None, coordinator: str | None = None, ca_file: str | Path | None = None) -> None:
        """Refuse a bundle for another federation or coordinator, or whose CA is not in ``ca_file``; None: not checked.

        Raises
        ------
        EnrolmentRefused
            ``wrong_federation``, ``wrong_coordinator``, ``ca_mismatch``; ``bad_value`` for a
            ``ca_file`` that holds no certificate.
        OSError
            If ``ca_file`` cannot be read.
        """
        if federation is not None and federation != self.federation:
            raise EnrolmentRefused(
                "wrong_federation",
                f"the bundle is for federation {self.federation!r}, this device is set up for {federation!r}: "
                f"use a bundle of {federation!r}, or drop the federation setting",
            )
        if coordinator is not None and coordinator != self.coordinator:
            raise EnrolmentRefused(
                "wrong_coordinator",
                f"the bundle is from coordinator {self.coordinator!r}, not {coordinator!r}: ask that coordinator's "
                f"operator for a bundle (fedhar-coordinator enrol)",
            )
        if ca_file is not None:
            have = pem_fingerprints(Path(ca_file).read_text(errors="replace"), what=str(ca_file))
            want = self.ca_fingerprint()
            if want is None:
                raise EnrolmentRefused(
                    "ca_mismatch", f"the bundle joins without TLS, but the CA file {ca_file} was given: drop it or use a TLS bundle"
                )
            if want not in have:
                raise EnrolmentRefused(
                    "ca_mismatch",
                    f"the CA file {ca_file} has SHA-256 {have[0]}, the bundle's CA {want}: this is not the CA of the "
                    f"bundle's broker; use the CA file the bundle came with (or none: an inline CA is enough)",
                )

    def ca_path(self, ca_dir: Path) -> Path:
        """Where :meth:`broker_config` writes an inline CA: ``<ca_dir>/<federation>.<client_id>.ca.pem``."""
        return Path(ca_dir) / f"{self.federation}.{self.client_id}.ca.pem"

    def broker_config(self, ca_dir: Path, *, ca_file: str | Path | None = None, **options: Any) -> BrokerConfig:
        """The broker settings of the bundle; an inline CA is first written to :meth:`ca_path` (0600, atomically).

        ``ca_file`` is used (after :meth:`check`) when given; ``options`` are further :class:`BrokerConfig` fields.

        Raises
        ------
        EnrolmentRefused
            ``missing_field`` if the bundle names its CA by fingerprint only and no ``ca_file``
            is given; ``ca_mismatch`` as :meth:`check`.
        OSError
            If the CA file cannot be written or read.
        """
        tls_ca: str | None = None
        if ca_file is not None:
            self.check(ca_file=ca_file)
            tls_ca = str(ca_file)
        elif self.tls_ca_pem is not None:
            path = self.ca_path(ca_dir)
            atomic_write_bytes(path, self.tls_ca_pem, mode=0o600)
            tls_ca = str(path)
        elif self.tls_ca_sha256 is not None:
            raise EnrolmentRefused(
                "missing_field",
                f"the bundle names the broker's CA by its SHA-256 {self.tls_ca_sha256} only and this device has no CA file: "
                f"import the bundle's .json file (it holds the CA) or give the CA certificate file",
            )
        return BrokerConfig(host=self.host, port=self.port, username=self.username, password=self.password, tls_ca=tls_ca,
                            enrolled=True, **options)  # fmt: skip


_FIELDS: dict[str, tuple[type, ...]] = {
    "coordinator": (str,),
    "federation": (str,),
    "client_id": (str,),
    "password": (str,),
    "host": (str,),
    "port": (int,),
    "tls_ca_pem": (str,),
    "tls_ca_sha256": (str,),
}
_OPTIONAL = {"tls_ca_pem", "tls_ca_sha256"}


def _unknown_version(version: object) -> EnrolmentRefused:
    reads = ", ".join(str(v) for v in READABLE_VERSIONS)
    return EnrolmentRefused(
        "unknown_version",
        f"bundle version {version!r} is not one this fedhar reads (version {reads}): update the app or fedhar "
        f"({update_hint()}), or have the coordinator write a version-{READABLE_VERSIONS[-1]} bundle",
    )


def read_bundle(path_or_text: str | Path) -> EnrolmentBundle:
    """A bundle from a file, or from its JSON text (a ``str`` starting with ``{``).

    Raises EnrolmentRefused (see :meth:`EnrolmentBundle.from_json`) or OSError if the file cannot be read.
    """
    if isinstance(path_or_text, str) and path_or_text.lstrip().startswith("{"):
        return EnrolmentBundle.from_json(path_or_text)
    path = Path(path_or_text)
    with open(path, "rb") as f:
        raw = f.read(MAX_BUNDLE_BYTES + 1)
    return EnrolmentBundle.from_json(raw)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m har_io.enrolment FILE``: check a bundle and install its parts, for firmware_scripts/pi_setup.sh.

    Runs on the system's Python before any venv exists. ``--shell`` prints the fields as shell
    assignments (never the password). Returns 0, or 2 (usage) for a refused or unreadable bundle.
    """
    import argparse
    import shlex

    ap = argparse.ArgumentParser(prog="python3 -m har_io.enrolment", description="check an enrolment bundle and install its parts")
    ap.add_argument("bundle", help="the bundle's .json file")
    ap.add_argument("--prog", default=None, help="program name its messages start with (default: this module's)")
    ap.add_argument("--federation", default=None, help="refuse a bundle of another federation")
    ap.add_argument("--coordinator", default=None, help="refuse a bundle of another coordinator")
    ap.add_argument("--tls-ca", default=None, help="refuse a bundle whose CA is not in this CA file")
    ap.add_argument("--shell", action="store_true", help="print the bundle's fields (never the password) as shell assignments")
    ap.add_argument("--write-password", type=Path, default=None, help="write the password to this file (mode 0600)")
    ap.add_argument("--write-ca", type=Path, default=None, help="write the inline CA certificate to this file (mode 0644)")
    args = ap.parse_args(argv)
    prog = args.prog or ap.prog
    try:
        bundle = read_bundle(Path(args.bundle))
        bundle.check(federation=args.federation, coordinator=args.coordinator, ca_file=args.tls_ca)
        if args.write_ca is not None:
            if bundle.tls_ca_pem is None:
                raise EnrolmentRefused("missing_field", "the bundle holds no CA certificate to write (--write-ca): give the CA file")
            atomic_write_bytes(args.write_ca, bundle.tls_ca_pem, mode=0o644)
        if args.write_password is not None:
            atomic_write_bytes(args.write_password, bundle.password, mode=0o600)
    except EnrolmentRefused as exc:
        return fail(f"{prog}: {args.bundle}: {exc}")
    except OSError as exc:
        return fail(f"{prog}: {args.bundle}: cannot read or install the bundle: {exc}")
    if args.shell:
        tls = "inline" if bundle.tls_ca_pem is not None else ("fingerprint" if bundle.tls_ca_sha256 is not None else "none")
        fields = {
            "client_id": bundle.client_id,
            "federation": bundle.federation,
            "broker": f"{bundle.host}:{bundle.port}",
            "coordinator": bundle.coordinator,
            "tls": tls,
            "ca_sha256": bundle.ca_fingerprint() or "",
        }
        print("\n".join(f"{k}={shlex.quote(v)}" for k, v in fields.items()))
    return Exit.OK


if __name__ == "__main__":
    raise SystemExit(main())
