"""The ``[transport]`` settings table: how model bytes travel, and the blob store they travel through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from har_io.blobs import TRANSPORTS
from har_models.settings import doc

BLOB_STORES = ("folder", "s3")
"""The blob store back ends (:mod:`coordinator.transport.folder_store`, :mod:`coordinator.transport.s3_store`)."""


@dataclass(frozen=True)
class TransportSettings:
    """The ``[transport]`` settings table (docs/scale.md, "Blob transport").

    Parameters
    ----------
    kind : {"mqtt", "blobs"}
        Model bytes in chunks through the broker, or as content-addressed objects in a blob store
        fetched and uploaded over HTTP with signed URLs, MQTT carrying only control.
    max_update_bytes : int
        Largest update envelope accepted (bytes); an upload grant allows the smaller of this and the
        model's own update size bound.
    store : {"folder", "s3"}
        With blobs: a folder served over HTTP by the coordinator, or an S3-compatible store.
    bind, port, public_url :
        The folder store's HTTP server (``run`` and the simulation; ``serve`` serves it beside the status
        page): address, port (0: a free one), and the base URL devices reach it at if not ``http://bind:port``.
    s3_endpoint, s3_bucket, s3_prefix :
        The S3 store (credentials from the environment, never sent to devices).
    """

    kind: str = field(
        default="mqtt",
        metadata=doc("how model bytes travel: in chunks through the broker (mqtt), or as content-addressed objects in a "
                     "blob store fetched and uploaded over HTTP with signed URLs, MQTT carrying only control (blobs; "
                     "docs/scale.md)", choices=TRANSPORTS, flag="--transport"),
    )
    max_update_bytes: int = field(default=512 * 1024 * 1024, metadata=doc("largest update envelope accepted", "bytes",
                                                                           flag="--max-update-bytes"))  # fmt: skip
    store: str = field(
        default="folder",
        metadata=doc("with transport blobs: a folder served over HTTP by the coordinator (folder), or an S3-compatible "
                     "store (s3: s3_bucket, s3_endpoint; credentials from the environment, never sent to devices)",
                     choices=BLOB_STORES, flag="--blob-store"),
    )
    bind: str = field(default="127.0.0.1", metadata=doc("address the folder store's HTTP server binds (run, simulate)",
                                                        flag="--blob-bind"))  # fmt: skip
    port: int = field(default=0, metadata=doc("port of the folder store's HTTP server (0: a free one)", flag="--blob-port"))
    public_url: str = field(
        default="", metadata=doc("base URL devices reach the folder store at, if not http://bind:port (a proxy, a name)",
                                 flag="--blob-public-url"),
    )
    s3_endpoint: str = field(default="", metadata=doc("S3 endpoint URL (empty: AWS's own)"))
    s3_bucket: str = field(default="", metadata=doc("S3 bucket that holds the objects and upload slots"))
    s3_prefix: str = field(default="", metadata=doc("key prefix inside the S3 bucket, e.g. 'fedhar/'"))

    def check(self, cfg: Any) -> None:
        """Refuse settings that cannot work (ValueError naming the setting and the fix)."""
        for name, allowed in (("kind", TRANSPORTS), ("store", BLOB_STORES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"[transport] {name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.kind == "blobs" and self.store == "s3" and not self.s3_bucket:
            raise ValueError("transport blobs with the s3 store needs [transport] s3_bucket (--s3-bucket)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"[transport] port (--blob-port) must be in [0, 65535], got {self.port}")
        if self.max_update_bytes < 1:
            raise ValueError(f"[transport] max_update_bytes must be >= 1, got {self.max_update_bytes}")
