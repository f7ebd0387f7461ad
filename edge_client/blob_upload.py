"""How a client's update leaves in the round's transport: chunks over MQTT, or a PUT to its blob grant.

:class:`TransportLink` is the :class:`edge_client.delivery.UploadLink` the agent gives its
:class:`~edge_client.delivery.Delivery`, so delivery (receipts, back-off, re-sends) is the same
in both transports. For an exchange announced with ``transport = "blobs"`` a whole send is a
PUT of the envelope to the client's signed upload URL (its :class:`BlobGrant`), then a
:class:`BlobNotice` ``{round, sha256, size}`` on ``{p}/client/{cid}/update/blob``; any other
exchange goes in chunks through the broker as before. A blob exchange whose grant has not
arrived yet is not sent through the broker instead: the send fails as a timeout, and delivery
tries again after its wait (docs/scale.md, "Blob transport").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from har_io.blob_http import upload_update
from har_io.blobs import BlobError
from har_io.mqtt_link import MqttLink
from har_models.wire import codec
from har_models.wire.blob_messages import BlobGrant, BlobNotice
from har_models.wire.chunking import transfer_id

log = logging.getLogger("fedhar.client")

Key = tuple[str, int, int]

BLOB_CHUNK_BYTES = 1 << 40
"""The "chunk size" a blob send reports to delivery: the whole envelope is one PUT."""


class TransportLink:
    """An :class:`~edge_client.delivery.UploadLink` that sends each update in its exchange's transport.

    Parameters
    ----------
    link : MqttLink
        The client's broker session (chunks, and the blob notice).
    notice_topic : str
        ``{p}/client/{cid}/update/blob``.
    transport_of : callable (key) -> str
        ``"blobs"`` or ``"mqtt"``: how the exchange ``key`` = (run id, round, stage) was announced.
    grant_of : callable (key) -> BlobGrant or None
        The client's grant for that exchange, if it arrived.
    """

    def __init__(self, link: MqttLink, notice_topic: str, transport_of: Callable[[Key], str],
                 grant_of: Callable[[Key], BlobGrant | None]):  # fmt: skip
        self._link = link
        self.connected: threading.Event = link.connected
        self._notice_topic = notice_topic
        self._transport_of = transport_of
        self._grant_of = grant_of
        self.blob_sends = 0  # updates uploaded to a blob store (for a test or a log)

    def chunk_size(self, topic_of: Callable[[int], str]) -> int:
        return self._link.chunk_size(topic_of)

    def note_refused(self, refused_payload: int) -> None:
        if refused_payload < BLOB_CHUNK_BYTES:
            self._link.note_refused(refused_payload)

    def publish_chunks(
        self,
        topic_of: Callable[[int], str],
        payload: bytes,
        retain: bool = False,
        timeout: float = 300.0,
        chunk_bytes: int | None = None,
        only: Collection[int] | None = None,
    ) -> int:
        """Send ``payload`` (an update envelope): in chunks over MQTT, or whole to the blob grant of its exchange.

        Returns the number of chunks it was cut into (1 for a blob upload).

        Raises
        ------
        TimeoutError
            A blob exchange whose grant has not arrived, or whose upload failed (the store
            refused or could not be reached): delivery sends it whole again later.
        PacketRejected, TimeoutError
            From the MQTT link, for a chunked send.
        """
        header = codec.peek_header(payload)
        key = (str(header.get("meta", {}).get("run_id", "")), int(header["round"]), int(header.get("meta", {}).get("stage", 0)))
        if self._transport_of(key) != "blobs":
            return self._link.publish_chunks(topic_of, payload, retain=retain, timeout=timeout, chunk_bytes=chunk_bytes, only=only)
        grant = self._grant_of(key)
        if grant is None:
            raise TimeoutError(f"no upload grant yet for round {key[1]}")
        try:
            upload_update(grant.upload, payload)
        except BlobError as exc:
            raise TimeoutError(str(exc)) from None
        notice = BlobNotice(key[0], key[1], key[2], transfer_id(payload), len(payload))
        self._link.publish(self._notice_topic, notice.to_bytes(), timeout=timeout)
        self.blob_sends += 1
        return 1
