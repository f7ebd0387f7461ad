"""The MQTT carrier: models as retained chunks through the broker, updates as chunks reassembled here.

Each model envelope is published retained in chunks (:meth:`har_io.mqtt_link.MqttLink.publish_chunks`)
with per-chunk integrity, so brokers with a small message limit carry it: G on the global model
topics, each device's P_i on its own. An update arrives the same way on the device's update topic;
the reassembler (:class:`har_models.wire.chunking.Reassembler`) checks the whole envelope's SHA-256
against its transfer id before it hands anything on. A transfer that stalls is answered with the
indices of its missing chunks (:meth:`coordinator.receipts.ReceiptDesk.request_missing`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from coordinator.receipts import ReceiptDesk
from coordinator.transport.carrier import Arrival, Opening, Published, Refused
from har_io.mqtt_link import MqttLink
from har_models.wire import codec
from har_models.wire.blob_messages import BLOB_NOTICE_INDEX
from har_models.wire.chunking import ChunkError, Reassembler, transfer_id
from har_models.wire.topics import Topics

if TYPE_CHECKING:
    from coordinator.strategies import Federation
    from coordinator.transport.intake import UpdateIntake

log = logging.getLogger("fedhar.coordinator")


class MqttChunks:
    """The MQTT carrier (see the module docstring).

    Parameters
    ----------
    link : MqttLink
        The coordinator's broker session.
    topics : Topics
    receipts : ReceiptDesk
        Receipts and requests for missing chunks.
    reassembler : Reassembler
        Of the update chunks (streams ``update/{cid}``).
    """

    name = "mqtt"

    def __init__(self, link: MqttLink, topics: Topics, receipts: ReceiptDesk, reassembler: Reassembler):
        self.link = link
        self.topics = topics
        self.receipts = receipts
        self.reassembler = reassembler
        self._owned: dict[str, int] = {}  # retained chunk topic base -> chunks published (cleared at the end)
        self._open: tuple[Federation, Opening, Published] | None = None  # what restore() publishes again

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def publish(self, fed: Federation, opening: Opening) -> Published:
        """Publish G (if any selected device needs it) and each selected device's P_i, retained, in chunks."""
        spec = fed.spec
        meta = {"arch": spec.to_dict()}
        personal: dict[str, str] = {}
        down = 0
        need_global = [c for c in opening.selected if c not in fed.personal]
        global_id = ""
        if need_global:
            env = codec.encode(fed.global_state, kind="model", round=opening.round, arch_version=spec.version, meta=meta)
            global_id = self._send(self.topics.global_model, self.topics.global_model(0), env)
            down += len(env) * len(need_global)
        for cid in opening.selected:
            if cid in fed.personal:
                env = codec.encode(fed.personal[cid], kind="model", round=opening.round, arch_version=spec.version,
                                   client_id=cid, meta=meta)  # fmt: skip
                personal[cid] = self._send(functools.partial(self.topics.client_model, cid), self.topics.client_model(cid, 0), env)
                down += len(env)
        published = Published(global_id, personal, down, {"selected": tuple(opening.selected), "transport": self.name})
        self._open = (fed, opening, published)
        return published

    def _send(self, topic_of: Callable[[int], str], first: str, env: bytes) -> str:
        n = self.link.publish_chunks(topic_of, env, retain=True)
        base = first.rsplit("/", 1)[0]
        self._owned[base] = max(n, self._owned.get(base, 0))
        return transfer_id(env)

    def restore(self) -> None:
        if self._open is None:
            return
        fed, opening, before = self._open
        again = self.publish(fed, opening)
        if (again.global_id, again.personal) != (before.global_id, before.personal):
            log.error("round %d: the models published again differ from the announced ones; clients may wait", opening.round)

    def arrived(self, cid: str, index: str, payload: bytes, intake: UpdateIntake) -> Arrival | None:
        if index == BLOB_NOTICE_INDEX:
            raise Refused("wrong_transport", "an upload notice arrived, but this coordinator does not use the blob transport")
        self.receipts.before_chunk(cid, payload)
        try:
            done = self.reassembler.add(f"update/{cid}", payload)
        except ChunkError as exc:
            raise Refused(exc.reason, str(exc)) from None
        return None if done is None else Arrival(done[0], done[1])

    def tick(self, selected: Collection[str]) -> None:
        self.receipts.request_missing(selected)

    def closed(self, round_: int, stage: int, late_rounds: int) -> None:
        self._open = None

    def forget(self, cid: str) -> None:
        pass  # the grid clears a forgotten device's retained topics

    def bad_object(self, sha256: str) -> bool:
        return False  # chunks carry their own digests: a damaged transfer is re-sent chunk by chunk, never stored

    def finish(self) -> None:
        self.link.clear_retained([f"{base}/{i}" for base, n in sorted(self._owned.items()) for i in range(n)])

    def send_program(self, cid: str, version: int, envelope: bytes) -> str:
        n = self.link.publish_chunks(functools.partial(self.topics.client_programs, cid), envelope)
        return f"{len(envelope)} bytes in {n} chunk(s)"
