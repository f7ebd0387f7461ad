"""The blob transport: its messages, the folder store served over HTTP, a device's fetch and upload,
the coordinator's check of an uploaded update, and a federation run over it (docs/scale.md).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from coordinator.config import TransportSettings
from coordinator.transport import Refused
from coordinator.transport.blobs import publish_object, read_noticed
from coordinator.transport.folder_store import BlobServer, FolderBlobStore, load_secret
from har_io.blob_http import BlobCache, fetch_model, upload_update
from har_io.blobs import BlobError, upload_slot
from har_models.wire import codec
from har_models.wire.blob_messages import BlobGrant, BlobNotice, BlobRef, UploadGrant
from har_models.wire.messages import MessageError, RoundAnnouncement

SHA_A = hashlib.sha256(b"a").hexdigest()


@pytest.fixture
def served(tmp_path: Path):
    """A folder store served on a free loopback port: (store, server)."""
    store = FolderBlobStore(tmp_path / "blobs", "", load_secret(tmp_path / "secret"))
    server = BlobServer(store, "127.0.0.1", 0)
    server.start()
    try:
        yield store
    finally:
        server.stop()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers (names lowercase) of a GET of ``url``."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}


def _put(url: str, body: bytes, chunked: bool = False) -> int:
    """PUT ``body``; ``chunked`` sends it without a Content-Length (the server must count as it reads)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
    try:
        if chunked:
            conn.putrequest("PUT", f"{u.path}?{u.query}")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for i in range(0, len(body), 1000):
                piece = body[i : i + 1000]
                conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            conn.request("PUT", f"{u.path}?{u.query}", body=body)
        return conn.getresponse().status
    finally:
        conn.close()


# ------------------------------------------------------------------------------ messages
def test_the_messages_round_trip_and_refuse_what_is_not_theirs():
    ref = BlobRef(SHA_A, 12, "http://127.0.0.1:9/blobs/objects/" + SHA_A + "?exp=1&sig=x")
    grant = BlobGrant("run-1", 3, 0, "att", UploadGrant("https://s3.example/b/k?X-Amz=1", 1_800_000_000.5, 1024), ref)
    assert BlobGrant.from_bytes(grant.to_bytes()) == grant
    assert BlobGrant.from_bytes(BlobGrant("r", 0, 1, "", grant.upload).to_bytes()).model is None
    notice = BlobNotice("run-1", 3, 0, SHA_A, 12)
    assert BlobNotice.from_bytes(notice.to_bytes()) == notice
    for bad in (b"[]", b"{}", notice.to_bytes().replace(SHA_A.encode(), b"A" * 64),
                notice.to_bytes().replace(b'"size": 12', b'"size": -1'),
                notice.to_bytes().replace(b'"size": 12', b'"size": 12, "extra": 1'),
                grant.to_bytes().replace(b"https://s3", b"file://s3")):  # fmt: skip
        with pytest.raises(MessageError):
            (BlobGrant if b"upload" in bad else BlobNotice).from_bytes(bad)
    # An announcement over MQTT is the message earlier clients know; one over blobs names its global model's object.
    plain = RoundAnnouncement("r", 0, "training", {}, "x", global_model=SHA_A)
    assert b"transport" not in plain.to_bytes() and b"global_blob" not in plain.to_bytes()
    blob = RoundAnnouncement("r", 0, "training", {}, "x", global_model=SHA_A, transport="blobs", global_blob=ref.to_json())
    assert RoundAnnouncement.from_bytes(blob.to_bytes()) == blob
    other = RoundAnnouncement("r", 0, "training", {}, "x", global_model="b" * 64, transport="blobs", global_blob=ref.to_json())
    with pytest.raises(MessageError, match="another model"):
        RoundAnnouncement.from_bytes(other.to_bytes())
    with pytest.raises(MessageError, match="transport"):
        RoundAnnouncement.from_bytes(plain.to_bytes().replace(b'"attempt"', b'"transport": "ftp", "attempt"'))


def test_an_upload_slot_is_one_per_client_and_exchange_and_names_nothing_else():
    assert upload_slot("run-1", 7, 1, "phone.01") == "uploads/run-1/r0007-s1/phone.01"
    for run, cid in (("../x", "a"), ("r", "../a"), ("r/x", "a"), ("..", "a")):
        with pytest.raises(ValueError):
            upload_slot(run, 0, 0, cid)


