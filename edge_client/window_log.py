"""An append-only, crash-safe log of labelled windows: what the device's owner recorded.

A database file cut short is lost whole, and recorded activity cannot be fetched again, so every
window is one self-checking record::

    file header   b"FHWL" | u16 version | u16 n_channels | u16 window | u16 len(name) | label-set name (UTF-8)
    each record   b"FHWR" | u32 body_len | u32 crc32(body) | body
    body          i64 t_start_ns | i64 label | float32 x[n_channels * window] (little-endian, channel-major)

Appends are fsync-ed before :meth:`WindowLog.append` returns. On open a record cut off or failing
its checksum is dropped and logged, the others kept, and the file rewritten. Over
``max_windows + slack`` windows, the oldest windows of the largest activity are dropped one at a
time until ``max_windows`` remain (rare activities and every activity's newest stay); rewrites go
through a temporary file and a rename.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from pathlib import Path

import numpy as np

from har_models.data.labels import LabelSet
from har_models.data.windowing import N_CHANNELS, WINDOW, WindowSet
from har_models.files import atomic_write_bytes

log = logging.getLogger("fedhar.client.window_log")

FILE_MAGIC = b"FHWL"
RECORD_MAGIC = b"FHWR"
VERSION = 1
_FILE_HEAD = struct.Struct("<4sHHHH")
_REC_HEAD = struct.Struct("<4sII")
_BODY_HEAD = struct.Struct("<qq")


class WindowLog:
    """Append-only log of labelled windows in ``path`` (created with its folder).

    ``max_windows`` bounds it (20,000: about 7 hours of recording, 61 MB at T = 128); ``slack``
    windows above it (default 5 %) are allowed before a trim, so a full log is not rewritten on every
    append. Raises ValueError if the file is not a window log, or holds another label set or window length.
    """

    def __init__(self, path: Path, labels: LabelSet, window: int = WINDOW, max_windows: int = 20_000, slack: int | None = None):
        if max_windows <= 0:
            raise ValueError(f"WindowLog: max_windows must be > 0, got {max_windows}")
        self.path = Path(path)
        self.labels = labels
        self.window = int(window)
        self.max_windows = int(max_windows)
        self.slack = max(1, self.max_windows // 20) if slack is None else int(slack)
        self._name = labels.name.encode()
        self._body_len = _BODY_HEAD.size + 4 * N_CHANNELS * self.window
        self._rec_len = _REC_HEAD.size + self._body_len
        self._lock = threading.Lock()
        self.dropped_on_open = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._t = np.empty(0, np.int64)
        self._y = np.empty(0, np.int64)
        if self.path.exists() and self.path.stat().st_size > 0:
            self._load()
        else:
            self._rewrite(np.empty((0, N_CHANNELS, self.window), np.float32), self._y, self._t)

    # -- layout ----------------------------------------------------------------------------
    def _file_header(self) -> bytes:
        return _FILE_HEAD.pack(FILE_MAGIC, VERSION, N_CHANNELS, self.window, len(self._name)) + self._name

    def _records(self, x: np.ndarray, y: np.ndarray, t: np.ndarray) -> bytes:
        out = bytearray()
        for i in range(len(y)):
            body = _BODY_HEAD.pack(int(t[i]), int(y[i])) + np.ascontiguousarray(x[i], dtype="<f4").tobytes()
            out += _REC_HEAD.pack(RECORD_MAGIC, len(body), zlib.crc32(body)) + body
        return bytes(out)

    def _load(self) -> None:
        data = self.path.read_bytes()
        head = self._file_header()
        if len(data) < len(head) and head.startswith(data):  # created, then cut off inside its header
            log.warning("window log %s: header cut off after %d bytes; starting an empty log", self.path, len(data))
            self._rewrite(np.empty((0, N_CHANNELS, self.window), np.float32), self._y, self._t)
            return
        if data[: _FILE_HEAD.size] != head[: _FILE_HEAD.size] or data[: len(head)] != head:
            if data[:4] != FILE_MAGIC:
                raise ValueError(f"{self.path} is not a fedhar window log; move it away or choose another folder")
            _, version, ch, win, n = _FILE_HEAD.unpack_from(data)
            name = data[_FILE_HEAD.size : _FILE_HEAD.size + n].decode(errors="replace")
            raise ValueError(
                f"{self.path} holds windows of label set {name!r} ({ch} x {win}, format {version}), "
                f"not {self.labels.name!r} ({N_CHANNELS} x {self.window}, format {VERSION}); use another state folder"
            )
        xs, ys, ts = [], [], []
        pos, bad, n_rec = len(head), [], 0
        while pos < len(data):
            rec = data[pos : pos + self._rec_len]
            if len(rec) < self._rec_len:
                bad.append(f"a record cut off after {len(rec)} of {self._rec_len} bytes at offset {pos}")
                break
            magic, blen, crc = _REC_HEAD.unpack_from(rec)
            body = rec[_REC_HEAD.size :]
            if magic != RECORD_MAGIC or blen != self._body_len or zlib.crc32(body) != crc:
                bad.append(f"a damaged record at offset {pos}")
            else:
                t, y = _BODY_HEAD.unpack_from(body)
                ts.append(t)
                ys.append(y)
                xs.append(np.frombuffer(body, dtype="<f4", offset=_BODY_HEAD.size).reshape(N_CHANNELS, self.window))
                n_rec += 1
            pos += self._rec_len
        self._t = np.array(ts, np.int64)
        self._y = np.array(ys, np.int64)
        if bad:
            self.dropped_on_open = len(bad)
            for b in bad:
                log.warning("window log %s: dropped %s; %d complete windows kept", self.path, b, n_rec)
            x = np.stack(xs) if xs else np.empty((0, N_CHANNELS, self.window), np.float32)
            self._rewrite(x, self._y, self._t)

    def _rewrite(self, x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        """Replace the file by these windows atomically (temporary file, fsync, rename, fsync folder)."""
        atomic_write_bytes(self.path, self._file_header() + self._records(x, y, t))
        self._y, self._t = np.asarray(y, np.int64), np.asarray(t, np.int64)

    # -- public ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._y.size)

    def counts(self) -> np.ndarray:
        """Windows per class, shape (C,)."""
        with self._lock:
            return np.bincount(self._y, minlength=len(self.labels)).astype(np.int64)

    def append(self, windows: WindowSet) -> int:
        """Append windows (x ``(k, 6, T)`` float32) durably, fsync-ed on return; returns how many.

        Raises ValueError on another label set or window length.
        """
        if len(windows) == 0:
            return 0
        if windows.labels != self.labels:
            raise ValueError(f"WindowLog.append: windows of label set {windows.labels.name!r}, the log keeps {self.labels.name!r}")
        if windows.x.shape[1:] != (N_CHANNELS, self.window):
            raise ValueError(f"WindowLog.append: windows of shape {windows.x.shape[1:]}, the log keeps (6, {self.window})")
        assert windows.t_start_ns is not None
        blob = self._records(windows.x, windows.y, windows.t_start_ns)
        with self._lock:
            with open(self.path, "ab") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            self._y = np.concatenate([self._y, windows.y])
            self._t = np.concatenate([self._t, windows.t_start_ns])
            if len(self._y) > self.max_windows + self.slack:
                self._trim()
        return len(windows)

    def _trim(self) -> None:
        keep = keep_mask_for_limit(self._y, self.max_windows, len(self.labels))
        dropped = np.bincount(self._y[~keep], minlength=len(self.labels))
        x = self._read_x()[keep]
        self._rewrite(x, self._y[keep], self._t[keep])
        log.info("window log %s: over %d windows; dropped the oldest of the largest activities: %s", self.path, self.max_windows,
                 ", ".join(f"{self.labels.names[c]} {int(n)}" for c, n in enumerate(dropped) if n))  # fmt: skip

    def _read_x(self) -> np.ndarray:
        data = self.path.read_bytes()
        start = len(self._file_header())
        n = (len(data) - start) // self._rec_len
        recs = np.frombuffer(data, dtype=np.uint8, count=n * self._rec_len, offset=start).reshape(n, self._rec_len)
        x = recs[:, _REC_HEAD.size + _BODY_HEAD.size :].copy().view("<f4")
        return x.reshape(n, N_CHANNELS, self.window).astype(np.float32)

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """Start times (N,) int64 ns and labels (N,) int64 of the windows, in the order they were recorded (copies)."""
        with self._lock:
            return self._t.copy(), self._y.copy()

    def remove(self, drop: np.ndarray) -> int:
        """Delete the windows where ``drop`` (one flag per window of :meth:`index`) is True; returns how many.

        Rewritten atomically, as a trim is. Raises ValueError if the flags do not match (the log changed since).
        """
        drop = np.asarray(drop, bool)
        with self._lock:
            if drop.shape != self._y.shape:
                raise ValueError(f"WindowLog.remove: {drop.size} flags for {self._y.size} windows; read the index again")
            n = int(drop.sum())
            if n:
                self._rewrite(self._read_x()[~drop], self._y[~drop], self._t[~drop])
        if n:
            log.info("window log %s: deleted %d windows", self.path, n)
        return n

    def read(self) -> WindowSet:
        """All windows in the order they were recorded: x (N, 6, T) float32, y (N,), t_start_ns (N,)."""
        with self._lock:
            x = self._read_x()
            return WindowSet(x, self._y.copy(), self.labels, self._t.copy())


def keep_mask_for_limit(y: np.ndarray, max_windows: int, n_classes: int) -> np.ndarray:
    """Which windows (labels in recording order) stay when at most ``max_windows`` may: the oldest window of the class
    with the most windows (ties: the lower index) goes first, repeatedly; True for windows kept."""
    y = np.asarray(y, np.int64)
    counts = np.bincount(y, minlength=n_classes).astype(np.int64)
    excess = int(y.size - max_windows)
    drop = np.zeros(n_classes, np.int64)
    for _ in range(max(0, excess)):
        c = int(np.argmax(counts))
        counts[c] -= 1
        drop[c] += 1
    keep = np.ones(y.size, bool)
    for cls in np.flatnonzero(drop).tolist():
        idx = np.flatnonzero(y == cls)
        keep[idx[: int(drop[cls])]] = False
    return keep

