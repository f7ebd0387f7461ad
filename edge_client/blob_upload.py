"""How a client's update leaves in its exchange's transport: chunks over MQTT, or a PUT to its blob grant.

:class:`TransportLink` is the :class:`edge_client.delivery.UploadLink` of the agent's delivery, so
receipts, back-off and re-sends are the same in both transports. For ``"blobs"`` a whole send is a
PUT to the client's signed upload URL, then a :class:`BlobNotice` ``{round, sha256, size}`` on
``{p}/client/{cid}/update/blob``; without the grant yet, the send fails as a timeout and delivery
tries again later (docs/scale.md, "Blob transport").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from edge_client.delivery import Exchange, Key
from har_io.blob_http import UploadClosed, upload_update
from har_io.blobs import BlobError
from har_io.mqtt_link import MqttLink
from har_models.wire.blob_messages import BlobGrant, BlobNotice
from har_models.wire.chunking import transfer_id

log = logging.getLogger("fedhar.client")

BLOB_CHUNK_BYTES = 1 << 40
"""The "chunk size" of a blob send: the whole envelope is one PUT."""


class TransportLink:
    """An :class:`~edge_client.delivery.UploadLink` that sends each update in its exchange's transport: chunks on
    ``topic_of(i)`` through ``link``, or a PUT to the grant ``grant_of(key)`` and a notice on ``notice_topic``."""

    def __init__(self, link: MqttLink, topic_of: Callable[[int], str], notice_topic: str, grant_of: Callable[[Key], BlobGrant | None]):
        self._link = link
        self.connected: threading.Event = link.connected
        self._topic_of = topic_of
        self._notice_topic = notice_topic
        self._grant_of = grant_of
        self.blob_sends = 0  # updates uploaded to a blob store (for a test or a log)

    def chunk_size(self, exchange: Exchange) -> int:
        """One PUT for a blob exchange; the link's chunk size on the update topics for an MQTT one (bytes)."""
        return BLOB_CHUNK_BYTES if exchange.transport == "blobs" else self._link.chunk_size(self._topic_of)

    def note_refused(self, refused_payload: int) -> None:
        if refused_payload < BLOB_CHUNK_BYTES:
            self._link.note_refused(refused_payload)

    def send(self, exchange: Exchange, payload: bytes, chunk_bytes: int, only: Collection[int] | None = None,
             timeout: float = 300.0) -> int:  # fmt: skip
        """Send ``payload`` for ``exchange``: in chunks over MQTT, or whole to its blob grant; return the chunk count (1).

        Raises TimeoutError for a blob exchange without its grant yet or whose upload failed (delivery
        sends it whole again later), and PacketRejected or TimeoutError from the MQTT link. An upload the store
        refuses because its exchange is over (:class:`~har_io.blob_http.UploadClosed`) still sends its notice.
        """
        if exchange.transport != "blobs":
            return self._link.publish_chunks(self._topic_of, payload, timeout=timeout, chunk_bytes=chunk_bytes, only=only)
        grant = self._grant_of(exchange.key)
        if grant is None:
            raise TimeoutError(f"no upload grant yet for round {exchange.round}")
        try:
            upload_update(grant.upload, payload)
        except UploadClosed as exc:
            # The exchange is over at the store: the notice still goes, so the coordinator names the late update in its
            # records (a stale_round rejection, as over MQTT) instead of it vanishing in this device's log.
            log.warning("round %d: the blob store no longer takes this update (%s); telling the coordinator", exchange.round, exc)
        except BlobError as exc:
            raise TimeoutError(str(exc)) from None
        notice = BlobNotice(exchange.run_id, exchange.round, exchange.stage, transfer_id(payload), len(payload))
        self._link.publish(self._notice_topic, notice.to_bytes(), timeout=timeout)
        self.blob_sends += 1
        return 1
