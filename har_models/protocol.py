"""Wire protocol: topics, JSON control messages and chunked binary transfers over MQTT.

Everything here works on MQTT 3.1.1 (the embedded broker speaks nothing newer).

Topics (``{p}`` = ``fedhar/v1/{federation}``)::

    {p}/coordinator/status          retained; last will "offline"
    {p}/round                       retained round announcement (JSON)
    {p}/model/global/{i}            retained chunk i of the current global model envelope
    {p}/client/{cid}/status         retained client status (JSON); last will "offline"
    {p}/client/{cid}/model/{i}      retained chunk i of the client's personalised model
    {p}/client/{cid}/update/{i}     chunk i of the client's update envelope (not retained)

Large envelopes travel in chunks of at most ``max_message_bytes`` so brokers with a 1 MB
packet limit work. Each chunk carries the sha256 of the whole envelope (the transfer id),
its index, the chunk count, the total length and a CRC-32 of its own payload; the
receiver drops a chunk whose CRC fails and checks the sha256 of the reassembled
envelope, so a corrupted or mixed-up chunk can never produce a wrong envelope.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from har_models.settings import AlaConfig, LocalTraining, from_mapping

PROTOCOL_VERSION = 1

MAX_WINDOW_COUNT = 10**9
"""Upper bound on any window count a device reports (n_train, n_test, class counts, confusion
entries): 10^9 windows of 3 KB are 3 TB, far beyond a phone. Larger numbers from the network
are refused where they enter, so no single device can take over a weighted average."""


def check_count(value: Any, what: str) -> int:
    """``value`` if it is an integer in [0, :data:`MAX_WINDOW_COUNT`] (not a bool or float), else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WINDOW_COUNT:
        raise ValueError(f"{what} must be an integer in [0, {MAX_WINDOW_COUNT}], got {value!r:.40}")
    return value
DEFAULT_MAX_MESSAGE_BYTES = 1_000_000
"""Default largest MQTT payload we publish (EMQX's default packet limit is 1 MB)."""

GUIDANCE_PREFIX = "guidance/"
"""Name prefix of the FedDWA guidance model's tensors inside an update envelope."""

CLIENT_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
FEDERATION_RE = CLIENT_ID_RE