# ------------------------------------------------------------------------------ the folder store over HTTP
def test_an_object_is_served_once_named_by_its_hash_only_with_a_valid_signature(served):
    store = served
    data = b"model bytes " * 1000
    ref = publish_object(store, data, time.time() + 60)
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size == len(data)
    assert store.put_object(data) == ref.sha256 and len(list((store.folder / "objects").iterdir())) == 1  # written once
    status, body, headers = _get(ref.url)
    assert (status, body) == (200, data)
    assert headers["etag"] == f'"{ref.sha256}"' and "immutable" in headers["cache-control"]
    status, body, _ = _get(ref.url, {"If-None-Match": f'"{ref.sha256}"'})
    assert (status, body) == (304, b"")
    assert _get(ref.url.replace("sig=", "sig=0"))[0] == 403  # tampered
    assert _get(ref.url.split("?")[0])[0] == 403  # unsigned
    assert _get(store.object_url(ref.sha256, time.time() - 1))[0] == 403  # expired
    assert _get(store.object_url(SHA_A, time.time() + 60))[0] == 404  # signed, but no such object


def test_an_upload_lands_whole_in_its_slot_and_never_past_its_limit(served):
    store = served
    slot = upload_slot("run", 2, 0, "dev-a")
    url = store.upload_url(slot, time.time() + 60, 5000)
    assert store.read_upload(slot, 5000) is None
    assert _put(url, b"x" * 4000) == 201
    assert store.read_upload(slot, 5000) == b"x" * 4000
    assert _put(url, b"y" * 10, chunked=True) == 201  # a second upload replaces the first
    assert store.read_upload(slot, 5000) == b"y" * 10
    assert _put(url, b"z" * 5001) == 413  # declared too large: refused before reading
    assert _put(url, b"z" * 9000, chunked=True) == 413  # undeclared: cut off while reading
    assert store.read_upload(slot, 5000) == b"y" * 10  # neither replaced what was there
    assert _put(url.replace("max=5000", "max=50000"), b"z" * 9000) == 403  # the limit is signed
    assert _put(store.upload_url(slot, time.time() - 1, 5000), b"z") == 403  # expired
    other = upload_slot("run", 3, 0, "dev-a")
    assert _put(store.upload_url(other, time.time() + 60, 5000), b"next") == 201
    store.drop_uploads("uploads/run/r0002-s0/")
    assert store.read_upload(slot, 5000) is None and store.read_upload(other, 5000) == b"next"
    with pytest.raises(BlobError, match="only upload slots"):
        store.drop_uploads("objects/")
    assert not list(store.folder.rglob(".part-*"))  # no half upload left behind


def test_a_device_uses_a_model_only_if_every_byte_matches_and_fetches_it_once(served, tmp_path):
    store = served
    data = bytes(range(256)) * 400
    ref = publish_object(store, data, time.time() + 60)
    cache = BlobCache(tmp_path / "cache", keep=2)
    assert fetch_model(ref, 1 << 20, cache) == data and fetch_model(ref, 1 << 20, cache) == data
    assert cache.fetches == 1 and (tmp_path / "cache" / ref.sha256).read_bytes() == data
    # A restarted device (a new cache on the same folder) reads its kept copy, checked against the hash...
    again = BlobCache(tmp_path / "cache")
    assert fetch_model(ref, 1 << 20, again) == data and again.fetches == 0
    # ... and fetches again when the kept copy was damaged.
    (tmp_path / "cache" / ref.sha256).write_bytes(b"\xff" + data[1:])
    fresh = BlobCache(tmp_path / "cache")
    assert fetch_model(ref, 1 << 20, fresh) == data and fresh.fetches == 1
    lying = BlobRef(hashlib.sha256(b"other").hexdigest(), ref.size, ref.url)  # the store serves other bytes than announced
    with pytest.raises(BlobError, match="not used"):
        fetch_model(lying, 1 << 20, BlobCache(tmp_path / "c2"))
    assert not (tmp_path / "c2" / lying.sha256).exists()
    with pytest.raises(BlobError, match="more than the announced"):
        fetch_model(BlobRef(ref.sha256, 100, ref.url), 1 << 20)
    with pytest.raises(BlobError, match="over this client's limit"):
        fetch_model(ref, 1000)
    with pytest.raises(BlobError, match="HTTP 403"):
        fetch_model(BlobRef(ref.sha256, ref.size, store.object_url(ref.sha256, time.time() - 1)), 1 << 20)


