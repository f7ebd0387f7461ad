"""The blob carrier: models as content-addressed objects, updates through signed upload slots, MQTT for control only.

Each model envelope is written once into the blob store, named by its SHA-256; the announcement
carries G's :class:`~har_models.wire.blob_messages.BlobRef` and lists nobody, and every selected
device finds its :class:`~har_models.wire.blob_messages.BlobGrant` (a signed PUT URL for its slot
and its own model, if it has one) retained on its own grant topic. A device uploads its update to
its slot and says so with a small notice; the carrier reads the slot as a stream, cheapest checks
first (the notice's size against the exchange's bound, the envelope's magic, version and header,
then the body against the notice's size and SHA-256), so junk costs a few bytes of memory.

A round owns its slots: a grant allows the exchange's update bound (the model's update size, not a
constant) and lives until the exchange closes (or, for buffered rounds, its staleness bound); the
folder store refuses a write to a closed slot or from a refused device (:meth:`FolderBlobStore.accept`),
and every slot the carrier did not count is deleted when an exchange closes and when the carrier
opens (a sweep over the store), so the store's size is bounded by the open rounds. Likewise the
objects: the carrier notes the ones it keeps in the store (``blob_objects.json`` in the run folder)
and the next process of the run (a restart of ``serve``, a restore from backup) removes them at
open, so a restart leaves no model or program object behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.transport.carrier import Arrival, Opening, Published, Refused
from coordinator.transport.settings import TransportSettings
from har_io.blobs import BlobError, BlobStore, upload_slot
from har_io.mqtt_link import MqttLink
from har_models.files import atomic_write_bytes
from har_models.wire import codec
from har_models.wire.blob_messages import BLOB_NOTICE_INDEX, PROGRAM_BLOB_INDEX, BlobGrant, BlobNotice, BlobRef, ProgramBlob, UploadGrant
from har_models.wire.messages import MessageError
from har_models.wire.topics import Topics

if TYPE_CHECKING:
    from coordinator.strategies import Federation
    from coordinator.transport.intake import UpdateIntake

log = logging.getLogger("fedhar.coordinator")

URL_GRACE_S = 30.0
"""Signed URLs stay valid this long past the exchange's deadline (s): a device whose clock is a little behind is not
refused by the store. The folder store refuses a write to a closed slot whatever its URL says; an S3 slot written
after its exchange closed is deleted by the next sweep."""

PROGRAM_URL_TTL_S = 3600.0
"""How long a program object's URL stays valid (s): a device fetches it right after it asked."""

OBJECTS_NOTE = "blob_objects.json"
"""The run folder's note of the objects a carrier keeps in the store (a JSON list of SHA-256 digests)."""

_FIXED = struct.Struct("<4sHI")  # the envelope's magic, version and header length (har_models.wire.codec)


def open_blob_store(settings: TransportSettings, run_dir: Path, refused: Callable[[str], bool]) -> tuple[BlobStore, Callable[[], None]]:
    """The blob store ``settings`` name, ready to use, and how to close it.

    ``folder``: ``{run_dir}/blobs`` served on ``bind:port`` (key ``{run_dir}/blob-secret``), refusing writes from
    devices ``refused`` names; ``s3``: the bucket through :class:`coordinator.transport.s3_store.S3BlobStore`.

    Raises
    ------
    BlobError
        If the store cannot be opened (the message names it and the fix).
    """
    if settings.store == "s3":
        from coordinator.transport.s3_store import S3BlobStore

        s3 = S3BlobStore(settings.s3_bucket, endpoint_url=settings.s3_endpoint or None, prefix=settings.s3_prefix)
        s3.check_bucket()  # a wrong endpoint, bucket or key fails the start, not the first round
        log.info("blob transport: objects and uploads in S3 bucket %s at %s", settings.s3_bucket, settings.s3_endpoint or "AWS")
        return s3, lambda: None
    from coordinator.transport.folder_store import BlobServer, FolderBlobStore, load_secret

    store = FolderBlobStore(run_dir / "blobs", "", load_secret(run_dir / "blob-secret"), refused=refused)
    server = BlobServer(store, settings.bind, settings.port, settings.public_url)
    try:
        port = server.start()
    except RuntimeError as exc:
        raise BlobError(f"the blob store's HTTP server did not start on {settings.bind}:{settings.port} ({exc}); "
                        f"choose another --blob-port") from None  # fmt: skip
    log.info("blob transport: objects and uploads in %s, served at %s (port %d)", store.folder, store.base_url, port)
    return store, server.stop


def publish_object(store: BlobStore, envelope: bytes, expires_unix: float) -> BlobRef:
    """Write ``envelope`` once (named by its SHA-256) and return its reference with a URL valid until ``expires_unix``."""
    sha = store.put_object(envelope)
    return BlobRef(sha, len(envelope), store.object_url(sha, expires_unix))


