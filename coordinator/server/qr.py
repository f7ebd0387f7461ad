"""An enrolment bundle as a QR code: a PNG to show or print, and a block of text for the terminal (segno).

What the code holds (:func:`qr_payload`) is the bundle's compact JSON, which a phone's
scanner hands to the app as text, exactly as if it had been pasted. With the EC P-256 CA that
``mosquitto_config.py --help``'s openssl recipe makes, a bundle with the CA inline is 829
bytes, a version 20 code (97 x 97 modules). A larger CA is too large for a code that scans
easily: an RSA-3072 CA makes 1718 bytes, a version 30 code of 137 x 137 modules at the lowest
error correction, wider than a terminal. So a bundle whose code would be above
:data:`QR_MAX_VERSION` goes into the code with the CA replaced by its SHA-256 fingerprint (about
280 bytes: version 11, 61 x 61 modules, 65 columns of terminal). The device that scans it needs the
CA certificate from elsewhere (the bundle's ``.json`` file, or ``ca.crt``), and checks it against
the fingerprint before it connects; the ``.json`` file always holds the whole bundle.

The code holds the password: the PNG is written with mode 0600, and the terminal text is for
the operator's eyes (it is never logged).

An *invitation* (:class:`har_io.cert_enrolment.Invitation`, enrolment by certificate) holds no
device's secret, only the shared enrolment account's. Its code (:func:`invitation_payload`)
carries the CA inline when the code stays at most :data:`QR_MAX_VERSION` (an EC P-256 CA
does), else its fingerprint, and the device fetches the CA from the broker's retained
``fedhar/v1/<fed>/ca`` over a connection it does not trust yet, keeping it only if its
SHA-256 is the fingerprint (:func:`edge_client.cert_enrol.fetch_ca`).
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
"""Error correction level (7 %): a code on a screen or clean paper needs no more, and L keeps it smallest."""

QR_MAX_VERSION = 20
"""Largest QR version (97 x 97 modules) the whole bundle is put in; above it the CA goes by fingerprint."""

PNG_SCALE = 8
"""Pixels per module of the PNG."""

QR_BORDER = 4
"""Quiet zone around the code (modules), as the QR standard asks for."""


def _make(text: str) -> segno.QRCode:
    return segno.make(text, error=QR_ERROR, micro=False, boost_error=False, mode="byte", encoding="utf-8")


def qr_payload(bundle: EnrolmentBundle) -> str:
    """The text the QR code holds: the bundle's compact JSON, with the CA by fingerprint if the whole one is too large.

    Returns
    -------
    str
        JSON that :meth:`~har_io.enrolment.EnrolmentBundle.from_json` reads; its QR version is at most
        :data:`QR_MAX_VERSION` (a bundle without an inline CA always fits: its fields are short).
    """
    full = bundle.to_json(indent=None)
    if bundle.tls_ca_pem is None or int(_make(full).version) <= QR_MAX_VERSION:  # version is a str only for Micro QR
        return full
    slim = dataclasses.replace(bundle, tls_ca_pem=None, tls_ca_sha256=bundle.ca_fingerprint())
    return slim.to_json(indent=None)


def invitation_payload(invitation: Invitation) -> str:
    """The text an invitation's QR code holds: its compact JSON (the CA inline, without its pin, which is the CA's own), or,
    if that is above :data:`QR_MAX_VERSION`, the CA by its fingerprint only."""
    full = invitation.to_json(compact=True)
    if invitation.tls_ca_pem is None or int(_make(full).version) <= QR_MAX_VERSION:
        return full
    return dataclasses.replace(invitation, tls_ca_pem=None).to_json()


def text_qr(text: str) -> segno.QRCode:
    """The QR code of ``text`` (byte mode, UTF-8, error level :data:`QR_ERROR`).

    Raises
    ------
    ValueError
        If it does not fit a QR code.
    """
    try:
        return _make(text)
    except segno.DataOverflowError as exc:
        raise ValueError(f"{len(text.encode())} bytes do not fit a QR code: {exc}") from None


def make_qr(bundle: EnrolmentBundle) -> segno.QRCode:
    """The QR code of :func:`qr_payload` (byte mode, UTF-8, error level :data:`QR_ERROR`).

    Raises
    ------
    ValueError
        If the payload does not fit a QR code (only with host or names far longer than any real one).
    """
    text = qr_payload(bundle)
    try:
        return _make(text)
    except segno.DataOverflowError as exc:
        raise ValueError(f"the enrolment bundle of {bundle.client_id} ({len(text.encode())} bytes) does not fit a QR code: {exc}") from None


def write_qr_png(bundle: EnrolmentBundle, path: Path, scale: int = PNG_SCALE) -> Path:
    """Write the bundle's QR code as a PNG (mode 0600, atomically); returns ``path``.

    The image is ``(modules + 2 * QR_BORDER) * scale`` pixels square, black on white, 1 bit per pixel.

    Raises
    ------
    ValueError
        As :func:`make_qr`.
    OSError
        If the file cannot be written.
    """
    qr = make_qr(bundle)
    path = Path(path)
    atomic_write(path, lambda tmp: qr.save(str(tmp), kind="png", scale=scale, border=QR_BORDER), mode=0o600)
    return path


def qr_terminal(bundle: EnrolmentBundle) -> str:
    """The bundle's QR code as text for a terminal: half-block characters, one column per module.

    A fingerprint bundle (version 11) is 61 + 2 * 2 = 65 columns wide and 33 lines high; the
    border is 2 modules (a terminal's own margin adds to it). It is drawn for a dark terminal
    background (light modules are the blocks); on a light background the code shows inverted,
    and a scanner that does not read inverted codes needs the PNG instead.

    Raises
    ------
    ValueError
        As :func:`make_qr`.
    """
    out = io.StringIO()
    make_qr(bundle).terminal(out=out, compact=True, border=2)
    return out.getvalue()
