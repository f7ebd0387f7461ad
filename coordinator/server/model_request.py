"""An operator's request to change the served model: ``pin VERSION`` or ``rollback [VERSION]``, as one file.

``fedhar-coordinator pin`` / ``rollback`` write ``<data>/model_request.json`` atomically; a running
``serve`` takes it up before its next round::

    {"action": "pin" | "rollback", "version": 7 | null, "id": "<unix time of the request>"}

``pin``: continue from that version; the guard judges afresh from it. ``rollback``: the same with a
shrunk server step; without VERSION, to the guard's best version, which stays the best. The file
stays until the round started from it completes; its ``id`` is then noted in the run's database and
the file deleted, so a request is taken up once (again after a kill -9 in between).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from har_models.files import atomic_write_bytes

REQUEST_FILE = "model_request.json"
"""The request's file in the data folder."""

ACTIONS = ("pin", "rollback")


@dataclass(frozen=True)
class ModelRequest:
    """One request: ``action`` in :data:`ACTIONS`, the version (None: the guard's best, rollback only), its id."""

    action: str
    version: int | None
    id: str

    def describe(self) -> str:
        """``pin to version 7``, ``rollback to the best version``."""
        to = f"version {self.version}" if self.version is not None else "the best version"
        return f"{self.action} to {to}"


def write_request(data: Path, action: str, version: int | None) -> ModelRequest:
    """Write (or replace) the request in ``data`` atomically; ValueError for another action, or ``pin`` without a version."""
    if action not in ACTIONS or (action == "pin" and version is None):
        raise ValueError(f"model request: action must be pin VERSION or rollback [VERSION], got {action} {version}")
    req = ModelRequest(action, version, f"{time.time():.6f}")
    atomic_write_bytes(Path(data) / REQUEST_FILE, json.dumps({"action": action, "version": version, "id": req.id}))
    return req


def read_request(data: Path) -> ModelRequest | None:
    """The pending request in ``data`` (None: none); ValueError naming a file that is not a request."""
    path = Path(data) / REQUEST_FILE
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
        req = ModelRequest(str(d["action"]), None if d.get("version") is None else int(d["version"]), str(d["id"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a model request ({exc}); delete it and run pin or rollback again") from None
    if req.action not in ACTIONS or (req.action == "pin" and req.version is None):
        raise ValueError(f"{path}: not a model request (action {req.action!r}, version {req.version}); delete it and ask again")
    return req


def clear_request(data: Path, req: ModelRequest) -> None:
    """Delete the request file when it still holds ``req`` (a newer request written meanwhile stays)."""
    try:
        now = read_request(data)
    except ValueError:
        return
    if now is not None and now.id == req.id:
        (Path(data) / REQUEST_FILE).unlink(missing_ok=True)
