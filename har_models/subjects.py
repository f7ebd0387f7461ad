"""Dataset subjects as clients: which recordings a subject has and its labelled windows.

A source text names one subject of a dataset (``hapt:PATH/userXX.npz`` or
``realworld:ROOT:probandN[:positions]``). Both the edge client (which replays it into its
store) and the simulation's evaluation harness (which rebuilds the union test set) use
these functions, so they see the same windows and the same split.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from har_models.hapt import hapt_subject_ids, read_hapt_recordings
from har_models.labels import HAPT_LABELS, REALWORLD_LABELS, LabelSet
from har_models.pipeline import windows_from_recording
from har_models.realworld import RealWorldConfig, load_realworld_subject, read_realworld_subject, realworld_subject_ids
from har_models.recording import Recording
from har_models.windowing import WindowSet, stratified_split

DEFAULT_HAPT = Path(__file__).resolve().parents[1] / "datasets" / "hapt"
"""The HAPT recordings committed with the project."""

TEST_FRACTION = 0.2
"""Per-subject test share of the FedDist protocol (80/20, stratified)."""


@dataclass(frozen=True)
class SubjectSource:
    """One dataset subject (one client) and how to read it.

    Attributes
    ----------
    kind : {"hapt", "realworld"}
    path : Path
        HAPT: the ``userXX.npz`` file; REALWORLD: the archive (zip) or its extracted folder.
    subject : str
        REALWORLD subject (``proband1``); empty for HAPT.
    positions : tuple of str
        REALWORLD body positions to pool (empty = all 7).
    labels : LabelSet
    """

    kind: str
    path: Path
    subject: str
    positions: tuple[str, ...]
    labels: LabelSet

    def fingerprint(self) -> str:
        """Identifies the source files and settings; changes when either changes."""
        st = self.path.stat()
        text = f"{self.kind}|{self.path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.subject}|{','.join(self.positions)}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def parse_source(text: str) -> SubjectSource:
    """Parse ``hapt:PATH`` or ``realworld:ROOT:SUBJECT[:pos1,pos2]``.

    Raises
    ------
    ValueError
        For an unknown kind or a malformed text (the message shows the accepted forms).
    FileNotFoundError
        If the named file or folder does not exist.
    """
    kind, _, rest = text.partition(":")
    if kind == "hapt" and rest:
        path = Path(rest)
        if not path.is_file():
            raise FileNotFoundError(f"HAPT subject file {path} does not exist (expected datasets/hapt/userXX.npz)")
        return SubjectSource("hapt", path, "", (), HAPT_LABELS)
    if kind == "realworld" and rest:
        parts = rest.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise ValueError(f"source {text!r}: use realworld:ROOT:probandN[:position,...]")
        path = Path(parts[0])
        if not path.exists():
            raise FileNotFoundError(f"REALWORLD data {path} does not exist (the archive zip or its extracted folder)")
        positions = tuple(p for p in parts[2].split(",") if p) if len(parts) == 3 else ()
        return SubjectSource("realworld", path, parts[1], positions, REALWORLD_LABELS)
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
    """All windows of a source, through the device pipeline, in recording order.

    REALWORLD subjects come from the per-subject cache when it is still valid (parsing
    the CSVs of a subject takes tens of seconds).
    """
    if spec.kind == "realworld":
        subject, cfg = _realworld(spec)
        return load_realworld_subject(spec.path, subject, cfg).windows
    parts = [windows_from_recording(r, spec.labels) for r in recordings_of(spec)]
    return WindowSet.concat(parts, spec.labels)


def split(data: WindowSet, seed: int = 1) -> tuple[WindowSet, WindowSet]:
    """``(train, test)`` of one subject: stratified 80/20 with ``seed`` (FedDist protocol)."""
    tr, te = stratified_split(data.y, TEST_FRACTION, seed)
    return data.subset(tr), data.subset(te)


def subject_sources(dataset: str, data: Path, positions: str = "") -> dict[str, str]:
    """Client id -> source text for every subject of the dataset under ``data``.

    Raises
    ------
    FileNotFoundError
        If no subject is found (the message says what was expected).
    """
    if dataset == "hapt":
        return {f"hapt-{sid}": f"hapt:{data / f'user{sid}.npz'}" for sid in hapt_subject_ids(data)}
    subjects = realworld_subject_ids(data)
    if not subjects:
        raise FileNotFoundError(f"no REALWORLD subjects (proband1..15) under {data}; pass the archive zip or its extracted folder")
    suffix = f":{positions}" if positions else ""
    return {f"proband{k}": f"realworld:{data}:proband{k}{suffix}" for k in subjects}


def union_test_set(sources: dict[str, str], seed: int) -> WindowSet:
    """Concatenated test splits of all subjects (rebuilt exactly as each client splits its windows).

    Raises
    ------
    ValueError
        If ``sources`` is empty.
    """
    if not sources:
        raise ValueError("union_test_set: no subjects given")
    specs = [parse_source(text) for text in sources.values()]
    return WindowSet.concat([split(load_windows(src), seed)[1] for src in specs], specs[0].labels)
