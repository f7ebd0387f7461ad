"""What every blob store must do (:class:`har_io.blobs.BlobStore`), checked the way a device sees it.

:func:`check_store_contract` runs against any back end (the folder one, the S3 one against moto
or SeaweedFS). The coordinator's side goes through the store's methods; the device's side is
plain ``urllib.request`` against the URLs the store signs, with no credentials, as the client
on a phone or a board does.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request

from har_io.blobs import BlobError, BlobStore, upload_slot

HTTP_TIMEOUT_S = 10.0
"""Seconds a device's request may take against a store on loopback before the contract fails."""


def read_upload(store: BlobStore, slot: str, max_bytes: int) -> bytes | None:
    """The bytes in ``slot`` as the coordinator reads them (:meth:`BlobStore.open_upload`, as a stream); None when empty."""
    reader = store.open_upload(slot, max_bytes)
    if reader is None:
        return None
    try:
        assert reader.size <= max_bytes, f"{slot}: open_upload let {reader.size} bytes past a limit of {max_bytes}"
        parts = []
        while chunk := reader.read(4096):
            parts.append(chunk)
        data = b"".join(parts)
        assert len(data) == reader.size, f"{slot}: {len(data)} bytes read, the reader said {reader.size}"
        return data
    finally:
        reader.close()


def http_get(url: str) -> tuple[int, bytes]:
    """GET ``url`` as a device does: (status, body); an HTTP error answer is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def http_put(url: str, data: bytes) -> int | None:
    """PUT ``data`` to ``url`` as a device does: the HTTP status, or None if the store dropped the connection.

    The body is sent as ``application/octet-stream``: without a type urllib sends form-encoding,
    which some S3 servers parse as a form and store as an empty object.
    """
    req = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, ConnectionError):
        return None  # a store may close the connection on an oversized body instead of answering


def exchange_prefix(slot: str) -> str:
    """The prefix every slot of ``slot``'s exchange shares: ``uploads/{run_id}/r{round:04d}-s{stage}/``."""
    return slot.rsplit("/", 1)[0] + "/"


