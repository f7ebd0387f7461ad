"""The client's side of program delivery: ask the coordinator for the ExecuTorch ``.pte`` programs it lacks, check, store.

A client that trains through exported programs but cannot export them (a phone, a board without
PyTorch: :func:`needs_delivery`) keeps a :class:`ProgramFetcher`: before a round whose architecture
it has no programs for, it sends a :class:`~har_models.wire.pte_delivery.ProgramRequest` (again
after 60, 120, 240, 300, ... s, never while chunks arrive), receives the ``"program"`` envelope on
its own ``programs/{i}`` topics, checks it (:func:`~har_models.wire.pte_delivery.decode_programs`;
with the Python runtime also the exporter's cache key) and stores it where the backend finds it.
A set the runtime then refuses makes the round train on numpy. No PyTorch imported here; the
exchange: docs/protocol.md ("ExecuTorch programs").
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from edge_client.bad_objects import BadObjects
from har_io.blob_http import BlobMismatch, fetch_model
from har_io.blobs import BlobError
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.blob_messages import ProgramBlob
from har_models.wire.chunking import ChunkError, Reassembler, peek_transfer
from har_models.wire.messages import MessageError, RoundAnnouncement
from har_models.wire.pte_delivery import ProgramError, ProgramRequest, ProgramSet, decode_programs, find_programs, store_programs
from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.client.programs")

PROGRAM_MODES = ("auto", "export", "fetch")
"""How an ExecuTorch client gets its programs: ``export`` them itself (needs PyTorch and the exporter),
``fetch`` them from the coordinator, or ``auto``: fetch where the exporter cannot run."""
PROGRAM_BACKENDS = ("executorch", "executorch-android")
"""Backends that run exported programs."""
STREAM = "programs"
QUIET_S = 10.0
"""A request is repeated only once no program chunk arrived for this many seconds."""
Publish = Callable[[str, bytes], None]


def needs_delivery(backend: str, mode: str = "auto") -> bool:
    """True if a client with ``backend`` must get its programs from the coordinator: always ``executorch-android``;
    ``executorch`` with ``mode="fetch"``, or ``"auto"`` without PyTorch. ValueError on a mode not in :data:`PROGRAM_MODES`."""
    if mode not in PROGRAM_MODES:
        raise ValueError(f"programs mode must be one of {PROGRAM_MODES}, got {mode!r}")
    if backend == "executorch-android":
        return True
    if backend != "executorch" or mode == "export":
        return False
    return mode == "fetch" or importlib.util.find_spec("torch") is None


class ProgramFetcher:
    """Requests, checks and stores the programs of the announced architecture in ``folder`` (see the module docstring).

    ``backend`` ``"executorch"`` also checks the exporter's cache key; ``max_bytes`` bounds an
    envelope; ``retry_s`` is the first wait before asking again (doubling up to 300 s).
    """

    def __init__(
        self, client_id: str, topics: Topics, folder: str | os.PathLike[str], backend: str, max_bytes: int, retry_s: float = 60.0
    ):
        self.client_id, self.topics, self.folder, self.backend = client_id, topics, Path(folder), backend
        self.max_bytes, self.retry_s = int(max_bytes), float(retry_s)
        self.reassembler = Reassembler(max_payload_bytes=self.max_bytes)
        self._have: set[str] = set()  # spec JSON with a stored set
        self._wanted: dict[int, tuple[str, ArchSpec]] = {}  # version -> (run, spec) asked for
        self._next_ask: dict[str, tuple[float, float]] = {}  # spec JSON -> (monotonic time of the next request, wait after it)
        self.requests = 0
        self._last_chunk = -float("inf")  # monotonic time of the last program chunk
        self.stored: list[int] = []  # versions stored, in order
        self.rejected: list[str] = []  # reasons of rejected envelopes, in order
        self.bad = BadObjects()  # program sets whose bytes did not match their hash (the agent gives its own, for its status)

    def subscriptions(self) -> list[tuple[str, int]]:
        """The topic filter (QoS 1) the client must subscribe to: its own program chunks."""
        return [(self.topics.client_programs(self.client_id, "+"), 1)]

    def owns(self, topic: str) -> bool:
        """True for a chunk topic of this client's programs."""
        return topic.startswith(self.topics.client_programs(self.client_id, ""))

    def have(self, spec: ArchSpec) -> bool:
        """True if a complete set for exactly ``spec`` is stored."""
        key = spec.to_json()
        if key not in self._have and find_programs(self.folder, spec) is not None:
            self._have.add(key)
        return key in self._have

    def ready(self, ann: RoundAnnouncement, publish: Publish) -> bool:
        """True if the programs of ``ann``'s architecture are stored; otherwise ask for them when due and return False
        (an architecture that does not parse is left to the trainer: True)."""
        try:
            spec = ArchSpec.from_json(ann.arch)
        except ValueError:
            return True  # the round's own checks reject it with a reason
        if self.have(spec):
            return True
        key = spec.to_json()
        now = time.monotonic()
        due, wait = self._next_ask.get(key, (0.0, self.retry_s))
        if now >= due and now - self._last_chunk >= QUIET_S:  # not while a transfer is arriving
            self._wanted = {spec.version: (ann.run_id, spec)}
            if self.requests == 0 or key not in self._next_ask:
                log.info("[%s] no ExecuTorch programs for architecture v%d here; asking the coordinator", self.client_id, spec.version)
            else:
                log.info("[%s] the programs of v%d have not arrived; asking again", self.client_id, spec.version)
            publish(self.topics.client_program_request(self.client_id), ProgramRequest(ann.run_id, spec.version).to_bytes())
            self.requests += 1
            self._next_ask[key] = (now + wait, min(300.0, 2 * wait))
        return False

    def on_message(self, payload: bytes) -> None:
        """Take one program chunk, or a reference to the programs in the blob store; check and store a whole set (never raises)."""
        if payload[:1] == b"{":
            self._on_blob(payload)
            return
        t = peek_transfer(payload)
        self._last_chunk = time.monotonic()
        try:
            done = self.reassembler.add(STREAM, payload)
        except ChunkError as exc:
            if exc.reason == "transfer_sha256_mismatch" and t is not None:
                self.bad.refused(t)
            log.warning("[%s] dropped a program chunk (%s): %s", self.client_id, exc.reason, exc)
            return
        if done is None:
            return
        if t is not None:
            self.reassembler.forget(STREAM, t)  # stored or rejected: a later send of the same bytes is looked at again
        self._take(done[1])

    def _on_blob(self, payload: bytes) -> None:
        """Blob transport: fetch the program envelope a :class:`ProgramBlob` names (checked byte for byte), then take it."""
        try:
            msg = ProgramBlob.from_bytes(payload)
        except MessageError as exc:
            log.warning("[%s] ignoring a malformed program reference: %s", self.client_id, exc)
            return
        if msg.arch_version not in self._wanted:
            self.rejected.append("unrequested")
            log.error("[%s] rejected the programs received (unrequested): v%d, none asked for", self.client_id, msg.arch_version)
            return
        try:
            envelope = fetch_model(msg.ref, self.max_bytes)
        except BlobError as exc:
            if isinstance(exc, BlobMismatch):
                self.bad.refused(msg.ref.sha256)
            log.warning("[%s] cannot fetch the programs of v%d: %s; asking again later", self.client_id, msg.arch_version, exc)
            return
        self._take(envelope)

    def _take(self, envelope: bytes) -> None:
        """Check a whole program envelope (:meth:`accept`) and store it."""
        try:
            programs = self.accept(envelope)
        except ProgramError as exc:
            self.rejected.append(exc.reason)
            log.error("[%s] rejected the programs received (%s): %s", self.client_id, exc.reason, exc)
            return
        try:
            store_programs(self.folder, programs)
        except OSError as exc:
            log.error("[%s] cannot store the programs of v%d in %s: %s", self.client_id, programs.spec.version, self.folder, exc)
            return
        self._have.add(programs.spec.to_json())
        self._next_ask.pop(programs.spec.to_json(), None)
        self.stored.append(programs.spec.version)
        log.info("[%s] stored the ExecuTorch programs of architecture v%d (%d bytes) in %s", self.client_id, programs.spec.version,
                 len(envelope), self.folder)  # fmt: skip

    def accept(self, envelope: bytes) -> ProgramSet:
        """Check a whole program envelope against the request made for its version.

        Raises ProgramError: ``unrequested``, every reason of :func:`~har_models.wire.pte_delivery.decode_programs`,
        and ``runtime_mismatch`` when this runtime's cache key differs from the exporter's.
        """
        try:
            header = codec.peek_header(envelope)
        except codec.EnvelopeError as exc:
            raise ProgramError(exc.reason, str(exc)) from None
        wanted = self._wanted.get(header["arch_version"])
        if wanted is None:
            raise ProgramError("unrequested", f"programs of v{header['arch_version']} arrived; none were asked for")
        run_id, spec = wanted
        programs = decode_programs(envelope, client_id=self.client_id, run_id=run_id, spec=spec, max_bytes=self.max_bytes)
        if self.backend == "executorch":
            local = _local_key(programs)
            if local is not None and local != programs.key:
                raise ProgramError(
                    "runtime_mismatch",
                    f"the programs' cache key {programs.key} differs from this runtime's {local} (another executorch "
                    "version or batch limits than the coordinator's exporter): install the coordinator's executorch version",
                )
        return programs


def _local_key(programs: ProgramSet) -> str | None:
    """This runtime's cache key for ``programs`` (None where the exporter's module cannot be imported)."""
    try:
        from har_models.nn.export import program_key

        return program_key(programs.spec, int(programs.meta["train_batch"]), int(programs.meta["infer_batch"]))
    except Exception:
        return None


def make_fetcher(client_id: str, topics: Topics, backend: str, mode: str, folder: str | os.PathLike[str] | None,
                 state_dir: str | os.PathLike[str], max_bytes: int) -> ProgramFetcher | None:  # fmt: skip
    """The fetcher of a client that needs delivered programs, storing in ``folder`` (``--program-cache``) else
    ``<state_dir>/programs``; else None. ValueError on an unknown ``mode``."""
    if not needs_delivery(backend, mode):
        return None
    where = Path(folder) if folder else Path(state_dir) / "programs"
    return ProgramFetcher(client_id, topics, where, backend, max_bytes)
