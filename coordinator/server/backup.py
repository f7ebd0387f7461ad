"""``fedhar-coordinator backup DEST`` and ``restore SRC``: the home server's state, copied safely while it runs.

``DEST/`` (mode 0700: it holds passwords) has ``data/`` (the two SQLite databases copied first with
the online backup API, a consistent snapshot whose rounds all have their model files; the rest as
files, skipping those deleted meanwhile), ``server.toml``, ``broker/`` (``[server] broker_dir``),
``etc/`` (with ``--etc``) and ``manifest.json``: version, time, sources, each file's SHA-256 and the
original's mode, owner and group, which :func:`check_backup` checks before a restore puts anything back.
With ``--keep N`` each backup is a new ``fedhar-<time>`` folder and the newest N stay (:mod:`coordinator.server.backup_cli`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

log = logging.getLogger("fedhar.backup")

MANIFEST = "manifest.json"
DATABASES = ("server.sqlite", "run/state.sqlite")
"""The data folder's SQLite files (relative paths), copied with the online backup API."""
_SKIP_SUFFIXES = ("-journal", "-wal", "-shm", ".lock", ".pid")


class BackupError(RuntimeError):
    """A backup or restore cannot be done as asked; the message names the file and the fix."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def copy_database(src: Path, dst: Path) -> None:
    """Copy the SQLite database ``src`` to ``dst`` with the online backup API (safe while another process writes it).

    Raises BackupError if ``src`` cannot be read as a database, or the copy fails ``PRAGMA quick_check``.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with closing(sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30.0)) as source, closing(sqlite3.connect(dst)) as target:
            source.backup(target)
            check = target.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        raise BackupError(f"{src}: cannot be copied ({exc}); check that it is a fedhar database and readable") from None
    if check != [("ok",)]:
        raise BackupError(f"the copy of {src} fails its integrity check ({check[0][0]}); the source may be damaged")


def _owner(st: os.stat_result) -> dict[str, int]:
    return {"mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid}


def _record(root: Path, files: dict[str, Any], dirs: dict[str, Any], prefix: str, source: Path) -> None:
    """Add every file under ``root/prefix`` (SHA-256 of the copy, owner and mode of the original) to ``files``, folders to ``dirs``."""
    base = root / prefix
    for path in sorted(p for p in [base, *base.rglob("*")] if not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        original = source / path.relative_to(base)
        try:
            st = original.stat()
        except OSError:  # gone from the source since it was copied: the copy's own
            st = path.stat()
        if path.is_dir():
            dirs[rel] = _owner(st)
        elif path.is_file():
            files[rel] = {"sha256": _sha256(path), **_owner(st)}


def _copy_tree(src: Path, dst: Path, skip: set[Path]) -> None:
    """Copy the files of ``src`` into ``dst`` (modes kept), leaving out ``skip``, locks, journals, sockets and vanished files."""
    for path in sorted(src.rglob("*")):
        if path in skip or path.is_symlink() or path.name.endswith(_SKIP_SUFFIXES):
            continue
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if not path.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(path, target)
        except FileNotFoundError:  # deleted by the running server while being copied (an old round's models)
            continue


def backup(data: Path, dest: Path, settings_file: Path, broker_dir: Path | None, etc_dir: Path | None = None) -> dict[str, Any]:
    """Copy the home server's state into the new (or empty) folder ``dest``; the manifest (also ``dest/manifest.json``).

    Raises BackupError if ``data`` holds no registry, ``dest`` is not empty or inside ``data``, or a database cannot be copied.
    """
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        version = package_version("fedhar")
    except PackageNotFoundError:
        version = "unknown"
    data, dest = Path(data).resolve(), Path(dest).resolve()
    if not (data / "server.sqlite").is_file():
        raise BackupError(f"{data / 'server.sqlite'} does not exist: name the server's data folder with --data")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty folder: name a new folder for the backup")
    if dest == data or data in dest.parents:
        raise BackupError(f"{dest} is inside the data folder {data}: put the backup elsewhere (another disk is best)")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(dest, 0o700)
    for rel in DATABASES:
        if (data / rel).is_file():
            copy_database(data / rel, dest / "data" / rel)
    _copy_tree(data, dest / "data", skip={data / rel for rel in DATABASES})
    files: dict[str, Any] = {}
    dirs: dict[str, Any] = {}
    _record(dest, files, dirs, "data", data)
    parts: dict[str, Any] = {"data": str(data), "settings": None, "broker": None, "etc": None}
    if Path(settings_file).is_file():
        shutil.copy2(settings_file, dest / "server.toml")
        files["server.toml"] = {"sha256": _sha256(dest / "server.toml"), **_owner(os.stat(settings_file))}
        parts["settings"] = str(Path(settings_file).resolve())
    for part, folder in (("broker", broker_dir), ("etc", etc_dir)):
        if folder is not None and Path(folder).is_dir():
            folder = Path(folder).resolve()
            (dest / part).mkdir(mode=0o700)
            _copy_tree(folder, dest / part, skip=set())
            _record(dest, files, dirs, part, folder)
            parts[part] = str(folder)
    st = data.stat()
    parts["data_owner"] = [st.st_uid, st.st_gid, st.st_mode & 0o7777]
    manifest = {"fedhar": version, "created_unix": time.time(), "owners": "source", "parts": parts, "files": files, "dirs": dirs}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def check_backup(src: Path) -> dict[str, Any]:
    """The manifest of the backup in ``src`` once every file in it checks out.

    Raises BackupError for a missing or unreadable manifest, a missing file or one that differs from its
    SHA-256, a database failing ``PRAGMA quick_check``, or a registry schema newer than this fedhar reads.
    """
    from coordinator.server.registry import SCHEMA_VERSION

    src = Path(src)
    try:
        manifest = json.loads((src / MANIFEST).read_text())
        files = dict(manifest["files"])
        parts = dict(manifest["parts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{src / MANIFEST}: not a fedhar backup ({exc}); name the folder fedhar-coordinator backup wrote") from None
    for rel, meta in files.items():
        path = src / rel
        if not path.is_file():
            raise BackupError(f"the backup in {src} is incomplete: {rel} is missing; nothing was restored")
        if _sha256(path) != meta["sha256"]:
            raise BackupError(f"the backup in {src} is damaged: {rel} differs from its checksum; nothing was restored")
    for rel in DATABASES:
        path = src / "data" / rel
        if not path.is_file():
            continue
        try:
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                check = db.execute("PRAGMA quick_check").fetchall()
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() if rel == "server.sqlite" else None
        except sqlite3.Error as exc:
            raise BackupError(f"the backup's {rel} is not a readable database ({exc}); nothing was restored") from None
        if check != [("ok",)]:
            raise BackupError(f"the backup's {rel} fails its integrity check ({check[0][0]}); nothing was restored")
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise BackupError(f"the backup's {rel} has schema {row[0]}, this fedhar reads up to {SCHEMA_VERSION}: "
                              f"restore it with fedhar {manifest.get('fedhar')} or newer")  # fmt: skip
    if "data" not in parts:
        raise BackupError(f"{src / MANIFEST} names no data folder; nothing was restored")
    return manifest
