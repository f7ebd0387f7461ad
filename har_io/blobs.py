"""Model bytes as content-addressed blobs: the storage interface of the blob transport.

With ``transport = "blobs"`` the broker carries only control messages (docs/scale.md, "Blob
transport"): a model version is one immutable object ``objects/{sha256}`` fetched over HTTP(S)
through a URL the coordinator signs; each selected client PUTs its update to its own slot
(:func:`upload_slot`) through a short-lived signed URL and announces ``{round, sha256, size}``.
Devices never hold storage credentials. Back ends:
:class:`coordinator.transport.folder_store.FolderBlobStore` (HMAC-signed, :func:`sign`) and
:class:`coordinator.transport.s3_store.S3BlobStore`; blobs are envelopes decoded by
:mod:`har_models.wire.codec`, never unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Protocol

from har_models.wire.blob_messages import BlobRef, UploadGrant, check_sha256
from har_models.wire.topics import check_client_id

__all__ = ["TRANSPORTS", "BlobError", "BlobRef", "BlobStore", "UploadGrant", "check_sha256", "object_key", "sha256_hex",
           "sign", "signature_ok", "upload_slot"]

TRANSPORTS = ("mqtt", "blobs")
"""How model bytes travel: through the broker in chunks (the default) or through a blob store."""


class BlobError(Exception):
    """A blob could not be stored, found, fetched or trusted (the message says which and why)."""


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data`` as lowercase hex (the object name of ``data``)."""
    return hashlib.sha256(data).hexdigest()


def object_key(sha256: str) -> str:
    """The store key of the object named ``sha256``: ``objects/{sha256}``."""
    return f"objects/{check_sha256(sha256)}"


def upload_slot(run_id: str, round_: int, stage: int, client_id: str) -> str:
    """The store key of a client's update for one exchange, ``uploads/{run_id}/r{round:04d}-s{stage}/{client_id}`` (a
    second upload replaces the first); ValueError unless the run id is a plain name and the client id valid."""
    if not re.match(r"^[A-Za-z0-9._-]{1,128}$", run_id) or run_id in (".", ".."):
        raise ValueError(f"run id {run_id!r:.80} cannot name a blob slot (letters, digits, '._-' only)")
    if round_ < 0 or stage < 0:
        raise ValueError(f"round {round_} and stage {stage} must be >= 0")
    return f"uploads/{run_id}/r{round_:04d}-s{stage}/{check_client_id(client_id)}"


def sign(secret: bytes, method: str, path: str, expires_unix: int, max_bytes: int) -> str:
    """HMAC-SHA256 (hex) with the coordinator's ``secret`` over method, URL path, expiry (unix s) and the largest PUT body
    (0 for a GET): the folder back end's URL signature."""
    msg = f"{method}\n{path}\n{expires_unix}\n{max_bytes}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def signature_ok(secret: bytes, method: str, path: str, expires_unix: int, max_bytes: int, signature: str) -> bool:
    """Whether ``signature`` is :func:`sign`'s for these values (compared in constant time)."""
    return hmac.compare_digest(sign(secret, method, path, expires_unix, max_bytes), signature)


class UploadReader(Protocol):
    """An upload slot opened for reading (:meth:`BlobStore.open_upload`): its size, read as a stream."""

    size: int
    """Bytes in the slot."""

    def read(self, n: int) -> bytes:
        """Up to ``n`` more bytes (b"" at the end)."""
        ...

    def close(self) -> None:
        """Release the slot."""
        ...


class BlobStore(Protocol):
    """Where the coordinator keeps model objects and receives update uploads; every method may raise :class:`BlobError`."""

    def put_object(self, data: bytes, replace: bool = False) -> str:
        """Store ``data`` as ``objects/{sha256}`` unless that object exists already (``replace``: write it again, a
        copy found damaged); return its sha256 (hex)."""
        ...

    def has_object(self, sha256: str) -> bool:
        """Whether ``objects/{sha256}`` exists."""
        ...

    def object_url(self, sha256: str, expires_unix: float) -> str:
        """A URL that GETs ``objects/{sha256}`` without credentials until ``expires_unix`` (s)."""
        ...

    def upload_url(self, slot: str, expires_unix: float, max_bytes: int) -> str:
        """A URL that takes one PUT of at most ``max_bytes`` into ``slot`` (:func:`upload_slot`) until ``expires_unix``."""
        ...

    def open_upload(self, slot: str, max_bytes: int) -> UploadReader | None:
        """``slot`` opened for reading, its size known before a byte is read; None if nothing was uploaded there.
        BlobError if it holds more than ``max_bytes`` (refused unread)."""
        ...

    def list_exchanges(self, root: str) -> list[str]:
        """The exchange prefixes below ``root`` (``uploads/{run_id}/``) that hold slots: ``uploads/{run_id}/r0005-s0/``."""
        ...

    def drop_uploads(self, prefix: str) -> None:
        """Delete the upload slots of an exchange (``prefix`` ends with ``/``) or one slot (a slot's whole key)."""
        ...

    def drop_object(self, sha256: str) -> None:
        """Delete ``objects/{sha256}`` if it exists (a model no exchange needs any more)."""
        ...
