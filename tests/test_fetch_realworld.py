"""datasets/fetch_realworld.py offline: download from file:// and a local range-capable HTTP server,
resume, size and sha256 checks, layout check, safe unpacking."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from har_models.data.realworld import read_realworld_subject, realworld_subject_ids

SCRIPT = Path(__file__).resolve().parents[1] / "datasets" / "fetch_realworld.py"


@pytest.fixture(scope="module")
def fetch():
    spec = importlib.util.spec_from_file_location("fetch_realworld", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_archive(extra: dict[str, bytes] | None = None) -> bytes:
    """The official layout with one subject and one activity, a few rows each."""
    rows = "id,attr_time,attr_x,attr_y,attr_z\n" + "".join(f"{i + 1},{1435993159400 + 20 * i},0.1,9.8,0.2\n" for i in range(200))
    inner = {}
    for st, prefix in (("acc", "acc"), ("gyr", "Gyroscope")):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(f"{prefix}_walking_shin.csv", rows)
            zf.writestr("readMe", "frequency: 50 Hz")
        inner[f"realworld2016_dataset/proband1/data/{st}_walking_csv.zip"] = buf.getvalue()
    inner.update(extra or {})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in inner.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def archive(tmp_path) -> Path:
    path = tmp_path / "src" / "realworld2016_dataset.zip"
    path.parent.mkdir()
    path.write_bytes(tiny_archive())
    return path


def test_download_from_file_url_verify_and_extract(fetch, archive, tmp_path, capsys):
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    dest = tmp_path / "out"
    rc = fetch.main(
        ["--url", archive.as_uri(), "--dest", str(dest), "--sha256", digest.upper(), "--extract", "--quiet", "--json"]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sha256"] == digest and summary["size"] == archive.stat().st_size
    assert summary["subjects"] == [1] and summary["warnings"] == [
        f"subjects without acc/gyr data: {', '.join(f'proband{k}' for k in range(2, 16))}"
    ]
    assert (dest / "realworld2016_dataset.zip").read_bytes() == archive.read_bytes()
    assert not (dest / "realworld2016_dataset.zip.part").exists()
    # the loader reads both what was downloaded and what was unpacked
    assert realworld_subject_ids(dest / "realworld2016_dataset.zip") == realworld_subject_ids(dest) == [1]
    assert [r.session for r in read_realworld_subject(dest, 1).recordings] == ["walking/shin"]


def test_plain_output_prints_the_checksum_to_pin(fetch, archive, tmp_path, capsys):
    rc = fetch.main(["--url", str(archive), "--dest", str(tmp_path / "out")])  # a plain path works as --url
    out, err = capsys.readouterr()
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert rc == 0 and out.startswith(f"{digest}  ") and f"--sha256 {digest}" in out
    assert "downloading file://" in err and "(100.0 %)" in err  # progress goes to stderr
    # a second run finds the archive and only verifies it
    assert fetch.main(["--url", "file:///nonexistent", "--dest", str(tmp_path / "out"), "--quiet"]) == 0


def test_wrong_checksum_or_size_fails_with_a_clear_message(fetch, archive, tmp_path, capsys):
    rc = fetch.main(["--archive", str(archive), "--dest", str(tmp_path), "--sha256", "0" * 64, "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "sha256 of" in err and f"expected {'0' * 64}" in err and "download again" in err
    rc = fetch.main(["--archive", str(archive), "--size", "12", "--quiet"])
    assert rc == 1 and f"has {archive.stat().st_size:,} bytes, expected 12" in capsys.readouterr().err


def test_not_a_zip_corrupt_member_and_wrong_content_are_rejected(fetch, tmp_path, capsys):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"<html>404 Not Found</html>")
    assert fetch.main(["--archive", str(junk), "--quiet"]) == 1
    assert "is not a readable zip archive" in capsys.readouterr().err

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("realworld2016_dataset/proband1/data/acc_walking_csv.zip", b"0123456789" * 50)
    data = bytearray(buf.getvalue())
    data[data.index(b"0123456789") + 5] ^= 1
    corrupt = tmp_path / "corrupt.zip"
    corrupt.write_bytes(bytes(data))
    assert fetch.main(["--archive", str(corrupt), "--quiet"]) == 1
    assert "fails its CRC check" in capsys.readouterr().err
    assert fetch.main(["--archive", str(corrupt), "--no-crc", "--quiet", "--json"]) == 0
    capsys.readouterr()

    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("photos/cat.jpg", b"meow")
    assert fetch.main(["--archive", str(other), "--quiet"]) == 1
    assert "it is not the REALWORLD archive" in capsys.readouterr().err


def test_unpacking_refuses_paths_outside_the_destination(fetch, tmp_path, capsys):
    evil = tmp_path / "evil.zip"
    evil.write_bytes(tiny_archive({"../outside.txt": b"x"}))
    dest = tmp_path / "dest"
    assert fetch.main(["--archive", str(evil), "--dest", str(dest), "--extract", "--quiet"]) == 1
    assert "would be written outside" in capsys.readouterr().err
    assert not (tmp_path / "outside.txt").exists()


class _RangeHandler(BaseHTTPRequestHandler):
    payload = b""
    ranges: ClassVar[list[str]] = []
    fail_after: int | None = None

    def do_GET(self) -> None:
        if not self.path.endswith(".zip"):
            self.send_error(404)
            return
        data = self.payload
        header = self.headers.get("Range")
        type(self).ranges.append(header or "")
        start = int(header.split("=")[1].rstrip("-")) if header else 0
        if start >= len(data):
            self.send_response(416)
            self.end_headers()
            return
        self.send_response(206 if header else 200)
        if header:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if type(self).fail_after is not None:  # the connection drops mid-way
            body = body[: type(self).fail_after]
            type(self).fail_after = None
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    payload = tiny_archive()
    _RangeHandler.payload, _RangeHandler.ranges, _RangeHandler.fail_after = payload, [], None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/realworld2016_dataset.zip", payload
    httpd.shutdown()
    httpd.server_close()


def test_interrupted_download_resumes_with_a_range_request(fetch, server, tmp_path):
    url, payload = server
    dest = tmp_path / "realworld2016_dataset.zip"
    _RangeHandler.fail_after = 1000
    with pytest.raises(fetch.FetchError, match=r"incomplete download: 1,000 of .* run again to resume"):
        fetch.download(url, dest, quiet=True)
    assert (tmp_path / "realworld2016_dataset.zip.part").stat().st_size == 1000 and not dest.exists()
    assert fetch.download(url, dest, quiet=True) == dest
    assert dest.read_bytes() == payload
    assert _RangeHandler.ranges == ["", "bytes=1000-"]
    # a complete .part (the server answers 416 to its range) is taken as it is
    dest.rename(tmp_path / "realworld2016_dataset.zip.part")
    assert fetch.download(url, dest, quiet=True) == dest and dest.read_bytes() == payload


def test_http_errors_are_clear(fetch, server, tmp_path, capsys):
    url, _ = server
    assert fetch.main(["--url", url.replace(".zip", ".html"), "--dest", str(tmp_path), "--quiet"]) == 1
    assert "download of http://127.0.0.1" in capsys.readouterr().err
    with pytest.raises(fetch.FetchError, match="HTTP 404"):
        fetch.download(url.replace(".zip", ".html"), tmp_path / "x.zip", quiet=True)
    with pytest.raises(fetch.FetchError, match=r"cannot reach http://127\.0\.0\.1:1/"):
        fetch.download("http://127.0.0.1:1/x.zip", tmp_path / "x.zip", quiet=True, timeout_s=5)
