"""A device's life on the home server after enrolment: re-issued, renamed, forgotten, its bundle cleaned away.

* :func:`reissue`: a new password for the same name (a reset phone, a lost bundle). The broker
  account gets the new password and is reloaded, so the old one is refused from that moment and
  a session logged in with it is closed; a new bundle and QR code are written; the registry,
  its participation and the run's records are untouched, so the history stays one device's.
* :func:`rename`: a device id is its MQTT user name and the id in its topics
  (``fedhar/v1/<fed>/client/<id>/...``) and ACL, so a rename cannot be an alias on the broker:
  it is a new account and ACL under the new name, the old account removed (its session
  closed, its password refused), the registry row and participation moved to the new name
  (the old name stays revoked for good, with ``renamed_to``), the kept personalised models
  moved, the old retained status and models cleared, and a new bundle for the device to load.
  Rounds already recorded keep the name the device had then (they are what happened).
* :func:`scrub_run`: what ``forget`` removes from the run's records: every per-device entry of
  the name in ``state.sqlite`` (round records, events, meta), then ``report.json`` and
  ``report.md`` rewritten from them. Counts (selected, updates, clients) stay: they are
  anonymous. FedDWA's weight matrix loses the device's row and column.
* :func:`prune_bundles`: enrolment bundles hold the device's password; they are deleted once
  the device has joined, when it is revoked, renamed or forgotten, or after a set age. An
  invitation (``invite``, enrolment by certificate) is another kind of artefact: shared by every
  device it invites and holding no device's secret, it lives until its stated expiry or
  ``invite --revoke`` (:func:`note_invitation`, :func:`drop_invitation`), never removed with the bundles.
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
"""Default age (s) after which an enrolment bundle is deleted even if its device never joined: a
week is long enough to hand a device its bundle, short enough that a forgotten copy of the
password does not lie in the data folder for months (enrol again with ``reissue``)."""


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
"""The name of the invitation's files in ``<data>/enrolment/`` (``invitation.json``, ``.png``; its expiry in ``.expires``)."""
INVITATION_DAYS = 30
"""How long an invitation lives unless ``invite --days`` says otherwise: a month to enrol a household's devices."""


def note_invitation(data: Path, expires_unix: float) -> None:
    """Record when the invitation just written in ``<data>/enrolment/`` expires (UNIX s)."""
    from har_models.files import atomic_write_bytes

    atomic_write_bytes(Path(data) / "enrolment" / f"{INVITATION}.expires", json.dumps({"expires_unix": float(expires_unix)}).encode())


def invitation_expiry(data: Path) -> float | None:
    """When the invitation expires (UNIX s); None without one, or with one of a release that recorded no expiry."""
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
    """Delete the enrolment bundles that are no longer needed; returns the device names whose files went.

    The invitation is not a bundle: it goes only when its expiry has passed (:func:`note_invitation`).
    A bundle goes when its device is not enrolled (revoked, renamed, forgotten, or unknown to the
    registry), has joined (named in ``joined``, or has contributed to a round since the bundle was
    written: a participation row newer than the file, so a bundle made again by ``reissue`` for a
    device that took part before stays until the device uses it), or its JSON file is older than
    ``max_age_s`` seconds (``now`` in UNIX s, default now).

    Raises
    ------
    coordinator.server.registry.RegistryDamaged
        If ``server.sqlite`` cannot be read.
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
    """A round record's JSON (:meth:`coordinator.record.RoundRecord.to_json`) without client ``name``.

    Removed: ``name`` as a key (per-client figures, failures, growth contributions), in lists
    (missing), rejection entries (``[client id, reason, count]``, or objects with its
    ``client_id``), its row and column of ``feddwa_weights``.
    Counts and means stay (they name no device).
    """
    out = _scrub(summary, name)
    return out if isinstance(out, dict) else {}


def scrub_run(run_dir: Path, name: str) -> int:
    """Remove client ``name`` from the run in ``run_dir``: round records, events and meta of
    ``state.sqlite`` (one transaction), then ``report.json``/``report.md`` rewritten from them.

    Returns the number of round records changed. A missing run folder is nothing to do (0).
    The rounds' rewrite counter is raised, so a running status page reads them again.

    Raises
    ------
    coordinator.state.StateDamaged
        If ``state.sqlite`` cannot be read or written.
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
    """Delete ``name``'s personalised models (every kept round), spilled updates and enrolment files; returns how many."""
    removed = 0
    for path in [*(Path(data) / "run" / "models").glob(f"r*/personal/{name}.safetensors"),
                 *(Path(data) / "run" / "spill").glob(f"*/{name}.safetensors")]:  # fmt: skip
        path.unlink(missing_ok=True)
        removed += 1
    return removed + delete_bundle(data, name)


def move_personal_models(data: Path, old: str, new: str) -> int:
    """Rename ``old``'s kept personalised models (``run/models/r*/personal/OLD.safetensors``) to ``new``; returns how many."""
    n = 0
    for path in sorted((Path(data) / "run" / "models").glob(f"r*/personal/{old}.safetensors")):
        os.replace(path, path.with_name(f"{new}.safetensors"))
        n += 1
    return n


LEAVE_REQUESTS = "leave_requests.json"
"""Devices that left from their app, in the data folder: name -> ``{"forget": bool, "sent_unix": float, "noted_unix": float}``."""


def leave_requests(data: Path) -> dict[str, dict[str, Any]]:
    """The devices that said they left (:attr:`har_models.wire.messages.ClientStatus.left`), by name; {} when none (or unreadable)."""
    try:
        doc = json.loads((Path(data) / LEAVE_REQUESTS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in doc.items() if isinstance(v, dict)} if isinstance(doc, dict) else {}


def note_leave_request(data: Path, name: str, forget: bool, sent_unix: float, now: float | None = None) -> bool:
    """Keep a device's word that it left (asking to be forgotten when ``forget``); returns whether it is news.

    Only the device's own broker account can publish its status, so the request is the device's;
    it deletes nothing: the operator sees it (``fedhar-coordinator devices``) and decides
    (``fedhar-coordinator forget NAME``), which drops it (:func:`drop_leave_request`).

    Raises
    ------
    OSError
        If the file cannot be written.
    """
    from har_models.files import atomic_write_bytes

    requests = leave_requests(data)
    old = requests.get(name)
    if old is not None and old.get("forget") == forget and old.get("sent_unix") == sent_unix:
        return False
    requests[name] = {"forget": bool(forget), "sent_unix": float(sent_unix), "noted_unix": time.time() if now is None else now}
    atomic_write_bytes(Path(data) / LEAVE_REQUESTS, json.dumps(requests, indent=1, sort_keys=True).encode())
    return True


def drop_leave_request(data: Path, name: str) -> bool:
    """Forget ``name``'s leave request (it was acted on, or the device came back); returns whether there was one.

    Raises
    ------
    OSError
        If the file cannot be written.
    """
    from har_models.files import atomic_write_bytes

    requests = leave_requests(data)
    if requests.pop(name, None) is None:
        return False
    atomic_write_bytes(Path(data) / LEAVE_REQUESTS, json.dumps(requests, indent=1, sort_keys=True).encode())
    return True


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