def check_client_id(cid: str) -> str:
    """Return ``cid`` if it is a valid client id (letters, digits, ``_ . -``, 1-64 chars).

    Raises
    ------
    ValueError
        Naming the id and the allowed characters.
    """
    if not isinstance(cid, str) or not CLIENT_ID_RE.match(cid):
        raise ValueError(f"client id {cid!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    return cid


@dataclass(frozen=True)
class Topics:
    """Topic names of one federation.

    Parameters
    ----------
    federation : str
        Federation name (same rules as a client id).
    root : str
        Versioned topic root (default ``fedhar/v1``).
    """

    federation: str = "default"
    root: str = "fedhar/v1"

    def __post_init__(self) -> None:
        if not FEDERATION_RE.match(self.federation):
            raise ValueError(f"federation name {self.federation!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")

    @property
    def prefix(self) -> str:
        return f"{self.root}/{self.federation}"

    @property
    def coordinator_status(self) -> str:
        return f"{self.prefix}/coordinator/status"

    @property
    def round(self) -> str:
        return f"{self.prefix}/round"

    def global_model(self, index: int | str) -> str:
        return f"{self.prefix}/model/global/{index}"

    def client_status(self, cid: str) -> str:
        return f"{self.prefix}/client/{cid}/status"

    def client_model(self, cid: str, index: int | str) -> str:
        return f"{self.prefix}/client/{cid}/model/{index}"

    def client_update(self, cid: str, index: int | str) -> str:
        return f"{self.prefix}/client/{cid}/update/{index}"

    def parse_client_topic(self, topic: str) -> tuple[str, str] | None:
        """``(client_id, kind)`` for a ``{p}/client/{cid}/{kind}/...`` topic, else None."""
        parts = topic.split("/")
        base = self.prefix.split("/")
        if len(parts) < len(base) + 3 or parts[: len(base)] != base or parts[len(base)] != "client":
            return None
        return parts[len(base) + 1], parts[len(base) + 2]


# ---------------------------------------------------------------------------------------
# Chunked transfers

_CHUNK = struct.Struct("<4s32sIIQI")  # magic, transfer sha256, index, count, total_len, CRC-32 of the chunk payload
CHUNK_MAGIC = b"FHC1"
CHUNK_HEADER_BYTES = _CHUNK.size


class ChunkError(ValueError):
    """A chunk that must be dropped; ``reason`` is a short code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Chunk:
    """One parsed chunk. ``transfer`` is the hex sha256 of the whole payload."""

    transfer: str
    index: int
    count: int
    total_len: int
    payload: bytes


def transfer_id(payload: bytes) -> str:
    """The id under which ``payload`` travels: its sha256, hex (what :class:`Chunk` carries)."""
    return hashlib.sha256(payload).hexdigest()


def iter_chunks(payload: bytes, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """Cut ``payload`` into chunk messages of at most ``max_message_bytes`` bytes each, lazily.

    Parameters
    ----------
    payload : bytes
        The envelope.
    max_message_bytes : int
        Largest MQTT payload allowed (bytes); must exceed the 56-byte chunk header.

    Yields
    ------
    bytes
        ``ceil(len(payload) / (max_message_bytes - 56))`` messages (at least one), each a
        56-byte header and a slice of the payload.

    Raises
    ------
    ValueError
        If ``max_message_bytes`` leaves no room for data.
    """
    room = int(max_message_bytes) - CHUNK_HEADER_BYTES
    if room <= 0:
        raise ValueError(f"max_message_bytes={max_message_bytes} must exceed the {CHUNK_HEADER_BYTES}-byte chunk header")
    digest = hashlib.sha256(payload).digest()
    count = max(1, -(-len(payload) // room))
    view = memoryview(payload)
    for i in range(count):
        part = view[i * room : (i + 1) * room]
        yield _CHUNK.pack(CHUNK_MAGIC, digest, i, count, len(payload), zlib.crc32(part)) + part


def split_payload(payload: bytes, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[bytes]:
    """All chunk messages of ``payload`` as a list (see :func:`iter_chunks`)."""
    return list(iter_chunks(payload, max_message_bytes))


def parse_chunk(message: bytes) -> Chunk:
    """Parse and verify one chunk message.

    Raises
    ------
    ChunkError
        reason ``"bad_chunk"`` for a short message, wrong magic or inconsistent counters,
        ``"chunk_crc_mismatch"`` when the payload does not match its CRC-32.
    """
    if len(message) < CHUNK_HEADER_BYTES:
        raise ChunkError("bad_chunk", f"chunk of {len(message)} bytes is shorter than its {CHUNK_HEADER_BYTES}-byte header")
    magic, transfer, index, count, total, crc = _CHUNK.unpack_from(message)
    if magic != CHUNK_MAGIC:
        raise ChunkError("bad_chunk", f"chunk starts with {magic!r}, expected {CHUNK_MAGIC!r}")
    if count == 0 or index >= count:
        raise ChunkError("bad_chunk", f"chunk index {index} out of range for count {count}")
    payload = bytes(message[CHUNK_HEADER_BYTES:])
    if zlib.crc32(payload) != crc:
        raise ChunkError("chunk_crc_mismatch", f"chunk {index}/{count} of transfer {transfer.hex()[:12]} is corrupted (CRC-32)")
    return Chunk(transfer.hex(), index, count, total, payload)


@dataclass
class _Partial:
    count: int
    total_len: int
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0
    started: float = field(default_factory=time.monotonic)


class Reassembler:
    """Collects chunks into whole payloads, per stream (e.g. one client's update topic).

    Duplicated chunks (QoS 1 redelivery) are harmless; chunks of a transfer that already
    completed are ignored; a stream keeps at most ``max_partial_per_stream`` unfinished
    transfers (the oldest is dropped), and all unfinished data is capped at
    ``max_buffer_bytes``; transfers older than ``ttl_s`` are dropped.

    Parameters
    ----------
    max_payload_bytes : int
        Largest payload accepted (bytes); bigger announced totals are rejected.
    max_buffer_bytes : int
        Cap on bytes held in unfinished transfers (bytes).
    ttl_s : float
        Seconds an unfinished transfer may wait for its remaining chunks.
    max_partial_per_stream : int
        Unfinished transfers kept per stream.
    """

    def __init__(
        self,
        max_payload_bytes: int = 512 * 1024 * 1024,
        max_buffer_bytes: int = 2 * 1024 * 1024 * 1024,
        ttl_s: float = 600.0,
        max_partial_per_stream: int = 2,
    ):
        self.max_payload_bytes = max_payload_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.ttl_s = ttl_s
        self.max_partial_per_stream = max_partial_per_stream
        self._partial: OrderedDict[tuple[str, str], _Partial] = OrderedDict()
        self._done: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._buffered = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes currently held in unfinished transfers."""
        return self._buffered

    def add(self, stream: str, message: bytes) -> tuple[str, bytes] | None:
        """Add one chunk message; return ``(transfer, payload)`` when a transfer completes.

        Raises
        ------
        ChunkError
            For a malformed or corrupted chunk (``bad_chunk``, ``chunk_crc_mismatch``),
            a chunk that contradicts earlier chunks of its transfer (``inconsistent_chunk``),
            a payload over the limit (``oversized``) or a reassembled payload whose digest is
            wrong (``transfer_sha256_mismatch``). Nothing is delivered in these cases.
        """
        chunk = parse_chunk(message)
        key = (stream, chunk.transfer)
        if key in self._done:
            return None
        if chunk.total_len > self.max_payload_bytes:
            raise ChunkError("oversized", f"transfer of {chunk.total_len} bytes exceeds the limit of {self.max_payload_bytes}")
        self._expire()
        part = self._partial.get(key)
        if part is None:
            part = _Partial(chunk.count, chunk.total_len)
            self._partial[key] = part
            same_stream = [k for k in self._partial if k[0] == stream]
            for k in same_stream[: max(0, len(same_stream) - self.max_partial_per_stream)]:
                self._drop(k)
        elif (part.count, part.total_len) != (chunk.count, chunk.total_len):
            self._drop(key)
            raise ChunkError(
                "inconsistent_chunk", f"chunk {chunk.index} of transfer {chunk.transfer[:12]} disagrees on count/length"
            )
        if chunk.index not in part.parts:
            part.parts[chunk.index] = chunk.payload
            part.size += len(chunk.payload)
            self._buffered += len(chunk.payload)
        while self._buffered > self.max_buffer_bytes and self._partial:
            self._drop(next(iter(self._partial)))
        if key not in self._partial or len(part.parts) < part.count:
            return None
        payload = b"".join(part.parts[i] for i in range(part.count))
        self._drop(key)
        self._done[key] = None
        while len(self._done) > 256:
            self._done.popitem(last=False)
        if len(payload) != part.total_len or hashlib.sha256(payload).hexdigest() != chunk.transfer:
            raise ChunkError("transfer_sha256_mismatch", f"reassembled transfer {chunk.transfer[:12]} does not match its digest")
        return chunk.transfer, payload

    def _drop(self, key: tuple[str, str]) -> None:
        part = self._partial.pop(key, None)
        if part is not None:
            self._buffered -= part.size

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._partial.items() if now - p.started > self.ttl_s]:
            self._drop(key)


# ---------------------------------------------------------------------------------------
# JSON control messages


class MessageError(ValueError):
    """A JSON control message that must be ignored (malformed or of another protocol)."""


def _load_json(payload: bytes, what: str) -> dict[str, Any]:
    try:
        d = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise MessageError(f"{what}: expected a JSON object")
    if d.get("protocol") != PROTOCOL_VERSION:
        raise MessageError(f"{what}: protocol {d.get('protocol')!r}, this build speaks {PROTOCOL_VERSION}")
    return d


@dataclass(frozen=True)
class TrainingPlan:
    """What a selected client must do in a round (part of the announcement).

    Parameters
    ----------
    local_epochs : int
        E, passes over the local training windows.
    lr : float
        SGD learning rate eta.
    batch_size : int
        B, windows per SGD step.
    prox_mu : float
        FedProx proximal weight mu (0 = plain FedAvg local objective).
    client_init : {"overwrite", "ala"}
        How the client combines the received and its previous local model (FedALA).
    guidance : bool
        Also train the FedDWA guidance model (one more local pass) and upload it.
    keep_local : tuple of str
        Tensor names the client keeps from its own model (FedPer personal layers).
    frozen : tuple of str
        Tensor names not trained this round (FedDist paper-mode intermediate rounds).
    class_weights : {"balanced", "none"}
        Per-client class weights in the loss (FedDist used sklearn's "balanced").
    seed : int
        Base seed; each client derives its own from it, its id and the round.
    ala : dict
        FedALA settings (eta, rand_percent, layer_idx, threshold, num_pre_loss, max_passes).
    """

    local_epochs: int = LocalTraining.local_epochs
    lr: float = LocalTraining.lr
    batch_size: int = LocalTraining.batch_size
    prox_mu: float = 0.0
    client_init: str = "overwrite"
    guidance: bool = False
    keep_local: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    class_weights: str = LocalTraining.class_weights
    seed: int = 1
    ala: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.local_epochs < 0 or self.batch_size <= 0 or not (self.lr >= 0) or not (self.prox_mu >= 0):
            raise ValueError(
                f"TrainingPlan: need local_epochs >= 0, batch_size > 0, lr >= 0, prox_mu >= 0; got "
                f"{self.local_epochs}, {self.batch_size}, {self.lr}, {self.prox_mu}"
            )
        if self.client_init not in ("overwrite", "ala"):
            raise ValueError(f"TrainingPlan.client_init must be 'overwrite' or 'ala', got {self.client_init!r}")
        if self.class_weights not in ("balanced", "none"):
            raise ValueError(f"TrainingPlan.class_weights must be 'balanced' or 'none', got {self.class_weights!r}")
        object.__setattr__(self, "keep_local", tuple(self.keep_local))
        object.__setattr__(self, "frozen", tuple(self.frozen))
        # Checked here, where the plan enters a client, so that a mistyped key is refused
        # with its name instead of killing the trainer later.
        self.ala_config()

    def ala_config(self) -> AlaConfig:
        """The typed FedALA settings of :attr:`ala`.

        Raises
        ------
        ValueError
            For an unknown key, a wrong type or a value out of range (named in the message).
        """
        return from_mapping(AlaConfig, self.ala, "training plan ala")

    @classmethod
    def from_json(cls, d: Any) -> TrainingPlan:
        """Build from a JSON object; unknown keys are an error."""
        if not isinstance(d, dict):
            raise MessageError("training plan: expected an object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise MessageError(f"training plan: unknown fields {sorted(unknown)}")
        try:
            return cls(**d)
        except (TypeError, ValueError, OverflowError) as exc:
            raise MessageError(f"training plan: {exc}") from None


@dataclass(frozen=True)
class RoundAnnouncement:
    """The retained message that opens a round (or says the federation is finished).

    Parameters
    ----------
    run_id : str
        Identifies the run; clients keep their per-run state apart.
    round : int
        Round index r (0-based).
    state : {"training", "finished"}
    arch : dict
        :class:`~har_models.model.ArchSpec` as a JSON object (widths, version, normalisation).
    label_set : str
        Name of the label set all windows must use.
    selected : tuple of str
        Client ids that should train in this round.
    plan : TrainingPlan
    global_model : str
        Transfer id (sha256 hex) of the model on the global model topic, or "".
    personal_models : dict of str -> str
        Transfer id of each client's personalised model, for clients that get their own.
    deadline_unix : float
        Wall-clock time (s since epoch) after which the coordinator closes the round.
    stage : int
        0 for the main exchange; FedDist paper-mode intermediate exchanges count up.
    attempt : str
        Changes whenever the coordinator (re)starts; a client that already answered this
        round sends its stored update again instead of retraining.
    """

    run_id: str
    round: int
    state: str
    arch: dict[str, Any]
    label_set: str
    selected: tuple[str, ...] = ()
    plan: TrainingPlan = field(default_factory=TrainingPlan)
    global_model: str = ""
    personal_models: dict[str, str] = field(default_factory=dict)
    deadline_unix: float = 0.0
    stage: int = 0
    attempt: str = ""

    def model_for(self, cid: str) -> tuple[str, str]:
        """``(source, transfer)`` of the model ``cid`` must start from: source is "personal" or "global"."""
        if cid in self.personal_models:
            return "personal", self.personal_models[cid]
        return "global", self.global_model

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["protocol"] = PROTOCOL_VERSION
        d["selected"] = list(self.selected)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> RoundAnnouncement:
        """Parse an announcement.

        Raises
        ------
        MessageError
            If the message is not JSON, of another protocol version, or malformed.
        """
        d = _load_json(payload, "round announcement")
        d.pop("protocol")
        try:
            d["plan"] = TrainingPlan.from_json(d.get("plan", {}))
            d["selected"] = tuple(check_client_id(c) for c in d.get("selected", []))
            ann = cls(**d)
        except (TypeError, ValueError) as exc:
            raise MessageError(f"round announcement: {exc}") from None
        if ann.state not in ("training", "finished") or not isinstance(ann.round, int) or ann.round < 0:
            raise MessageError(f"round announcement: bad state {ann.state!r} or round {ann.round!r}")
        if not isinstance(ann.arch, dict) or not isinstance(ann.personal_models, dict):
            raise MessageError("round announcement: 'arch' and 'personal_models' must be objects")
        return ann


@dataclass(frozen=True)
class ClientStatus:
    """Retained presence and capability message of a client.

    Parameters
    ----------
    client_id : str
    state : {"online", "offline", "training", "idle"}
    label_set : str
        Label set of the client's windows.
    n_train, n_test : int
        Numbers of local training and test windows.
    train_stats : dict
        :class:`~har_models.windowing.ChannelStats` of the training windows (JSON form).
    class_counts : list of int
        Training windows per class.
    run_id : str
        Run the client last worked for.
    last_round : int
        Last round whose update the client sent (-1 if none).
    """

    client_id: str
    state: str
    label_set: str = ""
    n_train: int = 0
    n_test: int = 0
    train_stats: dict[str, Any] = field(default_factory=dict)
    class_counts: tuple[int, ...] = ()
    run_id: str = ""
    last_round: int = -1

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["protocol"] = PROTOCOL_VERSION
        d["class_counts"] = list(self.class_counts)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> ClientStatus:
        """Parse a status message.

        Raises
        ------
        MessageError
            If it is not JSON, of another protocol, or malformed.
        """
        d = _load_json(payload, "client status")
        d.pop("protocol")
        try:
            counts = d.get("class_counts", ())
            if not isinstance(counts, list):
                raise ValueError("class_counts must be a list")
            d["class_counts"] = tuple(check_count(c, "class_counts[i]") for c in counts)
            st = cls(**d)
            check_client_id(st.client_id)
            check_count(st.n_train, "n_train")
            check_count(st.n_test, "n_test")
            if isinstance(st.last_round, bool) or not isinstance(st.last_round, int):
                raise ValueError(f"last_round must be an integer, got {st.last_round!r:.40}")
            if not isinstance(st.label_set, str) or not isinstance(st.run_id, str) or not isinstance(st.train_stats, dict):
                raise ValueError("label_set and run_id must be strings, train_stats an object")
        except (TypeError, ValueError, OverflowError) as exc:
            raise MessageError(f"client status: {exc}") from None
        if st.state not in ("online", "offline", "training", "idle"):
            raise MessageError(f"client status: unknown state {st.state!r:.40}")
        return st


def offline_status(cid: str) -> bytes:
    """The last-will payload of a client: a minimal status saying it is offline."""
    return ClientStatus(check_client_id(cid), "offline").to_bytes()