def test_the_coordinator_counts_an_upload_only_as_the_notice_describes_it(served):
    store = served
    env = codec.encode({"w": np.arange(300, dtype=np.float32)}, kind="update", round=4, arch_version=0, client_id="dev-a",
                       meta={"run_id": "run"})  # fmt: skip
    assert len(env) < 4096
    expires = time.time() + 60
    grant = BlobGrant("run", 4, 0, "att", UploadGrant(store.upload_url(upload_slot("run", 4, 0, "dev-a"), expires, 4096), expires, 4096))
    with pytest.raises(Refused) as missing:
        read_noticed(store, "dev-a", BlobNotice("run", 4, 0, hashlib.sha256(env).hexdigest(), len(env)), 4096)
    assert missing.value.reason == "blob_missing"
    upload_update(grant.upload, env)
    notice = BlobNotice("run", 4, 0, hashlib.sha256(env).hexdigest(), len(env))
    got = read_noticed(store, "dev-a", notice, 4096)
    assert got.data == env and got.transfer == notice.sha256
    for bad, reason in ((BlobNotice("run", 4, 0, SHA_A, len(env)), "blob_mismatch"),
                        (BlobNotice("run", 4, 0, notice.sha256, len(env) + 1), "blob_mismatch"),
                        (BlobNotice("run", 4, 0, notice.sha256, 5000), "too_large")):  # fmt: skip
        with pytest.raises(Refused) as exc:
            read_noticed(store, "dev-a", bad, 4096)
        assert exc.value.reason == reason
    junk = b"GIF89a" + b"\0" * 3000  # not an envelope: refused after its first bytes, its hash never computed
    upload_update(UploadGrant(store.upload_url(upload_slot("run", 4, 0, "dev-j"), expires, 4096), expires, 4096), junk)
    with pytest.raises(Refused) as exc:
        read_noticed(store, "dev-j", BlobNotice("run", 4, 0, hashlib.sha256(junk).hexdigest(), len(junk)), 4096)
    assert exc.value.reason == "bad_magic"
    with pytest.raises(Refused) as other:  # another client's notice cannot point at dev-a's slot
        read_noticed(store, "dev-b", notice, 4096)
    assert other.value.reason == "blob_missing"
    with pytest.raises(BlobError, match="over the coordinator's limit"):
        upload_update(grant.upload, b"x" * 5000)
    with pytest.raises(BlobError, match="expired"):
        upload_update(UploadGrant(grant.upload.url, time.time() - 1, 4096), env)


# ------------------------------------------------------------------------------ a federation over it
class _Observer:
    """Counts the bytes of every message under ``fedhar/`` on a broker, by kind of topic."""

    def __init__(self, port: int):
        self.bytes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="blob-observer")
        self.c.on_message = self._on
        self.c.connect("127.0.0.1", port)
        self.c.subscribe("fedhar/#", qos=0)
        self.c.loop_start()

    def _on(self, _c, _u, msg) -> None:
        parts = msg.topic.split("/")
        kind = "model" if "model" in parts else "update" if "update" in parts else "grant" if parts[-1] == "grant" else "other"
        with self.lock:
            self.bytes[kind] = self.bytes.get(kind, 0) + len(msg.payload)

    def stop(self) -> dict[str, int]:
        self.c.loop_stop()
        self.c.disconnect()
        return dict(self.bytes)


