"""A device's side of the blob transport: fetch a model by its reference, upload an update to its grant.

Plain HTTP(S) with the standard library, through URLs the coordinator signed (:mod:`har_io.blobs`).
Every fetched byte is checked against the reference's size and SHA-256; a kept copy is named by
its hash (:class:`BlobCache`) and checked again whenever it is read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from har_io.blobs import BlobError
from har_models.wire.blob_messages import BlobRef, UploadGrant

READ_PIECE_BYTES = 1 << 20


class UploadClosed(BlobError):
    """The upload's exchange is over: its grant expired, or the store refuses its slot as closed (HTTP 410)."""


def _http_error(what: str, url: str, exc: Exception) -> BlobError:
    where = url.split("?", 1)[0]
    if isinstance(exc, urllib.error.HTTPError):
        body = b""
        with contextlib.suppress(Exception):
            body = exc.read(300)
        kind = UploadClosed if exc.code == 410 else BlobError
        return kind(f"{what} {where}: HTTP {exc.code} {exc.reason} {body.decode('utf-8', 'replace')}".rstrip())
    return BlobError(f"{what} {where}: {type(exc).__name__}: {exc} (is the coordinator's blob store reachable from here?)")


class BlobCache:
    """Kept model envelopes named by SHA-256 (shared by the clients of one process).

    The newest is held in memory (a worker's clients all start from the same model: fetched and
    checked once); with a ``folder`` (created; None: memory only) the newest ``keep`` are also kept
    on disk, so a restarted device does not fetch its model again.
    """

    def __init__(self, folder: Path | None = None, keep: int = 4):
        self.folder = None if folder is None else Path(folder)
        self.keep = keep
        self.lock = threading.Lock()  # one fetch of an object at a time in this process
        self._newest: tuple[str, bytes] | None = None
        self.fetches = 0  # objects fetched over HTTP through this cache (the rest were kept ones)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def get(self, ref: BlobRef) -> bytes | None:
        """The kept bytes of ``ref`` if present and whole (size and SHA-256 checked), else None (a bad copy is deleted)."""
        newest = self._newest
        if newest is not None and newest[0] == ref.sha256 and len(newest[1]) == ref.size:
            return newest[1]  # checked when it was stored, immutable since
        if self.folder is None:
            return None
        path = self.folder / ref.sha256
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if len(data) == ref.size and hashlib.sha256(data).hexdigest() == ref.sha256:
            self._newest = (ref.sha256, data)
            return data
        path.unlink(missing_ok=True)
        return None

    def put(self, ref: BlobRef, data: bytes) -> None:
        """Keep ``data`` (already checked against ``ref``) under its hash; drop the oldest files beyond ``keep``."""
        self._newest = (ref.sha256, data)
        if self.folder is None:
            return
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.folder / ref.sha256)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return  # a full disk costs the cache, not the round
        kept = sorted((p for p in self.folder.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)
        for old in kept[: max(0, len(kept) - self.keep)]:
            old.unlink(missing_ok=True)


class BlobMismatch(BlobError):
    """The bytes fetched for an object are not the ones its reference names (another length or SHA-256)."""


def fetch_model(ref: BlobRef, max_bytes: int, cache: BlobCache | None = None, timeout: float = 60.0) -> bytes:
    """The envelope ``ref`` names: from ``cache`` if kept there, else a GET of ``ref.url`` (``timeout`` s), checked byte for byte.

    Raises BlobError if ``ref.size`` exceeds ``max_bytes`` (refused unread), the server refuses or
    cannot be reached, or (:class:`BlobMismatch`) the bytes differ from ``ref`` (nothing kept then).
    """
    if ref.size > max_bytes:
        raise BlobError(f"model {ref.sha256[:12]} is {ref.size} bytes, over this client's limit of {max_bytes} (max_model_bytes)")
    if cache is None:
        return _fetch(ref, timeout)
    with cache.lock:
        kept = cache.get(ref)
        if kept is not None:
            return kept
        data = _fetch(ref, timeout)
        cache.fetches += 1
        cache.put(ref, data)
        return data


def _fetch(ref: BlobRef, timeout: float) -> bytes:
    req = urllib.request.Request(ref.url, headers={"Accept": "application/octet-stream"})
    h = hashlib.sha256()
    parts: list[bytes] = []
    got = 0
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            while True:
                piece = resp.read(READ_PIECE_BYTES)
                if not piece:
                    break
                got += len(piece)
                if got > ref.size:
                    raise BlobMismatch(f"model {ref.sha256[:12]}: the server sent more than the announced {ref.size} bytes")
                h.update(piece)
                parts.append(piece)
    except BlobError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _http_error("fetching model", ref.url, exc) from None
    if got != ref.size or h.hexdigest() != ref.sha256:
        raise BlobMismatch(f"model {ref.sha256[:12]}: got {got} bytes with SHA-256 {h.hexdigest()[:12]}, "
                        f"announced {ref.size} bytes {ref.sha256[:12]}; not used")  # fmt: skip
    return b"".join(parts)


def upload_update(grant: UploadGrant, envelope: bytes, timeout: float = 120.0) -> None:
    """PUT ``envelope`` to the grant's signed URL; :class:`UploadClosed` if the grant expired or the store refuses the
    slot as closed (410), BlobError if the envelope is over its ``max_bytes`` or the store refuses otherwise or cannot
    be reached (naming the URL without its signature, and the status)."""
    if time.time() > grant.expires_unix:
        raise UploadClosed("the upload grant expired with its round; the update cannot be uploaded for it")
    if len(envelope) > grant.max_bytes:
        raise BlobError(f"the update is {len(envelope)} bytes, over the coordinator's limit of {grant.max_bytes}")
    req = urllib.request.Request(grant.url, data=envelope, method="PUT",
                                 headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(envelope))})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _http_error("uploading update to", grant.url, exc) from None
