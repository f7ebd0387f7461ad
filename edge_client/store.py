"""The client's local store: labelled windows, local model, FedALA state, round bookkeeping.

One folder survives a restart: ``store.sqlite`` (windows with their split, key/value metadata),
``local_model.safetensors`` (theta_i, architecture in its metadata), ``ala_state.safetensors`` (W
and flags), ``last_update.bin`` (the last update sent, re-sent after a crash). Files are written
atomically; raw sensor data never leaves the folder. One owner at a time: an exclusive ``flock`` on
``owner.lock`` (naming pid and client id; the kernel drops it however the owner exits), else
:class:`StoreInUseError`. A folder that cannot be written is :class:`StateFolderUnusable`: exit 6 at
opening; while running each failed write sets :attr:`ClientStore.fault` (shown on screen and in the
status, so the coordinator stops selecting the device) until a write succeeds. The store keeps
:class:`WindowCounts` in step with every write of windows and tells its ``window_listeners``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from har_models.data.labels import LabelSet
from har_models.data.splits import DEFAULT_SPLIT_SEED, DEFAULT_TEST_FRACTION, SplitSpec
from har_models.data.windowing import N_CHANNELS, ChannelStats, WindowSet
from har_models.files import atomic_write, atomic_write_bytes
from har_models.wire.safetensors_np import read_metadata

try:
    from safetensors.numpy import load_file, save_file
except ImportError:  # a phone without the Rust wheel: the numpy reader writes the same bytes
    from har_models.wire.safetensors_np import load_file, save_file  # type: ignore[assignment]

LOCK_FILE = "owner.lock"
"""Name of the lock file in a state folder; it holds ``{"pid": ..., "client_id": ...}`` of the owner."""

log = logging.getLogger("fedhar.client.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS windows (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    t_start_ns INTEGER NOT NULL,
    label INTEGER NOT NULL,
    split TEXT NOT NULL CHECK (split IN ('train', 'test')),
    x BLOB NOT NULL
);
"""


@dataclass(frozen=True)
class WindowCounts:
    """What a device reports of its stored windows (aggregates only, never a window).

    ``class_counts``: training windows per class; ``train_stats``: :meth:`ChannelStats.to_json` of the
    training windows (empty without any).
    """

    n_train: int
    n_test: int
    class_counts: tuple[int, ...]
    train_stats: dict[str, object]

    @classmethod
    def of(cls, train: WindowSet, n_test: int) -> WindowCounts:
        """The counts of training windows ``train`` (x of shape (N, 6, T)) beside ``n_test`` test windows."""
        stats = ChannelStats.of(train.x).to_json() if len(train) else {}
        return cls(len(train), int(n_test), tuple(int(c) for c in train.class_counts()), stats)


class StoreInUseError(OSError):
    """A state folder is already open by another :class:`ClientStore`; ``pid`` and ``owner`` (client id) if recorded."""

    def __init__(self, folder: Path, pid: int | None, owner: str) -> None:
        self.folder, self.pid, self.owner = folder, pid, owner
        who = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
        super().__init__(
            f"state folder {folder} is in use by a running fedhar client ({who}, client id {owner or 'unknown'}); "
            "nothing was changed. Stop that client first, or give this one its own --state-dir"
        )


class StateFolderUnusable(OSError):
    """A state folder that cannot be written (read-only, full, not this user's): ``what`` was being written, ``cause`` the error."""

    def __init__(self, folder: Path, what: str, cause: BaseException) -> None:
        self.folder, self.what, self.cause = folder, what, cause
        text = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        super().__init__(
            f"state folder {folder} cannot be written ({what}: {text}); this device takes part in no round until it can. "
            "Make the folder writable by this user (remounted read-write, space freed, owner fixed), then restart it"
        )


def _take_lock(folder: Path, owner: str) -> IO[str]:
    """Open ``folder/owner.lock``, lock it exclusively without waiting, and write the owner into it."""
    f = open(folder / LOCK_FILE, "a+")  # noqa: SIM115 - kept open while the store is open (the lock lives on this descriptor)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        text = f.read()
        f.close()
        try:
            info = json.loads(text)
            pid, who = int(info["pid"]), str(info.get("client_id", ""))
        except (ValueError, KeyError, TypeError):
            pid, who = None, ""
        raise StoreInUseError(folder, pid, who) from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "client_id": owner}) + "\n")
    f.flush()
    return f