@pytest.mark.slow
def test_a_federation_over_blobs_gives_the_figures_of_mqtt_with_no_model_byte_on_the_broker(small_simulation, mosquitto, tmp_path,
                                                                                            caplog):  # fmt: skip
    figures = {}
    seen = {}
    caplog.set_level(logging.INFO, logger="fedhar.coordinator")
    for transport in ("mqtt", "blobs"):
        obs = _Observer(mosquitto)
        doc = small_simulation("--rounds", "2", "--broker", f"127.0.0.1:{mosquitto}", "--transport", transport, "--workers", "1",
                               name=transport, run_id="blobs-e2e")  # fmt: skip
        seen[transport] = obs.stop()
        figures[transport] = [(r["updates"], r["global"]["macro_f1"], r["personalisation"]["macro_f1"]) for r in doc["rounds"]]
    assert figures["blobs"] == figures["mqtt"] and [f[0] for f in figures["mqtt"]] == [3, 3]
    # Over MQTT the models cross the broker; over blobs only control messages do: a notice per update, a grant per client.
    assert seen["mqtt"]["model"] > 50_000 and seen["mqtt"]["update"] > 20_000
    assert seen["blobs"].get("model", 0) == 0 and seen["blobs"]["update"] < 6 * 300 and seen["blobs"]["grant"] > 0
    run = tmp_path / "blobs"
    assert len(list((run / "blobs" / "objects").iterdir())) == 1  # the last round's global model: earlier ones are dropped
    assert not [p for p in (run / "blobs" / "uploads").rglob("*") if p.is_file()]  # closed exchanges' slots are gone
    assert json.loads((run / "report.json").read_text())["config"]["transport"]["kind"] == "blobs"
    # The worker hosting the three clients fetched each round's model once for all of them; each client uploaded once a round.
    assert "blob transport: 2 model fetch(es) served" in caplog.text and ", 6 upload(s) taken" in caplog.text


def test_the_folder_store_keeps_the_contract_of_every_blob_store(served):
    from support.blob_contract import check_store_contract

    check_store_contract(served, run_id="folder-contract")


@pytest.mark.slow
def test_personalised_models_travel_as_objects_named_in_each_clients_grant(small_simulation, tmp_path):
    """FedDWA: from round 1 each client starts from its own model, an object of its own, named in its grant only."""
    docs = {t: small_simulation("--rounds", "2", "--aggregation", "feddwa", "--transport", t, name=f"dwa-{t}", run_id="dwa")
            for t in ("mqtt", "blobs")}  # fmt: skip
    figures = {t: [(r["updates"], r["global"]["macro_f1"], r["personalisation"]["macro_f1"]) for r in d["rounds"]]
               for t, d in docs.items()}  # fmt: skip
    assert figures["blobs"] == figures["mqtt"] and [f[0] for f in figures["mqtt"]] == [3, 3]
    # Round 1's three personalised models are the objects left in the store, none of them another's.
    objects = sorted(p.name for p in (tmp_path / "dwa-blobs" / "blobs" / "objects").iterdir())
    assert len(objects) == 3


# ------------------------------------------------------------------------------ the grid's side, without a broker
class _DownStore(FolderBlobStore):
    """A folder store whose writes fail, as an S3 store that cannot be reached does."""

    def put_object(self, data: bytes, replace: bool = False) -> str:
        raise BlobError("store at http://s3.invalid: EndpointConnectionError (is it running?)")


def _grid(tmp_path: Path, transport: str = "blobs", store=None, late=None):
    from coordinator.config import CoordinatorConfig
    from coordinator.mqtt_grid import MqttGrid
    from coordinator.state import RunState

    cfg = CoordinatorConfig(run_dir=tmp_path / "run", federation="blobfed", run_id="run",
                            transport=TransportSettings(kind=transport, max_update_bytes=4096))  # fmt: skip
    state = RunState(cfg.run_dir)
    return MqttGrid(cfg, state, blob_store=store, **({"late": late} if late else {})), state


def test_a_blob_store_that_fails_closes_the_exchange_without_updates_instead_of_the_coordinator(tmp_path):
    from coordinator.round import base_plan
    from coordinator.rounds import NO_STEERING
    from coordinator.strategies import Federation
    from har_models.nn.model import ArchSpec, init_state

    store = _DownStore(tmp_path / "blobs", "http://127.0.0.1:9", b"k" * 32)
    grid, state = _grid(tmp_path, store=store)
    try:
        spec = ArchSpec(n_classes=6, conv_filters=2, dense_units=4)
        ex = grid.exchange(Federation(spec, spec, init_state(spec, 0)), "hapt6", 3, 0, ["dev-a", "dev-b"], base_plan(grid.cfg, 3),
                           NO_STEERING)  # fmt: skip
        assert ex.updates == {} and [(f.client_id, f.reason) for f in ex.failures()] == [
            ("dev-a", "blob_store_unavailable"), ("dev-b", "blob_store_unavailable")]
        assert [(r, c, d[:33]) for r, c, _, d in state.events("blob_store_failed")] == [(3, None, "store at http://s3.invalid: Endpo")]
    finally:
        state.close()


