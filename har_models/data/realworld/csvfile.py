"""One REALWORLD sensor CSV (``id,attr_time,attr_x,attr_y,attr_z``) to a timestamped stream.

Malformed rows are skipped and counted, a missing or unusable header is reported, and the
time column's unit is checked (:mod:`har_models.data.realworld.timestamps`): milliseconds are
read as always; seconds, microseconds or nanoseconds are converted when the unit is
certain and the file is rejected otherwise, never overflowing 64-bit nanoseconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from har_models.data.realworld.config import CSV_COLUMNS
from har_models.data.realworld.timestamps import UNIT_NAMES, UNIT_NS, guess_time_unit, to_ns
from har_models.data.recording import SensorStream

MAX_TIME_SPREAD_MS = 86_400_000
"""Rows stamped more than a day from the file's median time are malformed (a recording lasts minutes)."""

_NUM = r"[ \t]*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[ \t]*"


def parse_realworld_csv(data: bytes, name: str = "<csv>") -> tuple[SensorStream, list[tuple[str, str]]]:
    """Parse one REALWORLD sensor CSV, skipping what cannot be trusted.

    Rows must have exactly as many numeric fields as the header; rows that are truncated,
    non-numeric, non-finite, stamped with a non-positive or implausible time (more than
    :data:`MAX_TIME_SPREAD_MS` from the file's median) or, except for seconds, a
    non-integer time are dropped and counted.

    Parameters
    ----------
    data : bytes
        File content (UTF-8; a byte-order mark is ignored).
    name : str
        File name, only for messages.

    Returns
    -------
    stream : SensorStream
        ``t_ns`` = attr_time in ns (int64) in file order; ``xyz`` = attr_x, attr_y, attr_z
        in the file's unit (m/s^2 or rad/s). Empty if nothing is usable.
    problems : list of (kind, action)
        ``no_header``, ``bad_header``, ``time_unit`` (stamps converted from another unit),
        ``bad_time_unit`` (file rejected: the message names the file and the suspected
        unit), ``malformed_rows`` or ``empty``, each with what was done; empty for a clean
        file.
    """
    text = data.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = text.splitlines()
    empty = SensorStream(np.empty(0, np.int64), np.empty((0, 3)))
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return empty, [("empty", f"{name} has no rows; recording skipped")]
    fields = [f.strip().strip('"').strip() for f in lines[first].split(",")]
    problems: list[tuple[str, str]] = []
    if all(c in fields for c in CSV_COLUMNS[1:]):
        cols = [fields.index(c) for c in CSV_COLUMNS[1:]]
        n_fields, body_start = len(fields), first + 1
    elif len(fields) == len(CSV_COLUMNS) and all(re.fullmatch(_NUM, f) for f in fields):
        problems.append(("no_header", f"{name} has no header line; columns read as {','.join(CSV_COLUMNS)}"))
        cols, n_fields, body_start = [1, 2, 3, 4], len(CSV_COLUMNS), first
    else:
        return empty, [("bad_header", f"{name} header {lines[first][:80]!r} lacks {', '.join(CSV_COLUMNS[1:])}; file skipped")]
    body = lines[body_start:]
    values, body_idx, bad = _parse_rows(body, n_fields)
    line_no = body_idx + body_start + 1  # 1-based line numbers in the file
    bad_lines = [body_start + 1 + i for i in bad]
    t_raw, xyz = values[:, cols[0]], values[:, cols[1:]]
    ok = np.isfinite(xyz).all(axis=1) & np.isfinite(t_raw) & (t_raw > 0)
    guess = guess_time_unit(t_raw[ok])
    if guess.unit is None:
        problems.append(("bad_time_unit", f"attr_time of {name}: {guess.reason}; file skipped (expected Unix epoch milliseconds)"))
        return empty, problems
    unit = guess.unit
    if unit != "s":
        ok &= t_raw == np.floor(t_raw)
    if ok.any():
        ok &= np.abs(t_raw - np.median(t_raw[ok])) <= MAX_TIME_SPREAD_MS * 1_000_000 / UNIT_NS[unit]
    exact: list[int] | None = None
    if unit in ("us", "ns") and ok.any():  # beyond 2^53 float64 rounds whole numbers: read the text again
        parsed = [_as_int(body[i].split(",")[cols[0]]) for i in body_idx[ok]]
        ok[np.flatnonzero(ok)[np.array([e is None for e in parsed])]] = False
        exact = [e for e in parsed if e is not None]
    bad_lines = sorted(bad_lines + line_no[~ok].tolist())
    if bad_lines:
        shown = ", ".join(str(i) for i in bad_lines[:5]) + (", ..." if len(bad_lines) > 5 else "")
        problems.append(
            (
                "malformed_rows",
                f"{len(bad_lines)} of {len(bad_lines) + int(ok.sum())} rows of {name} skipped "
                f"(truncated, non-numeric, non-finite or implausible time) at line {shown}",
            )
        )
    if not ok.any():
        problems.append(("empty", f"{name} has no valid rows; recording skipped"))
        return empty, problems
    try:
        t_ns = to_ns(t_raw[ok], unit, exact)
    except OverflowError as exc:
        problems.append(("bad_time_unit", f"attr_time of {name}: {exc}; file skipped (expected Unix epoch milliseconds)"))
        return empty, problems
    if unit != "ms":
        clue = "Unix epoch time by its magnitude" if guess.by_epoch == unit else "not Unix epoch time"
        problems.append(
            (
                "time_unit",
                f"attr_time of {name} is in {UNIT_NAMES[unit]} ({guess.rate_hz:.0f} Hz by its spacing, {clue}), "
                "not milliseconds; converted to ns",
            )
        )
    return SensorStream(t_ns, xyz[ok]), problems


def read_realworld_csv(path: Path) -> tuple[SensorStream, list[tuple[str, str]]]:
    """:func:`parse_realworld_csv` of a CSV file on disk (e.g. the committed sample).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"REALWORLD CSV {path} does not exist")
    return parse_realworld_csv(path.read_bytes(), path.name)


def _as_int(field: str) -> int | None:
    try:
        return int(field.strip().strip('"'))
    except ValueError:
        return None


def _parse_rows(lines: list[str], n_fields: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Numeric rows of ``lines``: values (m, n_fields), their line indices, indices of bad lines.

    Fast path: numpy's C parser on everything. If any row is malformed, each line is first
    checked against a strict number grammar (which accepts what that parser accepts except
    nan/inf, which are rejected afterwards anyway), so both paths keep the same rows.
    """
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    if not nonblank:
        return np.empty((0, n_fields)), np.empty(0, np.int64), []
    try:
        values = np.loadtxt(lines, delimiter=",", comments=None, dtype=np.float64, ndmin=2)
        if values.shape == (len(nonblank), n_fields):
            return values, np.asarray(nonblank, np.int64), []
    except ValueError:
        pass
    row = re.compile(_NUM + ("," + _NUM) * (n_fields - 1))
    good = [i for i in nonblank if row.fullmatch(lines[i])]
    good_set = set(good)
    bad = [i for i in nonblank if i not in good_set]
    if not good:
        return np.empty((0, n_fields)), np.empty(0, np.int64), bad
    values = np.loadtxt([lines[i] for i in good], delimiter=",", comments=None, dtype=np.float64, ndmin=2)
    return values, np.asarray(good, np.int64), bad
