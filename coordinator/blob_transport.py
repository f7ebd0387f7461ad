"""The coordinator's side of the blob transport: opening the store, the references and grants of a round.

With ``transport = "blobs"`` (:class:`coordinator.config.CoordinatorConfig`) the MQTT grid
(:mod:`coordinator.mqtt_grid`) writes each model once into the blob store, named by its
SHA-256, announces its :class:`~har_models.wire.blob_messages.BlobRef`, hands every selected
client a :class:`~har_models.wire.blob_messages.BlobGrant` on its own topic, and reads each
update from the client's slot when the client's notice arrives, checking its size and hash
before the update goes through the same validation as one that came in chunks. This module
holds what the grid needs for that and nothing of MQTT.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.config import CoordinatorConfig
from har_io.blobs import BlobError, BlobStore, upload_slot
from har_models.wire.blob_messages import BlobGrant, BlobNotice, BlobRef, UploadGrant

log = logging.getLogger("fedhar.coordinator")

URL_GRACE_S = 120.0
"""Signed URLs stay valid this long past the exchange's deadline (s): a device whose clock is a
little behind, or an upload that started just before the deadline, is not refused by the store
(the coordinator still counts only what arrives before it closes the exchange)."""


def open_blob_store(cfg: CoordinatorConfig) -> tuple[BlobStore, Callable[[], None]]:
    """The blob store ``cfg`` names, ready to use, and how to close it.

    ``folder``: ``{run_dir}/blobs`` served by :class:`~coordinator.blob_folder.BlobServer` on
    ``blob_bind:blob_port`` (key ``{run_dir}/blob-secret``); ``s3``: the bucket through
    :class:`coordinator.blob_s3.S3BlobStore`.

    Raises
    ------
    BlobError
        If the store cannot be opened (the message names it and the fix).
    """
    if cfg.blob_store == "s3":
        from coordinator.blob_s3 import S3BlobStore

        s3 = S3BlobStore(cfg.s3_bucket, endpoint_url=cfg.s3_endpoint or None, prefix=cfg.s3_prefix)
        s3.check_bucket()  # a wrong endpoint, bucket or key fails the start, not the first round
        log.info("blob transport: objects and uploads in S3 bucket %s at %s", cfg.s3_bucket, cfg.s3_endpoint or "AWS")
        return s3, lambda: None
    from coordinator.blob_folder import BlobServer, FolderBlobStore, load_secret

    store = FolderBlobStore(cfg.run_dir / "blobs", "", load_secret(cfg.run_dir / "blob-secret"))
    server = BlobServer(store, cfg.blob_bind, cfg.blob_port, cfg.blob_public_url)
    try:
        port = server.start()
    except RuntimeError as exc:
        raise BlobError(f"the blob store's HTTP server did not start on {cfg.blob_bind}:{cfg.blob_port} ({exc}); "
                        f"choose another --blob-port") from None  # fmt: skip
    log.info("blob transport: objects and uploads in %s, served at %s (port %d)", store.folder, store.base_url, port)
    return store, server.stop


def publish_object(store: BlobStore, envelope: bytes, expires_unix: float) -> BlobRef:
    """Write ``envelope`` once (named by its SHA-256) and return its reference with a URL valid until ``expires_unix``."""
    sha = store.put_object(envelope)
    return BlobRef(sha, len(envelope), store.object_url(sha, expires_unix))


def make_grant(store: BlobStore, run_id: str, round_: int, stage: int, attempt: str, cid: str, expires_unix: float,
               max_bytes: int, model: BlobRef | None) -> BlobGrant:  # fmt: skip
    """Client ``cid``'s grant for one exchange: a PUT URL for its slot (:func:`har_io.blobs.upload_slot`), its own model."""
    url = store.upload_url(upload_slot(run_id, round_, stage, cid), expires_unix, max_bytes)
    return BlobGrant(run_id, round_, stage, attempt, UploadGrant(url, expires_unix, max_bytes), model)


@dataclass(frozen=True)
class Fetched:
    """An update read from its slot: ``transfer`` (its SHA-256, hex) and its bytes, checked against the notice."""

    transfer: str
    data: bytes


class NoticeRefused(Exception):
    """An upload notice that cannot be counted: ``reason`` (a rejection reason of the round record) and why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def read_noticed(store: BlobStore, cid: str, notice: BlobNotice, max_bytes: int) -> Fetched:
    """Read the update ``notice`` announces from ``cid``'s slot and check it byte for byte.

    Raises
    ------
    NoticeRefused
        ``too_large`` (the notice or the slot is over ``max_bytes``), ``blob_missing`` (nothing in
        the slot), ``blob_unreadable`` (the store failed), ``blob_mismatch`` (size or SHA-256
        differ from the notice).
    """
    if notice.size > max_bytes:
        raise NoticeRefused("too_large", f"the notice announces {notice.size} bytes, over the {max_bytes}-byte limit")
    slot = upload_slot(notice.run_id, notice.round, notice.stage, cid)
    try:
        data = store.read_upload(slot, max_bytes)
    except BlobError as exc:
        raise NoticeRefused("blob_unreadable", str(exc)) from None
    if data is None:
        raise NoticeRefused("blob_missing", f"nothing was uploaded to {slot}")
    sha = hashlib.sha256(data).hexdigest()
    if len(data) != notice.size or sha != notice.sha256:
        raise NoticeRefused("blob_mismatch", f"{slot} holds {len(data)} bytes {sha[:12]}, the notice says {notice.size} bytes "
                                             f"{notice.sha256[:12]}")  # fmt: skip
    return Fetched(sha, data)
