"""The blob transport's S3 back end: objects and upload slots in a bucket of any S3-compatible store.

:class:`S3BlobStore` implements :class:`har_io.blobs.BlobStore` with boto3 against AWS S3,
MinIO, SeaweedFS, Garage, Ceph RGW or any store that speaks the S3 API and AWS Signature
Version 4. Keys are ``{prefix}objects/{sha256}`` and ``{prefix}uploads/{run_id}/...`` (the
slot names of :func:`har_io.blobs.upload_slot`); devices reach them only through presigned
URLs (SigV4 query signatures), a GET per object and a PUT per slot, valid until the exchange's
deadline. The coordinator's credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` in the environment, ``~/.aws/credentials``, an instance role) and
never leave its machine.

Limits
------
* A presigned PUT cannot cap the size of its body: S3 has no such condition for a plain PUT
  URL (only POST policies have ``content-length-range``). A device can therefore store more
  than ``max_bytes`` in its slot; :meth:`S3BlobStore.read_upload` asks for the size first
  (``HeadObject``) and refuses an oversized slot without downloading it, and reads at most
  ``max_bytes + 1`` bytes in case the slot grew between the two requests; the sweep deletes every
  slot of a closed exchange, oversized ones included. A presigned POST with ``content-length-range``
  would let the store refuse the body itself, but devices of the previous release upload with PUT to
  the URL of their grant, so the grant stays a PUT. The bucket's own quotas and lifecycle rules are
  the operator's guard against a full disk.
* A SigV4 presigned URL lives at most 7 days (604800 s) and its lifetime is counted in whole
  seconds from the second it was signed in, so it may lapse up to one second early or late
  against ``expires_unix``.
* Objects are written once: :meth:`S3BlobStore.put_object` skips the upload when the object
  exists. Upload slots of a closed exchange are deleted by :meth:`S3BlobStore.drop_uploads`, and
  objects no exchange needs by :meth:`S3BlobStore.drop_object` (the blob carrier decides which).
* boto3 is imported when a store is built, not when this module is, so the coordinator runs
  without it until ``transport = "blobs"`` with S3 is chosen; the extra is ``fedhar[s3]``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from typing import Any

from har_io.blobs import BlobError, object_key, sha256_hex
from har_io.install_hints import install_hint

log = logging.getLogger(__name__)

MAX_PRESIGN_S = 604800
"""Longest lifetime of a SigV4 presigned URL, s (7 days; AWS S3 refuses a longer ``X-Amz-Expires``)."""

CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for the store to accept a connection before a request counts as failed."""
READ_TIMEOUT_S = 60.0
"""Seconds to wait for the store's answer on an open connection (an update of a few MB over a LAN takes well under this)."""
MAX_ATTEMPTS = 3
"""Tries per request (boto3's "standard" retry mode, with backoff) before :class:`BlobError`."""
DELETE_BATCH = 1000
"""Keys per ListObjectsV2 page and per DeleteObjects request (the most S3 allows in one DeleteObjects)."""

_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_DENIED_CODES = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                 "AllAccessDisabled"}  # fmt: skip


def _boto3() -> Any:
    """The boto3 module, or BlobError saying how to install it."""
    try:
        import boto3
    except ModuleNotFoundError as exc:
        raise BlobError(f"the S3 blob store needs boto3, which is not installed: {install_hint('s3')}") from exc
    return boto3


def make_s3_client(endpoint_url: str | None = None, region: str | None = None, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                   read_timeout_s: float = READ_TIMEOUT_S, max_attempts: int = MAX_ATTEMPTS) -> Any:  # fmt: skip
    """A boto3 S3 client set up for S3-compatible stores, with credentials from boto3's usual chain.

    SigV4 signatures (what presigned URLs need everywhere), path-style addressing when an
    ``endpoint_url`` is given (a store on an IP address or without wildcard DNS cannot serve
    ``bucket.host``), bounded timeouts and retries, and checksums only where the operation
    requires them (boto3 >= 1.36 otherwise sends CRC32 trailers that several S3-compatible
    stores refuse).

    Parameters
    ----------
    endpoint_url : str, optional
        ``http(s)://host:port`` of the store; None for AWS S3.
    region : str, optional
        Signing region; None takes boto3's chain (``AWS_DEFAULT_REGION``, config file), else ``us-east-1``.
    connect_timeout_s, read_timeout_s : float
        Seconds to connect, and to wait for an answer.
    max_attempts : int
        Tries per request, >= 1.

    Raises
    ------
    ValueError
        If ``endpoint_url`` is not ``http(s)://...``.
    BlobError
        If boto3 is not installed (the message has the install command).
    """
    if endpoint_url is not None and (not isinstance(endpoint_url, str) or not re.match(r"^https?://[^\s/]+", endpoint_url)):
        raise ValueError(f"S3 endpoint_url must be http(s)://host[:port], e.g. http://127.0.0.1:9000, got {endpoint_url!r:.120}")
    boto3 = _boto3()
    from botocore.config import Config

    options: dict[str, Any] = {"signature_version": "s3v4", "connect_timeout": connect_timeout_s, "read_timeout": read_timeout_s,
                               "retries": {"max_attempts": max_attempts, "mode": "standard"},
                               "s3": {"addressing_style": "path" if endpoint_url else "auto"}}  # fmt: skip
    if "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36; older ones send no checksums unasked
        options.update(request_checksum_calculation="when_required", response_checksum_validation="when_required")
    config = Config(**options)
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint_url, region_name=region or session.region_name or "us-east-1", config=config)


