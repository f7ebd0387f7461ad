"""``fedhar-coordinator restore SRC``: a backup put back, with each file's owner, group and mode as the backup recorded them.

A backup failing :func:`coordinator.server.backup.check_backup` is refused, and a non-empty target
unless ``--force`` moves it aside (``<path>.before-restore-<time>``; nothing deleted). Each part is
written beside its target and renamed into place. As root every file gets back its original owner
and group (older backups: the data folder's owner, the broker folder's group), and always its mode.
Stop ``serve`` before restoring.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from coordinator.server.audit import audit
from coordinator.server.backup import BackupError, check_backup
from coordinator.server.data_lock import holder_now
from coordinator.transport.blobs import note_objects_also, noted_objects


def _names(uid: int, gid: int) -> str:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return f"{user}:{group}"


def _recorded(manifest: dict[str, Any], prefix: str) -> dict[str, dict[str, int]]:
    """Owner, group and mode of each file and folder of part ``prefix``, by path inside it ("" for the part's folder)."""
    parts = manifest["parts"]
    out: dict[str, dict[str, int]] = {}
    for table in (manifest.get("dirs", {}), manifest["files"]):
        for rel, meta in table.items():
            if rel == prefix or rel.startswith(prefix + "/"):
                out[rel[len(prefix) + 1 :]] = {k: int(meta[k]) for k in ("mode", "uid", "gid")}
    if manifest.get("owners") != "source":  # a backup that recorded its copies' owners (root's): the folders' owners
        folder = parts.get("data_owner") if prefix == "data" else parts.get(f"{prefix}_owner")
        if folder is not None:
            out[""] = {"uid": folder[0], "gid": folder[1], "mode": folder[2]}
            for meta in out.values():
                if prefix == "data":
                    meta["uid"], meta["gid"] = folder[0], folder[1]
                elif meta["gid"] == 0 and meta["mode"] & 0o040:
                    meta["gid"] = folder[1]
    return out


def _put(src: Path, target: Path, force: bool, owners: dict[str, dict[str, int]]) -> list[str]:
    """Copy the backup's ``src`` folder to ``target`` through a sibling folder and a rename, with ``owners``; lines."""
    moved = ""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not force:
            raise BackupError(f"{target} exists and is not empty: stop the server and give --force (it is moved aside, not deleted), "
                              "or restore into an empty folder")  # fmt: skip
        aside = target.with_name(f"{target.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while aside.exists():  # two restores in one second: each earlier state is kept
            aside, n = aside.with_name(f"{target.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
        os.replace(target, aside)
        moved = f" ({target} moved aside to {aside})"
    elif target.exists():
        target.rmdir()
    staging = target.with_name(f".{target.name}.restoring-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging, copy_function=shutil.copy2)
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    counted: Counter[str] = Counter()
    for rel, meta in sorted(owners.items(), key=lambda kv: -kv[0].count("/")):  # files and deep folders first
        path = staging / rel if rel else staging
        if not path.exists() or path.is_symlink():
            continue
        if as_root:
            os.chown(path, meta["uid"], meta["gid"])
        os.chmod(path, meta["mode"])
        counted[_names(meta["uid"], meta["gid"])] += 1
    os.replace(staging, target)
    owned = ", ".join(f"{who} {n}" for who, n in counted.most_common())
    how = (f"owners, groups and modes as the backup recorded them ({owned})" if as_root
           else "modes as the backup recorded them; owners are this account's (run restore as root to give them back)")  # fmt: skip
    return [f"{target} restored{moved}: {sum(counted.values())} files and folders, {how}"]


def restore(src: Path, data: Path | None = None, force: bool = False) -> list[str]:
    """Put the backup in ``src`` back: the data folder (to ``data``, default where it came from), the settings file,
    the broker folder and the units' folder to where they came from; returns what was done, as lines.

    Raises
    ------
    BackupError
        If the backup fails :func:`coordinator.server.backup.check_backup`, or a target is not empty without ``force``.
    """
    src = Path(src).resolve()
    manifest = check_backup(src)
    parts, files = manifest["parts"], manifest["files"]
    target = Path(data).resolve() if data is not None else Path(parts["data"])
    holder = holder_now(target)
    if holder is not None:
        raise BackupError(f"{target} is in use by {holder}: stop it first (sudo systemctl stop fedhar-coordinator); nothing was restored")
    written_since = noted_objects(target / "run")  # an S3 store outside the folder keeps what was written since the backup
    done = _put(src / "data", target, force, _recorded(manifest, "data"))
    if written_since and (target / "run").is_dir():
        note_objects_also(target / "run", written_since)
        done.append(f"{len(written_since)} blob object(s) written since the backup are removed from the store at the next start")
    settings = Path(parts["settings"]) if parts.get("settings") and (src / "server.toml").is_file() else None
    if settings is not None and settings.parent != Path(parts["data"]):  # one inside the data folder came back with it
        if settings.exists() and not force:
            done.append(f"{settings} exists and was kept (--force replaces it); the backup's copy is {src / 'server.toml'}")
        else:
            settings.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / "server.toml", settings)
            meta = {k: int(files["server.toml"][k]) for k in ("mode", "uid", "gid")}
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                os.chown(settings, meta["uid"], meta["gid"])
            os.chmod(settings, meta["mode"])
            done.append(f"{settings} restored ({_names(meta['uid'], meta['gid'])}, mode {meta['mode']:04o})")
    for part in ("broker", "etc"):
        if parts.get(part) and (src / part).is_dir():
            done += _put(src / part, Path(parts[part]), force, _recorded(manifest, part))
    if parts.get("broker") and (src / "broker").is_dir():
        done.append("restart the broker (systemctl restart mosquitto) so that it reads the restored accounts")
    audit(target, "restore", None, f"from {src} (backup of {time.strftime('%Y-%m-%d %H:%M', time.localtime(manifest['created_unix']))})")
    return done
