"""Dataset subjects as clients: which recordings a subject has and its labelled windows.

A source text (``hapt:PATH/userXX.npz`` or ``realworld:ROOT:probandN[:positions]``) parses
into a :class:`SubjectSource`, which also carries the client's split; the edge client and the
simulation's evaluation both go through it, so they see the same windows and split.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from har_models.data.hapt import hapt_subject_ids, read_hapt_recordings
from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS, LabelSet
from har_models.data.pipeline import windows_from_recording
from har_models.data.realworld import (
    RealWorldConfig,
    load_realworld_subject,
    read_realworld_subject,
    realworld_subject_ids,
    subject_has_sensor_pair,
)
from har_models.data.recording import Recording
from har_models.data.splits import DEFAULT_SPLIT_SEED, DEFAULT_TEST_FRACTION, SplitSpec
from har_models.data.windowing import WindowSet

log = logging.getLogger(__name__)

DEFAULT_HAPT = Path(__file__).resolve().parents[2] / "datasets" / "hapt"
"""The HAPT recordings committed with the project."""

TEST_FRACTION = DEFAULT_TEST_FRACTION
"""Per-subject test share of the FedDist protocol (80/20, stratified); see :mod:`har_models.data.splits`."""


@dataclass(frozen=True)
class SubjectSource:
    """One dataset subject (one client) and how to read it.

    ``path``: HAPT's ``userXX.npz``, or REALWORLD's archive or folder; ``subject``: REALWORLD's
    ``proband1`` ("" for HAPT); ``positions``: REALWORLD positions to pool (empty = all 7).
    """

    kind: str
    path: Path
    subject: str
    positions: tuple[str, ...]
    labels: LabelSet
    split: SplitSpec = field(default_factory=SplitSpec)

    def fingerprint(self) -> str:
        """Identifies the source files and settings (not the split); changes when either changes."""
        st = self.path.stat()
        text = f"{self.kind}|{self.path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.subject}|{','.join(self.positions)}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def store_key(self) -> str:
        """Key under which a client's store keeps this source's windows: files, settings and split."""
        return self.fingerprint() + self.split.tag()

    @property
    def name(self) -> str:
        """The subject's name, the same on every machine: ``user01`` (HAPT file stem) or ``proband3``."""
        return self.path.stem if self.kind == "hapt" else self.subject

    def with_split(self, split: SplitSpec) -> SubjectSource:
        """The same subject with another split."""
        return replace(self, split=split)

    def recordings(self) -> list[Recording]:
        """The raw recordings (:func:`recordings_of`)."""
        return recordings_of(self)

    def windows(self) -> WindowSet:
        """All windows, in recording order (:func:`load_windows`)."""
        return load_windows(self)

    def train_test(self) -> tuple[WindowSet, WindowSet]:
        """``(train, test)`` windows, split with :attr:`split` (windows it drops are in neither)."""
        return self.split.apply(self.windows(), self.name)

    def count_windows(self) -> int:
        """Number of windows (:func:`count_windows`)."""
        return count_windows(self)


def parse_source(text: str, split: SplitSpec | None = None) -> SubjectSource:
    """Parse ``hapt:PATH`` or ``realworld:ROOT:SUBJECT[:pos1,pos2]`` (``split`` default 80/20, seed 1).

    ValueError for an unknown kind or malformed text (showing the accepted forms);
    FileNotFoundError if the named file or folder does not exist.
    """
    kind, _, rest = text.partition(":")
    if kind == "hapt" and rest:
        path = Path(rest)
        if not path.is_file():
            raise FileNotFoundError(f"HAPT subject file {path} does not exist (expected datasets/hapt/userXX.npz)")
        return SubjectSource("hapt", path, "", (), HAPT_LABELS, split or SplitSpec())
    if kind == "realworld" and rest:
        parts = rest.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise ValueError(f"source {text!r}: use realworld:ROOT:probandN[:position,...]")
        path = Path(parts[0])
        if not path.exists():
            raise FileNotFoundError(f"REALWORLD data {path} does not exist (the archive zip or its extracted folder)")
        positions = tuple(p for p in parts[2].split(",") if p) if len(parts) == 3 else ()
        return SubjectSource("realworld", path, parts[1], positions, REALWORLD_LABELS, split or SplitSpec())
    raise ValueError(f"source {text!r}: use hapt:PATH/userXX.npz or realworld:ROOT:probandN[:position,...]")


