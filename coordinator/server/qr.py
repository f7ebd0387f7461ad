"""An enrolment bundle as a QR code: a PNG to show or print, and a block of text for the terminal (segno).

The code holds the bundle's compact JSON (:func:`qr_payload`), which a scanner hands to the app as
pasted text. A bundle whose code would exceed :data:`QR_MAX_VERSION` (an RSA CA inline) carries the
CA by its SHA-256 fingerprint instead; the device then needs the CA from the ``.json`` file and checks
it against the fingerprint (sizes in README.md). The code holds the password: the PNG is mode 0600
and the terminal text is never logged. An invitation (:func:`invitation_payload`) holds no device's
secret; with the CA by fingerprint the device fetches it from ``fedhar/v1/<fed>/ca`` and checks it.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import segno

from har_io.cert_enrolment import Invitation
from har_io.enrolment import EnrolmentBundle
from har_models.files import atomic_write

QR_ERROR = "L"
"""Error correction level (7 %): enough for a screen or clean paper, and the smallest code."""

QR_MAX_VERSION = 20
"""Largest QR version (97 x 97 modules) the whole bundle is put in; above it the CA goes by fingerprint."""

PNG_SCALE = 8
"""Pixels per module of the PNG."""

QR_BORDER = 4
"""Quiet zone around the code (modules), as the QR standard asks for."""


def _make(text: str) -> segno.QRCode:
    return segno.make(text, error=QR_ERROR, micro=False, boost_error=False, mode="byte", encoding="utf-8")


def qr_payload(bundle: EnrolmentBundle) -> str:
    """The text the QR code holds: the bundle's compact JSON, with the CA by fingerprint if the whole one is too large."""
    full = bundle.to_json(indent=None)
    if bundle.tls_ca_pem is None or int(_make(full).version) <= QR_MAX_VERSION:  # version is a str only for Micro QR
        return full
    slim = dataclasses.replace(bundle, tls_ca_pem=None, tls_ca_sha256=bundle.ca_fingerprint())
    return slim.to_json(indent=None)


def invitation_payload(invitation: Invitation) -> str:
    """An invitation's QR text: its compact JSON, or with the CA by fingerprint only above :data:`QR_MAX_VERSION`."""
    full = invitation.to_json(compact=True)
    if invitation.tls_ca_pem is None or int(_make(full).version) <= QR_MAX_VERSION:
        return full
    return dataclasses.replace(invitation, tls_ca_pem=None).to_json()


def text_qr(text: str, what: str = "") -> segno.QRCode:
    """The QR code of ``text`` (byte mode, UTF-8, error level :data:`QR_ERROR`); ValueError (naming ``what``) if it does not fit."""
    try:
        return _make(text)
    except segno.DataOverflowError as exc:
        n = len(text.encode())
        size = f"{what} ({n} bytes) does" if what else f"{n} bytes do"
        raise ValueError(f"{size} not fit a QR code: {exc}") from None


def make_qr(bundle: EnrolmentBundle) -> segno.QRCode:
    """The QR code of :func:`qr_payload`; ValueError if it does not fit (only with names far longer than any real one)."""
    return text_qr(qr_payload(bundle), f"the enrolment bundle of {bundle.client_id}")


def write_qr_png(bundle: EnrolmentBundle, path: Path, scale: int = PNG_SCALE) -> Path:
    """Write the bundle's QR code as a black-on-white PNG (mode 0600, atomically); ValueError as :func:`make_qr`, OSError."""
    qr = make_qr(bundle)
    path = Path(path)
    atomic_write(path, lambda tmp: qr.save(str(tmp), kind="png", scale=scale, border=QR_BORDER), mode=0o600)
    return path


def qr_terminal(bundle: EnrolmentBundle) -> str:
    """The bundle's QR code as half-block text for a dark terminal (border 2; a fingerprint bundle is 65 columns).

    Raises ValueError as :func:`make_qr`.
    """
    out = io.StringIO()
    make_qr(bundle).terminal(out=out, compact=True, border=2)
    return out.getvalue()
