"""Thousands of devices: the real coordinator against N light simulated devices on one Mosquitto, in both transports.

The coordinator is the real one (``python -m coordinator.cli run``, FedAvg, a tiny CNN of
``--conv-filters 1 --dense-units 2`` by default: a 1.6 kB update envelope; a wider one shows
whether the coordinator holds updates). Each N (``--sizes``) is measured in each transport
(``--transports mqtt,blobs``, both by default): ``mqtt``, model bytes in chunks through the
broker; ``blobs``, the coordinator started with ``--transport blobs`` (its folder store, served by
its own HTTP server on a free loopback port), model bytes over HTTP and only control messages on
the broker (``coordinator/transport/blobs.py``). The devices are simulated by a light load
generator: ``--procs`` processes, each holding N / procs paho-mqtt connections in one thread (a
selector over their sockets, no thread per device). Each device speaks the protocol of
``edge_client/agent.py``:

* it connects with its last will (``offline_status``), subscribes to the coordinator's status, the
  round announcement, the global model's chunks, its own receipt topic and its own grant topic,
  and publishes its retained :class:`~har_models.wire.messages.ClientStatus` (label set
  ``hapt6``, ``n_train``, channel statistics; ``refresh_s`` 0, so the status never goes stale
  however long a round of 10,000 takes);
* when an announcement selects it and it holds the announced model, it answers with a real update
  envelope: the received tensors plus deterministic noise of standard deviation 1e-3 (no
  training), encoded by :func:`har_models.wire.codec.encode` with an
  :class:`~har_models.wire.update_meta.UpdateMeta`;
* MQTT: it holds the model once its own :class:`~har_models.wire.chunking.Reassembler` put it
  together from its own copy of the chunks (the process keeps one copy of each chunk); the update
  is cut by :func:`har_models.wire.chunking.iter_chunks` and published at QoS 1 on its update topics;
* blobs: it holds the model once its :class:`~har_models.wire.blob_messages.BlobGrant` for the
  exchange arrived and the model named by the announcement's ``global_blob`` is in the process's
  :class:`~har_io.blob_http.BlobCache` (fetched over HTTP ONCE PER GENERATOR PROCESS, as a worker
  hosting virtual clients does, every byte checked against the SHA-256 by
  :func:`har_io.blob_http.fetch_model`); the update is PUT to the grant's signed URL, then its
  :class:`~har_models.wire.blob_messages.BlobNotice` is published at QoS 1 on
  ``{p}/client/{cid}/update/blob``. The PUTs run in a pool of ``UPLOAD_THREADS`` (4) threads per
  process, each on one kept-alive ``http.client`` connection to the store (opened again once if
  the server closed it while idle), so 10,000 uploads from 4 processes take 16 TCP connections
  a round, not 10,000 (the store's server closes idle ones between rounds; ``http_connections``
  in the JSON line counts those opened: 32 for 1,000 devices and 2 rounds); the
  notice is published from the selector's thread once its PUT answered 201;
* it follows the end-to-end delivery of ``edge_client/delivery.py``: an update counts when the
  coordinator's receipt says ``accepted``; ``missing`` chunks are sent again (MQTT); without a
  word the update is sent whole again (all chunks, or the PUT and the notice again) after 30 s,
  then 60 s, while its round is open.

Mosquitto 2 runs on loopback with the house broker's queue settings (``max_inflight_messages 20``,
``max_queued_messages 10000``, ``coordinator/broker/render.py``), anonymous, and ``sys_interval 1``
so that it publishes ``$SYS/broker/bytes/received`` and ``.../sent`` every second.

Measured per N and transport, over ``--rounds`` rounds:

* ``cpu_s/update``: the coordinator's CPU seconds (user + system, ``psutil``) from the first
  round's announcement to the run's ``finished`` announcement, over the updates it accepted
  (in blob mode this includes the coordinator's HTTP server, a thread of the same process);
* ``peak RSS``: the coordinator's peak resident set over its whole life (``ru_maxrss`` of
  ``os.wait4``: exact, not sampled);
* ``round s``: mean wall time of a round (``report.json``, announcement to close);
* ``broker B/round``: bytes received + sent by the broker (``$SYS``, so never HTTP) from the last
  sample before round 0's traffic began (its first model chunk or grant reaching a device, or its
  announcement, whichever came first: the models and grants are published before the
  announcement) to the first sample after the ``finished`` announcement, over the rounds;
  ``B/device`` that over N. The coordinator starts without ``--expected-clients``
  (``--min-clients N --start-settle 3``), so its start-up (every retained status delivered to
  it) is over seconds before round 0 and the starting sample, taken at most 1 s before round 0's
  traffic, falls in that quiet gap;
* ``HTTP B/round`` (blob mode): body bytes the generator moved over HTTP, over the rounds: the
  models fetched (once per process and round) plus the updates PUT (re-sends included); HTTP
  headers and the signed URLs' query strings are not counted;
* ``lost`` / ``double``: over the rounds, updates the coordinator's report counted short of N,
  and beyond N; ``copies``: re-sent copies of updates already counted, which the coordinator
  recognised and did not count (``duplicates`` in the report: a device re-sends when its
  receipt takes longer than its receipt wait); the devices' own tally of ``accepted`` receipts
  per round is in the JSON line of each run (``device_accepted``, ``resent``, ``upload_errors``),
  with the 1-minute load average when it ended (``load_avg_1m``; the machine may be shared).

The last line holds the figures of the largest N as ``key=value``, per transport (``mqtt_*``,
``blobs_*``, with ``blobs_http_bytes_per_round``), then ``blob_broker_ratio`` (blob mode's broker
bytes per round over MQTT mode's; goal < 0.01) and ``lost`` / ``double`` summed over both.

    python benchmarks/bench_scale.py [--sizes 100,1000,10000] [--transports mqtt,blobs] [--rounds 3] [--procs 4]
        [--keep DIR] [--conv-filters 1 --dense-units 2]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import paho.mqtt.client as mqtt  # noqa: E402

from har_io.blob_http import BlobCache, fetch_model  # noqa: E402
from har_io.blobs import BlobError  # noqa: E402
from har_models.wire import codec  # noqa: E402
from har_models.wire.blob_messages import BLOB_NOTICE_INDEX, BlobGrant, BlobNotice, BlobRef  # noqa: E402
from har_models.wire.chunking import ChunkError, Reassembler, SharedTransfers, iter_chunks, transfer_id  # noqa: E402
from har_models.wire.messages import ClientStatus, MessageError, Receipt, RoundAnnouncement, offline_status  # noqa: E402
from har_models.wire.topics import Topics  # noqa: E402
from har_models.wire.update_meta import UpdateMeta  # noqa: E402
from simulation.broker import find_mosquitto, free_port, stop_process, wait_for_port  # noqa: E402

FEDERATION = "scale"
LABEL_SET = "hapt6"
WINDOW_SAMPLES = 128
"""Samples per window behind the statuses' channel statistics (count = windows x 128)."""
NOISE_STD = 1e-3
"""Standard deviation of the noise a simulated device adds to the received tensors."""
RECEIPT_WAIT_S = 30.0
"""First wait for a receipt before an update is sent whole again; doubles up to 60 s (as ``edge_client.delivery``)."""
KEEPALIVE_S = 300
MAX_MESSAGE_BYTES = 1_000_000
MAX_MODEL_BYTES = 1 << 26
"""Largest global model a simulated device fetches in blob mode (bytes)."""
UPLOAD_THREADS = 4
"""Threads per generator process that PUT updates to their grants' URLs (blob mode), each on one kept-alive connection."""
TRANSPORTS = ("mqtt", "blobs")