def exchange_prefix(run_id: str, round_: int, stage: int) -> str:
    """The store key prefix of one exchange's upload slots: ``uploads/{run_id}/r{round:04d}-s{stage}/``."""
    return upload_slot(run_id, round_, stage, "x").rsplit("/", 1)[0] + "/"


def read_noticed(store: BlobStore, cid: str, notice: BlobNotice, max_bytes: int) -> Arrival:
    """Read the update ``notice`` announces from ``cid``'s slot, cheapest checks first (see the module docstring).

    Raises
    ------
    Refused
        ``too_large`` (the notice or the slot is over ``max_bytes``), ``blob_missing`` (nothing in the slot),
        ``blob_unreadable`` (the store failed), ``bad_magic`` / ``bad_version`` / ``malformed`` (not an update
        envelope: refused after its first bytes), ``blob_mismatch`` (size or SHA-256 differ from the notice).
    """
    if notice.size > max_bytes:
        raise Refused("too_large", f"the notice announces {notice.size} bytes, over this exchange's limit of {max_bytes}")
    slot = upload_slot(notice.run_id, notice.round, notice.stage, cid)
    try:
        reader = store.open_upload(slot, max_bytes)
    except BlobError as exc:
        raise Refused("blob_unreadable", str(exc)) from None
    if reader is None:
        raise Refused("blob_missing", f"nothing was uploaded to {slot}")
    try:
        if reader.size != notice.size:
            raise Refused("blob_mismatch", f"{slot} holds {reader.size} bytes, the notice says {notice.size}")
        head = reader.read(_FIXED.size)
        magic, version, header_len = _FIXED.unpack(head) if len(head) == _FIXED.size else (head, 0, 0)
        if magic != codec.MAGIC:
            raise Refused("bad_magic", f"{slot} does not hold an update envelope (it starts with {bytes(magic[:4])!r})")
        if version != codec.ENVELOPE_VERSION or header_len > min(codec.MAX_HEADER_BYTES, notice.size - _FIXED.size):
            raise Refused("bad_version" if version != codec.ENVELOPE_VERSION else "malformed",
                          f"{slot}: envelope version {version}, header of {header_len} bytes")  # fmt: skip
        digest = hashlib.sha256(head)
        parts = [head]
        while len(chunk := reader.read(1 << 20)):
            digest.update(chunk)
            parts.append(chunk)
    except BlobError as exc:
        raise Refused("blob_unreadable", str(exc)) from None
    finally:
        reader.close()
    data = b"".join(parts)
    sha = digest.hexdigest()
    if len(data) != notice.size or sha != notice.sha256:
        raise Refused("blob_mismatch", f"{slot} holds {len(data)} bytes {sha[:12]}, the notice says {notice.size} bytes "
                                       f"{notice.sha256[:12]}")  # fmt: skip
    return Arrival(sha, data)


def noted_objects(run_dir: Path) -> list[str]:
    """The objects (SHA-256 hex) the run in ``run_dir`` noted as kept in its blob store ([]: no note, or unreadable,
    which is logged: those objects then stay in the store)."""
    note = run_dir / OBJECTS_NOTE
    try:
        return [str(sha) for sha in json.loads(note.read_text())]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError) as exc:
        log.warning("the note of the objects an earlier process left (%s) is unreadable (%s): they stay in the store", note, exc)
        return []


def note_objects_also(run_dir: Path, shas: Collection[str]) -> None:
    """Add ``shas`` to the run's note, so its next process removes them too: a restore from backup brings back the
    note of the backup's time, while a store outside the data folder (S3) still holds what was written since.

    Raises OSError if the note cannot be written."""
    atomic_write_bytes(run_dir / OBJECTS_NOTE, json.dumps(sorted(set(noted_objects(run_dir)) | set(shas))))


