"""The models an edge client receives: chunk streams reassembled, blob references fetched, each checked by its hash.

Over MQTT a model is whole once its chunks' bytes match the transfer id; with the blob transport
it is fetched by the reference in the announcement or the client's grant (docs/scale.md). Bytes
that do not match are dropped and their hash noted in :class:`~edge_client.bad_objects.BadObjects`
(the status tells the coordinator). The newest whole models wait in :attr:`ModelIntake.models`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from edge_client.bad_objects import BadObjects
from har_io.blob_http import BlobCache, BlobMismatch, fetch_model
from har_io.blobs import BlobError
from har_models.wire.blob_messages import BlobGrant, BlobRef
from har_models.wire.chunking import ChunkError, Reassembler, SharedTransfers, peek_transfer
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.client")

FETCH_RETRY_S = 5.0
"""Seconds before a failed model fetch is tried again (while the round is open)."""

KEPT_MODELS = 2
"""Whole models kept waiting for a round (the newest)."""


class ModelIntake:
    """Receives one client's models (see the module docstring); ``shared`` by the clients of one worker process holds a
    model they all receive once; ``blob_cache`` keeps fetched models by hash."""

    def __init__(self, client_id: str, topics: Topics, max_bytes: int, bad: BadObjects, shared: SharedTransfers | None,
                 blob_cache: BlobCache):  # fmt: skip
        self.client_id = client_id
        self.topics = topics
        self.max_bytes = max_bytes
        self.bad = bad
        self.reassembler = Reassembler(max_payload_bytes=max_bytes, shared=shared)
        self.blob_cache = blob_cache
        self.models: OrderedDict[str, bytes] = OrderedDict()  # transfer id -> envelope (newest last)
        self.download_s: float | None = None  # seconds the last whole model took to arrive (first chunk to whole, or the fetch)
        self._first_chunk: OrderedDict[str, float] = OrderedDict()  # transfer id -> monotonic time of its first chunk
        self._fetch_retry_at = 0.0  # monotonic time a failed fetch may be tried again

    def on_chunk(self, topic: str, payload: bytes) -> None:
        """Take one chunk from a model topic (global or personal); never raises (a bad chunk is logged and dropped)."""
        stream = "global" if topic.startswith(self.topics.global_model("")) else "personal"
        t = peek_transfer(payload)
        if t is not None and t not in self.models and self.reassembler.completed(stream, t):
            # Received and used before: sent again, it is a new publication (a new run may send a
            # byte-identical model), so collect it again rather than ignore it.
            self.reassembler.forget(stream, t)
        if t is not None and t not in self._first_chunk:
            self._first_chunk[t] = time.monotonic()
            while len(self._first_chunk) > 8:
                self._first_chunk.popitem(last=False)
        try:
            done = self.reassembler.add(stream, payload)
        except ChunkError as exc:
            if exc.reason == "transfer_sha256_mismatch" and t is not None:
                self.bad.refused(t)
            # A JSON message where a chunk belongs is another message type delivered on a model
            # topic (amqtt's retained delivery at subscribe time does this): not worth a warning.
            level = logging.DEBUG if payload[:1] == b"{" else logging.WARNING
            log.log(level, "[%s] dropped a %s model chunk (%s): %s", self.client_id, stream, exc.reason, exc)
            return
        if done is not None:
            transfer, envelope = done
            began = self._first_chunk.pop(transfer, None)
            if began is not None:
                self.download_s = time.monotonic() - began
            log.debug("[%s] %s model %s received whole (%d bytes)", self.client_id, stream, transfer[:12], len(envelope))
            self._keep(transfer, envelope)

    def fetch(self, ann: RoundAnnouncement, transfer: str, grant: BlobGrant | None) -> None:
        """Fetch the model ``transfer`` of a blob-transport round into :attr:`models` (checked byte for byte).

        The global model's reference is in the announcement, a personalised one in this client's
        ``grant`` (nothing fetched before it arrives); a failure is retried after :data:`FETCH_RETRY_S`.
        """
        if time.monotonic() < self._fetch_retry_at:
            return
        ref: BlobRef | None = None
        try:
            if transfer == ann.global_model and ann.global_blob is not None:
                ref = BlobRef.from_json(ann.global_blob)
            elif grant is not None and grant.model is not None:
                ref = grant.model
        except ValueError as exc:  # the announcement was checked on arrival; kept for safety
            log.warning("[%s] round %d: bad model reference: %s", self.client_id, ann.round, exc)
        if ref is None or ref.sha256 != transfer:
            return  # the grant naming this client's own model is still on its way
        began = time.monotonic()
        try:
            envelope = fetch_model(ref, self.max_bytes, self.blob_cache)
        except BlobError as exc:
            if isinstance(exc, BlobMismatch):
                self.bad.refused(ref.sha256)
            log.warning("[%s] round %d: cannot fetch model %s: %s; trying again in %.0f s", self.client_id, ann.round, transfer[:12],
                        exc, FETCH_RETRY_S)  # fmt: skip
            self._fetch_retry_at = time.monotonic() + FETCH_RETRY_S
            return
        self.download_s = time.monotonic() - began
        self.bad.fine(ref.sha256)
        self._keep(transfer, envelope)

    def _keep(self, transfer: str, envelope: bytes) -> None:
        self.models[transfer] = envelope
        while len(self.models) > KEPT_MODELS:
            self.models.popitem(last=False)