def check_store_contract(store: BlobStore, *, run_id: str = "contract", check_expiry: bool = True) -> None:
    """Assert that ``store`` behaves as :class:`har_io.blobs.BlobStore` says, end to end over HTTP.

    Parameters
    ----------
    store : BlobStore
        An empty store (or one without ``run_id``'s slots); its URLs must be reachable from this process.
    run_id : str
        The run whose upload slots the contract writes and drops.
    check_expiry : bool
        Whether to check that an expired URL is refused (waits about 2.5 s). Only for a store
        that does not check expiry at all (moto's S3 server ignores ``X-Amz-Expires``); the
        back end's own tests must then show the expiry is put in the URL.

    Raises
    ------
    AssertionError
        At the first broken promise, saying which.
    """
    t0 = time.time()
    # Random bytes, so a store shared between runs cannot answer from an earlier object.
    model = b"fedhar-model\x00" + os.urandom(4096)
    model_sha = hashlib.sha256(model).hexdigest()

    # Objects: content-addressed, written once.
    assert not store.has_object(model_sha), "a fresh object is reported present"
    assert store.put_object(model) == model_sha
    assert store.has_object(model_sha)
    assert store.put_object(model) == model_sha, "a second put of the same bytes names another object"
    assert store.has_object(model_sha)

    ahead = t0 + 300
    status, body = http_get(store.object_url(model_sha, ahead))
    assert status == 200, f"GET of a signed object URL answered {status}: {body[:200]!r}"
    assert body == model and hashlib.sha256(body).hexdigest() == model_sha

    # Signed now, 1 s ahead; tried after every other check (an S3 URL counts whole seconds from its signing second).
    slot_late = upload_slot(run_id, 7, 0, "dev-late")
    soon = time.time() + 1
    expiring_get = store.object_url(model_sha, soon)
    expiring_put = store.upload_url(slot_late, soon, 1024)

    # Upload slots: empty, written by PUT, replaced by a second PUT.
    slot_a = upload_slot(run_id, 3, 1, "dev-a")
    assert read_upload(store, slot_a, 1 << 20) is None, "an empty slot is not None"
    update1 = b"fedhar-update-1\x00" + os.urandom(2048)
    status_put = http_put(store.upload_url(slot_a, ahead, 1 << 20), update1)
    assert status_put is not None and 200 <= status_put < 300, f"PUT to a signed upload URL answered {status_put}"
    assert read_upload(store, slot_a, 1 << 20) == update1
    update2 = b"fedhar-update-2\x00" + os.urandom(1024)
    status_put = http_put(store.upload_url(slot_a, ahead, 1 << 20), update2)
    assert status_put is not None and 200 <= status_put < 300, f"a second PUT answered {status_put}"
    assert read_upload(store, slot_a, 1 << 20) == update2, "a second upload did not replace the first"

    # The size limit: exactly max_bytes passes; one byte more never reaches the coordinator.
    limit = 100
    slot_b = upload_slot(run_id, 3, 1, "dev-b")
    exact = os.urandom(limit)
    status_put = http_put(store.upload_url(slot_b, ahead, limit), exact)
    assert status_put is not None and 200 <= status_put < 300, f"PUT of exactly max_bytes answered {status_put}"
    assert read_upload(store, slot_b, limit) == exact
    slot_c = upload_slot(run_id, 3, 1, "dev-c")
    oversized = os.urandom(limit + 1)
    status_put = http_put(store.upload_url(slot_c, ahead, limit), oversized)
    refused_by_url = status_put is None or status_put >= 400
    try:
        got = read_upload(store, slot_c, limit)
    except BlobError as exc:
        assert slot_c in str(exc) and str(limit) in str(exc), f"the refusal names neither the slot nor the limit: {exc}"
    else:
        assert refused_by_url and got is None, f"upload of {limit + 1} bytes over a limit of {limit} reached the coordinator ({got!r:.40})"

    # Dropping one exchange's slots leaves another exchange's.
    slot_other = upload_slot(run_id, 3, 2, "dev-a")
    other = b"fedhar-other-exchange\x00" + os.urandom(64)
    status_put = http_put(store.upload_url(slot_other, ahead, 1 << 20), other)
    assert status_put is not None and 200 <= status_put < 300, f"PUT answered {status_put}"
    assert store.list_exchanges(f"uploads/{run_id}/") == [exchange_prefix(slot_a), exchange_prefix(slot_other)]
    slot_d = upload_slot(run_id, 3, 1, "dev-a2")  # a client id that starts with another's: dropping one slot leaves it
    status_put = http_put(store.upload_url(slot_d, ahead, 1 << 20), other)
    assert status_put is not None and 200 <= status_put < 300, f"PUT answered {status_put}"
    store.drop_uploads(slot_a)
    assert read_upload(store, slot_a, 1 << 20) is None and read_upload(store, slot_d, 1 << 20) == other, "one slot's drop"
    store.drop_uploads(exchange_prefix(slot_a))
    for slot in (slot_a, slot_b, slot_c):
        assert read_upload(store, slot, 1 << 20) is None, f"{slot} survived drop_uploads({exchange_prefix(slot_a)!r})"
    assert read_upload(store, slot_other, 1 << 20) == other, "drop_uploads removed another exchange's slot"
    assert store.has_object(model_sha), "drop_uploads removed an object"
    store.drop_object(model_sha)
    assert not store.has_object(model_sha), "drop_object left the object"
    store.drop_object(model_sha)  # dropping it again is no error
    assert store.put_object(model) == model_sha and store.has_object(model_sha), "a dropped object could not be written again"
    store.drop_uploads(exchange_prefix(slot_other))
    assert read_upload(store, slot_other, 1 << 20) is None

    if check_expiry:
        time.sleep(max(0.0, soon + 1.5 - time.time()))
        status, body = http_get(expiring_get)
        assert 400 <= status < 500, f"GET of an expired object URL answered {status}: {body[:120]!r}"
        assert body != model
        status_put = http_put(expiring_put, b"too late")
        assert status_put is None or 400 <= status_put < 500, f"PUT to an expired upload URL answered {status_put}"
        assert read_upload(store, slot_late, 1024) is None, "an expired upload URL still wrote its slot"