def device_id(index: int) -> str:
    """The client id of simulated device ``index`` (``d00000`` ...)."""
    return f"d{index:05d}"


def n_train_of(index: int) -> int:
    """Training windows device ``index`` reports (40..139: FedAvg weights that differ)."""
    return 40 + index % 100


def device_status(index: int, instance: str) -> bytes:
    """The retained status of device ``index``: idle, ``hapt6``, n_train and unit-variance channel statistics."""
    n = n_train_of(index)
    count = n * WINDOW_SAMPLES
    stats = {"count": count, "sum": [0.0] * 6, "sum_sq": [float(count)] * 6}
    return ClientStatus(device_id(index), "idle", label_set=LABEL_SET, n_train=n, n_test=n // 4, train_stats=stats,
                        class_counts=(n // 6,) * 5 + (n - 5 * (n // 6),), instance=instance, sent_unix=time.time(),
                        refresh_s=0.0).to_bytes()  # fmt: skip


def update_envelope(index: int, ann: RoundAnnouncement, received: dict[str, np.ndarray], seed: int) -> bytes:
    """Device ``index``'s update for ``ann``: received tensors + N(0, NOISE_STD^2) noise, float32, as an update envelope."""
    rng = np.random.default_rng([seed, index, ann.round, ann.stage])
    tensors = {k: (v + rng.normal(0.0, NOISE_STD, v.shape)).astype(np.float32) for k, v in received.items()}
    meta = UpdateMeta(run_id=ann.run_id, stage=ann.stage, n_train=n_train_of(index), n_test=n_train_of(index) // 4,
                      label_set=LABEL_SET, train_loss=(1.0,), train_seconds=0.0, steps=1, init_mode="received",
                      backend="numpy")  # fmt: skip
    return codec.encode(tensors, kind="update", round=ann.round, arch_version=int(ann.arch.get("version", 0)),
                        client_id=device_id(index), meta=meta.to_wire())  # fmt: skip


# -- the load generator (one process, many devices) ---------------------------------------------------


class Uploader:
    """PUTs of update envelopes to signed URLs (blob mode), off the selector's thread.

    ``threads`` threads, each holding one kept-alive :class:`http.client.HTTPConnection` per
    server (opened again once if the server closed it while idle), so 10,000 uploads cost a
    handful of TCP connections, not 10,000. A finished PUT is put on :attr:`done` as
    ``(device, pending, body bytes, error or None)``; the selector's thread takes it from there
    and publishes the notice, so paho is only ever driven from that one thread.
    """

    def __init__(self, threads: int = UPLOAD_THREADS):
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench-put")
        self.local = threading.local()
        self.done: queue.Queue[tuple[Device, Pending, int, str | None]] = queue.Queue()
        self.opened = 0  # HTTP connections opened (the keep-alive check: about one per thread)
        self._lock = threading.Lock()

    def submit(self, d: Device, p: Pending, grant: BlobGrant) -> None:
        """PUT ``p.envelope`` to ``grant``'s URL in a pool thread; the outcome goes to :attr:`done`."""
        self.pool.submit(self._put, d, p, grant)

    def _conn(self, netloc: str, fresh: bool) -> http.client.HTTPConnection:
        conns: dict[str, http.client.HTTPConnection] = self.local.__dict__.setdefault("conns", {})
        c = conns.get(netloc)
        if c is None or fresh:
            if c is not None:
                c.close()
            host, _, port = netloc.rpartition(":")
            c = conns[netloc] = http.client.HTTPConnection(host, int(port), timeout=60)
            with self._lock:
                self.opened += 1
        return c

    def _put(self, d: Device, p: Pending, grant: BlobGrant) -> None:
        error: str | None = None
        url = urllib.parse.urlsplit(grant.upload.url)
        target = f"{url.path}?{url.query}"
        for attempt in range(2):  # a kept-alive connection the server closed while idle: open it again, once
            try:
                c = self._conn(url.netloc, fresh=attempt > 0)
                c.request("PUT", target, body=p.envelope, headers={"Content-Type": "application/octet-stream"})
                resp = c.getresponse()
                body = resp.read()
                error = None if resp.status == 201 else f"HTTP {resp.status} {body[:200]!r}"
                break
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
        self.done.put((d, p, len(p.envelope), error))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class Pending:
    """An update sent and not yet accepted: its exchange, envelope (and chunks), transfer id, next whole send (monotonic s).

    ``uploading``: a PUT of it is in flight (blob mode); it is not sent again meanwhile.
    """

    key: tuple[str, int, int]
    envelope: bytes
    chunks: list[bytes]
    transfer: str
    due: float
    wait_s: float = RECEIPT_WAIT_S
    uploading: bool = False


@dataclass
class Device:
    """One simulated device: its paho client, reassembler, grant, the exchanges it answered and its pending update."""

    index: int
    client: mqtt.Client
    reassembler: Reassembler
    connected: bool = False
    models: dict[str, bytes] = field(default_factory=dict)
    grant: BlobGrant | None = None
    answered: set[tuple[str, int, int]] = field(default_factory=set)
    pending: Pending | None = None


class Generator:
    """``count`` devices from index ``first`` on one selector, in this process's one thread (plus upload threads).

    Parameters
    ----------
    port : int
        The broker's loopback port.
    first, count : int
        Device indices ``first .. first + count - 1``.
    seed : int
        Seed of the devices' noise.
    """

    def __init__(self, port: int, first: int, count: int, seed: int):
        self.port, self.seed = port, seed
        self.topics = Topics(FEDERATION)
        self.sel = selectors.DefaultSelector()
        self.shared = SharedTransfers(max_transfers=2)
        self.cache = BlobCache()  # blob mode: the global model, fetched once for all devices of this process
        self.uploader: Uploader | None = None
        self.instance = os.urandom(4).hex()
        self.devices = [self._device(i) for i in range(first, first + count)]
        self.announcement: RoundAnnouncement | None = None
        self._ann_bytes = b""
        self._selected: frozenset[str] = frozenset()
        self._decoded: dict[str, dict[str, np.ndarray]] = {}
        self.status_acks: set[int] = set()
        self._status_mids: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.accepted: dict[int, int] = {}
        self.resent = 0
        self.http_down: dict[int, int] = {}  # round -> model bytes fetched over HTTP (blob mode)
        self.http_up: dict[int, int] = {}  # round -> update bytes PUT (blob mode, re-sends included)
        self.upload_errors = 0
        self.first_model_msg: float | None = None  # monotonic time the first model chunk or grant reached a device
        self.finished = False

    def _device(self, index: int) -> Device:
        cid = device_id(index)
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311)
        d = Device(index, c, Reassembler(max_payload_bytes=1 << 24, shared=self.shared))
        c.user_data_set(d)
        c.will_set(self.topics.client_status(cid), offline_status(cid, self.instance), qos=1, retain=True)
        c.on_socket_open = lambda _c, _u, sock: self._watch(sock, selectors.EVENT_READ, d)
        c.on_socket_close = lambda _c, _u, sock: self._forget(sock)
        c.on_socket_register_write = lambda _c, _u, sock: self._watch(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, d)
        c.on_socket_unregister_write = lambda _c, _u, sock: self._unwrite(sock, d)
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_publish = self._on_publish
        return d

    def _watch(self, sock: Any, events: int, d: Device) -> None:
        if sock in self.sel.get_map():
            self.sel.modify(sock, events, d)
        else:
            self.sel.register(sock, events, d)

    def _forget(self, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(sock)

    def _unwrite(self, sock: Any, d: Device) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.modify(sock, selectors.EVENT_READ, d)

    def _on_connect(self, c: mqtt.Client, d: Device, _flags: Any, rc: Any, _props: Any) -> None:
        if rc.is_failure:
            return
        d.connected = True
        cid = device_id(d.index)
        c.subscribe([(self.topics.coordinator_status, 1), (self.topics.round, 1), (self.topics.global_model("+"), 1),
                     (self.topics.client_receipt(cid), 1), (self.topics.client_grant(cid), 1)])  # fmt: skip
        info = c.publish(self.topics.client_status(cid), device_status(d.index, self.instance), qos=1, retain=True)
        self._status_mids[id(d)] = info.mid

    def _on_publish(self, _c: mqtt.Client, d: Device, mid: int, _rc: Any, _props: Any) -> None:
        if self._status_mids.get(id(d)) == mid:
            self.status_acks.add(d.index)

    def _on_message(self, _c: mqtt.Client, d: Device, msg: mqtt.MQTTMessage) -> None:
        topic, payload = msg.topic, bytes(msg.payload)
        cid = device_id(d.index)
        if topic == self.topics.round:
            self._note_announcement(payload)
        elif topic == self.topics.client_receipt(cid):
            self._on_receipt(d, payload)
        elif topic == self.topics.client_grant(cid):
            if not payload:
                return  # the coordinator cleared it at the end
            if self.first_model_msg is None:
                self.first_model_msg = time.monotonic()
            try:
                d.grant = BlobGrant.from_bytes(payload)
            except MessageError:
                return
        elif topic.startswith(self.topics.global_model("")) and payload:
            if self.first_model_msg is None:
                self.first_model_msg = time.monotonic()
            try:
                done = d.reassembler.add("global", payload)
            except ChunkError:
                return
            if done is not None:
                d.models = {done[0]: done[1]}
        else:
            return
        self._work(d)

    def _note_announcement(self, payload: bytes) -> None:
        if payload == self._ann_bytes or not payload:
            return
        try:
            ann = RoundAnnouncement.from_bytes(payload)
        except MessageError:
            return
        self._ann_bytes, self.announcement, self._selected = payload, ann, frozenset(ann.selected)
        if ann.state == "finished":
            self.finished = True

    def _on_receipt(self, d: Device, payload: bytes) -> None:
        try:
            r = Receipt.from_bytes(payload)
        except MessageError:
            return
        p = d.pending
        if p is None or r.transfer != p.transfer:
            return
        if r.state == "accepted":
            self.accepted[r.round] = self.accepted.get(r.round, 0) + 1
            d.pending = None
        elif p.chunks and r.count == len(p.chunks):  # chunks the coordinator misses (MQTT mode only)
            for i in r.missing:
                if i < len(p.chunks):
                    d.client.publish(self.topics.client_update(device_id(d.index), i), p.chunks[i], qos=1)
            self.resent += 1

    def _received(self, ann: RoundAnnouncement, d: Device, transfer: str) -> dict[str, np.ndarray] | None:
        """The announced model's tensors (decoded once per process), or None while ``d`` does not hold it yet.

        MQTT mode: ``d`` reassembled it from its chunks. Blob mode: ``d`` holds its grant for the
        exchange, and the model was fetched over HTTP once for this process (:class:`BlobCache`
        by SHA-256, every byte checked by :func:`har_io.blob_http.fetch_model`).
        """
        key = (ann.run_id, ann.round, ann.stage)
        if ann.transport == "blobs":
            if d.grant is None or d.grant.key() != key or ann.global_blob is None:
                return None
            if transfer not in self._decoded:
                ref = BlobRef.from_json(ann.global_blob)
                fetches = self.cache.fetches
                try:
                    data = fetch_model(ref, MAX_MODEL_BYTES, self.cache)
                except BlobError as exc:
                    print(f"fetching the global model failed: {exc}", file=sys.stderr, flush=True)
                    return None
                if self.cache.fetches > fetches:
                    self.http_down[ann.round] = self.http_down.get(ann.round, 0) + len(data)
                env = codec.decode(data, verified=transfer)
                self._decoded = {transfer: {k: np.asarray(v, dtype=np.float32) for k, v in env.tensors.items()}}
            return self._decoded[transfer]
        if transfer not in d.models:
            return None
        received = self._decoded.get(transfer)
        if received is None:
            env = codec.decode(d.models[transfer], verified=transfer)
            received = {k: np.asarray(v, dtype=np.float32) for k, v in env.tensors.items()}
            self._decoded = {transfer: received}
        return received

    def _work(self, d: Device) -> None:
        ann = self.announcement
        cid = device_id(d.index)
        if ann is None or ann.state != "training":
            return
        # Over MQTT the announcement names the selected devices; over blobs it names nobody, and a device is
        # selected when it holds its grant for this exchange and attempt (as edge_client/agent.py decides).
        granted = d.grant is not None and (*d.grant.key(), d.grant.attempt) == (ann.run_id, ann.round, ann.stage, ann.attempt)
        if cid not in self._selected and not (ann.transport == "blobs" and granted):
            return
        key = (ann.run_id, ann.round, ann.stage)
        _, transfer = ann.model_for(cid)
        if key in d.answered:
            return
        received = self._received(ann, d, transfer)
        if received is None:
            return
        envelope = update_envelope(d.index, ann, received, self.seed)
        chunks = [] if ann.transport == "blobs" else list(iter_chunks(envelope, MAX_MESSAGE_BYTES))
        d.pending = Pending(key, envelope, chunks, transfer_id(envelope), 0.0)
        d.answered.add(key)
        d.models = {}
        self.sent[ann.round] = self.sent.get(ann.round, 0) + 1
        self._send_whole(d)

    def _send_whole(self, d: Device) -> None:
        """Send the pending update whole: its chunks (MQTT), or a PUT to the grant's URL and then the notice (blobs)."""
        p = d.pending
        assert p is not None
        p.due = time.monotonic() + p.wait_s
        p.wait_s = min(2 * p.wait_s, 60.0)
        if not p.chunks:
            grant = d.grant
            if p.uploading or grant is None or grant.key() != p.key:
                return
            if self.uploader is None:
                self.uploader = Uploader()
            p.uploading = True
            self.uploader.submit(d, p, grant)
            return
        for i, chunk in enumerate(p.chunks):
            d.client.publish(self.topics.client_update(device_id(d.index), i), chunk, qos=1)

    def _uploaded(self) -> None:
        """Publish the notice of every PUT that finished (blob mode); a failed PUT is tried again at its due time."""
        if self.uploader is None:
            return
        while True:
            try:
                d, p, size, error = self.uploader.done.get_nowait()
            except queue.Empty:
                return
            p.uploading = False
            if error is not None:
                self.upload_errors += 1
                if self.upload_errors <= 5:
                    print(f"upload of {device_id(d.index)} failed: {error}", file=sys.stderr, flush=True)
                continue
            self.http_up[p.key[1]] = self.http_up.get(p.key[1], 0) + size
            if d.pending is not p:
                continue  # accepted or dropped meanwhile
            notice = BlobNotice(p.key[0], p.key[1], p.key[2], p.transfer, size)
            d.client.publish(self.topics.client_update(device_id(d.index), BLOB_NOTICE_INDEX), notice.to_bytes(), qos=1)

    def _retry(self) -> None:
        """Send whole again what waited past its receipt wait, while its round is open."""
        ann, now = self.announcement, time.monotonic()
        open_key = (ann.run_id, ann.round, ann.stage) if ann is not None and ann.state == "training" else None
        for d in self.devices:
            p = d.pending
            if p is None:
                continue
            if p.key != open_key:
                d.pending = None
            elif now >= p.due and not p.uploading:
                self.resent += 1
                self._send_whole(d)

    def connect_all(self, batch: int = 100) -> None:
        """Open every device's connection, ``batch`` at a time, serving the sockets in between."""
        for start in range(0, len(self.devices), batch):
            for d in self.devices[start : start + batch]:
                d.client.connect("127.0.0.1", self.port, keepalive=KEEPALIVE_S)
            self.pump(0.01)

    def pump(self, timeout_s: float) -> None:
        """Serve ready sockets once (waiting at most ``timeout_s``), then publish the notices of finished uploads."""
        for key, events in self.sel.select(timeout_s):
            c = key.data.client
            if events & selectors.EVENT_READ:
                c.loop_read(100)
            if events & selectors.EVENT_WRITE:
                c.loop_write()
        self._uploaded()

    def run(self, ready_out: Any, stop: threading.Event) -> None:
        """Connect, say ``ready`` on ``ready_out`` once every status is acknowledged, serve until the run finishes."""
        self.connect_all()
        said_ready, last_misc = False, time.monotonic()
        while not stop.is_set():
            self.pump(0.02 if self.uploader is not None else 0.05)
            now = time.monotonic()
            if not said_ready and len(self.status_acks) == len(self.devices):
                print("ready", flush=True, file=ready_out)
                said_ready = True
            if now - last_misc >= 1.0:
                for d in self.devices:
                    d.client.loop_misc()
                self._retry()
                last_misc = now
            if self.finished and not any(d.pending for d in self.devices):
                break
        if self.uploader is not None:
            self.uploader.close()
        for d in self.devices:
            d.client.disconnect()
        self.pump(0.1)


def worker_main(args: argparse.Namespace) -> int:
    """A generator process: serve devices ``first .. first+count-1``; print ``ready``, then a JSON tally at the end."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    gen = Generator(args.port, args.first, args.count, args.seed)
    gen.run(sys.stdout, stop)
    print(json.dumps({"sent": gen.sent, "accepted": gen.accepted, "resent": gen.resent, "http_down": gen.http_down,
                      "http_up": gen.http_up, "upload_errors": gen.upload_errors, "model_fetches": gen.cache.fetches,
                      "first_model_msg": gen.first_model_msg,
                      "http_connections": gen.uploader.opened if gen.uploader is not None else 0}), flush=True)  # fmt: skip
    return 0


# -- the measurement ------------------------------------------------------------------------------------


MOSQUITTO_CONF = """listener {port} 127.0.0.1
allow_anonymous true
persistence false
sys_interval 1
max_connections -1
max_inflight_messages 20
max_queued_messages 10000
log_dest stdout
log_type error
log_type warning
"""


class Observer:
    """A plain MQTT session that notes when announcements come and the broker's ``$SYS`` byte counters (own paho thread)."""

    def __init__(self, port: int, on_round: Any):
        self.topics = Topics(FEDERATION)
        self.sys: list[tuple[float, int, int]] = []
        self._recv: int | None = None
        self.announced: dict[str, float] = {}
        self.on_round = on_round
        self.finished = threading.Event()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-observer", protocol=mqtt.MQTTv311)
        c.on_connect = lambda cl, *_: cl.subscribe([(self.topics.round, 1), ("$SYS/broker/bytes/+", 0)])
        c.on_message = self._on_message
        c.connect("127.0.0.1", port, keepalive=60)
        c.loop_start()
        self.client = c

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.monotonic()
        if msg.topic == "$SYS/broker/bytes/received":
            self._recv = int(msg.payload)
        elif msg.topic == "$SYS/broker/bytes/sent" and self._recv is not None:
            self.sys.append((now, self._recv, int(msg.payload)))
        elif msg.topic == self.topics.round and msg.payload:
            ann = RoundAnnouncement.from_bytes(bytes(msg.payload))
            name = "finished" if ann.state == "finished" else f"r{ann.round}.{ann.stage}"
            if name not in self.announced:
                self.announced[name] = now
                self.on_round(name)
            if ann.state == "finished":
                self.finished.set()

    def bytes_after(self, t: float, wait_s: float = 3.0) -> tuple[int, int]:
        """(received, sent) of the first ``$SYS`` sample after monotonic time ``t`` (waits up to ``wait_s`` for one)."""
        end = time.monotonic() + wait_s
        while True:
            later = [(r, s) for (ts, r, s) in self.sys if ts >= t]
            if later or time.monotonic() > end:
                return later[0] if later else self.sys[-1][1:]
            time.sleep(0.1)

    def bytes_before(self, t: float) -> tuple[int, int]:
        """(received, sent) of the last ``$SYS`` sample before monotonic time ``t``.

        Raises
        ------
        RuntimeError
            If no sample came before ``t`` (the broker publishes none without ``sys_interval``).
        """
        earlier = [(r, s) for (ts, r, s) in self.sys if ts < t]
        if not earlier:
            raise RuntimeError("no $SYS/broker/bytes sample before the first round (is sys_interval set?)")
        return earlier[-1]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _log(stack: contextlib.ExitStack, path: Path) -> Any:
    """``path`` opened for appending bytes, closed with ``stack``: a child process's output."""
    return stack.enter_context(path.open("ab"))


def measure(n: int, rounds: int, procs: int, folder: Path, seed: int, timeout_s: float, width: tuple[int, int] = (1, 2),
            transport: str = "mqtt", start_timeout_s: float = 600.0) -> dict[str, Any]:  # fmt: skip
    """One run with ``n`` devices, the CNN of ``width`` (conv filters F, dense units H) and ``transport``: the module's figures.

    Raises ValueError for an unknown transport, RuntimeError on a failed run.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    import psutil

    exe = find_mosquitto()
    if exe is None:
        raise RuntimeError("mosquitto is not installed (apt-get install mosquitto)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (folder / "mosquitto.conf").write_text(MOSQUITTO_CONF.format(port=port))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 1000
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    if min(need, hard) < need:
        raise RuntimeError(f"{n} devices need about {need} open files, the hard limit is {hard} (raise it: ulimit -Hn)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    logs = contextlib.ExitStack()
    broker = subprocess.Popen([exe, "-c", str(folder / "mosquitto.conf")], stdout=_log(logs, folder / "mosquitto.log"),
                              stderr=subprocess.STDOUT)  # fmt: skip
    workers: list[subprocess.Popen[str]] = []
    coord: subprocess.Popen[bytes] | None = None
    observer: Observer | None = None
    try:
        if not wait_for_port("127.0.0.1", port, 10):
            raise RuntimeError(f"mosquitto did not start; see {folder / 'mosquitto.log'}")
        coord_cpu: dict[str, float] = {}
        proc_holder: list[psutil.Process] = []

        def on_round(name: str) -> None:
            if proc_holder:
                t = proc_holder[0].cpu_times()
                coord_cpu[name] = t.user + t.system

        observer = Observer(port, on_round)
        t0 = time.monotonic()
        share = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        first = 0
        for i, count in enumerate(share):
            if count:
                workers.append(subprocess.Popen([sys.executable, __file__, "--worker", "--port", str(port), "--first", str(first),
                                                 "--count", str(count), "--seed", str(seed), "--transport", transport],
                                                stdout=subprocess.PIPE,
                                                stderr=_log(logs, folder / f"worker{i}.log"), text=True, env=env))  # fmt: skip
            first += count
        for w in workers:
            line = w.stdout.readline() if w.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"a generator process did not connect its devices ({line!r}); see {folder}/worker*.log")
        connect_s = time.monotonic() - t0
        run_dir = folder / "run"
        cmd = [sys.executable, "-m", "coordinator.cli", "run", "--broker", f"127.0.0.1:{port}", "--federation", FEDERATION,
               "--run-id", f"scale-{n}", "--run-dir", str(run_dir), "--min-clients", str(n), "--start-settle", "3",
               "--rounds", str(rounds), "--aggregation", "fedavg", "--conv-filters", str(width[0]), "--dense-units", str(width[1]),
               "--round-timeout", str(timeout_s), "--start-timeout", str(start_timeout_s), "--no-progress", "--no-guard",
               "--log-level", "WARNING", "--seed", str(seed), "--transport", transport]  # fmt: skip
        if transport == "blobs":  # the folder store in the run folder, served by the coordinator on a free loopback port
            cmd += ["--blob-store", "folder", "--blob-bind", "127.0.0.1", "--blob-port", "0"]
        coord = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=_log(logs, folder / "coordinator.log"), stderr=subprocess.STDOUT)
        proc_holder.append(psutil.Process(coord.pid))
        _, status, usage = os.wait4(coord.pid, 0)
        coord.returncode = os.waitstatus_to_exitcode(status)
        if coord.returncode != 0:
            raise RuntimeError(f"the coordinator ended with {coord.returncode}; see {folder / 'coordinator.log'}")
        tallies = []
        for w in workers:
            out, _ = w.communicate(timeout=120)
            tallies.append(json.loads(out.strip().splitlines()[-1]))
        report = json.loads((run_dir / "report.json").read_text())
        recs = report["rounds"]
        counted = [int(r["updates"]) for r in recs]
        duplicates = [int(r.get("duplicates", 0)) for r in recs]
        accepted = [sum(int(t["accepted"].get(str(r), 0)) for t in tallies) for r in range(rounds)]
        walls = [float(r["seconds"]) for r in recs]
        # Round 0's traffic starts with its models (MQTT) or grants (blobs), published before its announcement.
        firsts = [float(t["first_model_msg"]) for t in tallies if t.get("first_model_msg") is not None]
        b1 = observer.bytes_before(min([observer.announced["r0.0"], *firsts]))
        b2 = observer.bytes_after(observer.announced["finished"])
        per_round = (b2[0] - b1[0] + b2[1] - b1[1]) / rounds
        cpu = coord_cpu["finished"] - coord_cpu["r0.0"]
        http_down = sum(int(v) for t in tallies for v in t["http_down"].values())
        http_up = sum(int(v) for t in tallies for v in t["http_up"].values())
        return {
            "transport": transport, "updates": n, "rounds": rounds, "connect_s": connect_s, "counted": counted, "duplicates": duplicates,
            "device_accepted": accepted, "resent": sum(int(t["resent"]) for t in tallies),
            "cpu_s_per_update": cpu / max(1, sum(counted)), "coord_cpu_s_rounds": cpu,
            "coord_cpu_s_total": usage.ru_utime + usage.ru_stime, "coord_peak_rss_mib": usage.ru_maxrss / 1024,
            "round_wall_s": sum(walls) / len(walls), "round_wall_max_s": max(walls),
            "broker_bytes_per_round": per_round, "broker_in_per_round": (b2[0] - b1[0]) / rounds,
            "broker_out_per_round": (b2[1] - b1[1]) / rounds, "bytes_per_device": per_round / n,
            "http_bytes_per_round": (http_down + http_up) / rounds, "http_down_per_round": http_down / rounds,
            "http_up_per_round": http_up / rounds, "model_fetches": sum(int(t["model_fetches"]) for t in tallies),
            "upload_errors": sum(int(t["upload_errors"]) for t in tallies),
            "http_connections": sum(int(t["http_connections"]) for t in tallies),
            "lost": sum(max(0, n - c) for c in counted), "double": sum(max(0, c - n) for c in counted), "copies": sum(duplicates),
            "load_avg_1m": os.getloadavg()[0],
        }  # fmt: skip
    finally:
        if coord is not None and coord.returncode is None:
            stop_process(coord)
        for w in workers:
            stop_process(w)  # type: ignore[arg-type]
        if observer is not None:
            observer.close()
        stop_process(broker)
        logs.close()


def summary_line(results: list[dict[str, Any]]) -> str:
    """The last line: ``key=value`` figures of the largest N, per transport (``mqtt_*``, ``blobs_*``), then the comparison.

    ``blob_broker_ratio`` is blob mode's broker bytes per round over MQTT mode's at that N (only
    when both were measured); ``lost`` and ``double`` are summed over the transports measured at it.
    """
    n = max(r["updates"] for r in results)
    at = {r["transport"]: r for r in results if r["updates"] == n}
    parts = [f"updates={n}"]
    for t in TRANSPORTS:
        r = at.get(t)
        if r is None:
            continue
        parts += [f"{t}_cpu_s_per_update={r['cpu_s_per_update']:.6f}", f"{t}_coord_peak_rss_mib={r['coord_peak_rss_mib']:.1f}",
                  f"{t}_round_wall_s={r['round_wall_s']:.2f}", f"{t}_broker_bytes_per_round={r['broker_bytes_per_round']:.0f}",
                  f"{t}_bytes_per_device={r['bytes_per_device']:.0f}"]  # fmt: skip
        if t == "blobs":
            parts.append(f"blobs_http_bytes_per_round={r['http_bytes_per_round']:.0f}")
    if "mqtt" in at and "blobs" in at:
        parts.append(f"blob_broker_ratio={at['blobs']['broker_bytes_per_round'] / at['mqtt']['broker_bytes_per_round']:.4f}")
    parts += [f"lost={sum(r['lost'] for r in at.values())}", f"double={sum(r['double'] for r in at.values())}"]
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fedhar at scale: the real coordinator against N simulated devices, MQTT and blob transports")
    ap.add_argument("--sizes", default="100,1000,10000", help="updates per round (devices), comma-separated (default 100,1000,10000)")
    ap.add_argument("--transports", default="mqtt,blobs", help="transports to measure at each size, comma-separated (default mqtt,blobs)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    ap.add_argument("--procs", type=int, default=4, help="load generator processes (default 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conv-filters", type=int, default=1, help="the CNN's conv filters F (default 1: a 1.6 kB update)")
    ap.add_argument("--dense-units", type=int, default=2, help="the CNN's dense units H (default 2)")
    ap.add_argument("--round-timeout", type=float, default=900.0, help="the coordinator's --round-timeout (s)")
    ap.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="the coordinator's --start-timeout (s): how long N statuses may take to reach it (default 600)",
    )
    ap.add_argument("--keep", type=Path, help="keep each run's folder (logs, report) under this folder")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", default="mqtt", choices=TRANSPORTS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 2:
        ap.error("--sizes needs sizes of at least 2 devices")
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not transports or set(transports) - set(TRANSPORTS):
        ap.error(f"--transports takes {' and/or '.join(TRANSPORTS)}, comma-separated; got {args.transports!r}")
    results = []
    with tempfile.TemporaryDirectory(prefix="fedhar-scale-") as tmp:
        base = args.keep or Path(tmp)
        for n in sizes:
            for transport in transports:
                t0 = time.monotonic()
                try:
                    res = measure(n, args.rounds, min(args.procs, n), base / f"n{n}-{transport}", args.seed, args.round_timeout,
                                  (args.conv_filters, args.dense_units), transport, args.start_timeout)  # fmt: skip
                except (RuntimeError, KeyError, OSError, subprocess.TimeoutExpired) as exc:
                    print(f"N={n} {transport}: not measured: {type(exc).__name__}: {exc}", flush=True)
                    continue
                res["run_s"] = time.monotonic() - t0
                results.append(res)
                print(f"N={n} {transport}: {json.dumps(res)}", flush=True)
    if not results:
        print("bench_scale: no size finished", file=sys.stderr)
        return 1
    print()
    print(f"coordinator FedAvg, CNN F={args.conv_filters} H={args.dense_units}; {args.rounds} rounds; devices in {args.procs} "
          f"generator processes; Mosquitto on loopback; blobs: folder store served by the coordinator")  # fmt: skip
    print(f"{'updates':>8} {'transport':>9} {'counted/round':>20} {'lost':>5} {'double':>6} {'copies':>7} {'cpu_s/update':>13} "
          f"{'peak RSS MiB':>13} {'round s':>8} {'broker MB/round':>16} {'B/device':>9} {'HTTP MB/round':>14} {'connect s':>10} "
          f"{'load 1m':>8}")  # fmt: skip
    for r in results:
        print(f"{r['updates']:>8} {r['transport']:>9} {'/'.join(map(str, r['counted'])):>20} {r['lost']:>5} {r['double']:>6} "
              f"{r['copies']:>7} {r['cpu_s_per_update']:>13.5f} {r['coord_peak_rss_mib']:>13.1f} {r['round_wall_s']:>8.2f} "
              f"{r['broker_bytes_per_round'] / 1e6:>16.3f} {r['bytes_per_device']:>9.0f} {r['http_bytes_per_round'] / 1e6:>14.3f} "
              f"{r['connect_s']:>10.1f} {r['load_avg_1m']:>8.2f}")  # fmt: skip
    for t in transports:
        mine = [r for r in results if r["transport"] == t]
        if len(mine) > 1:
            small, big = mine[0], mine[-1]
            print(f"memory ({t}): coordinator peak RSS {small['coord_peak_rss_mib']:.1f} MiB at {small['updates']} updates, "
                  f"{big['coord_peak_rss_mib']:.1f} MiB at {big['updates']} "
                  f"({big['coord_peak_rss_mib'] / small['coord_peak_rss_mib']:.2f}x)")  # fmt: skip
    print(summary_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
