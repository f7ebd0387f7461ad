"""Upload delivery on its own (edge_client/delivery.py): receipts end it, silence re-sends it, requests re-send chunks.

The link here records what would go to the broker (the real chunk messages of
:func:`har_models.wire.chunking.iter_chunks`) and the clock is the test's, so every re-send
interval is checked to the second. The last test runs the same delivery over a real
:class:`~har_io.mqtt_link.MqttLink` and Mosquitto on 127.0.0.1, the test playing the coordinator.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Collection

import pytest

from edge_client.blob_upload import TransportLink
from edge_client.delivery import MAX_RECEIPT_WAIT_S, RESTART_RETRY_S, RESTART_TRIES, Delivery, Exchange, Key
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink, PacketRejected
from har_models.wire.chunking import CHUNK_HEADER_BYTES, Reassembler, iter_chunks, transfer_id
from har_models.wire.messages import Receipt

KEY: Key = ("run-a", 3, 0)
EXCHANGE = Exchange(*KEY, attempt="a1")
CHUNK = 1000 + CHUNK_HEADER_BYTES  # 1000 payload bytes per chunk message
WAIT_S = 30.0
DEADLINE = 10_000.0


class RecordingLink:
    """The part of :class:`MqttLink` delivery uses, recording each chunk message it would publish."""

    def __init__(self, chunk_bytes: int = CHUNK) -> None:
        self.connected = threading.Event()
        self.connected.set()
        self.size = chunk_bytes
        self.sent: list[tuple[str, bytes]] = []
        self.refused: list[int] = []
        self.reject_next = 0  # publish calls to refuse (PacketRejected) before sending

    def chunk_size(self, exchange: Exchange) -> int:
        return self.size

    def note_refused(self, refused_payload: int) -> None:
        self.refused.append(refused_payload)
        self.size = min(self.size, refused_payload // 2)

    def send(self, exchange: Exchange, payload: bytes, chunk_bytes: int, only: Collection[int] | None = None) -> int:
        assert exchange == EXCHANGE  # every send names the exchange delivery was given
        if self.reject_next:
            self.reject_next -= 1
            self.size //= 2
            raise PacketRejected("refused")
        n = 0
        for i, c in enumerate(iter_chunks(payload, chunk_bytes)):
            n += 1
            if only is None or i in only:
                self.sent.append((f"up/{i}", c))
        return n

    def indices(self) -> list[int]:
        """Chunk indices sent so far, in order."""
        return [int(t.rsplit("/", 1)[1]) for t, _ in self.sent]


class DownLink(RecordingLink):
    """A link whose sends fail as a refused connection fails (TimeoutError) while ``down``."""

    down = True

    def send(self, exchange: Exchange, payload: bytes, chunk_bytes: int, only: Collection[int] | None = None) -> int:
        if self.down:
            raise TimeoutError("connection refused")
        return super().send(exchange, payload, chunk_bytes, only)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(link: RecordingLink, envelope: bytes, stored: list[tuple[Key, bytes] | None] | None = None) -> tuple[Delivery, Clock]:
    clock = Clock()
    store = stored if stored is not None else [(KEY, envelope)]
    d = Delivery(link, lambda: store[0], "dev-a", receipt_wait_s=WAIT_S, max_message_bytes=CHUNK, clock=clock, wall=clock)
    return d, clock


def receipt(envelope: bytes, state: str, missing: tuple[int, ...] = (), count: int = 0, key: Key = KEY) -> Receipt:
    return Receipt(run_id=key[0], round=key[1], stage=key[2], transfer=transfer_id(envelope), state=state, missing=missing, count=count)


ENVELOPE = os.urandom(4500)  # 5 chunks of 1000 payload bytes
N_SMALL = len(list(iter_chunks(ENVELOPE, CHUNK // 2)))  # after a halving: 472 payload bytes per chunk, 10 chunks


def test_a_receipt_ends_delivery_and_nothing_is_sent_again() -> None:
    link = RecordingLink()
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    assert link.indices() == [0, 1, 2, 3, 4]
    r = Reassembler()
    done = [r.add("u", c) for _, c in link.sent][-1]
    assert done is not None and done[1] == ENVELOPE  # what went out is the update, whole
    d.on_receipt(receipt(ENVELOPE, "accepted"))
    assert d.pending is None
    clock.t = 10 * WAIT_S
    d.poll(KEY)
    assert len(link.sent) == 5


def test_a_receipt_for_another_update_or_exchange_changes_nothing() -> None:
    link = RecordingLink()
    d, _ = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    d.on_receipt(receipt(b"another update", "accepted"))
    d.on_receipt(receipt(ENVELOPE, "accepted", key=("run-a", 4, 0)))
    assert d.pending is not None and d.pending.transfer == transfer_id(ENVELOPE)


def test_without_a_receipt_the_update_is_sent_again_after_the_wait_which_doubles_up_to_its_cap() -> None:
    link = RecordingLink()
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    assert d.pending is not None and d.pending.envelope is None  # after the first send it is read from the store
    sends_at: list[float] = []
    for step in range(1, 221):
        clock.t = float(step)
        before = len(link.sent)
        d.poll(KEY)
        if len(link.sent) > before:
            assert d.pending is not None and link.indices()[before:] == list(range(d.pending.count))  # sent whole
            sends_at.append(clock.t)
    # first send at 0; then after 30, 60 (doubled), 60 (capped), 60 ...
    assert sends_at[:4] == [30.0, 90.0, 150.0, 210.0]
    assert MAX_RECEIPT_WAIT_S == 60.0


def test_two_unanswered_sends_make_the_third_cut_smaller() -> None:
    link = RecordingLink()
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    clock.t = 30.0
    d.poll(KEY)
    assert link.refused == []
    clock.t = 90.0
    d.poll(KEY)
    assert link.refused == [CHUNK]  # never sent unchanged a third time
    assert d.pending is not None and d.pending.chunk_bytes == CHUNK // 2


def test_a_missing_chunk_request_re_sends_only_those_chunks_at_their_size() -> None:
    link = RecordingLink()
    d, _ = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    link.size = 700  # the link learned a smaller size meanwhile: the request is about the 1000-byte cut
    d.on_receipt(receipt(ENVELOPE, "missing", missing=(1, 3, 9), count=5))
    assert link.indices() == [0, 1, 2, 3, 4, 1, 3]  # 9 is not a chunk of this transfer
    first = dict(link.sent[:5])
    assert link.sent[5:] == [("up/1", first["up/1"]), ("up/3", first["up/3"])]  # byte-identical re-sends
    assert d.pending is not None and d.pending.unanswered == 0  # the coordinator answered: the wait restarts
    # A request about another cut (6 chunks announced) is not answered with chunks of this one.
    d.on_receipt(receipt(ENVELOPE, "missing", missing=(0,), count=6))
    assert len(link.sent) == 7


def test_chunks_lost_twice_make_the_link_cut_smaller_and_send_all_again() -> None:
    link = RecordingLink()
    d, _ = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    d.on_receipt(receipt(ENVELOPE, "missing", missing=(2,), count=5))
    d.on_receipt(receipt(ENVELOPE, "missing", missing=(2,), count=5))
    assert link.refused == [CHUNK]
    assert N_SMALL == 10
    assert link.indices() == [0, 1, 2, 3, 4, 2, *range(N_SMALL)]
    assert d.pending is not None and d.pending.count == N_SMALL and d.pending.sends == 2


def test_a_refused_size_is_sent_again_smaller_at_the_next_poll() -> None:
    link = RecordingLink()
    link.reject_next = 1
    d, _ = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    assert link.sent == [] and d.pending is not None and d.pending.next_try == 0.0
    d.poll(KEY)
    assert link.indices() == list(range(N_SMALL))


def test_delivery_is_bounded_by_the_round_and_its_deadline() -> None:
    link = RecordingLink()
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, deadline_unix=100.0)
    clock.t = 30.0
    d.poll(None)  # the round closed
    assert d.pending is None
    d.start(EXCHANGE, ENVELOPE, deadline_unix=100.0)
    clock.t = 130.0
    d.poll(KEY)  # past the round's deadline: given up, not sent
    assert d.pending is None and len(link.sent) == 10
    d.start(EXCHANGE, ENVELOPE, deadline_unix=1000.0)
    link.connected.clear()
    clock.t = 400.0
    d.poll(KEY)  # not connected: waits, keeps the update
    assert d.pending is not None and len(link.sent) == 15


def test_after_a_coordinator_restart_the_update_goes_once_more_whatever_round_is_open() -> None:
    """Sent while no coordinator listened (it was restarting), the update would wait for a receipt that never comes and
    be dropped when another round opens: it goes to the new coordinator once, at the next poll, even past its deadline
    and with another round open; then the usual bounds hold again."""
    link = RecordingLink()
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, deadline_unix=100.0)
    d.after_restart()
    link.connected.clear()
    clock.t = 150.0
    d.poll(("run-a", 5, 0))  # not connected yet: kept for later, not sent
    assert d.pending is not None and len(link.sent) == 5
    link.connected.set()
    d.poll(("run-a", 5, 0))  # round 5 open and the deadline passed: sent whole all the same
    assert link.indices() == [0, 1, 2, 3, 4] * 2 and d.pending is not None and not d.pending.restarted
    clock.t = 10_000.0
    d.poll(("run-a", 5, 0))  # once: then another open round ends it as before
    assert d.pending is None and len(link.sent) == 10
    d.after_restart()  # nothing followed: nothing to send
    assert d.pending is None


def test_after_a_coordinator_restart_a_send_that_could_not_go_out_is_tried_again_a_bounded_number_of_times() -> None:
    """The restarted coordinator's status can arrive before its blob store listens: the send fails (TimeoutError, as
    the blob link raises for a refused connection) and goes again at the next wait, RESTART_TRIES sends at most."""

    link = DownLink()
    link.down = False
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, deadline_unix=100.0)
    link.down = True
    d.after_restart()
    clock.t = 150.0
    d.poll(("run-a", 5, 0))  # refused: kept, still to go whatever round is open, again in a second
    assert d.pending is not None and d.pending.restarted and len(link.sent) == 5 and d.pending.next_try == 150.0 + RESTART_RETRY_S
    link.down = False
    clock.t = d.pending.next_try
    d.poll(("run-a", 5, 0))  # the store is up: sent whole
    assert link.indices() == [0, 1, 2, 3, 4] * 2 and d.pending is not None and not d.pending.restarted
    link.down = True  # a store that never comes back: RESTART_TRIES sends, then the usual bounds drop it
    d.after_restart()
    for _ in range(RESTART_TRIES + 1):
        assert d.pending is not None
        clock.t = d.pending.next_try
        d.poll(("run-a", 5, 0))
    assert d.pending is None and len(link.sent) == 10


def test_an_update_that_changed_in_the_store_is_not_sent_again() -> None:
    link = RecordingLink()
    store: list[tuple[Key, bytes] | None] = [(KEY, ENVELOPE)]
    d, clock = make(link, ENVELOPE, store)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    store[0] = (KEY, b"another update")
    clock.t = 30.0
    d.poll(KEY)
    assert d.pending is None and len(link.sent) == 5


def test_delivery_over_mosquitto_sends_what_the_coordinator_asks_for(mosquitto: int) -> None:
    cfg = BrokerConfig(port=mosquitto, max_message_bytes=64 * 1024)
    spy = MqttLink(cfg, "t-coordinator", subscriptions=[("fedhar/v1/t/client/dev-a/update/+", 1)])
    dev = MqttLink(cfg, "t-dev-a")
    envelope = os.urandom(200_000)
    store: list[tuple[Key, bytes] | None] = [(KEY, envelope)]
    topic_of = lambda i: f"fedhar/v1/t/client/dev-a/update/{i}"  # noqa: E731
    uplink = TransportLink(dev, topic_of, "fedhar/v1/t/client/dev-a/update/blob", lambda key: None)
    d = Delivery(uplink, lambda: store[0], "dev-a", receipt_wait_s=WAIT_S, max_message_bytes=cfg.max_message_bytes)
    try:
        assert spy.start(10.0) and dev.start(10.0)
        d.start(EXCHANGE, envelope, DEADLINE * 1e6)
        n = d.pending.count if d.pending else 0
        assert n == 4  # 200,000 bytes in chunks of 64 KiB less header and topic
        got = [spy.inbox.get(timeout=10.0) for _ in range(n)]
        assert [t for t, _, _ in got] == [topic_of(i) for i in range(n)]
        d.on_receipt(receipt(envelope, "missing", missing=(2,), count=n))
        topic, payload, _ = spy.inbox.get(timeout=10.0)
        assert topic == topic_of(2) and payload == got[2][1]
        r = Reassembler()
        done = [r.add("u", p) for _, p, _ in got][-1]
        assert done is not None and done[1] == envelope
        d.on_receipt(receipt(envelope, "accepted"))
        assert d.pending is None
        with pytest.raises(queue.Empty):
            spy.inbox.get(timeout=0.5)  # nothing else was sent
    finally:
        dev.stop()
        spy.stop()


def test_an_upload_the_store_refuses_as_closed_still_sends_its_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device thawed after its exchange closed at the store (410, or its grant expired): the notice still goes, so the
    coordinator names the late update (stale_round) instead of it vanishing in the device's log; any other refusal is
    tried again later (TimeoutError), as before."""
    from edge_client import blob_upload
    from har_io.blob_http import UploadClosed
    from har_io.blobs import BlobError
    from har_models.wire.blob_messages import BlobGrant, BlobNotice, UploadGrant

    published: list[tuple[str, bytes]] = []
    link = type("L", (), {"connected": threading.Event(),
                          "publish": lambda self, topic, payload, timeout=0.0: published.append((topic, payload))})()  # fmt: skip
    grant = BlobGrant("run-a", 3, 0, "a1", UploadGrant("http://127.0.0.1:9/u", 4e9, 10_000))
    uplink = TransportLink(link, lambda i: f"up/{i}", "up/blob", lambda key: grant if key == KEY else None)
    blob_exchange = Exchange(*KEY, attempt="a1", transport="blobs")
    refusal: list[Exception] = [UploadClosed("HTTP 410 Gone")]

    def refuse(upload: UploadGrant, payload: bytes) -> None:
        raise refusal[0]

    monkeypatch.setattr(blob_upload, "upload_update", refuse)
    assert uplink.send(blob_exchange, ENVELOPE, 0) == 1
    notice = BlobNotice.from_bytes(published[0][1])
    assert published[0][0] == "up/blob" and (notice.round, notice.sha256, notice.size) == (3, transfer_id(ENVELOPE), len(ENVELOPE))
    refusal[0] = BlobError("HTTP 500")
    with pytest.raises(TimeoutError, match="HTTP 500"):
        uplink.send(blob_exchange, ENVELOPE, 0)
    assert len(published) == 1


