"""A device that refuses a model whose bytes do not match its SHA-256 tells the coordinator in its status (edge_client/bad_objects.py).

Bytes of another hash reach the device as a chunked model whose chunks are each intact (CRC-32) but belong to
another payload, and as a blob store object that serves other bytes than its name says; both are dropped, never
trained on, and listed in ``ClientStatus.bad_objects`` until an object arrives right.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.bad_objects import KEEP_S, KEPT, BadObjects
from edge_client.store import ClientStore
from har_io.broker_config import BrokerConfig
from har_models.data.labels import HAPT_LABELS
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.blob_messages import BlobRef
from har_models.wire.chunking import iter_chunks, transfer_id
from har_models.wire.messages import ClientStatus, RoundAnnouncement
from har_models.wire.topics import Topics

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def envelope(value: float) -> bytes:
    return codec.encode({"w": np.full(600, value, np.float32)}, kind="model", round=1, arch_version=SPEC.version)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[EdgeAgent]:
    store = ClientStore(tmp_path / "s", HAPT_LABELS)
    yield EdgeAgent(ClientConfig("a", BrokerConfig(port=9), backend="numpy"), store)
    store.close()


def test_a_chunked_model_whose_bytes_are_not_its_hash_is_dropped_and_reported(agent: EdgeAgent) -> None:
    good, other = envelope(1.0), envelope(2.0)
    chunks = list(iter_chunks(good, 1000))
    forged = list(iter_chunks(other, 1000))[1]
    chunks[1] = chunks[1][:4] + bytes.fromhex(transfer_id(good)) + forged[36:]  # intact by its CRC, from another payload
    for c in chunks:
        agent._handle(Topics().global_model(0), c)
    assert agent.models == {}  # never used
    assert ClientStatus.from_bytes(agent._status_bytes()).bad_objects == (transfer_id(good),)


class _Serve(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_blob_object_served_with_other_bytes_is_reported_until_it_arrives_right(agent: EdgeAgent) -> None:
    good = envelope(3.0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = BlobRef(transfer_id(good), len(good), f"http://127.0.0.1:{server.server_address[1]}/objects/{transfer_id(good)}")
        ann = RoundAnnouncement("r", 1, "training", SPEC.to_dict(), "hapt6", selected=("a",), global_model=ref.sha256,
                                transport="blobs", global_blob=ref.to_json())  # fmt: skip
        _Serve.body = envelope(4.0)  # a store that serves other bytes of the same length under this name
        agent.intake.fetch(ann, ref.sha256, None)
        assert agent.models == {} and ClientStatus.from_bytes(agent._status_bytes()).bad_objects == (ref.sha256,)
        _Serve.body = good  # written again by the coordinator
        agent.intake._fetch_retry_at = 0.0  # the next try, without the test waiting 5 s for it
        agent.intake.fetch(ann, ref.sha256, None)
        assert list(agent.models) == [ref.sha256] and ClientStatus.from_bytes(agent._status_bytes()).bad_objects == ()
    finally:
        server.shutdown()
        server.server_close()


def test_the_list_keeps_the_newest_few_for_an_hour_and_says_each_new_one_at_once() -> None:
    now = [0.0]
    told: list[int] = []
    bad = BadObjects(on_change=lambda: told.append(1), clock=lambda: now[0])
    shas = [f"{i:064x}" for i in range(KEPT + 2)]
    for sha in shas:
        bad.refused(sha)
    bad.refused(shas[-1])  # the same object again: no new word
    assert bad.listed() == tuple(shas[2:]) and len(told) == KEPT + 2
    now[0] = KEEP_S + 1
    bad.refused(shas[0])
    assert bad.listed() == (shas[0],)  # the others are over an hour old
