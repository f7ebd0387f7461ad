"""``fedhar-coordinator backup DEST`` and ``restore SRC``: the home server's state, copied safely while it runs.

What a backup holds (``DEST/``, mode 0700: bundles and the broker folder hold passwords):

* ``data/``: the data folder. Its two SQLite databases (``server.sqlite``, ``run/state.sqlite``)
  are copied with SQLite's online backup API (:meth:`sqlite3.Connection.backup`), which reads a
  consistent snapshot while ``serve`` goes on writing; they are copied first, so every round
  they name has its model files in the copy (a round's models are written before its row).
  Everything else (model versions, the run's kept models and reports, enrolment bundles,
  ``audit.jsonl``) is copied as files; a file deleted while being copied is skipped.
* ``server.toml``: the settings file used (``--config``, default ``<data>/server.toml``).
* ``broker/``: the broker folder (``[server] broker_dir``): accounts, ACL, TLS files, passwords.
* ``manifest.json``: fedhar's version, the time, where each part came from, and each file's
  SHA-256, mode, owner and group; :func:`restore` checks them before anything is put back.

``restore`` refuses a backup that fails its checks (a file missing or changed, a database that
fails ``PRAGMA quick_check``, a registry schema newer than this fedhar), and a target that is not
empty unless ``--force``, which moves it aside (``<path>.before-restore-<time>``, nothing is
deleted). It writes into a sibling folder and renames it into place, and gives files back their
owner and group when run as root. Stop ``serve`` before restoring.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from coordinator.server.audit import audit

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

    Raises
    ------
    BackupError
        If ``src`` cannot be read as a database, or the copy fails ``PRAGMA quick_check``.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30.0)
        try:
            target = sqlite3.connect(dst)
            try:
                source.backup(target)
                check = target.execute("PRAGMA quick_check").fetchall()
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise BackupError(f"{src}: cannot be copied ({exc}); check that it is a fedhar database and readable") from None
    if check != [("ok",)]:
        raise BackupError(f"the copy of {src} fails its integrity check ({check[0][0]}); the source may be damaged")


def _record(root: Path, files: dict[str, Any], prefix: str) -> None:
    """Add every file under ``root/prefix`` to ``files``: SHA-256, mode, owner, group."""
    base = root / prefix
    for path in sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink()):
        st = path.stat()
        files[path.relative_to(root).as_posix()] = {"sha256": _sha256(path), "mode": st.st_mode & 0o7777,
                                                    "uid": st.st_uid, "gid": st.st_gid}  # fmt: skip


def _copy_tree(src: Path, dst: Path, skip: set[Path]) -> None:
    """Copy the files of ``src`` into ``dst`` (modes kept), leaving out ``skip``, lock/journal files and files that vanish."""
    for path in sorted(src.rglob("*")):
        if path in skip or path.is_symlink() or path.name.endswith(_SKIP_SUFFIXES):
            continue
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(path, target)
        except FileNotFoundError:  # deleted by the running server while being copied (an old round's models)
            continue


def backup(data: Path, dest: Path, settings_file: Path, broker_dir: Path | None) -> dict[str, Any]:
    """Copy the home server's state into the new folder ``dest``; returns the manifest (also ``dest/manifest.json``).

    Parameters
    ----------
    data : Path
        The data folder (holds ``server.sqlite``).
    dest : Path
        Where the backup goes; must not exist, or be an empty folder.
    settings_file : Path
        The settings file ``serve`` reads (copied when it exists).
    broker_dir : Path, optional
        The broker folder (``[server] broker_dir``).

    Raises
    ------
    BackupError
        If ``data`` holds no registry, ``dest`` is not empty, or a database cannot be copied.
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
    _record(dest, files, "data")
    parts: dict[str, Any] = {"data": str(data), "settings": None, "broker": None}
    if Path(settings_file).is_file():
        shutil.copy2(settings_file, dest / "server.toml")
        st = os.stat(settings_file)
        files["server.toml"] = {"sha256": _sha256(dest / "server.toml"), "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid}
        parts["settings"] = str(Path(settings_file).resolve())
    if broker_dir is not None and Path(broker_dir).is_dir():
        broker_dir = Path(broker_dir).resolve()
        (dest / "broker").mkdir(mode=0o700)
        _copy_tree(broker_dir, dest / "broker", skip=set())
        _record(dest, files, "broker")
        st = broker_dir.stat()
        parts["broker"] = str(broker_dir)
        parts["broker_owner"] = [st.st_uid, st.st_gid, st.st_mode & 0o7777]
    st = data.stat()
    parts["data_owner"] = [st.st_uid, st.st_gid, st.st_mode & 0o7777]
    manifest = {"fedhar": version, "created_unix": time.time(), "parts": parts, "files": files}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def check_backup(src: Path) -> dict[str, Any]:
    """The manifest of the backup in ``src`` once every file in it checks out.

    Raises
    ------
    BackupError
        If the manifest is missing or unreadable, a file is missing or differs from its SHA-256,
        a database fails ``PRAGMA quick_check``, or the registry's schema is newer than this fedhar reads.
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
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                check = db.execute("PRAGMA quick_check").fetchall()
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() if rel == "server.sqlite" else None
            finally:
                db.close()
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


def _put(src: Path, target: Path, force: bool, files: dict[str, Any], prefix: str, owner: list[int] | None) -> str:
    """Copy the backup's ``src`` folder to ``target`` through a sibling folder and a rename; returns what was done."""
    moved = ""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not force:
            raise BackupError(f"{target} exists and is not empty: stop the server and give --force (it is moved aside, not deleted), "
                              "or restore into an empty folder")  # fmt: skip
        aside = target.with_name(f"{target.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(target, aside)
        moved = f" ({target} moved aside to {aside})"
    elif target.exists():
        target.rmdir()
    staging = target.with_name(f".{target.name}.restoring-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging, copy_function=shutil.copy2)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # give files back their owner and group
        for rel, meta in files.items():
            if rel.startswith(prefix + "/"):
                os.chown(staging / rel[len(prefix) + 1 :], int(meta["uid"]), int(meta["gid"]))
        if owner is not None:
            for path in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
                os.chown(path, owner[0], owner[1])
    if owner is not None:
        os.chmod(staging, owner[2])
    os.replace(staging, target)
    return f"{target} restored{moved}"


def restore(src: Path, data: Path | None = None, force: bool = False) -> list[str]:
    """Put the backup in ``src`` back: the data folder (to ``data``, default where it came from), the
    settings file and the broker folder to where they came from; returns what was done, as lines.

    Raises
    ------
    BackupError
        If the backup fails :func:`check_backup`, or a target is not empty without ``force``.
    """
    src = Path(src).resolve()
    manifest = check_backup(src)
    parts, files = manifest["parts"], manifest["files"]
    target = Path(data).resolve() if data is not None else Path(parts["data"])
    done = [_put(src / "data", target, force, files, "data", parts.get("data_owner"))]
    if parts.get("settings") and (src / "server.toml").is_file():
        settings = Path(parts["settings"])
        if settings.parent == Path(parts["data"]):
            settings = target / settings.name  # it lives in the data folder: restored with it
            shutil.copy2(src / "server.toml", settings)
        elif not settings.exists() or force:
            settings.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / "server.toml", settings)
            done.append(f"{settings} restored")
        else:
            done.append(f"{settings} exists and was kept (--force replaces it); the backup's copy is {src / 'server.toml'}")
    if parts.get("broker") and (src / "broker").is_dir():
        done.append(_put(src / "broker", Path(parts["broker"]), force, files, "broker", parts.get("broker_owner")))
        done.append("restart the broker (systemctl restart mosquitto) so that it reads the restored accounts")
    audit(target, "restore", None, f"from {src} (backup of {time.strftime('%Y-%m-%d %H:%M', time.localtime(manifest['created_unix']))})")
    return done


def main(cmd: str, argv: list[str]) -> int:
    """``fedhar-coordinator backup DEST`` / ``restore SRC``: 0 done, 2 bad options or a refused backup (the reason printed)."""
    from coordinator.server.devices_cli import match_data_owner
    from coordinator.server.settings import default_data_dir, read_serve_file
    from har_io.cli import add_logging_arguments, setup_logging
    from har_io.exit_codes import Exit

    ap = argparse.ArgumentParser(prog=f"fedhar-coordinator {cmd}", description=(__doc__ or "").split("\n\n")[0])
    if cmd == "backup":
        ap.add_argument("dest", type=Path, help="a new folder for the backup (best on another disk)")
        ap.add_argument("--config", type=Path, default=None, metavar="FILE", help="settings file (default <data>/server.toml)")
    else:
        ap.add_argument("src", type=Path, help="a folder fedhar-coordinator backup wrote")
        ap.add_argument("--force", action="store_true", help="move existing non-empty targets aside (nothing is deleted)")
    ap.add_argument("--data", type=Path, default=None, help=f"data folder (default $STATE_DIRECTORY, else {default_data_dir({})})")
    add_logging_arguments(ap, progress=False)
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    prog = f"fedhar-coordinator {cmd}"
    try:
        if cmd == "backup":
            data = args.data or default_data_dir()
            settings = args.config or data / "server.toml"
            file = read_serve_file(settings)
            broker_dir = Path(file.server.broker_dir) if file.server.broker_dir else None
            manifest = backup(data, args.dest, settings, broker_dir)
            audit(data, "backup", None, f"to {Path(args.dest).resolve()}")
            match_data_owner(data)
            broker = f", the broker folder {broker_dir}" if manifest["parts"]["broker"] else ""
            print(f"backup of {data} in {Path(args.dest).resolve()}: {len(manifest['files'])} files{broker}; it holds passwords")
        else:
            for line in restore(args.src, args.data, args.force):
                print(line)
    except (BackupError, ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return int(Exit.USAGE)
    return int(Exit.OK)