def test_an_update_that_never_went_out_is_not_dropped_when_its_round_closes() -> None:
    """Its upload failed while the coordinator stopped (connection refused), and the round closed meanwhile: instead of
    vanishing from the device's log only, it goes out like after a restart, RESTART_TRIES sends at most, then is dropped."""

    link = DownLink()
    d, clock = make(link, ENVELOPE)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    assert d.pending is not None and not d.pending.went_out and link.sent == []
    clock.t = d.pending.next_try
    d.poll(None)  # the round closed (serve stopped) with the update never out: tried again, not dropped
    assert d.pending is not None and d.pending.restarted
    link.down = False
    clock.t = d.pending.next_try
    d.poll(("run-a", 4, 0))
    assert link.indices() == [0, 1, 2, 3, 4] and d.pending is not None and d.pending.went_out
    link.down = True
    d.start(EXCHANGE, ENVELOPE, DEADLINE)  # another one that never goes out: bounded, then dropped for good
    for _ in range(RESTART_TRIES + 2):
        if d.pending is None:
            break
        clock.t = d.pending.next_try
        d.poll(None)
    assert d.pending is None and len(link.sent) == 5


class KeyedLink(DownLink):
    """A link that takes any exchange and records ``(round, whole payload)`` per send; refuses all while ``down``."""

    down = False

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[tuple[int, bytes]] = []

    def send(self, exchange: Exchange, payload: bytes, chunk_bytes: int, only: Collection[int] | None = None) -> int:
        if self.down:
            raise TimeoutError("connection refused")
        self.updates.append((exchange.round, payload))
        return 1