class BlobCarrier:
    """The blob carrier (see the module docstring).

    Parameters
    ----------
    link : MqttLink
        The coordinator's broker session (grants and program references go there).
    topics : Topics
    run_id : str
    settings : TransportSettings
    run_dir : Path
        The folder store lives in ``{run_dir}/blobs``.
    refused : callable cid -> bool
        Devices that may no longer send anything (revoked, forgotten).
    store : BlobStore, optional
        A store served by someone else (``serve`` serves its folder store beside the status page); else
        :meth:`open` opens the one ``settings`` names.
    """

    name = "blobs"

    def __init__(self, link: MqttLink, topics: Topics, run_id: str, settings: TransportSettings, run_dir: Path,
                 refused: Callable[[str], bool], store: BlobStore | None = None):  # fmt: skip
        self.link = link
        self.topics = topics
        self.run_id = run_id
        self.settings = settings
        self.run_dir = run_dir
        self.refused = refused
        self.store: BlobStore | None = store
        self._close: Callable[[], None] = lambda: None
        self._objects: dict[str, bytes] = {}  # sha256 -> envelope of the objects the open (or last) exchange uses
        self._grants: dict[str, bytes] = {}  # client id -> its retained grant of the open exchange
        self._granted: set[str] = set()  # clients with a retained grant on the broker (cleared at the end)
        self._open_slots: dict[str, int] = {}  # exchange prefix -> the round after which its slots close
        self._programs: dict[str, str] = {}  # client id -> sha256 of the last program object it was sent
        self._limit = settings.max_update_bytes  # the open exchange's update bound

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        """Open the store (unless one was given) and sweep the slots an earlier process of this run left.

        Raises
        ------
        coordinator.grid.CoordinatorError
            If the store cannot be opened.
        """
        from coordinator.grid import CoordinatorError

        if self.store is None:
            try:
                self.store, self._close = open_blob_store(self.settings, self.run_dir, self.refused)
            except BlobError as exc:
                raise CoordinatorError(f"cannot open the blob store: {exc}") from None
        self._sweep()
        self._drop_left()

    def _drop_left(self) -> None:
        """Remove the objects an earlier process of this run noted (:data:`OBJECTS_NOTE`): none of its URLs is used
        any more, since devices drop an earlier epoch's announcement; what this process needs it writes again."""
        if not (self.run_dir / OBJECTS_NOTE).exists():
            return
        left = noted_objects(self.run_dir)
        for sha in left:
            self._drop_object(sha, -1)
        self._note_objects()
        if left:
            log.info("blob transport: removed %d object(s) an earlier process of this run left in the store", len(left))

    def _note_objects(self) -> None:
        """Write :data:`OBJECTS_NOTE`: the objects this process keeps in the store now (models and programs)."""
        try:
            atomic_write_bytes(self.run_dir / OBJECTS_NOTE, json.dumps(sorted(set(self._objects) | set(self._programs.values()))))
        except OSError as exc:  # a full disk: the objects stay in the store after a restart, nothing else is lost
            log.warning("the note of the blob store's objects was not written (%s)", exc)

    def close(self) -> None:
        moved = [int(getattr(self.store, k, -1)) for k in ("served", "served_bytes", "taken", "taken_bytes")]
        if min(moved) >= 0:  # the folder store counts what its HTTP side moved
            log.info("blob transport: %d model fetch(es) served (%.1f MB), %d upload(s) taken (%.1f MB)", moved[0],
                     moved[1] / 1e6, moved[2], moved[3] / 1e6)  # fmt: skip
        self._close()

    @property
    def _store(self) -> BlobStore:
        if self.store is None:
            raise BlobError("the blob store is not open")
        return self.store

    # ------------------------------------------------------------------ an exchange
    def publish(self, fed: Federation, opening: Opening) -> Published:
        """Write G (if any selected device needs it) and each selected device's P_i to the store, drop the objects no
        exchange needs any more, and hand each selected device its grant (before the announcement goes out)."""
        store = self._store
        spec = fed.spec
        meta = {"arch": spec.to_dict()}
        expires = opening.deadline_unix + URL_GRACE_S
        objects: dict[str, bytes] = {}

        def put(state: Any, cid: str | None) -> BlobRef:
            who = {"client_id": cid} if cid is not None else {}
            env = codec.encode(state, kind="model", round=opening.round, arch_version=spec.version, meta=meta, **who)
            ref = publish_object(store, env, expires)
            objects[ref.sha256] = env
            return ref

        need_global = [c for c in opening.selected if c not in fed.personal]
        g = put(fed.global_state, None) if need_global else None
        personal = {cid: put(fed.personal[cid], cid) for cid in opening.selected if cid in fed.personal}
        for sha in sorted(self._objects.keys() - objects.keys()):
            self._drop_object(sha, opening.round)
        self._objects = objects
        self._note_objects()
        self._limit = opening.update_bytes or self.settings.max_update_bytes
        prefix = exchange_prefix(self.run_id, opening.round, opening.stage)
        self._open_slots[prefix] = opening.round + opening.late_rounds
        for r, last in opening.earlier.items():  # after a restart of serve, its devices' grants work again
            self._open_slots.setdefault(exchange_prefix(self.run_id, r, 0), last)
        self._accepting()
        grant_expiry = expires + opening.late_rounds * max(0.0, opening.deadline_unix - time.time())
        self._grants = {}
        for cid in opening.selected:
            url = store.upload_url(upload_slot(self.run_id, opening.round, opening.stage, cid), grant_expiry, self._limit)
            grant = BlobGrant(self.run_id, opening.round, opening.stage, opening.attempt,
                              UploadGrant(url, grant_expiry, self._limit), personal.get(cid))  # fmt: skip
            self._grants[cid] = grant.to_bytes()
            # Queued, not one round trip each (10,000 grants): paho sends them in order, before the announcement.
            self.link.publish_nowait(self.topics.client_grant(cid), self._grants[cid], retain=True)
            self._granted.add(cid)
        down = (g.size * len(need_global) if g is not None else 0) + sum(r.size for r in personal.values())
        announce = {"selected": (), "transport": self.name, "global_blob": g.to_json() if g is not None else None}
        return Published(g.sha256 if g is not None else "", {c: r.sha256 for c, r in personal.items()}, down, announce)

    def restore(self) -> None:
        for cid, grant in self._grants.items():  # the models are in the store, the grants on the broker
            self.link.publish(self.topics.client_grant(cid), grant, retain=True)

    def arrived(self, cid: str, index: str, payload: bytes, intake: UpdateIntake) -> Arrival | None:
        """Read the update a device's notice announces from its slot, once the intake says the notice may count."""
        if index != BLOB_NOTICE_INDEX:
            raise Refused("wrong_transport", "update chunks arrived, but this coordinator uses the blob transport")
        try:
            notice = BlobNotice.from_bytes(payload)
        except MessageError as exc:
            raise Refused("malformed", str(exc)) from None
        if not intake.screen(cid, notice.run_id, notice.round, notice.stage, notice.sha256):
            return None
        return read_noticed(self._store, cid, notice, self._limit)

    def tick(self, selected: Collection[str]) -> None:
        pass

    def closed(self, round_: int, stage: int, late_rounds: int) -> None:
        """The exchange closed: no more grants to restore; sweep the slots of every exchange no longer open."""
        self._grants = {}
        self._open_slots = {p: last for p, last in self._open_slots.items() if last > round_}
        self._accepting()
        self._sweep()

    def _accepting(self) -> None:
        accept = getattr(self.store, "accept", None)
        if accept is not None:  # the folder store refuses writes to closed slots itself
            accept(set(self._open_slots))

    def _sweep(self) -> None:
        """Delete every upload slot of this run outside the open exchanges (counted ones, junk, late writes)."""
        root = f"uploads/{self.run_id}/"
        try:
            gone = [p for p in self._store.list_exchanges(root) if p not in self._open_slots]
            for prefix in gone:
                self._store.drop_uploads(prefix)
        except BlobError as exc:
            log.warning("the blob store's closed upload slots were not removed (%s); the next sweep tries again", exc)
            return
        if gone:
            log.debug("blob transport: removed the upload slots of %d closed exchange(s)", len(gone))

    def forget(self, cid: str) -> None:
        """Device ``cid`` is refused: its slots in open exchanges and its own objects go, its grant is withdrawn."""
        store = self._store
        for prefix in self._open_slots:
            try:
                store.drop_uploads(prefix + cid)
            except BlobError as exc:
                log.warning("the upload slot of %s in %s was not removed (%s)", cid, prefix, exc)
        self._grants.pop(cid, None)
        program = self._programs.pop(cid, None)
        if program is not None:
            self._drop_object(program, -1)
            self._note_objects()

    def bad_object(self, sha256: str) -> bool:
        env = self._objects.get(sha256)
        if env is None:
            return False
        try:
            self._store.put_object(env, replace=True)
        except BlobError as exc:
            log.warning("the damaged object %s was not written again (%s)", sha256[:12], exc)
            return False
        log.warning("a device found object %s damaged; it is written again", sha256[:12])
        return True

    def _drop_object(self, sha: str, round_: int) -> None:
        try:
            self._store.drop_object(sha)
        except BlobError as exc:
            log.warning("round %d: an earlier object %s was not removed from the blob store (%s)", round_, sha[:12], exc)

    def finish(self) -> None:
        self.link.clear_retained([self.topics.client_grant(cid) for cid in sorted(self._granted)])

    def send_program(self, cid: str, version: int, envelope: bytes) -> str:
        """Write the program envelope to the store (one object per device: the one sent before is dropped) and send the reference."""
        ref = publish_object(self._store, envelope, time.time() + PROGRAM_URL_TTL_S)
        self.link.publish(self.topics.client_programs(cid, PROGRAM_BLOB_INDEX), ProgramBlob(self.run_id, version, ref).to_bytes())
        old = self._programs.get(cid)
        self._programs[cid] = ref.sha256
        if old is not None and old != ref.sha256 and old not in self._programs.values():
            self._drop_object(old, -1)
        self._note_objects()
        return f"{len(envelope)} bytes through the blob store, object {ref.sha256[:12]}"
