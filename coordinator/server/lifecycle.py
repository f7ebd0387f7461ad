"""A device's life on the home server after enrolment: its bundle cleaned away, its records scrubbed, its leave request kept.

Bundles hold the device's password: :func:`prune_bundles` deletes them once the device joined, left
the registry or after a set age. An invitation (enrolment by certificate) holds no device's secret
and lives until its expiry or ``invite --revoke``. :func:`scrub_run` is what ``forget`` removes from
the run's records; counts stay, as they are anonymous.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from coordinator.server.registry import Registry

log = logging.getLogger("fedhar.devices")

BUNDLE_MAX_AGE_S = 7 * 24 * 3600.0
"""Age (s) after which an enrolment bundle is deleted even if its device never joined: a week to hand it over."""


def bundle_paths(data: Path, name: str) -> list[Path]:
    """The enrolment files of ``name`` (``<data>/enrolment/NAME.json`` and ``.png``), existing or not."""
    return [Path(data) / "enrolment" / f"{name}.{ext}" for ext in ("json", "png")]


def delete_bundle(data: Path, name: str) -> int:
    """Delete ``name``'s enrolment files; returns how many existed."""
    n = 0
    for p in bundle_paths(data, name):
        if p.exists():
            p.unlink()
            n += 1
    return n


INVITATION = "invitation"
"""The name of the invitation's files in ``<data>/enrolment/`` (``.json``, ``.png``, expiry in ``.expires``)."""
INVITATION_DAYS = 30
"""How long an invitation lives unless ``invite --days`` says otherwise: a month to enrol a household's devices."""


def note_invitation(data: Path, expires_unix: float) -> None:
    """Record when the invitation just written in ``<data>/enrolment/`` expires (UNIX s)."""
    from har_models.files import atomic_write_bytes

    atomic_write_bytes(Path(data) / "enrolment" / f"{INVITATION}.expires", json.dumps({"expires_unix": float(expires_unix)}).encode())


def invitation_expiry(data: Path) -> float | None:
    """When the invitation expires (UNIX s); None without one (or one without a recorded expiry)."""
    try:
        return float(json.loads((Path(data) / "enrolment" / f"{INVITATION}.expires").read_text())["expires_unix"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def drop_invitation(data: Path) -> int:
    """Delete the invitation's files (its expiry passed, or ``invite --revoke``); returns how many existed."""
    n = 0
    for ext in ("json", "png", "expires"):
        p = Path(data) / "enrolment" / f"{INVITATION}.{ext}"
        if p.exists():
            p.unlink()
            n += ext != "expires"
    return n


def prune_bundles(data: Path, joined: set[str] | frozenset[str] = frozenset(), max_age_s: float = BUNDLE_MAX_AGE_S,
                  now: float | None = None) -> list[str]:  # fmt: skip
    """Delete the enrolment bundles no longer needed; the device names whose files went.

    A bundle goes when its device is not enrolled, has joined (in ``joined``, or a participation row
    newer than the file, so a reissued bundle stays until used), or is older than ``max_age_s``. The
    invitation goes only once expired. Raises RegistryDamaged if ``server.sqlite`` cannot be read.
    """
    folder = Path(data) / "enrolment"
    if not folder.is_dir():
        return []
    now = time.time() if now is None else now
    expires = invitation_expiry(data)
    if expires is not None and expires <= now and drop_invitation(data):
        log.info("the invitation expired on %s: its files are deleted (fedhar-coordinator invite makes a new one)",
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(expires)))  # fmt: skip
    names = sorted({p.stem for p in folder.iterdir() if p.suffix in (".json", ".png")} - {INVITATION})
    reg = Registry(data)
    try:
        last_took = {name: p.last_t for name, p in reg.participation_summary().items()}  # UNIX s of the newest row
        gone = []
        for name in names:
            js = folder / f"{name}.json"
            written = js.stat().st_mtime if js.exists() else 0.0
            old = js.exists() and now - written > max_age_s
            took = name in last_took and last_took[name] >= written
            if not reg.is_enrolled(name) or name in joined or took or old:
                delete_bundle(data, name)
                gone.append(name)
    finally:
        reg.close()
    for name in gone:
        log.info("deleted the enrolment bundle of %s (it holds a password no longer needed there)", name)
    return gone


# --------------------------------------------------------------------------------------- the run's records
def _scrub(value: Any, name: str) -> Any:
    """``value`` (a round record's JSON, or part of it) without any entry of client ``name``."""
    if isinstance(value, dict):
        if value.get("client_id") == name:
            return None
        if isinstance(value.get("clients"), list) and isinstance(value.get("p"), list) and name in value["clients"]:
            i = value["clients"].index(name)  # FedDWA's p_ij: drop row i and column i
            return {**value, "clients": [c for c in value["clients"] if c != name],
                    "p": [[x for j, x in enumerate(row) if j != i] for k, row in enumerate(value["p"]) if k != i]}  # fmt: skip
        out = {}
        for k, v in value.items():
            if k == name:
                continue
            s = _scrub(v, name)
            if s is not None or v is None:
                out[k] = s
        return out
    if isinstance(value, list):
        # a rejection is [client id, reason, count]
        kept = [_scrub(v, name) for v in value if v != name and not (isinstance(v, list) and v and v[0] == name)]
        return [v for v in kept if v is not None]
    return value


def scrub_record(summary: dict[str, Any], name: str) -> dict[str, Any]:
    """A round record's JSON without client ``name``: as a key, in lists, in rejections, in ``feddwa_weights``; counts stay."""
    out = _scrub(summary, name)
    return out if isinstance(out, dict) else {}


def scrub_run(run_dir: Path, name: str) -> int:
    """Remove client ``name`` from ``state.sqlite`` (one transaction) and rewrite ``report.json``/``report.md``; records changed.

    A missing run folder is nothing to do (0). Raises StateDamaged if ``state.sqlite`` cannot be read or written.
    """
    from coordinator.record import records
    from coordinator.report import write_report
    from coordinator.state import RunState

    run_dir = Path(run_dir)
    if not (run_dir / "state.sqlite").is_file():
        return 0
    state = RunState(run_dir)
    try:
        changed = state.rewrite_client(name, lambda value: _scrub(value, name))
        rounds = state.rounds()
    finally:
        state.close()
    report = run_dir / "report.json"
    if report.is_file():
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError):
            doc = {}
        header = {k: v for k, v in doc.items() if k not in ("rounds", "models_evaluated", "best", "final")}
        header = _scrub(header, name)
        write_report(run_dir, header, records(rounds), plot=(run_dir / "metrics.png").exists())
    return changed