class S3BlobStore:
    """Model objects and update slots in one bucket of an S3-compatible store (:class:`har_io.blobs.BlobStore`).

    Parameters
    ----------
    bucket : str
        The bucket; it must exist (the store does not create it) and the coordinator's credentials
        need ``s3:GetObject``, ``s3:PutObject``, ``s3:DeleteObject`` and ``s3:ListBucket`` on it.
    endpoint_url : str, optional
        ``http(s)://host:port`` of the store (MinIO, SeaweedFS, ...); None for AWS S3.
    prefix : str
        Prepended to every key, e.g. ``"fedhar/"`` to share a bucket; ``""`` for the bucket's root.
    region : str, optional
        Signing region (see :func:`make_s3_client`).
    client : optional
        A boto3 S3 client to use instead of :func:`make_s3_client`'s (``endpoint_url`` and ``region`` are then unused).

    Raises
    ------
    ValueError
        If ``bucket`` is empty or ``prefix`` starts with ``/``.
    BlobError
        If boto3 is not installed. Every method raises BlobError when the store cannot be reached,
        has no such bucket, or refuses the credentials; the message names the endpoint, the bucket
        and what to change.
    """

    def __init__(self, bucket: str, endpoint_url: str | None = None, prefix: str = "", region: str | None = None,
                 client: Any = None) -> None:  # fmt: skip
        if not isinstance(bucket, str) or not bucket.strip():
            raise ValueError(f"S3 bucket must be a bucket name, got {bucket!r:.80}")
        if not isinstance(prefix, str) or prefix.startswith("/"):
            raise ValueError(f"S3 key prefix must be a string not starting with '/', e.g. 'fedhar/', got {prefix!r:.80}")
        self.bucket = bucket
        self.prefix = prefix
        self.client = client if client is not None else make_s3_client(endpoint_url, region)
        self.endpoint = str(getattr(getattr(self.client, "meta", None), "endpoint_url", None) or endpoint_url or "AWS S3")
        self._bucket_seen = False

    def __repr__(self) -> str:
        return f"S3BlobStore(bucket={self.bucket!r}, endpoint={self.endpoint!r}, prefix={self.prefix!r})"

    # -- the BlobStore interface ---------------------------------------------------------------

    def put_object(self, data: bytes | bytearray | memoryview, replace: bool = False) -> str:
        """Store ``data`` as ``{prefix}objects/{sha256}`` unless it exists (HeadObject first; ``replace``: write it again,
        a copy found damaged); return the sha256 (hex).

        Raises
        ------
        TypeError
            If ``data`` is not bytes.
        BlobError
            If the store cannot be reached or refuses.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"a blob is bytes, got {type(data).__name__}")
        data = bytes(data)
        sha = sha256_hex(data)
        if not replace and self.has_object(sha):
            return sha
        key = self.prefix + object_key(sha)
        self._call("store object", key, lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=data))
        self._bucket_seen = True
        log.debug("blob %s stored in %s (%d bytes)", sha[:12], self, len(data))
        return sha

    def has_object(self, sha256: str) -> bool:
        """Whether ``{prefix}objects/{sha256}`` exists (HeadObject). ValueError for a malformed digest."""
        return self._head(self.prefix + object_key(sha256)) is not None

    def object_url(self, sha256: str, expires_unix: float) -> str:
        """A presigned GET URL of ``{prefix}objects/{sha256}``, valid until ``expires_unix`` (Unix time, s; see the module's limits).

        Signing is local: the object's existence is not checked. ValueError for a malformed
        digest or an expiry more than 7 days ahead.
        """
        return self._presign("get_object", self.prefix + object_key(sha256), expires_unix)

    def upload_url(self, slot: str, expires_unix: float, max_bytes: int) -> str:
        """A presigned PUT URL of ``{prefix}{slot}``, valid until ``expires_unix`` (Unix time, s).

        ``max_bytes`` is checked but cannot be part of the URL: S3 does not cap a presigned PUT's
        body, so :meth:`read_upload` refuses an oversized slot instead.

        Raises
        ------
        ValueError
            If ``slot`` is not an upload slot (``uploads/...``), ``max_bytes`` is not an integer > 0,
            or the expiry is more than 7 days ahead.
        """
        _check_max_bytes(max_bytes)
        return self._presign("put_object", self.prefix + _check_slot(slot), expires_unix)

    def read_upload(self, slot: str, max_bytes: int) -> bytes | None:
        """The bytes a device uploaded into ``slot``; None if there are none.

        Asks for the object's size first (HeadObject) and never downloads a slot larger than
        ``max_bytes``; then reads at most ``max_bytes + 1`` bytes, so a slot replaced by a
        larger one between the two requests is refused too.

        Raises
        ------
        ValueError
            If ``slot`` is not an upload slot or ``max_bytes`` is not an integer > 0.
        BlobError
            If the slot holds more than ``max_bytes`` bytes (the message names the slot, the size
            and the limit), or the store cannot be reached or refuses.
        """
        reader = self.open_upload(slot, max_bytes)
        if reader is None:
            return None
        try:
            data = reader.read(max_bytes + 1)
        finally:
            reader.close()
        if len(data) > max_bytes:
            raise BlobError(f"upload slot {slot} in {self._where()} grew past the limit of {max_bytes} bytes while it was read; "
                            "the update is refused")  # fmt: skip
        return data

    def open_upload(self, slot: str, max_bytes: int) -> _BodyReader | None:
        """``slot`` opened for reading as a stream (HeadObject for its size first: a slot over ``max_bytes`` is refused
        unread); None if there is nothing in it.

        Raises
        ------
        BlobError
            If the slot holds more than ``max_bytes`` bytes, or the store cannot be reached or refuses.
        """
        _check_max_bytes(max_bytes)
        key = self.prefix + _check_slot(slot)
        head = self._head(key)
        if head is None:
            return None
        size = int(head.get("ContentLength", 0))
        if size > max_bytes:
            raise BlobError(f"upload slot {slot} in {self._where()} holds {size} bytes, more than the limit of {max_bytes} "
                            "(max_update_bytes); the update is refused without being downloaded")  # fmt: skip
        try:
            resp = self._call("read upload", key, lambda: self.client.get_object(Bucket=self.bucket, Key=key))
        except _Missing:
            return None  # deleted between the two requests
        return _BodyReader(resp["Body"], size, lambda n: self._call("read upload", key, lambda: resp["Body"].read(n)))

    def list_exchanges(self, root: str) -> list[str]:
        """The exchange prefixes under ``{prefix}{root}`` that hold slots (ListObjectsV2 with a delimiter)."""
        full = self.prefix + root

        def prefixes() -> list[str]:
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/")
            return [p["Prefix"][len(self.prefix):] for page in pages for p in page.get("CommonPrefixes", ())]

        return sorted(self._call("list uploads", full, prefixes))

    def drop_object(self, sha256: str) -> None:
        """Delete ``{prefix}objects/{sha256}`` (DeleteObject; deleting a missing key is no error in S3).

        Raises
        ------
        ValueError
            For a malformed digest.
        BlobError
            If the store refuses or cannot be reached.
        """
        key = self.prefix + object_key(sha256)
        with contextlib.suppress(_Missing):
            self._call("delete object", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))

    def drop_uploads(self, prefix: str) -> None:
        """Delete every key under ``{self.prefix}{prefix}`` (ListObjectsV2 pages, DeleteObjects in batches of :data:`DELETE_BATCH`).

        Raises
        ------
        ValueError
            If ``prefix`` does not start with ``uploads/`` (objects are never dropped here).
        BlobError
            If listing or deleting fails; keys deleted before the failure stay deleted.
        """
        if not isinstance(prefix, str) or not prefix.startswith("uploads/"):
            raise ValueError(f"drop_uploads takes an upload prefix ('uploads/<run_id>/...'), got {prefix!r:.120}")
        full = self.prefix + prefix
        if not prefix.endswith("/"):  # one slot: its key exactly (a prefix would also match a longer client id)
            self._call("delete upload", full, lambda: self.client.delete_object(Bucket=self.bucket, Key=full))
            return

        def keys_of_pages() -> list[list[str]]:
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=full, PaginationConfig={"PageSize": DELETE_BATCH})
            return [[o["Key"] for o in page.get("Contents", ())] for page in pages]

        dropped = 0
        for keys in self._call("list uploads", full, keys_of_pages):
            for i in range(0, len(keys), DELETE_BATCH):
                batch = [{"Key": k} for k in keys[i : i + DELETE_BATCH]]
                resp = self._call("delete uploads", full, lambda b=batch: self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": b, "Quiet": True}))  # fmt: skip
                errors = resp.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise BlobError(f"{len(errors)} upload slot(s) under {full} in {self._where()} could not be deleted: "
                                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}")  # fmt: skip
                dropped += len(batch)
        log.debug("dropped %d upload slot(s) under %s in %s", dropped, full, self)

    # -- beyond the interface ------------------------------------------------------------------

    def check_bucket(self) -> None:
        """Ask the store for the bucket (HeadBucket): BlobError naming the endpoint, the bucket and the fix if it is not usable.

        Worth calling once when the coordinator starts, so a wrong endpoint, bucket or key ends
        the start instead of the first round.
        """
        try:
            self._call("open bucket", "", lambda: self.client.head_bucket(Bucket=self.bucket))
        except _Missing:
            raise BlobError(f"{self._where()} has no bucket {self.bucket!r}; create it (e.g. `aws s3 mb s3://{self.bucket}"
                            f" --endpoint-url {self.endpoint}`) or set the name of an existing one") from None  # fmt: skip
        self._bucket_seen = True

    # -- helpers -------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"S3 store {self.endpoint} (bucket {self.bucket!r})"

    def _head(self, key: str) -> dict[str, Any] | None:
        """HeadObject's answer for ``key``, or None if there is no such object (after making sure the bucket exists)."""
        try:
            head: dict[str, Any] = self._call("look up", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        except _Missing:
            # A HEAD has no body, so a missing bucket also answers a bare 404: ask for the bucket once.
            if not self._bucket_seen:
                self.check_bucket()
            return None
        self._bucket_seen = True
        return head

    def _presign(self, method: str, key: str, expires_unix: float) -> str:
        if isinstance(expires_unix, bool) or not isinstance(expires_unix, (int, float)) or not math.isfinite(expires_unix):
            raise ValueError(f"expires_unix must be a Unix time in seconds, got {expires_unix!r:.40}")
        expires_in = max(1, math.ceil(expires_unix - time.time()))
        if expires_in > MAX_PRESIGN_S:
            raise ValueError(f"an S3 presigned URL lives at most {MAX_PRESIGN_S} s (7 days); expires_unix is {expires_in} s ahead")
        url: str = self._call("sign URL", key, lambda: self.client.generate_presigned_url(
            method, Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_in))  # fmt: skip
        return url

    def _call(self, what: str, key: str, fn: Any) -> Any:
        """``fn()``, with botocore's errors turned into BlobError (a missing key into :class:`_Missing`)."""
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

        try:
            return fn()
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            if code in _MISSING_CODES:
                raise _Missing(key) from None
            if code == "NoSuchBucket":
                fix = f"create the bucket or set the name of an existing one (store {self.endpoint})"
            elif code in _DENIED_CODES:
                fix = ("give the coordinator credentials the store accepts (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
                       "another boto3 credential source) with s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket "
                       "on the bucket")
            else:
                fix = "see the store's logs"
            raise BlobError(f"{what} {key or self.bucket} in {self._where()} failed: {code} {err.get('Message', '')}".rstrip()
                            + f"; {fix}") from exc  # fmt: skip
        except NoCredentialsError as exc:
            raise BlobError(f"{what} {key or self.bucket} in {self._where()}: no S3 credentials found; set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY (or another boto3 credential source) for the coordinator") from exc  # fmt: skip
        except EndpointConnectionError as exc:
            raise BlobError(f"{what} {key or self.bucket}: cannot connect to {self._where()} ({exc}); check the endpoint URL "
                            "and that the store is running and reachable from the coordinator") from exc  # fmt: skip
        except BotoCoreError as exc:
            raise BlobError(f"{what} {key or self.bucket} in {self._where()} failed: {exc}; check the endpoint URL and that the "
                            "store is running and reachable from the coordinator") from exc  # fmt: skip


class _BodyReader:
    """An S3 upload slot opened for reading (:class:`har_io.blobs.UploadReader`)."""

    def __init__(self, body: Any, size: int, read: Any):
        self._body = body
        self.size = size
        self._read = read

    def read(self, n: int) -> bytes:
        return bytes(self._read(n))

    def close(self) -> None:
        self._body.close()


class _Missing(Exception):
    """The key (or, from a HEAD, possibly the bucket) does not exist: handled inside :class:`S3BlobStore`."""


def _check_slot(slot: Any) -> str:
    if not isinstance(slot, str) or not slot.startswith("uploads/") or len(slot) > 900:
        raise ValueError(f"an upload slot is a key 'uploads/<run_id>/r<round>-s<stage>/<client_id>' (see upload_slot), got {slot!r:.120}")
    return slot


def _check_max_bytes(max_bytes: Any) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be an integer > 0, got {max_bytes!r:.40}")
    return max_bytes