NEXT_KEY: Key = ("run-a", 4, 0)
NEXT = os.urandom(3000)


def test_an_update_still_owed_a_send_when_the_next_one_starts_goes_beside_it() -> None:
    """Its upload was refused (serve restarting) and the next round's update took its place in the store before a retry:
    it is kept, with its bytes, and goes at the next poll instead of vanishing; the next one is still followed."""
    link = KeyedLink()
    link.down = True
    store: list[tuple[Key, bytes] | None] = [(KEY, ENVELOPE)]
    d, clock = make(link, ENVELOPE, store)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)
    assert d.pending is not None and not d.pending.went_out and d.pending.envelope == ENVELOPE  # kept in memory until out
    store[0] = (NEXT_KEY, NEXT)
    link.down = False
    d.start(Exchange(*NEXT_KEY, attempt="a2"), NEXT, DEADLINE)
    assert link.updates == [(4, NEXT)] and [p.key for p in d.earlier] == [KEY]
    d.poll(NEXT_KEY)
    assert link.updates == [(4, NEXT), (3, ENVELOPE)] and d.earlier == []  # from memory: the store holds round 4's
    assert d.pending is not None and d.pending.key == NEXT_KEY and d.pending.envelope is None
    clock.t = 10 * WAIT_S
    d.poll(NEXT_KEY)  # round 4's update is re-sent as usual; the earlier one is not sent again
    assert [r for r, _ in link.updates] == [4, 3, 4]