def forget_files(data: Path, name: str) -> int:
    """Delete ``name``'s personalised models (every kept round), spilled updates and enrolment files; how many."""
    removed = 0
    for path in [*(Path(data) / "run" / "models").glob(f"r*/personal/{name}.safetensors"),
                 *(Path(data) / "run" / "spill").glob(f"*/{name}.safetensors")]:  # fmt: skip
        path.unlink(missing_ok=True)
        removed += 1
    return removed + delete_bundle(data, name)


def move_personal_models(data: Path, old: str, new: str) -> int:
    """Rename ``old``'s kept personalised models to ``new``; how many."""
    n = 0
    for path in sorted((Path(data) / "run" / "models").glob(f"r*/personal/{old}.safetensors")):
        os.replace(path, path.with_name(f"{new}.safetensors"))
        n += 1
    return n


LEAVE_REQUESTS = "leave_requests.json"
"""Devices that left from their app: name -> ``{"forget": bool, "sent_unix": float, "noted_unix": float}``."""


def leave_requests(data: Path) -> dict[str, dict[str, Any]]:
    """The devices that said they left (``ClientStatus.left``), by name; {} when none or unreadable."""
    try:
        doc = json.loads((Path(data) / LEAVE_REQUESTS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in doc.items() if isinstance(v, dict)} if isinstance(doc, dict) else {}


def note_leave_request(data: Path, name: str, forget: bool, sent_unix: float, now: float | None = None) -> bool:
    """Keep a device's word that it left (asking to be forgotten when ``forget``); whether it is news. OSError if unwritable.

    Only the device's own account can publish its status; nothing is deleted: the operator decides.
    """
    requests = leave_requests(data)
    old = requests.get(name)
    if old is not None and old.get("forget") == forget and old.get("sent_unix") == sent_unix:
        return False
    requests[name] = {"forget": bool(forget), "sent_unix": float(sent_unix), "noted_unix": time.time() if now is None else now}
    _write_leave_requests(data, requests)
    return True


def drop_leave_request(data: Path, name: str) -> bool:
    """Forget ``name``'s leave request (acted on, or the device came back); whether there was one. OSError if unwritable."""
    requests = leave_requests(data)
    if requests.pop(name, None) is None:
        return False
    _write_leave_requests(data, requests)
    return True


def _write_leave_requests(data: Path, requests: dict[str, dict[str, Any]]) -> None:
    from har_models.files import atomic_write_bytes

    atomic_write_bytes(Path(data) / LEAVE_REQUESTS, json.dumps(requests, indent=1, sort_keys=True).encode())


def leave_lines(data: Path) -> list[str]:
    """One line per device that left from its app, for ``fedhar-coordinator devices``: when, and what the operator may do."""
    out = []
    for name, req in sorted(leave_requests(data).items()):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(req.get("sent_unix") or req.get("noted_unix") or 0)))
        if req.get("forget"):
            out.append(f"{name} left from its app on {when} and asks to be forgotten: fedhar-coordinator forget {name}")
        else:
            out.append(f"{name} left from its app on {when} (fedhar-coordinator revoke {name} refuses it for good)")
    return out
