#!/usr/bin/env python3
"""Download, verify and optionally unpack the REALWORLD (RealWorld HAR 2016) archive.

Standard library only, so it runs before the project is installed::

    python datasets/fetch_realworld.py                      # -> datasets/realworld/full/realworld2016_dataset.zip
    python datasets/fetch_realworld.py --sha256 <hex>       # also check a pinned checksum
    python datasets/fetch_realworld.py --extract            # and unpack next to it
    python datasets/fetch_realworld.py --archive ~/Downloads/realworld2016_dataset.zip   # verify a manual download

An interrupted download resumes where it stopped (HTTP range request) when run again.
After the download the script checks the size announced by the server (and ``--size``),
every member's CRC, that the archive has the ``proband{k}/data/{acc,gyr}_*_csv.zip``
layout, and the sha256 if ``--sha256`` is given. No official checksum is published; the
script prints the one it computed so that you can pin it. The loader
(``har_models.data.realworld``) reads the zip directly, so unpacking is optional.

Dataset: T. Sztyler and H. Stuckenschmidt, "On-body Localization of Wearable Devices: An
Investigation of Position-Aware Activity Recognition", IEEE PerCom 2016,
doi:10.1109/PERCOM.2016.7456521. Research use; cite the paper; do not redistribute.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://wifo5-14.informatik.uni-mannheim.de/sensor/dataset/realworld2016/realworld2016_dataset.zip"
"""The official archive (University of Mannheim), as used by the FedDist authors' preprocessing."""

ARCHIVE_NAME = "realworld2016_dataset.zip"
EXPECTED_SUBJECTS = 15
DEFAULT_DEST = Path(__file__).resolve().parent / "realworld" / "full"

_SENSOR_ARCHIVE = re.compile(r"(?:^|/)proband(\d+)/data/(acc|gyr)_[a-z]+_csv\.zip$")


class FetchError(Exception):
    """A download or verification step failed; the message says what and how to fix it."""