class ClientStore:
    """Persistent state of one edge client in ``folder`` (created if missing); ``owner`` is written into the lock file.

    Raises
    ------
    StoreInUseError
        If another store has the folder open (nothing is read or written then).
    StateFolderUnusable
        If the folder cannot be created or written.
    ValueError
        If the folder already holds windows of another label set or window length.
    """

    def __init__(self, folder: Path, labels: LabelSet, window: int = 128, owner: str = ""):
        self.folder = Path(folder)
        self.labels = labels
        self.window = window
        self._lock = threading.Lock()
        self.fault = ""
        self.fault_listeners: list[Callable[[str], object]] = []
        # Called with the new counts after every write of the windows (from the writing thread).
        self.window_listeners: list[Callable[[WindowCounts], object]] = []
        self._counts: WindowCounts | None = None  # of the window table; read once, then replaced by each write
        self._lock_file: IO[str] | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_file = _take_lock(self.folder, owner)
            self._db = sqlite3.connect(self.folder / "store.sqlite", check_same_thread=False)
            self._db.executescript(_SCHEMA)
        except StoreInUseError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise StateFolderUnusable(self.folder, "opening the store", exc) from exc
        try:
            stored = self.get_meta("labels")
            if stored is not None and (stored["name"] != labels.name or stored["window"] != window):
                raise ValueError(
                    f"store {self.folder} holds windows of label set {stored['name']!r} (T={stored['window']}), "
                    f"not {labels.name!r} (T={window}); use another --state-dir"
                )
            self.set_meta("labels", {"name": labels.name, "window": window})
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the database and give up the folder (another store may open it from now on)."""
        if getattr(self, "_db", None) is not None:
            self._db.close()
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Run a write of the state folder; a failure becomes :class:`StateFolderUnusable` and :attr:`fault`, a success clears it."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, StateFolderUnusable):
                raise
            err = StateFolderUnusable(self.folder, what, exc)
            self._set_fault(str(err))
            raise err from exc
        if self.fault:
            log.info("state folder %s can be written again", self.folder)
            self._set_fault("")

    def _set_fault(self, fault: str) -> None:
        """Keep the newest fault's sentence; tell the listeners when a fault begins or ends (not at each failed write)."""
        began_or_ended = bool(fault) != bool(self.fault)
        if fault and fault != self.fault:
            log.error("%s", fault)
        self.fault = fault
        if began_or_ended:
            for listener in list(self.fault_listeners):
                listener(fault)

    # -- metadata ------------------------------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) under ``key``; StateFolderUnusable (and :attr:`fault`) if the folder cannot be written."""
        with self._writing(f"the setting {key}"), self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # -- windows -------------------------------------------------------------------------
    def has_source(self, source: str) -> bool:
        """True if windows from ``source`` (a fingerprint of the recording) were stored already."""
        with self._lock:
            return self._db.execute("SELECT 1 FROM windows WHERE source = ? LIMIT 1", (source,)).fetchone() is not None

    def replace_windows(
        self,
        source: str,
        data: WindowSet,
        test_fraction: float = DEFAULT_TEST_FRACTION,
        seed: int = DEFAULT_SPLIT_SEED,
        *,
        split: SplitSpec | None = None,
    ) -> tuple[int, int]:
        """Replace all stored windows (x ``(N, 6, T)``) by those of ``source``, with a stratified split; return (n_train, n_test).

        The split is :meth:`SplitSpec.indices` over the windows in order (``split``, else from
        ``test_fraction`` and ``seed``), recorded in the metadata so the coordinator's evaluation can
        rebuild the same test windows. ``source``: see ``SubjectSource.store_key``.

        Raises
        ------
        ValueError
            If the windows' label set or shape differ from the store's.
        StateFolderUnusable
            If the folder cannot be written (the windows and their counts stay as they were).
        """
        if data.labels != self.labels:
            raise ValueError(f"replace_windows: windows use label set {data.labels.name!r}, the store {self.labels.name!r}")
        if data.x.shape[1:] != (N_CHANNELS, self.window):
            raise ValueError(f"replace_windows: windows of shape {data.x.shape[1:]}, the store keeps (6, {self.window})")
        spec = split if split is not None else SplitSpec(test_fraction, seed)
        train_idx, test_idx = spec.indices(data.y)
        part = np.full(len(data), "train", dtype=object)
        part[test_idx] = "test"
        assert data.t_start_ns is not None
        rows = [
            (source, int(data.t_start_ns[i]), int(data.y[i]), str(part[i]), data.x[i].astype("<f4").tobytes())
            for i in range(len(data))
        ]
        # The training windows in table order (ascending index), as windows("train") reads them back.
        counts = WindowCounts.of(data.subset(np.sort(train_idx)), len(test_idx))
        with self._writing("the recorded windows"), self._lock, self._db:
            self._db.execute("DELETE FROM windows")
            self._db.executemany("INSERT INTO windows (source, t_start_ns, label, split, x) VALUES (?, ?, ?, ?, ?)", rows)
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", ("split", json.dumps(spec.to_json())))
        self._counts = counts  # after the commit: a failed write leaves the old windows and their counts
        for listener in list(self.window_listeners):
            try:
                listener(counts)
            except Exception:  # the windows are written; a listener's failure must not undo that for the caller
                log.exception("a listener of the window counts failed")
        return len(train_idx), len(test_idx)

    def window_counts(self) -> WindowCounts:
        """The counts of the windows stored now (read from the table once, then kept with each write; sqlite3.Error)."""
        counts = self._counts
        if counts is None:
            with self._lock:
                (n_test,) = self._db.execute("SELECT COUNT(*) FROM windows WHERE split = 'test'").fetchone()
            counts = WindowCounts.of(self.windows("train"), n_test)
            with self._lock:
                if self._counts is None:  # a write in between holds newer counts
                    self._counts = counts
                counts = self._counts
        return counts

    def windows(self, split: str) -> WindowSet:
        """All stored windows of ``split`` ("train" or "test"), in insertion order."""
        if split not in ("train", "test"):
            raise ValueError(f"windows: split must be 'train' or 'test', got {split!r}")
        with self._lock:
            rows = self._db.execute("SELECT t_start_ns, label, x FROM windows WHERE split = ? ORDER BY id", (split,)).fetchall()
        if not rows:
            return WindowSet(np.empty((0, N_CHANNELS, self.window), np.float32), np.empty(0, np.int64), self.labels)
        x = np.stack([np.frombuffer(r[2], dtype="<f4").reshape(N_CHANNELS, self.window) for r in rows])
        return WindowSet(x, np.array([r[1] for r in rows]), self.labels, np.array([r[0] for r in rows]))

    # -- models --------------------------------------------------------------------------
    def save_local_model(self, arch_json: str, state: dict[str, np.ndarray]) -> None:
        """Persist theta_i with its architecture (JSON) atomically."""
        arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}
        with self._writing("the local model"):
            atomic_write(self.folder / "local_model.safetensors", lambda tmp: save_file(arrays, str(tmp), metadata={"arch": arch_json}))

    def load_local_model(self) -> tuple[str, dict[str, np.ndarray]] | None:
        """``(arch_json, state)`` of the last local model, or None if there is none (or it is unreadable)."""
        path = self.folder / "local_model.safetensors"
        if not path.exists():
            return None
        try:
            arch = read_metadata(path).get("arch", "")
            return arch, load_file(str(path))
        except Exception as exc:  # a damaged file must not stop the client: it restarts from the received model
            log.error("local model %s is unreadable (%s); starting again from the next received model", path, exc)
            return None

    def save_tensors(self, name: str, tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Persist a named tensor set (e.g. FedALA's W) with JSON metadata, atomically."""
        arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        with self._writing(f"the tensors {name}"):
            atomic_write(self.folder / f"{name}.safetensors", lambda tmp: save_file(arrays, str(tmp), metadata={"meta": json.dumps(meta)}))

    def load_tensors(self, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The tensor set saved under ``name`` and its metadata, or None."""
        path = self.folder / f"{name}.safetensors"
        if not path.exists():
            return None
        try:
            meta = json.loads(read_metadata(path).get("meta", "{}"))
            return load_file(str(path)), meta
        except Exception as exc:  # see load_local_model
            log.error("%s is unreadable (%s); ignoring it", path, exc)
            return None

    def forget_run_state(self) -> None:
        """Drop the local model, FedALA state, update-encoding residual and last update (a new run starts); windows stay."""
        with self._writing("forgetting the last run"):
            for name in ("local_model.safetensors", "ala_state.safetensors", "encoding_residual.safetensors", "last_update.bin"):
                (self.folder / name).unlink(missing_ok=True)
        for key in ("run_id", "last_update"):
            with self._writing("forgetting the last run"), self._lock, self._db:
                self._db.execute("DELETE FROM meta WHERE key = ?", (key,))

    def save_last_update(self, run_id: str, round_: int, stage: int, envelope: bytes, trained_on: str = "") -> None:
        """Remember the last update sent (to re-send it after a restart) and ``trained_on``, the model's transfer id.

        A round announced again with another model (a coordinator restored from a backup) is trained again.
        """
        with self._writing("the update sent"):
            atomic_write_bytes(self.folder / "last_update.bin", envelope)
        info: dict[str, Any] = {"run_id": run_id, "round": round_, "stage": stage}
        if trained_on:
            info["trained_on"] = trained_on
        self.set_meta("last_update", info)

    def load_last_update(self) -> tuple[dict[str, Any], bytes] | None:
        """``(info, envelope)`` of the last update sent, or None."""
        info = self.get_meta("last_update")
        path = self.folder / "last_update.bin"
        if info is None or not path.exists():
            return None
        return info, path.read_bytes()