def test_an_update_owed_a_send_after_a_restart_keeps_its_bytes_when_the_next_one_is_stored() -> None:
    link = KeyedLink()
    store: list[tuple[Key, bytes] | None] = [(KEY, ENVELOPE)]
    d, _ = make(link, ENVELOPE, store)
    d.start(EXCHANGE, ENVELOPE, DEADLINE)  # went out, then the coordinator restarted before its receipt
    d.after_restart()
    store[0] = (NEXT_KEY, NEXT)  # the next round's update before the restart send
    d.start(Exchange(*NEXT_KEY, attempt="a2"), NEXT, DEADLINE)
    d.poll(NEXT_KEY)
    assert link.updates == [(3, ENVELOPE), (4, NEXT), (3, ENVELOPE)] and d.earlier == []


def test_an_earlier_update_that_cannot_go_out_is_tried_a_bounded_number_of_times_and_at_most_two_are_kept() -> None:
    link = KeyedLink()
    link.down = True
    store: list[tuple[Key, bytes] | None] = [(KEY, ENVELOPE)]
    d, clock = make(link, ENVELOPE, store)
    for r in range(3, 7):  # four rounds' updates, none of which can go out
        key = ("run-a", r, 0)
        env = bytes([r]) * 100
        store[0] = (key, env)
        d.start(Exchange(*key, attempt=f"a{r}"), env, DEADLINE)
    assert [p.key[1] for p in d.earlier] == [4, 5]  # MAX_EARLIER: round 3's was given up for newer ones
    waits = []
    for _ in range(20):
        if not d.earlier:
            break
        clock.t = min(p.next_try for p in d.earlier)
        waits.append(clock.t)
        d.poll(("run-a", 6, 0))
    assert d.earlier == [] and link.updates == []
    assert waits == [0.0, 1.0, 3.0, 7.0, 15.0]  # RESTART_TRIES sends each, 1, 2, 4, 8 s apart
