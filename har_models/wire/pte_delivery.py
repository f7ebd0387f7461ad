"""Delivery of ExecuTorch ``.pte`` programs to clients that run but cannot export them (docs/protocol.md, "ExecuTorch programs").

A client asks with a JSON :class:`ProgramRequest` on ``{p}/client/{cid}/program_request``; the
coordinator answers with one envelope of kind ``"program"`` (:mod:`har_models.wire.codec`)
addressed to that client, in chunks on ``{p}/client/{cid}/programs/{i}``, as models travel.

Body: one 1-D ``uint8`` tensor per file of :data:`PROGRAM_FILES`. ``meta``: ``run_id``,
``program`` (the exporter's metadata, :func:`har_models.nn.export.ensure_programs`), ``files``
(``{name: {"bytes", "sha256"}}``) and ``executorch`` (the exporter's version).

The receiver stores the set in the exporter's cache layout (metadata last), and
:func:`check_program_set` refuses a set a runtime cannot load (:class:`ProgramRefused`). No PyTorch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from har_models.files import atomic_write_bytes
from har_models.nn.arch import ArchSpec
from har_models.wire import codec

PROTOCOL = 1
"""Version of the request format."""
MAX_REQUEST_BYTES = 4096
"""Largest request accepted (bytes); a real one is about 80."""
PROGRAM_FILES = {
    "train": ".train.pte",
    "infer": ".infer.pte",
    "infer_static": ".infer_static.pte",
    "weights_ptd": ".weights.ptd",
}
"""Files of one program set and their suffixes after the set's key (the exporter's cache names)."""
META_SUFFIX = ".json"


class ProgramError(ValueError):
    """A program request or envelope that must be rejected; ``reason`` is a short code for logs and tests.

    Requests: ``oversized``, ``bad_request``, ``unknown_protocol``; envelopes: the codec's reasons
    and ``wrong_kind``, ``client_mismatch``, ``wrong_run``, ``wrong_arch_version``, ``wrong_spec``, ``bad_program``.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ProgramRequest:
    """A client's request for the programs of one architecture version.

    Wire form: ``{"protocol": 1, "run_id": str, "arch_version": int}`` (at most
    :data:`MAX_REQUEST_BYTES`); the client is the one named in the topic.
    """

    run_id: str
    arch_version: int

    def to_bytes(self) -> bytes:
        """The JSON wire form."""
        return json.dumps({"protocol": PROTOCOL, "run_id": self.run_id, "arch_version": self.arch_version}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ProgramRequest:
        """Parse and check a request; ProgramError ``oversized``, ``bad_request`` or ``unknown_protocol``."""
        if len(data) > MAX_REQUEST_BYTES:
            raise ProgramError("oversized", f"program request of {len(data)} bytes exceeds {MAX_REQUEST_BYTES} bytes")
        try:
            doc = json.loads(bytes(data))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramError("bad_request", f"program request is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ProgramError("bad_request", "program request is not a JSON object")
        if doc.get("protocol") != PROTOCOL:
            raise ProgramError("unknown_protocol", f"program request protocol {doc.get('protocol')!r}; this build reads {PROTOCOL}")
        run_id, version = doc.get("run_id"), doc.get("arch_version")
        if not isinstance(run_id, str) or not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ProgramError("bad_request", f"program request needs a string run_id and an integer arch_version >= 0, got "
                                              f"{run_id!r}, {version!r}")  # fmt: skip
        return cls(run_id, version)


@dataclass(frozen=True)
class ProgramSet:
    """One architecture version's programs as received (or about to be sent): ``spec``, the exporter's ``meta``, and ``files`` by name."""

    spec: ArchSpec
    meta: dict[str, Any]
    files: dict[str, bytes]

    @property
    def key(self) -> str:
        """The exporter's cache key of the set (file name stem)."""
        return str(self.meta["key"])


def encode_programs(programs: ProgramSet, *, client_id: str, run_id: str, executorch_version: str) -> bytes:
    """The envelope (kind ``"program"``) carrying ``programs`` to ``client_id``; ValueError if a file is missing."""
    missing = sorted(set(PROGRAM_FILES) - set(programs.files))
    if missing:
        raise ValueError(f"encode_programs: program files {missing} are missing")
    tensors = {n: np.frombuffer(programs.files[n], dtype=np.uint8) for n in PROGRAM_FILES}
    files = {n: {"bytes": len(programs.files[n]), "sha256": hashlib.sha256(programs.files[n]).hexdigest()} for n in PROGRAM_FILES}
    meta = {"run_id": run_id, "program": programs.meta, "files": files, "executorch": executorch_version}
    return codec.encode(tensors, kind="program", round=0, arch_version=programs.spec.version, client_id=client_id, meta=meta)


def decode_programs(envelope: bytes, *, client_id: str, run_id: str, spec: ArchSpec, max_bytes: int | None = None) -> ProgramSet:
    """Check a program envelope (joined chunks) against what the client asked for; the programs it carries.

    Raises
    ------
    ProgramError
        The codec's reason, or ``wrong_kind``, ``client_mismatch``, ``wrong_run``,
        ``wrong_arch_version``, ``wrong_spec``, ``bad_program`` (a file missing or not matching its
        recorded length and sha256; metadata without the exporter's fields).
    """
    try:
        env = codec.decode(envelope, max_bytes=max_bytes)
    except codec.EnvelopeError as exc:
        raise ProgramError(exc.reason, str(exc)) from None
    if env.kind != "program":
        raise ProgramError("wrong_kind", f"envelope kind {env.kind!r}, expected 'program'")
    if env.client_id != client_id:
        raise ProgramError("client_mismatch", f"programs addressed to {env.client_id!r}, this client is {client_id!r}")
    if env.meta.get("run_id") != run_id:
        raise ProgramError("wrong_run", f"programs of run {env.meta.get('run_id')!r}, the announcement is of run {run_id!r}")
    if env.arch_version != spec.version:
        raise ProgramError("wrong_arch_version", f"programs of architecture version {env.arch_version}, asked for {spec.version}")
    meta, files = env.meta.get("program"), env.meta.get("files")
    if not isinstance(meta, dict) or not isinstance(files, dict) or not isinstance(meta.get("key"), str):
        raise ProgramError("bad_program", "program envelope lacks the exporter's metadata ('program' with a 'key', 'files')")
    if not all(c.isalnum() for c in meta["key"]) or not meta["key"]:
        raise ProgramError("bad_program", f"program key {meta['key']!r} is not a plain name")
    for field_ in ("train_batch", "infer_batch", "params", "weights_ptd"):
        if field_ not in meta:
            raise ProgramError("bad_program", f"program metadata lacks {field_!r}")
    try:
        recorded = ArchSpec.from_json(meta["spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ProgramError("bad_program", f"program metadata holds no valid architecture ({exc})") from None
    if recorded != spec:
        raise ProgramError("wrong_spec", f"programs exported for {recorded.conv_filters} filters / {recorded.dense_units} units "
                                         f"v{recorded.version}, the announcement is {spec.conv_filters} / {spec.dense_units} "
                                         f"v{spec.version} (or another input normalisation)")  # fmt: skip
    out: dict[str, bytes] = {}
    for name in PROGRAM_FILES:
        arr, info = env.tensors.get(name), files.get(name)
        if arr is None or arr.dtype != np.uint8 or arr.ndim != 1 or not isinstance(info, dict):
            raise ProgramError("bad_program", f"program file {name!r} is missing or not a byte vector")
        data = arr.tobytes()
        if len(data) != info.get("bytes") or hashlib.sha256(data).hexdigest() != info.get("sha256"):
            raise ProgramError("bad_program", f"program file {name!r} does not match its recorded length and sha256")
        out[name] = data
    return ProgramSet(spec, dict(meta), out)


def program_paths(folder: str | os.PathLike[str], key: str) -> dict[str, Path]:
    """Paths of a set's files (:data:`PROGRAM_FILES` and ``"meta"``) in ``folder``, named as the exporter's cache names them."""
    base = Path(folder)
    return {n: base / f"{key}{suffix}" for n, suffix in PROGRAM_FILES.items()} | {"meta": base / f"{key}{META_SUFFIX}"}


def store_programs(folder: str | os.PathLike[str], programs: ProgramSet) -> dict[str, Path]:
    """Write a received set into ``folder`` (created if missing), metadata last; its paths. OSError if it cannot."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = program_paths(folder, programs.key)
    for name in PROGRAM_FILES:
        atomic_write_bytes(paths[name], programs.files[name])
    atomic_write_bytes(paths["meta"], json.dumps(programs.meta, sort_keys=True, indent=1).encode())
    return paths


def find_programs(folder: str | os.PathLike[str], spec: ArchSpec) -> dict[str, Path] | None:
    """The paths of a complete set in ``folder`` exported for exactly ``spec``, or None (unreadable metadata is skipped)."""
    base = Path(folder)
    if not base.is_dir():
        return None
    for meta_path in sorted(base.glob(f"*{META_SUFFIX}")):
        try:
            meta = json.loads(meta_path.read_text())
            if ArchSpec.from_json(meta["spec"]) != spec:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        paths = program_paths(base, meta_path.name[: -len(META_SUFFIX)])
        if all(p.exists() for p in paths.values()):
            return paths
    return None


# -- checking a program before a runtime loads it ------------------------------------------------

PTE_IDENTIFIER = "ET12"
"""The flatbuffer file identifier of an ExecuTorch program (bytes 4..8 of a ``.pte``; executorch's ``schema/program.fbs``)."""
PTE_SCHEMA_VERSION = 0
"""The ``Program.version`` (schema version) that executorch 1.4.0 writes (``exir/version.py``) and reads."""
EXTENDED_HEADER_MAGIC = b"eh00"
"""Magic of the extended header that follows the identifier (bytes 8..12) in every program the exporter writes."""


class ProgramRefused(ProgramError):
    """A stored program that the runtime here must not load; ``reason`` is ``pte_corrupt`` or ``pte_incompatible``."""


@dataclass(frozen=True)
class PteHeader:
    """What the first bytes of a ``.pte`` say about it.

    Layout (executorch 1.4.0): bytes 0..4 the root table's offset (u32 LE); 4..8 the identifier
    (``ET12``); then the extended header ``eh00``, its length (u32, 32), the flatbuffer's size, the
    first segment's offset and the segments' size (u64 each). The schema version is
    ``Program.version`` (u32, absent when 0). ``program_size`` is 0 without an extended header;
    ``expected_size`` (whole file) None when the header does not say.
    """

    identifier: str
    schema_version: int
    program_size: int
    expected_size: int | None


def read_pte_header(data: bytes, name: str = "program") -> PteHeader:
    """Parse the identifier, extended header and schema version of a ``.pte`` (:class:`PteHeader`).

    Raises
    ------
    ProgramRefused
        ``pte_corrupt``: shorter than its header, an identifier not ``ET`` + two digits, or a table
        outside the flatbuffer.
    """
    import struct

    if len(data) < 16:
        raise ProgramRefused("pte_corrupt", f"{name}: {len(data)} bytes cannot hold an ExecuTorch program header")
    ident = data[4:8].decode("ascii", errors="replace")
    if not (ident.startswith("ET") and ident[2:].isdigit()):
        raise ProgramRefused("pte_corrupt", f"{name}: file identifier {ident!r} is not an ExecuTorch program's ('{PTE_IDENTIFIER}')")
    program_size, expected = len(data), None
    if data[8:12] == EXTENDED_HEADER_MAGIC and len(data) >= 8 + 32:
        hlen, program_size, seg_base, seg_size = struct.unpack_from("<IQQQ", data, 12)
        if hlen < 24:
            raise ProgramRefused("pte_corrupt", f"{name}: extended header of {hlen} bytes (at least 24)")
        expected = seg_base + seg_size if seg_base and hlen >= 32 else program_size
    limit = min(program_size, len(data))
    root = struct.unpack_from("<I", data, 0)[0]
    if not 8 <= root <= limit - 4:
        raise ProgramRefused("pte_corrupt", f"{name}: root table offset {root} lies outside the program's {limit} bytes")
    vtable = root - struct.unpack_from("<i", data, root)[0]
    if not 0 <= vtable <= limit - 4:
        raise ProgramRefused("pte_corrupt", f"{name}: vtable offset {vtable} lies outside the program's {limit} bytes")
    vt_size = struct.unpack_from("<H", data, vtable)[0]
    field0 = struct.unpack_from("<H", data, vtable + 4)[0] if vt_size >= 6 and vtable + 6 <= limit else 0
    if field0 and root + field0 + 4 > limit:
        raise ProgramRefused("pte_corrupt", f"{name}: schema version field lies outside the program")
    version = struct.unpack_from("<I", data, root + field0)[0] if field0 else 0
    return PteHeader(ident, int(version), int(program_size), None if expected is None else int(expected))


@dataclass(frozen=True)
class RuntimeInfo:
    """The ExecuTorch runtime that is to load the programs: ``name`` in words, release, newest ``Program.version`` it reads, identifier."""

    name: str
    executorch: str
    schema_version: int = PTE_SCHEMA_VERSION
    identifier: str = PTE_IDENTIFIER


ANDROID_RUNTIME = RuntimeInfo("executorch-android AAR", "1.4.0")
"""The Java runtime the app is built with (``org.pytorch:executorch-android:1.4.0`` in buildozer.spec)."""


def _release(version: str) -> str:
    """``"1.4.0+cpu"`` -> ``"1.4.0"``."""
    return version.split("+", 1)[0]


def check_program_set(paths: dict[str, Path], meta: dict[str, Any], runtime: RuntimeInfo, names: tuple[str, ...] | None = None) -> None:
    """Refuse a stored program set that ``runtime`` cannot run, before it is loaded.

    Checks each ``.pte`` of ``names`` (default all): length and sha256 against ``meta["files"]``,
    its header and length, identifier and schema version against the runtime's; then the exporter's
    recorded schema. Another exporter release with the same schema is allowed.

    Raises
    ------
    ProgramRefused
        ``pte_corrupt`` (missing, unreadable, not as recorded, not a program, wrong length) or
        ``pte_incompatible`` (another identifier, or a newer schema; names both versions).
    """
    files = meta.get("files") if isinstance(meta.get("files"), dict) else {}
    assert isinstance(files, dict)
    exporter = str(meta.get("executorch", "unknown"))
    for name in names or tuple(PROGRAM_FILES):
        path = paths[name]
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ProgramRefused("pte_corrupt", f"program file {path} cannot be read ({exc})") from None
        info = files.get(name)
        if isinstance(info, dict):
            if len(data) != info.get("bytes"):
                raise ProgramRefused("pte_corrupt", f"{path}: {len(data)} bytes, the metadata records {info.get('bytes')}")
            if hashlib.sha256(data).hexdigest() != info.get("sha256"):
                raise ProgramRefused("pte_corrupt", f"{path}: sha256 differs from the one the metadata records")
        if not str(path).endswith(".pte"):
            continue
        head = read_pte_header(data, str(path))
        if head.expected_size is not None and head.expected_size != len(data):
            raise ProgramRefused("pte_corrupt", f"{path}: {len(data)} bytes, its header says {head.expected_size} (truncated or "
                                                "extended); fetch or export the programs again")  # fmt: skip
        if head.identifier != runtime.identifier:
            raise ProgramRefused("pte_incompatible", f"{path}: program identifier {head.identifier!r}, the {runtime.name} "
                                                     f"(executorch {runtime.executorch}) expects {runtime.identifier!r}; "
                                                     f"exporter {exporter}")  # fmt: skip
        if head.schema_version > runtime.schema_version:
            raise ProgramRefused("pte_incompatible", f"{path}: schema version {head.schema_version} (exporter {exporter}) is newer "
                                                     f"than the {runtime.name}'s {runtime.schema_version} (executorch "
                                                     f"{runtime.executorch}); export with the runtime's executorch release")  # fmt: skip
    recorded = meta.get("schema_version")
    if isinstance(recorded, int) and recorded > runtime.schema_version:
        raise ProgramRefused("pte_incompatible", f"programs of schema version {recorded} (exporter {exporter}); the {runtime.name} "
                                                 f"reads up to {runtime.schema_version} (executorch {runtime.executorch})")  # fmt: skip


def exporter_differs(meta: dict[str, Any], runtime: RuntimeInfo) -> str | None:
    """A sentence naming the exporter's and the runtime's releases when they differ (None when equal or unrecorded)."""
    exporter = meta.get("executorch")
    if not isinstance(exporter, str) or _release(exporter) == _release(runtime.executorch):
        return None
    return f"programs exported by executorch {exporter}, run by the {runtime.name} of executorch {runtime.executorch}"
