"""``fedhar-coordinator backup`` and ``restore``: the commands, and the retention of scheduled backups.

``backup DEST`` writes one backup into the new folder ``DEST``
(:func:`coordinator.server.backup.backup`). ``backup DEST --keep N``, as the backup timer runs it
(``firmware_scripts/systemd/fedhar-backup.timer``), writes it into a new ``DEST/fedhar-<time>``
folder and then deletes the oldest complete backups there beyond the newest ``N``
(:func:`keep_newest`). ``restore SRC`` puts one back (:mod:`coordinator.server.restore`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from coordinator.server.audit import audit
from coordinator.server.backup import MANIFEST, BackupError, backup

STAMPED = re.compile(r"^fedhar-\d{8}-\d{6}$")
"""The names of the backups ``--keep`` makes and may delete: ``fedhar-20261201-031500``."""


def stamped_folder(parent: Path, now: float | None = None) -> Path:
    """``parent/fedhar-YYYYmmdd-HHMMSS`` for the local time ``now`` (default now), a second later if that one exists."""
    t = time.time() if now is None else now
    while True:
        path = Path(parent) / time.strftime("fedhar-%Y%m%d-%H%M%S", time.localtime(t))
        if not path.exists():
            return path
        t += 1.0


def keep_newest(parent: Path, keep: int) -> list[Path]:
    """Delete the complete backups in ``parent`` (folders named ``fedhar-<time>`` with a manifest) beyond the newest ``keep``,
    by the time their manifests recorded; returns the folders deleted, oldest first. Other folders are never touched.

    Raises
    ------
    ValueError
        If ``keep`` < 1 (the newest backup is always kept).
    """
    if keep < 1:
        raise ValueError(f"--keep {keep}: keep at least the newest backup (1 or more)")
    complete: list[tuple[float, Path]] = []
    for path in Path(parent).iterdir():
        if path.is_dir() and STAMPED.match(path.name):
            try:
                complete.append((float(json.loads((path / MANIFEST).read_text())["created_unix"]), path))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # incomplete (stopped while copying) or not ours: left for a person to look at
    complete.sort()
    gone = [path for _, path in complete[: max(0, len(complete) - keep)]]
    for path in gone:
        shutil.rmtree(path)
    return gone


def build_parser(cmd: str) -> argparse.ArgumentParser:
    """The parser of ``fedhar-coordinator backup`` (``cmd`` "backup") or ``restore``."""
    from coordinator.server.settings import default_data_dir
    from har_io.cli import add_logging_arguments

    what = ("Copy the home server's state (safe while serve runs): the data folder, its settings, the broker folder"
            if cmd == "backup" else "Put a backup back, with each file's owner, group and mode as it recorded them")
    ap = argparse.ArgumentParser(prog=f"fedhar-coordinator {cmd}", description=what)
    if cmd == "backup":
        ap.add_argument("dest", type=Path, help="a new folder for the backup (best on another disk); with --keep, the folder of backups")
        ap.add_argument("--config", type=Path, default=None, metavar="FILE", help="settings file (default <data>/server.toml)")
        ap.add_argument("--keep", type=int, default=None, metavar="N",
                        help="write the backup into a new DEST/fedhar-<time> and keep the newest N there (the timer's form)")  # fmt: skip
        ap.add_argument("--etc", type=Path, default=None, metavar="DIR",
                        help="also back up this folder: the units' environment and password files (/etc/fedhar)")  # fmt: skip
    else:
        ap.add_argument("src", type=Path, help="a folder fedhar-coordinator backup wrote")
        ap.add_argument("--force", action="store_true", help="move existing non-empty targets aside (nothing is deleted)")
    ap.add_argument("--data", type=Path, default=None, help=f"data folder (default $STATE_DIRECTORY, else {default_data_dir({})})")
    add_logging_arguments(ap, progress=False)
    return ap


def main(cmd: str, argv: list[str]) -> int:
    """``fedhar-coordinator backup DEST [--keep N] [--etc DIR]`` / ``restore SRC [--force]``: 0 done, 2 bad options or a
    refused backup (the reason printed)."""
    from coordinator.server.ownership import match_data_owner
    from coordinator.server.restore import restore
    from coordinator.server.settings import default_data_dir, read_serve_file
    from har_io.cli import setup_logging
    from har_io.exit_codes import Exit

    args = build_parser(cmd).parse_args(argv)
    setup_logging(args.log_level)
    prog = f"fedhar-coordinator {cmd}"
    try:
        if cmd == "backup":
            data = args.data or default_data_dir()
            settings = args.config or data / "server.toml"
            file = read_serve_file(settings)
            broker_dir = Path(file.server.broker_dir) if file.server.broker_dir else None
            dest = Path(args.dest).resolve()
            if args.keep is not None:
                if args.keep < 1:
                    raise ValueError(f"--keep {args.keep}: keep at least the newest backup (1 or more)")
                dest.mkdir(mode=0o700, parents=True, exist_ok=True)
                dest = stamped_folder(dest)
            manifest = backup(data, dest, settings, broker_dir, args.etc)
            audit(data, "backup", None, f"to {dest}")
            match_data_owner(data)
            more = "".join(f", the {what} folder {manifest['parts'][what]}" for what in ("broker", "etc") if manifest["parts"][what])
            print(f"backup of {data} in {dest}: {len(manifest['files'])} files{more}; it holds passwords")
            for old in keep_newest(dest.parent, args.keep) if args.keep is not None else []:
                print(f"deleted the older backup {old} (--keep {args.keep})")
        else:
            for line in restore(args.src, args.data, args.force):
                print(line)
    except (BackupError, ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return int(Exit.USAGE)
    return int(Exit.OK)
