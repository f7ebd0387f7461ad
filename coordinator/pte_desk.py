"""The coordinator's program desk: ExecuTorch ``.pte`` programs of the current architecture for clients that ask.

(``pte_*`` modules are about ``.pte`` files, never the console programs.) A client that trains through
exported programs but cannot export them sends a ProgramRequest on ``{p}/client/{cid}/program_request``
(docs/protocol.md). The desk checks it, exports the current architecture's programs
(:func:`har_models.nn.export.ensure_programs`, cached per architecture) and sends one ``"program"``
envelope in chunks on ``{p}/client/{cid}/programs/{i}``, not retained. Export and sending run on one
worker thread; a request already queued is dropped and one within ``min_interval_s`` of the last
send is ``repeated_request``. A federation whose clients never ask never starts the thread.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import queue
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path

from har_io.install_hints import install_hint
from har_io.mqtt_link import MqttLink
from har_io.threads import join_started
from har_models.nn.arch import ArchSpec
from har_models.wire.pte_delivery import PROGRAM_FILES, ProgramError, ProgramRequest, ProgramSet, encode_programs
from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.coordinator.programs")


def default_cache() -> Path:
    """Where exported programs are cached: ``FEDHAR_PROGRAM_CACHE``, else ``~/.cache/fedhar/programs`` (as the clients)."""
    return Path(os.environ.get("FEDHAR_PROGRAM_CACHE", Path.home() / ".cache" / "fedhar" / "programs"))


Rejected = Callable[[str, str, str], None]


class ProgramDesk:
    """Answers program requests of one run (see the module docstring).

    Requests of another ``run_id`` are ``wrong_run``; ``on_reject(client, reason, detail)`` is called on
    the first rejection of each (client, reason); ``send(client, version, envelope)`` is how an answer
    travels (default: chunks on the client's program topics), returning a line for the log.
    """

    def __init__(
        self,
        link: MqttLink,
        topics: Topics,
        run_id: str,
        current_spec: Callable[[], ArchSpec | None],
        cache_dir: str | os.PathLike[str] | None = None,
        on_reject: Rejected | None = None,
        min_interval_s: float = 30.0,
        send: Callable[[str, int, bytes], str] | None = None,
    ):
        self.link, self.topics, self.run_id = link, topics, run_id
        self.send = send or self._send_chunks
        self.current_spec = current_spec
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache()
        self.on_reject = on_reject
        self.rejected: Counter[tuple[str, str]] = Counter()
        self.sent: Counter[tuple[str, int]] = Counter()  # (client, version) -> envelopes sent
        self.min_interval_s = float(min_interval_s)
        self._last_sent: dict[tuple[str, str], float] = {}  # (client, spec JSON) -> monotonic time of the last send
        self._queue: queue.Queue[tuple[str, ArchSpec] | None] = queue.Queue()
        self._queued: set[tuple[str, str]] = set()  # (client, spec JSON) waiting or being answered
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._sets: OrderedDict[str, ProgramSet] = OrderedDict()  # spec JSON -> exported set (two newest)

    def on_request(self, cid: str, payload: bytes) -> None:
        """Check client ``cid``'s request and queue the answer; never raises (a bad one is counted, logged once, dropped).

        Reasons: those of :meth:`ProgramRequest.from_bytes`, ``wrong_run``, ``no_architecture``,
        ``unknown_version``, ``programs_unavailable`` (no executorch here), ``repeated_request``.
        """
        try:
            req = ProgramRequest.from_bytes(payload)
            if req.run_id != self.run_id:
                raise ProgramError("wrong_run", f"request for run {req.run_id!r}; this is run {self.run_id!r}")
            spec = self.current_spec()
            if spec is None:
                raise ProgramError("no_architecture", "no federation yet; ask again once a round is announced")
            if req.arch_version != spec.version:
                raise ProgramError("unknown_version", f"programs of architecture version {req.arch_version} asked for; the "
                                                      f"federation is at version {spec.version}")  # fmt: skip
            if importlib.util.find_spec("executorch") is None:
                raise ProgramError("programs_unavailable", "executorch is not installed on the coordinator: "
                                                           f"{install_hint('executorch')} there")  # fmt: skip
        except ProgramError as exc:
            self._reject(cid, exc.reason, str(exc))
            return
        job = (cid, spec.to_json())
        with self._lock:
            if job in self._queued:
                log.debug("program request of %s for v%d already queued", cid, spec.version)
                return
            since = time.monotonic() - self._last_sent.get(job, -float("inf"))
            if since < self.min_interval_s:
                self._reject(cid, "repeated_request", f"the programs of v{spec.version} were sent {since:.0f} s ago; "
                                                      f"ask again after {self.min_interval_s:.0f} s")  # fmt: skip
                return
            self._queued.add(job)
        log.info("client %s asked for the ExecuTorch programs of architecture v%d", cid, spec.version)
        self._queue.put((cid, spec))
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="program-desk", daemon=True)
            self._thread.start()

    def _reject(self, cid: str, reason: str, detail: str) -> None:
        key = (cid[:64], reason)
        self.rejected[key] += 1
        if self.rejected[key] == 1:
            log.warning("rejected program request from %s: %s (%s); repeats are counted", key[0], reason, detail[:300])
            if self.on_reject is not None:
                self.on_reject(key[0], reason, detail[:300])

    def programs_for(self, spec: ArchSpec) -> ProgramSet:
        """The exported set for ``spec`` (exported into the cache if absent; two kept in memory); ImportError without executorch."""
        key = spec.to_json()
        if key in self._sets:
            return self._sets[key]
        from har_models.nn.export import ensure_programs, read_program_spec  # PyTorch and the exporter, only when asked

        files = ensure_programs(spec, self.cache_dir)
        _, meta = read_program_spec(files.meta)
        paths = {"train": files.train, "infer": files.infer, "infer_static": files.infer_static, "weights_ptd": files.weights_ptd}
        assert set(paths) == set(PROGRAM_FILES)
        found = ProgramSet(spec, dict(meta), {n: p.read_bytes() for n, p in paths.items()})
        self._sets[key] = found
        while len(self._sets) > 2:
            self._sets.popitem(last=False)
        return found

    def _serve(self) -> None:
        """The worker thread: export (cached) and send each queued answer; failures are logged, never raised."""
        from importlib.metadata import version

        while True:
            job = self._queue.get()
            if job is None:
                return
            cid, spec = job
            try:
                programs = self.programs_for(spec)
                env = encode_programs(programs, client_id=cid, run_id=self.run_id, executorch_version=version("executorch"))
                how = self.send(cid, spec.version, env)
                log.info("sent the ExecuTorch programs of v%d to %s: %s", spec.version, cid, how)
                self.sent[(cid, spec.version)] += 1
                with self._lock:
                    self._last_sent[(cid, spec.to_json())] = time.monotonic()
            except Exception as exc:  # the round loop goes on; the client asks again
                log.error("could not send the programs of v%d to %s: %s: %s", spec.version, cid, type(exc).__name__, exc)
            finally:
                with self._lock:
                    self._queued.discard((cid, spec.to_json()))

    def _send_chunks(self, cid: str, version: int, env: bytes) -> str:
        n = self.link.publish_chunks(functools.partial(self.topics.client_programs, cid), env)
        return f"{len(env)} bytes in {n} chunk(s)"

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread after the answer it is sending (waits at most ``timeout_s``)."""
        if self._thread is not None:
            self._queue.put(None)
            join_started(self._thread, timeout_s)
