"""An enrolment bundle's QR code (coordinator/server/qr.py): what it holds, the PNG's pixels, the terminal text.

No QR decoder is installed, so the tests read back what segno encoded (its content, version,
error level) and the PNG's own pixels (decompressed and unfiltered here with zlib), and
compare the modules with the code of the payload.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import segno
from support.secured_broker import Missing, make_pki

from coordinator.server.qr import PNG_SCALE, QR_BORDER, QR_MAX_VERSION, make_qr, qr_payload, qr_terminal, write_qr_png
from har_io.enrolment import EnrolmentBundle, pem_fingerprints

SECRET = "EwZ3mS1q7c0f5Lr9vH2kT8nYxA4pJ6dB"  # the length of a generated password (32 characters)


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        ca, _, _, _ = make_pki(tmp_path_factory.mktemp("pki"))
    except Missing as exc:
        pytest.skip(str(exc))
    return ca.read_text()


def _bundle(**over: object) -> EnrolmentBundle:
    kw: dict = dict(
        coordinator="fedhar-home", federation="home", client_id="phone-anna", password=SECRET, host="homeserver.local", port=8883
    )
    kw.update(over)
    return EnrolmentBundle(**kw)


def _png_modules(path: Path) -> tuple[int, list[list[int]]]:
    """(side in pixels, rows of 0/1 with 1 = dark) of a 1-bit greyscale PNG, read with zlib alone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0], kind
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", ihdr)
    assert (w == h, depth, colour, interlace) == (True, 1, 0, 0)
    raw, stride = zlib.decompress(idat), (w + 7) // 8
    rows, prev = [], bytes(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):  # PNG filters with 1 byte per pixel group
            a, b, c = (line[i - 1] if i else 0), prev[i], (prev[i - 1] if i else 0)
            pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2}.get(f)
            if pred is None:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[i] = (line[i] + pred) & 0xFF
        prev = bytes(line)
        rows.append([1 - ((line[x // 8] >> (7 - x % 8)) & 1) for x in range(w)])  # greyscale 0 = black = dark
    return w, rows


def test_a_bundle_without_an_inline_ca_is_the_whole_payload():
    b = _bundle()
    text = qr_payload(b)
    assert text == b.to_json(indent=None) and EnrolmentBundle.from_json(text) == b
    assert json.loads(text)["password"] == SECRET


def test_a_large_inline_ca_goes_into_the_code_by_its_fingerprint(ca_pem):
    b = _bundle(tls_ca_pem=ca_pem)  # RSA 2048: the whole bundle is a version-27 code
    whole = segno.make(b.to_json(indent=None), error="L", micro=False, boost_error=False)
    assert whole.version > QR_MAX_VERSION
    back = EnrolmentBundle.from_json(qr_payload(b))
    assert back.tls_ca_pem is None and back.tls_ca_sha256 == pem_fingerprints(ca_pem)[0]
    assert (back.client_id, back.password, back.host, back.port, back.federation) == (
        "phone-anna",
        SECRET,
        "homeserver.local",
        8883,
        "home",
    )
    qr = make_qr(b)
    assert (qr.version, qr.error, qr.mode, qr.is_micro) == (11, "L", "byte", False)
    assert len(qr_payload(b).encode()) == 281  # 64 hex digits instead of the certificate


def test_the_png_shows_exactly_the_modules_of_the_payload(ca_pem, tmp_path):
    b = _bundle(tls_ca_pem=ca_pem)
    path = write_qr_png(b, tmp_path / "enrolment" / "phone-anna.png")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    side, pixels = _png_modules(path)
    modules = 4 * 11 + 17  # a version-11 code
    assert side == (modules + 2 * QR_BORDER) * PNG_SCALE == 552
    want = segno.make(qr_payload(b), error="L", micro=False, boost_error=False)
    matrix = [[int(bool(v)) for v in row] for row in want.matrix]
    seen = [[pixels[(QR_BORDER + y) * PNG_SCALE + PNG_SCALE // 2][(QR_BORDER + x) * PNG_SCALE + PNG_SCALE // 2] for x in range(modules)]
            for y in range(modules)]  # fmt: skip
    assert seen == matrix
    assert all(v == 0 for v in pixels[0]) and all(row[0] == 0 for row in pixels)  # the quiet zone is white
    for y in range(0, 7 * PNG_SCALE):  # every pixel of a module's square has its colour
        assert pixels[QR_BORDER * PNG_SCALE + y][QR_BORDER * PNG_SCALE : (QR_BORDER + 7) * PNG_SCALE] == [
            matrix[y // PNG_SCALE][x] for x in range(7) for _ in range(PNG_SCALE)
        ]


def test_the_terminal_code_fits_a_terminal_and_matches_the_modules(ca_pem):
    b = _bundle(tls_ca_pem=ca_pem)
    lines = qr_terminal(b).splitlines()
    assert len(lines) == (61 + 4 + 1) // 2 == 33 and {len(line) for line in lines} == {65}
    matrix = [[int(bool(v)) for v in row] for row in make_qr(b).matrix]
    # compact text: one character per column, two module rows per line; a dark module is a blank cell
    # (segno draws light modules), so the upper and lower halves give the modules back
    chars = {" ": (1, 1), "▀": (0, 1), "▄": (1, 0), "█": (0, 0)}
    padded = [[0] * 65 for _ in range(2)] + [[0, 0, *row, 0, 0] for row in matrix] + [[0] * 65] * 2
    padded.append([1] * 65)  # the half line below the code: nothing drawn
    for i, line in enumerate(lines):
        assert [chars[c] for c in line] == [(padded[2 * i][x], padded[2 * i + 1][x]) for x in range(65)], i


def test_a_small_ca_stays_inline(tmp_path):
    """An EC P-256 CA keeps the whole bundle inside the limit, so a scanned code needs nothing else."""
    key, crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    cmd = ["openssl", "req", "-x509", *ec, "-nodes", "-days", "30", "-subj", "/CN=fedhar CA", "-keyout", str(key), "-out", str(crt)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"openssl cannot make an EC CA here: {r.stderr}")
    b = _bundle(tls_ca_pem=crt.read_text())
    assert qr_payload(b) == b.to_json(indent=None)
    assert make_qr(b).version <= QR_MAX_VERSION