def test_a_notice_that_does_not_belong_to_the_open_exchange_is_counted_and_dropped(tmp_path):
    from coordinator.exchange import Exchange
    from coordinator.rounds import Late
    from har_models.nn.model import ArchSpec
    from har_models.wire.blob_messages import BLOB_NOTICE_INDEX

    notice = BlobNotice("run", 0, 0, SHA_A, 10).to_bytes()

    def not_needed(cid: str, round_: int, stage: int) -> Late | None:  # round 0 closed at its cohort goal without dev-b
        return Late(round_) if (cid, round_, stage) == ("dev-b", 0, 0) else None

    grid, state = _grid(tmp_path, store=FolderBlobStore(tmp_path / "blobs", "http://127.0.0.1:9", b"k" * 32), late=not_needed)
    plain, plain_state = _grid(tmp_path / "plain", transport="mqtt")

    def carried(g) -> Exchange:  # what arrived while no exchange was open, as the next one counts it
        ex = Exchange(1, 0, ArchSpec(n_classes=6, conv_filters=2, dense_units=4), frozenset(), False)
        g.intake.open(ex, 4096)
        g.intake.close()
        return ex

    def to(cid: str) -> str:
        return grid.topics.client_update(cid, BLOB_NOTICE_INDEX)

    try:
        grid.handle(to("dev-a"), notice)  # no exchange open
        grid.handle(to("dev-a"), b"{not json")
        grid.handle(to("dev-a"), BlobNotice("other-run", 0, 0, SHA_A, 10).to_bytes())
        grid.handle(to("dev-b"), notice)
        plain.handle(to("dev-a"), notice)  # a coordinator over MQTT takes no notice
        ex = carried(grid)
        assert dict(ex.rejected) == {("dev-a", "stale_round"): 2, ("dev-a", "malformed"): 1}
        assert dict(ex.duplicates) == {"dev-b": 1} and ("dev-b", "stale_round") not in ex.rejected
        assert dict(carried(plain).rejected) == {("dev-a", "wrong_transport"): 1}
    finally:
        state.close()
        plain_state.close()


def test_the_status_page_takes_a_blob_rounds_selected_devices_from_their_grants():
    """Over blobs the announcement names nobody: the page's monitor counts the devices holding a grant of this attempt."""
    from coordinator.server.monitor import Monitor
    from har_models.wire.messages import Receipt
    from har_models.wire.topics import Topics

    t = Topics("fed")
    mon = Monitor(t)
    ref = BlobRef(SHA_A, 1, "http://127.0.0.1:9/x")
    upload = UploadGrant("http://127.0.0.1:9/u", time.time() + 60, 100)
    ann = RoundAnnouncement("run", 2, "training", {}, "x", global_model=SHA_A, attempt="att2", transport="blobs",
                            global_blob=ref.to_json())  # fmt: skip
    mon.handle(t.round, ann.to_bytes())
    mon.handle(t.client_grant("dev-a"), BlobGrant("run", 2, 0, "att2", upload).to_bytes())
    mon.handle(t.client_grant("dev-b"), BlobGrant("run", 2, 0, "att2", upload).to_bytes())
    mon.handle(t.client_grant("dev-c"), BlobGrant("run", 2, 0, "att1", upload).to_bytes())  # an earlier attempt's
    mon.handle(t.client_grant("dev-d"), BlobGrant("run", 1, 0, "att2", upload).to_bytes())  # an earlier round's
    mon.handle(t.client_receipt("dev-a"), Receipt("run", 2, 0, SHA_A, "accepted").to_bytes())
    snap = mon.snapshot()
    assert snap.selected == {"dev-a", "dev-b"} and snap.answered == {"dev-a"}
    mon.handle(t.client_grant("dev-b"), b"")  # cleared at the end of the run
    assert mon.snapshot().selected == {"dev-a"}
