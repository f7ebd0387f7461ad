"""How model bytes travel: one carrier per transport, and the one update intake every update passes.

* :mod:`.carrier`: the :class:`Carrier` protocol (publish a round's models, restore them after a
  reconnection, turn an arriving message into an update's bytes, clean up a round);
* :mod:`.mqtt_chunks`: :class:`MqttChunks`, retained chunks through the broker (the default);
* :mod:`.blobs`: :class:`BlobCarrier`, content-addressed objects and signed upload slots in a blob
  store (:mod:`.folder_store`, a folder the coordinator serves; :mod:`.s3_store`, any S3-compatible store);
* :mod:`.intake`: :class:`UpdateIntake`, refused senders, duplicates, late updates, validation,
  spill, receipts and counts;
* :mod:`.settings`: the ``[transport]`` settings table.

A new transport is one new module with a carrier, and its name in :func:`make_carrier`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from coordinator.transport.carrier import Arrival, Carrier, Opening, Published, Refused
from coordinator.transport.intake import UpdateIntake
from coordinator.transport.settings import TransportSettings
from har_models.nn.model import ArchSpec

if TYPE_CHECKING:
    from pathlib import Path

    from coordinator.receipts import ReceiptDesk
    from har_io.blobs import BlobStore
    from har_io.mqtt_link import MqttLink
    from har_models.wire.chunking import Reassembler
    from har_models.wire.topics import Topics

UPDATE_MARGIN_BYTES = 256 * 1024
"""What an update envelope may carry beyond its tensors' float32 bytes: the envelope's and safetensors' headers, the
metadata (confusion matrices, losses, timings) and each tensor's name and shape. Measured: the header and metadata of
an update of the small CNN are about 3 kB, of the paper CNN about 4 kB (tests/test_transport.py)."""


def update_bound(spec: ArchSpec, guidance: bool) -> int:
    """The largest update envelope a device can honestly send for ``spec`` (bytes): float32 tensors (the largest
    encoding; int8 deltas and float16 are smaller), twice with a FedDWA guidance model, plus
    :data:`UPDATE_MARGIN_BYTES`. An upload grant allows this much, and the intake refuses more."""
    return 4 * spec.n_parameters() * (2 if guidance else 1) + UPDATE_MARGIN_BYTES


def make_carrier(settings: TransportSettings, run_id: str, run_dir: Path, link: MqttLink, topics: Topics, receipts: ReceiptDesk,
                 reassembler: Reassembler, refused: Callable[[str], bool], store: BlobStore | None = None) -> Carrier:  # fmt: skip
    """The carrier ``[transport] kind`` names for run ``run_id`` (folder ``run_dir``), over the coordinator's broker session
    ``link``."""
    if settings.kind == "blobs":
        from coordinator.transport.blobs import BlobCarrier

        return BlobCarrier(link, topics, run_id, settings, run_dir, refused, store)
    from coordinator.transport.mqtt_chunks import MqttChunks

    return MqttChunks(link, topics, receipts, reassembler)


__all__ = ["UPDATE_MARGIN_BYTES", "Arrival", "Carrier", "Opening", "Published", "Refused", "TransportSettings", "UpdateIntake",
           "make_carrier", "update_bound"]