def download(url: str, dest: Path, *, resume: bool = True, quiet: bool = False, timeout_s: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` through ``dest.part``, resuming a previous partial file.

    Parameters
    ----------
    url : str
        http(s) or file URL.
    dest : Path
        Final file; written only once the download is complete.
    resume : bool
        Continue an existing ``.part`` file with a range request (servers that ignore
        ranges get a fresh download).
    quiet : bool
        No progress output.
    timeout_s : float
        Socket timeout, seconds.

    Returns
    -------
    Path
        ``dest``.

    Raises
    ------
    FetchError
        On a network or HTTP error, or when fewer bytes arrive than the server announced.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if resume and part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fedhar-fetch-realworld/1"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # range starts at the end: the partial file is complete
            os.replace(part, dest)
            return dest
        raise FetchError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(
            f"cannot reach {url} ({exc}); check the network or download the file in a browser and pass --archive PATH"
        ) from None
    with response:
        status = getattr(response, "status", None)
        length = response.headers.get("Content-Length")
        if offset and status == 206:
            total = _range_total(response.headers.get("Content-Range"), offset, length)
            mode = "ab"
        else:
            if offset and not quiet:
                print(f"server ignored the resume request; downloading {url} from the start", file=sys.stderr)
            offset, mode = 0, "wb"
            total = int(length) if length is not None else None
        progress = _Progress(total, offset, quiet)
        try:
            with open(part, mode) as f:
                while True:
                    block = response.read(1 << 20)
                    if not block:
                        break
                    f.write(block)
                    progress.update(len(block))
        except OSError as exc:
            raise FetchError(f"download of {url} interrupted ({exc}); run again to resume from {part}") from None
        finally:
            progress.done()
    got = part.stat().st_size
    if total is not None and got != total:
        raise FetchError(f"incomplete download: {got:,} of {total:,} bytes in {part}; run again to resume")
    os.replace(part, dest)
    return dest


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in blocks by the standard library (``hashlib.file_digest``)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_archive(
    path: Path, expected_size: int | None = None, expected_sha256: str | None = None, check_crc: bool = True
) -> dict[str, Any]:
    """Check a downloaded archive and describe it.

    Parameters
    ----------
    path : Path
        The zip file.
    expected_size : int, optional
        Size in bytes it must have.
    expected_sha256 : str, optional
        Hex digest it must have (case-insensitive).
    check_crc : bool
        Read every member and check its CRC-32 (slow for the full archive: it reads it all).

    Returns
    -------
    dict
        ``path``, ``size`` (bytes), ``sha256``, ``members``, ``subjects`` (sorted ints of
        ``proband{k}`` with acc/gyr archives) and ``warnings`` (list of str).

    Raises
    ------
    FetchError
        If the file is missing, has the wrong size or checksum, is not a zip, has a
        corrupt member, or holds no ``proband{k}/data/{acc,gyr}_*_csv.zip`` member.
    """
    path = Path(path)
    if not path.is_file():
        raise FetchError(f"{path} does not exist")
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise FetchError(f"{path} has {size:,} bytes, expected {expected_size:,}; delete it and download again")
    digest = sha256_file(path)
    if expected_sha256 is not None and digest != expected_sha256.strip().lower():
        raise FetchError(
            f"sha256 of {path} is {digest}, expected {expected_sha256.strip().lower()}; the file is corrupt or a "
            "different version: delete it and download again (or check the expected value)"
        )
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            bad = zf.testzip() if check_crc else None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise FetchError(f"{path} is not a readable zip archive ({exc}); delete it and download again") from None
    if bad is not None:
        raise FetchError(f"member {bad} of {path} fails its CRC check; delete the archive and download again")
    subjects = sorted({int(m[1]) for m in map(_SENSOR_ARCHIVE.search, names) if m})
    if not subjects:
        raise FetchError(
            f"{path} holds no proband<k>/data/acc_*_csv.zip or gyr_*_csv.zip member; it is not the REALWORLD archive"
        )
    warnings = []
    missing = sorted(set(range(1, EXPECTED_SUBJECTS + 1)) - set(subjects))
    if missing:
        warnings.append(f"subjects without acc/gyr data: {', '.join(f'proband{k}' for k in missing)}")
    return {"path": str(path), "size": size, "sha256": digest, "members": len(names), "subjects": subjects, "warnings": warnings}


def extract(path: Path, dest: Path) -> Path:
    """Unpack the archive into ``dest``, refusing members that would land outside it.

    Returns
    -------
    Path
        ``dest``.

    Raises
    ------
    FetchError
        On an absolute or ``..`` member path, or a read/write error.
    """
    dest = Path(dest).resolve()
    try:
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                target = (dest / name).resolve()
                if name.startswith(("/", "\\")) or not target.is_relative_to(dest):
                    raise FetchError(f"member {name!r} of {path} would be written outside {dest}; refusing to unpack")
            zf.extractall(dest)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f"cannot unpack {path} into {dest} ({exc})") from None
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (0 ok, 1 failure, 2 usage)."""
    parser = argparse.ArgumentParser(description="Download and verify the REALWORLD HAR 2016 archive.")
    parser.add_argument("--url", default=DEFAULT_URL, help="archive URL or local path (default: the official URL)")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"folder for the archive (default {DEFAULT_DEST})")
    parser.add_argument("--archive", type=Path, help="verify (and extract) this already downloaded file instead")
    parser.add_argument("--sha256", help="expected sha256 (hex); none is published, pin the one printed")
    parser.add_argument("--size", type=int, help="expected size in bytes")
    parser.add_argument("--extract", action="store_true", help="unpack into --dest after verifying")
    parser.add_argument("--force", action="store_true", help="download again even if the archive is already there")
    parser.add_argument("--no-crc", action="store_true", help="skip reading every member to check its CRC")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    args = parser.parse_args(argv)

    try:
        if args.archive is not None:
            path = args.archive
        else:
            path = args.dest / ARCHIVE_NAME
            if args.force or not path.is_file():
                if args.force:
                    path.with_name(path.name + ".part").unlink(missing_ok=True)
                url = args.url if urllib.parse.urlparse(args.url).scheme else Path(args.url).resolve().as_uri()
                if not args.quiet:
                    print(f"downloading {url}\n         -> {path}", file=sys.stderr)
                download(url, path, quiet=args.quiet)
            elif not args.quiet:
                print(f"{path} already present; verifying (use --force to download again)", file=sys.stderr)
        summary = verify_archive(path, args.size, args.sha256, check_crc=not args.no_crc)
        if args.extract:
            summary["extracted_to"] = str(extract(path, args.dest))
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['sha256']}  {summary['path']}")
        print(f"{summary['size']:,} bytes, {summary['members']} members, subjects {summary['subjects']}")
        for w in summary["warnings"]:
            print(f"warning: {w}")
        if args.sha256 is None:
            print(f"pin this checksum next time with --sha256 {summary['sha256']}")
        print(f"point the loader at {summary.get('extracted_to', summary['path'])}")
    return 0


def _range_total(content_range: str | None, offset: int, length: str | None) -> int | None:
    """Total size from ``Content-Range: bytes a-b/total`` (else offset + Content-Length)."""
    m = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", (content_range or "").strip())
    if m:
        if int(m[1]) != offset:
            raise FetchError(f"server resumed at byte {m[1]}, not {offset}; delete the .part file and run again")
        return int(m[2])
    return offset + int(length) if length is not None else None


class _Progress:
    """Bytes received, on stderr: one updating line on a terminal, a line per 10 % otherwise."""

    def __init__(self, total: int | None, start: int, quiet: bool) -> None:
        self.total, self.done_bytes, self.quiet = total, start, quiet
        self.t0, self.last, self.start = time.monotonic(), 0.0, start
        self.tty = sys.stderr.isatty()
        self.next_pct = 10

    def update(self, n: int) -> None:
        self.done_bytes += n
        if self.quiet:
            return
        now = time.monotonic()
        pct = 100.0 * self.done_bytes / self.total if self.total else None
        if self.tty and now - self.last >= 0.5:
            self.last = now
            print("\r" + self._line(now, pct), end="", file=sys.stderr, flush=True)
        elif not self.tty and pct is not None and pct >= self.next_pct:
            self.next_pct = int(pct // 10) * 10 + 10
            print(self._line(now, pct), file=sys.stderr)

    def done(self) -> None:
        if not self.quiet and self.tty:
            print(
                "\r" + self._line(time.monotonic(), 100.0 * self.done_bytes / self.total if self.total else None), file=sys.stderr
            )

    def _line(self, now: float, pct: float | None) -> str:
        rate = (self.done_bytes - self.start) / max(now - self.t0, 1e-6) / 1e6
        total = f" / {self.total / 1e6:,.1f}" if self.total else ""
        share = f" ({pct:5.1f} %)" if pct is not None else ""
        return f"  {self.done_bytes / 1e6:,.1f}{total} MB{share}  {rate:.1f} MB/s"


if __name__ == "__main__":
    sys.exit(main())
