"""The folder back end of the blob transport: objects and upload slots in a folder, served over HTTP.

:class:`FolderBlobStore` keeps ``objects/{sha256}`` and ``uploads/...`` (:mod:`har_io.blobs`)
under one folder on the coordinator's machine, and :func:`blob_app` serves them: a GET of an
object and a PUT into an upload slot, each allowed only with a URL the coordinator signed
(HMAC-SHA256 over method, path, expiry and size limit, :func:`har_io.blobs.sign`) and only
until it expires. The signing key is a random 32-byte file in the run folder (mode 0600); it
never leaves the coordinator, so devices hold no storage credentials, only the URLs they were
handed for one exchange.

Served by the home server's web server under ``/blobs`` (``fedhar-coordinator serve``) or, for
``fedhar-coordinator run`` and the simulation, by :class:`BlobServer` on a port of its own.
An object is answered with ``ETag: "<sha256>"`` and ``Cache-Control: immutable``; a GET whose
``If-None-Match`` names it gets 304 and no body. A PUT is streamed to a temporary file, cut off
at the signed size limit (413, and the connection closed without reading on), and renamed into its
slot only when complete, so the coordinator never reads half an upload. A PUT into the slot of an
exchange that is not open (:meth:`FolderBlobStore.accept`) is refused (410) whatever its URL's expiry,
and one from a device the coordinator refuses (revoked, forgotten) is refused (403), so a round owns
its slots and revocation reaches the store at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from har_io.blobs import BlobError, check_sha256, object_key, sha256_hex, sign, signature_ok

ROUTE = "/blobs"
"""URL path under which the blob app is served (signatures cover the whole path)."""

SECRET_BYTES = 32


def load_secret(path: Path) -> bytes:
    """The signing key in ``path``, created (32 random bytes, mode 0600) if absent.

    Raises
    ------
    BlobError
        If the file exists with another length (damaged): delete it to make a new key
        (URLs signed with the old one stop working).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = secrets.token_bytes(SECRET_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return data
    if len(data) != SECRET_BYTES:
        raise BlobError(f"{path} holds {len(data)} bytes, not a {SECRET_BYTES}-byte signing key; delete it to make a new one")
    return data


class FolderBlobStore:
    """A :class:`har_io.blobs.BlobStore` in a local folder, with URLs signed for :func:`blob_app`.

    Parameters
    ----------
    folder : Path
        Holds ``objects/`` and ``uploads/`` (created).
    base_url : str
        How devices reach the blob app, e.g. ``http://192.168.1.10:8765`` (no trailing slash;
        :data:`ROUTE` is added). Can be set after construction (:attr:`base_url`), once a server
        bound its port.
    secret : bytes
        The signing key (:func:`load_secret`).
    refused : callable client id -> bool, optional
        Devices whose writes are refused (revoked or forgotten), asked at every request.
    """

    def __init__(self, folder: Path, base_url: str, secret: bytes, refused: Callable[[str], bool] | None = None):
        self.folder = Path(folder)
        self.base_url = base_url.rstrip("/")
        self.secret = secret
        self.refused: Callable[[str], bool] = refused or (lambda cid: False)
        self.accepting: frozenset[str] | None = None  # open exchange prefixes; None: every slot (a store used alone)
        self.served = 0  # objects answered whole by blob_app (200), and their bytes
        self.served_bytes = 0
        self.taken = 0  # uploads stored by blob_app (201), and their bytes
        self.taken_bytes = 0
        (self.folder / "objects").mkdir(parents=True, exist_ok=True)
        (self.folder / "uploads").mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        p = (self.folder / key).resolve()
        if self.folder.resolve() not in p.parents:
            raise BlobError(f"blob key {key!r:.100} leaves the store's folder")
        return p

    def put_object(self, data: bytes, replace: bool = False) -> str:
        sha = sha256_hex(data)
        path = self._path(object_key(sha))
        if path.exists() and not replace:
            return sha
        _write_atomic(path, data)
        return sha

    def accept(self, prefixes: Collection[str]) -> None:
        """Take writes only into the slots of the exchanges ``prefixes`` names (``uploads/{run}/r0005-s0/``) from now on."""
        self.accepting = frozenset(prefixes)

    def takes(self, slot: str) -> str | None:
        """Why a write into ``slot`` is refused now (None: it is taken): its device refused, or its exchange closed."""
        exchange, _, cid = slot.rpartition("/")
        if self.refused(cid):
            return f"device {cid} may not upload: it was revoked or forgotten on this home server"
        if self.accepting is not None and exchange + "/" not in self.accepting:
            return f"the exchange of {slot} is closed: an upload for it is no longer taken"
        return None
    def has_object(self, sha256: str) -> bool:
        return self._path(object_key(sha256)).is_file()

    def object_url(self, sha256: str, expires_unix: float) -> str:
        path = f"{ROUTE}/{object_key(sha256)}"
        exp = int(expires_unix)
        return f"{self.base_url}{path}?{urlencode({'exp': exp, 'sig': sign(self.secret, 'GET', path, exp, 0)})}"

    def upload_url(self, slot: str, expires_unix: float, max_bytes: int) -> str:
        path = f"{ROUTE}/{slot}"
        exp = int(expires_unix)
        q = {"exp": exp, "max": int(max_bytes), "sig": sign(self.secret, "PUT", path, exp, int(max_bytes))}
        return f"{self.base_url}{path}?{urlencode(q)}"

    def read_upload(self, slot: str, max_bytes: int) -> bytes | None:
        reader = self.open_upload(slot, max_bytes)
        if reader is None:
            return None
        try:
            return reader.read(reader.size + 1)
        finally:
            reader.close()

    def open_upload(self, slot: str, max_bytes: int) -> _FileReader | None:
        path = self._path(slot)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return None
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            f.close()
            raise BlobError(f"the upload in {slot} is {size} bytes, over the {max_bytes}-byte limit")
        return _FileReader(f, size)

    def list_exchanges(self, root: str) -> list[str]:
        base = self._path(root.rstrip("/"))
        if not base.is_dir():
            return []
        return sorted(f"{root.rstrip('/')}/{p.name}/" for p in base.iterdir() if p.is_dir())

    def drop_object(self, sha256: str) -> None:
        self._path(object_key(sha256)).unlink(missing_ok=True)

    def drop_uploads(self, prefix: str) -> None:
        if not prefix.startswith("uploads/"):
            raise BlobError(f"only upload slots can be dropped, not {prefix!r:.100}")
        path = self._path(prefix.rstrip("/"))
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file():
            path.unlink(missing_ok=True)


class _FileReader:
    """An upload slot of the folder store opened for reading (:class:`har_io.blobs.UploadReader`)."""

    def __init__(self, f: BinaryIO, size: int):
        self._f = f
        self.size = size

    def read(self, n: int) -> bytes:
        return self._f.read(n)

    def close(self) -> None:
        self._f.close()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _signed(store: FolderBlobStore, request: Request, method: str, max_bytes: int) -> Response | None:
    """None if ``request`` carries a valid, unexpired signature for ``method`` on its path, else the refusal."""
    q = request.query_params
    try:
        exp = int(q.get("exp", ""))
    except ValueError:
        return JSONResponse({"error": "this URL carries no expiry (exp): use the URL the coordinator handed out whole"}, status_code=403)
    if not signature_ok(store.secret, method, request.url.path, exp, max_bytes, q.get("sig", "")):
        return JSONResponse({"error": "bad signature: this URL was not signed by this coordinator for this method"}, status_code=403)
    if time.time() > exp:
        return JSONResponse({"error": f"this URL expired at {exp} (unix s): the exchange it belonged to is over"}, status_code=403)
    return None


def blob_app(store: FolderBlobStore) -> Starlette:
    """The HTTP side of :class:`FolderBlobStore`, to be served at :data:`ROUTE`.

    * ``GET {ROUTE}/objects/{sha256}?exp=&sig=``: the object (200, ``ETag``), 304 for a matching
      ``If-None-Match``, 404 if absent, 403 for a bad or expired signature.
    * ``PUT {ROUTE}/uploads/{run}/{exchange}/{client}?exp=&max=&sig=``: store the body in that
      slot (201); 413 past ``max`` bytes (the connection is closed without reading on), 403 for a bad
      or expired signature or a refused device, 410 for a slot whose exchange is not open.
    """

    async def get_object(request: Request) -> Response:
        sha = request.path_params["sha"]
        try:
            check_sha256(sha)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        refusal = _signed(store, request, "GET", 0)
        if refusal is not None:
            return refusal
        etag = f'"{sha}"'
        headers = {"ETag": etag, "Cache-Control": "public, max-age=31536000, immutable"}
        if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
            return Response(status_code=304, headers=headers)
        path = store._path(object_key(sha))
        if not path.is_file():
            return JSONResponse({"error": f"no object {sha}"}, status_code=404)
        store.served += 1
        store.served_bytes += path.stat().st_size
        return FileResponse(path, headers=headers, media_type="application/octet-stream")

    async def put_upload(request: Request) -> Response:
        try:
            max_bytes = int(request.query_params.get("max", ""))
        except ValueError:
            return JSONResponse({"error": "this URL carries no size limit (max)"}, status_code=403)
        refusal = _signed(store, request, "PUT", max_bytes)
        if refusal is not None:
            return refusal
        slot = request.url.path[len(ROUTE) + 1 :]
        try:
            path = store._path(slot)
        except BlobError as exc:
            return JSONResponse({"error": str(exc)}, status_code=403)
        why = store.takes(slot)
        if why is not None:
            return JSONResponse({"error": why}, status_code=403 if "revoked" in why else 410, headers=_CLOSE)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            return JSONResponse({"error": f"{declared} bytes is over this slot's limit of {max_bytes}"}, status_code=413,
                                headers=_CLOSE)  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                async for piece in request.stream():
                    size += len(piece)
                    if size > max_bytes:
                        raise _TooLarge
                    f.write(piece)
            os.replace(tmp, path)
        except _TooLarge:
            os.unlink(tmp)
            return JSONResponse({"error": f"the upload is over this slot's limit of {max_bytes} bytes"}, status_code=413,
                                headers=_CLOSE)  # fmt: skip
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        store.taken += 1
        store.taken_bytes += size
        return JSONResponse({"slot": slot, "size": size}, status_code=201)

    return Starlette(routes=[
        Route(ROUTE + "/objects/{sha}", get_object, methods=["GET", "HEAD"]),
        Route(ROUTE + "/uploads/{rest:path}", put_upload, methods=["PUT"]),
    ])  # fmt: skip


class _TooLarge(Exception):
    pass


_CLOSE = {"Connection": "close"}
"""A refusal closes the connection: the server reads no more of a body it will not store."""


class BlobServer:
    """:func:`blob_app` served by uvicorn in a thread, on a port of its own (``run`` and the simulation).

    Parameters
    ----------
    store : FolderBlobStore
        Its :attr:`~FolderBlobStore.base_url` is set to ``http://{advertise or host}:{port}``
        once the port is bound, unless ``public_url`` is given.
    host : str
        Address to bind.
    port : int
        0 picks a free port.
    public_url : str
        The base URL devices use, if not the bound address (a proxy, a name).
    """

    def __init__(self, store: FolderBlobStore, host: str = "127.0.0.1", port: int = 0, public_url: str = ""):
        from har_io.web_thread import WebServer

        self.store = store
        self._public_url = public_url
        self._web = WebServer(blob_app(store), host=host, port=port, signed=True)
        self.host = host

    def start(self) -> int:
        """Start serving; return the bound port (RuntimeError if it cannot bind within 10 s)."""
        port = self._web.start()
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.store.base_url = (self._public_url or f"http://{host}:{port}").rstrip("/")
        return port

    def stop(self) -> None:
        """Stop serving."""
        self._web.stop()
