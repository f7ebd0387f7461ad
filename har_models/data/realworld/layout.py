"""Where things are in the REALWORLD archive: subjects, per-sensor archives, parts and CSV members.

The dataset is read where it lies (the official zip, its extracted folder, or any mix of folders
and zip-in-zip parts); :class:`pathlib.Path` and :class:`zipfile.Path` share the calls used,
so one :class:`Node` covers all. Layout::

    proband{k}/data/{acc,gyr}_{activity}_csv.zip      one archive per sensor and activity
        acc_{activity}[_{i}]_{position}.csv           i: part infix, or a "_2" of a single recording
        Gyroscope_{activity}[_{i}]_{position}.csv
        readMe                                        sampling notes (ignored)
        {st}_{activity}[_{i}]_csv.zip                 instead of CSVs: one inner archive per part

Labels are paths from the dataset root with ``!`` after an archive, e.g.
``proband4/data/acc_climbingup_csv.zip!acc_climbingup_2_csv.zip!acc_climbingup_2_chest.csv``.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from har_models.data.realworld.anomalies import Report, log
from har_models.data.realworld.config import ACTIVITIES, ARCHIVE_PREFIX, CSV_PREFIX, POSITIONS, RealWorldConfig

IGNORED = re.compile(r"^(readme(\.txt)?|__macosx|\..*)$", re.IGNORECASE)
"""Members skipped without a report: the ``readMe`` notes, hidden files and macOS ``__MACOSX`` folders."""

_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, KeyError, ValueError)


class UnreadableError(Exception):
    """A file or archive that exists but cannot be read (message: why)."""


def _hidden(name: str) -> bool:
    return name.startswith(".") or name.lower() == "__macosx"


@dataclass(frozen=True)
class Node:
    """A folder-like place: a directory, a zip archive, or a folder inside one.

    ``label``: path from the dataset root ("" at the root); ``sep``: ``"!"`` at the top of an
    archive that is itself a file, ``"/"`` otherwise.
    """

    path: Path | zipfile.Path
    label: str
    sep: str = "/"

    def member_label(self, name: str) -> str:
        """Label of the member ``name`` of this node."""
        return f"{self.label}{self.sep}{name}" if self.label else name

    def _entries(self, want_dir: bool) -> list[str]:
        try:
            return sorted(e.name for e in self.path.iterdir() if not _hidden(e.name) and e.is_dir() == want_dir)
        except OSError as exc:
            raise UnreadableError(f"cannot list {self.path}: {exc}") from None

    def files(self) -> list[str]:
        """Names of the files in this node (sorted; hidden ones left out)."""
        return self._entries(False)

    def dirs(self) -> list[str]:
        """Names of the folders in this node (sorted; hidden ones left out)."""
        return self._entries(True)

    def read(self, name: str) -> bytes:
        """Content of the member file ``name``; UnreadableError on an I/O error, CRC mismatch or truncated archive."""
        try:
            return (self.path / name).read_bytes()
        except _READ_ERRORS as exc:
            if isinstance(self.path, Path):
                raise UnreadableError(f"cannot read {self.path / name}: {exc}") from None
            raise UnreadableError(f"member {name} cannot be read ({exc})") from None

    def child(self, name: str) -> Node:
        """The member ``name`` as a node (a sub-folder, or a zip opened as one); UnreadableError for a file that is no readable zip."""
        path = self.path / name
        if path.is_dir():
            return Node(path, self.member_label(name))
        return open_archive_bytes(self.read(name), self.member_label(name))

    def relabel(self, label: str) -> Node:
        """The same place under another label."""
        return replace(self, label=label)

    def fingerprint(self) -> list[list[object]]:
        """Every file below this node: ``[label, size, mtime_ns]`` in a folder, ``[label, crc32, size]`` in an archive."""
        out: list[list[object]] = []
        if isinstance(self.path, Path):
            for p in sorted(self.path.rglob("*")):
                if p.is_file():
                    st = p.stat()
                    out.append([self.member_label(p.relative_to(self.path).as_posix()), st.st_size, st.st_mtime_ns])
            return out
        prefix = self.path.at
        for info in sorted(self.path.root.infolist(), key=lambda i: i.filename):
            if info.filename.startswith(prefix) and not info.is_dir():
                out.append([self.member_label(info.filename[len(prefix) :]), info.CRC, info.file_size])
        return out


def open_archive_bytes(data: bytes, label: str) -> Node:
    """A zip archive held in memory as a node; UnreadableError if ``data`` is not a readable zip."""
    try:
        return Node(zipfile.Path(zipfile.ZipFile(io.BytesIO(data))), label, "!")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise UnreadableError(f"not a readable zip archive ({exc})") from None


@contextmanager
def open_dataset(root: Path) -> Iterator[Node]:
    """The dataset root (zip or extracted folder) as a node, for a ``with`` block.

    FileNotFoundError if ``root`` does not exist; ValueError for a file that is not a readable zip.
    """
    root = Path(root)
    if root.is_dir():
        yield Node(root, "")
        return
    if not root.is_file():
        raise FileNotFoundError(
            f"REALWORLD data not found at {root}; pass realworld2016_dataset.zip or the folder it was extracted to "
            "(download it with datasets/fetch_realworld.py)"
        )
    try:
        zf = zipfile.ZipFile(root)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(
            f"REALWORLD archive {root} is not a readable zip file ({exc}); download it again with datasets/fetch_realworld.py"
        ) from None
    with zf:
        yield Node(zipfile.Path(zf), "")


def find_subjects(top: Node) -> dict[int, Node]:
    """``proband{k}/data`` folders at the top or one folder down, labelled ``proband{k}/data``."""
    found = _subjects_in(top)
    for d in [] if found else top.dirs():
        try:
            found = _subjects_in(top.child(d))
        except UnreadableError as exc:
            log.warning("REALWORLD: skipping unreadable folder %s (%s)", d, exc)
        if found:
            break
    return found


def _subjects_in(folder: Node) -> dict[int, Node]:
    found: dict[int, Node] = {}
    for d in folder.dirs():
        m = re.fullmatch(r"proband(\d+)", d)
        if m and int(m[1]) not in found:
            subject = folder.child(d)
            if "data" in subject.dirs():
                found[int(m[1])] = subject.child("data").relabel(f"{d}/data")
    return found


def subject_data(top: Node, subject: int, root: Path) -> Node:
    """The ``proband{subject}/data`` node; FileNotFoundError listing the subjects present if missing."""
    subjects = find_subjects(top)
    if subject not in subjects:
        present = ", ".join(str(k) for k in sorted(subjects)) or "none"
        raise FileNotFoundError(f"REALWORLD subject proband{subject} has no data folder in {root} (subjects present: {present})")
    return subjects[subject]


def realworld_subject_ids(root: Path) -> list[int]:
    """Ascending subject numbers k of the ``proband{k}/data`` folders under ``root`` (at the top or one folder down).

    FileNotFoundError if ``root`` does not exist or holds none; ValueError for a file that is not a readable zip.
    """
    with open_dataset(Path(root)) as top:
        subjects = find_subjects(top)
    if not subjects:
        raise FileNotFoundError(
            f"no REALWORLD subject folders (proband<k>/data) in {root}; expected realworld2016_dataset.zip "
            "or the folder it was extracted to (download it with datasets/fetch_realworld.py)"
        )
    return sorted(subjects)


@dataclass
class SensorFiles:
    """CSV contents of one sensor and activity: ``csv`` maps (position, part) to (bytes, label).

    ``usable`` is False for a missing or unreadable archive and ``failed`` holds unreadable CSVs
    (both already reported); ``multipart``: one inner archive per part.
    """

    usable: bool
    label: str
    multipart: bool = False
    csv: dict[tuple[str, int], tuple[bytes, str]] = field(default_factory=dict)
    failed: set[tuple[str, int]] = field(default_factory=set)


def read_sensor_archive(data: Node, subject: int, activity: str, sensor: str, config: RealWorldConfig, report: Report) -> SensorFiles:
    """The CSVs of one sensor (``"acc"``/``"gyro"``) and activity of subject k, with the layout anomalies given to ``report``.

    Kinds: [missing_archive], [corrupt_archive], zip-in-zip parts [multipart] (acc part 1
    ``acc_{act}_1_csv.zip`` but gyro ``gyr_{act}_csv.zip``, parts 2-3 ``{st}_{act}_{i}_csv.zip``,
    also unpacked), a part infix on a single recording [odd_name], several CSVs for one position
    [ambiguous_csv], an unreadable member [corrupt_member], anything else [unexpected_member].
    """
    st = ARCHIVE_PREFIX[sensor]
    base = f"proband{subject}/{activity}"
    zip_name, dir_name = f"{st}_{activity}_csv.zip", f"{st}_{activity}_csv"
    if zip_name in data.files():
        name = zip_name
    elif dir_name in data.dirs():
        name = dir_name
    else:
        report.add(
            "missing_archive",
            base,
            data.member_label(zip_name),
            f"no {sensor} archive {zip_name} for {activity}; the {activity} recordings of proband{subject} are skipped",
        )
        return SensorFiles(usable=False, label=data.member_label(zip_name))
    try:
        archive = data.child(name)
    except UnreadableError as exc:
        report.add(
            "corrupt_archive",
            base,
            data.member_label(name),
            f"{exc}; expected a zip of {CSV_PREFIX[sensor]}_{activity}_<position>.csv files; "
            f"the {activity} recordings are skipped (download the dataset again)",
        )
        return SensorFiles(usable=False, label=data.member_label(name))

    inner_rx = re.compile(rf"{st}_{activity}(?:_(\d+))?_csv(?:\.zip)?", re.IGNORECASE)
    inner = [n for n in archive.files() if n.lower().endswith(".zip")] + [d for d in archive.dirs() if inner_rx.fullmatch(d)]
    out = SensorFiles(usable=True, label=archive.label, multipart=bool(inner))
    parts: dict[int, Node] = {}
    if not inner:
        parts[1] = archive
    else:
        for name in sorted(inner):
            m = inner_rx.fullmatch(name)
            if m is None:
                report.add("unexpected_member", base, archive.member_label(name), f"{name} is not a part of {activity}; ignored")
                continue
            part = int(m[1] or 1)
            if part in parts:
                report.add("ambiguous_csv", f"{base}/part{part}", archive.member_label(name), f"second archive for part {part}; ignored")
                continue
            try:
                parts[part] = archive.child(name)
            except UnreadableError as exc:
                report.add(
                    "corrupt_archive",
                    f"{base}/part{part}",
                    archive.member_label(name),
                    f"{exc}; expected a zip of {sensor} CSVs of part {part}; part {part} skipped",
                )
                out.failed.update((p, part) for p in config.positions)
        report.add(
            "multipart",
            base,
            archive.label,
            f"{sensor} archive holds {len(inner)} inner archives (zip-in-zip); read as parts "
            f"{', '.join(str(p) for p in sorted(parts)) or 'none'}, each a recording of its own",
        )
        for name in archive.files():
            if not name.lower().endswith(".zip") and not IGNORED.fullmatch(name):
                report.add("unexpected_member", base, archive.member_label(name), f"{name} beside the part archives; ignored")

    csv_rx = re.compile(rf"{CSV_PREFIX[sensor]}_{activity}(?:_(\d+))?_({'|'.join(POSITIONS)})\.csv", re.IGNORECASE)
    for part, container in sorted(parts.items()):
        candidates: dict[str, list[tuple[int, str]]] = {}
        for name in container.files():
            m = csv_rx.fullmatch(name)
            if m is None:
                if not IGNORED.fullmatch(name):
                    where = f"{base}/part{part}" if out.multipart else base
                    report.add(
                        "unexpected_member",
                        where,
                        container.member_label(name),
                        f"{name} is not a {sensor} CSV of {activity}; ignored",
                    )
                continue
            position = m[2].lower()
            if position in config.positions:
                candidates.setdefault(position, []).append((int(m[1] or 0), name))
        for position, names in candidates.items():
            where = f"{base}/{position}" + (f"/part{part}" if out.multipart else "")
            names.sort()
            infix, name = names[0]
            if len(names) > 1:
                report.add(
                    "ambiguous_csv",
                    where,
                    container.member_label(name),
                    f"{len(names)} {sensor} CSVs for {position}: used {name}, ignored {', '.join(n for _, n in names[1:])}",
                )
            if infix and not out.multipart:
                report.add(
                    "odd_name",
                    where,
                    container.member_label(name),
                    f"{name} carries a part infix in a single recording; read as {activity}/{position}",
                )
            try:
                out.csv[(position, part)] = (container.read(name), container.member_label(name))
            except UnreadableError as exc:
                report.add("corrupt_member", where, container.member_label(name), f"{exc}; {activity}/{position} skipped")
                out.failed.add((position, part))
    return out


def has_sensor_pair(data: Node) -> bool:
    """Whether any activity of the subject has both an accelerometer and a gyroscope archive (a listing only)."""
    names = set(data.files()) | set(data.dirs())
    return any(
        all(f"{ARCHIVE_PREFIX[s]}_{a}_csv.zip" in names or f"{ARCHIVE_PREFIX[s]}_{a}_csv" in names for s in ("acc", "gyro"))
        for a in ACTIVITIES
    )


def subject_has_sensor_pair(root: Path, subject: int) -> bool:
    """:func:`has_sensor_pair` for ``proband{subject}`` under ``root``.

    FileNotFoundError, ValueError as :func:`realworld_subject_ids`, and for a missing subject.
    """
    with open_dataset(Path(root)) as top:
        return has_sensor_pair(subject_data(top, int(subject), root))
