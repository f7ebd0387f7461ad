"""The home server's audit log ``<data>/audit.jsonl``: one JSON line per operator action, appended, never rewritten.

Written by the commands that change what the server trusts or holds (and by ``serve`` for each
settings reload); the status page shows the newest. A line is ``{"t": UNIX s, "action", "device",
"by", "detail"}``, ``by`` the account (``$SUDO_USER`` under sudo); one ``O_APPEND`` write, fsynced
before the command reports success, so a crash leaves at most a cut last line, which
:func:`read_audit` skips. A forgotten device's name stays: the log says it was forgotten.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

AUDIT_NAME = "audit.jsonl"

ACTIONS = ("enrol", "reissue", "rename", "revoke", "forget", "backup", "restore", "renew", "reload", "pin", "rollback", "release",
           "invite")
"""The actions an entry may name."""


@dataclass(frozen=True)
class AuditEntry:
    """One operator action: when (UNIX s), which action (:data:`ACTIONS`), on which device (or None), by whom, details."""

    t: float
    action: str
    device: str | None
    by: str
    detail: str


def who() -> str:
    """Who acts: ``$SUDO_USER`` when run with sudo, else this account."""
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


def audit(data: Path, action: str, device: str | None = None, detail: str = "") -> AuditEntry:
    """Append one entry to ``data / "audit.jsonl"`` (created 0640) and flush it to disk.

    Raises ValueError for an action outside :data:`ACTIONS`, OSError if the file cannot be written.
    """
    if action not in ACTIONS:
        raise ValueError(f"audit action {action!r}: use one of {', '.join(ACTIONS)}")
    entry = AuditEntry(time.time(), action, device, who(), detail)
    line = json.dumps({"t": entry.t, "action": action, "device": device, "by": entry.by, "detail": detail}) + "\n"
    Path(data).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(data) / AUDIT_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def read_audit(data: Path, newest: int | None = None) -> list[AuditEntry]:
    """The entries, oldest first (only the ``newest`` when given; [] without a file; cut lines skipped). OSError if unreadable."""
    path = Path(data) / AUDIT_NAME
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for text in lines:
        try:
            d = json.loads(text)
            out.append(AuditEntry(float(d["t"]), str(d["action"]), d.get("device"), str(d.get("by", "")), str(d.get("detail", ""))))
        except (ValueError, KeyError, TypeError):
            continue
    return out if newest is None else out[-newest:] if newest > 0 else []