def _realworld(spec: SubjectSource) -> tuple[int, RealWorldConfig]:
    number = spec.subject.removeprefix("proband")
    if not number.isdigit():
        raise ValueError(f"REALWORLD subject {spec.subject!r}: use proband1 .. proband15")
    return int(number), RealWorldConfig(positions=spec.positions) if spec.positions else RealWorldConfig()


def recordings_of(spec: SubjectSource) -> list[Recording]:
    """The raw recordings a source names (dataset readers; no windowing yet)."""
    if spec.kind == "hapt":
        return read_hapt_recordings(spec.path)
    subject, cfg = _realworld(spec)
    return list(read_realworld_subject(spec.path, subject, cfg).recordings)


def load_windows(spec: SubjectSource) -> WindowSet:
    """All windows of a source through the device pipeline, in recording order (REALWORLD from its per-subject cache when valid)."""
    if spec.kind == "realworld":
        subject, cfg = _realworld(spec)
        return load_realworld_subject(spec.path, subject, cfg).windows
    parts = [windows_from_recording(r, spec.labels) for r in recordings_of(spec)]
    return WindowSet.concat(parts, spec.labels)


def split(data: WindowSet, seed: int = DEFAULT_SPLIT_SEED) -> tuple[WindowSet, WindowSet]:
    """``(train, test)`` of one subject: ``SplitSpec(seed=seed).apply(data)``, stratified 80/20 (FedDist protocol)."""
    return SplitSpec(seed=seed).apply(data)


def count_windows(source: SubjectSource | str) -> int:
    """How many labelled windows (train and test) a source gives; 0 means the client would have nothing to train on.

    A REALWORLD subject lacking a sensor pair for every activity gives 0 from the listing alone;
    otherwise the windows are loaded (through the cache the client then reuses). Any window means
    a training window (each class gives ``round(0.2 n) < n`` to test). Errors as :func:`parse_source`.
    """
    spec = parse_source(source) if isinstance(source, str) else source
    if spec.kind == "realworld":
        subject, _ = _realworld(spec)
        if not subject_has_sensor_pair(spec.path, subject):
            return 0
    return len(load_windows(spec))


def drop_empty_sources(sources: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split client sources into ``(kept, dropped)``: those with windows, in order, and client id -> why (one line) for the others.

    For a launcher, so a client with nothing to train on is never started nor waited for.
    """
    kept: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for cid, text in sources.items():
        try:
            n = count_windows(text)
        except (ValueError, OSError) as exc:
            dropped[cid] = f"its data cannot be read: {exc}"
            continue
        if n == 0:
            dropped[cid] = f"its data gives no labelled windows ({text})"
        else:
            kept[cid] = text
    return kept, dropped


def subject_sources(dataset: str, data: Path, positions: str = "") -> dict[str, str]:
    """Client id -> source text for every subject of the dataset under ``data``; FileNotFoundError (saying what was expected) if none."""
    if dataset == "hapt":
        return {f"hapt-{sid}": f"hapt:{data / f'user{sid}.npz'}" for sid in hapt_subject_ids(data)}
    subjects = realworld_subject_ids(data)
    if not subjects:
        raise FileNotFoundError(f"no REALWORLD subjects (proband1..15) under {data}; pass the archive zip or its extracted folder")
    suffix = f":{positions}" if positions else ""
    return {f"proband{k}": f"realworld:{data}:proband{k}{suffix}" for k in subjects}


def union_test_set(sources: dict[str, str], seed: int = DEFAULT_SPLIT_SEED, *, split: SplitSpec | None = None) -> WindowSet:
    """Concatenated test splits of all subjects, rebuilt exactly as each client splits (``split``, else the paper split with ``seed``).

    ValueError if ``sources`` is empty.
    """
    if not sources:
        raise ValueError("union_test_set: no subjects given")
    spec = split or SplitSpec(seed=seed)
    subjects = [parse_source(text, spec) for text in sources.values()]
    return WindowSet.concat([src.train_test()[1] for src in subjects], subjects[0].labels)
