"""The two files through which the app's UI and its Android sensing service talk, and what each holds.

Both are small JSON objects in the app's private folder, each written to a temporary name and
renamed (:func:`write_json_atomic`), so a reader sees the old or the new one, never a mix:
:data:`SETTINGS_FILE` is written by the UI (:class:`~edge_client.app.remote.RemoteController`),
:data:`STATUS_FILE` by the service (:func:`~edge_client.app.service.run_service`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_client.app.config import AppConfig
from edge_client.app.joining import federation_fields
from har_models.data.labels import LABEL_SETS
from har_models.files import atomic_write_bytes

log = logging.getLogger("fedhar.app.service")

SETTINGS_FILE = "app_settings.json"
STATUS_FILE = "app_status.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (:func:`har_models.files.atomic_write_bytes`)."""
    atomic_write_bytes(path, json.dumps(obj))


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None if it is missing or unreadable (mid-rename on odd filesystems)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


FEDERATION_KEYS = ("client_id", "broker", "federation", "username", "password_file", "password_stamp", "tls_ca", "backend")
"""Settings keys that say how the device joins its federation (a change restarts the agent)."""


def settings_of(cfg: AppConfig) -> dict[str, Any]:
    """The settings file's content for ``cfg``, nothing recorded, not taking part.

    ``password_file`` is the path of the stored password (never the password);
    ``password_stamp`` its modification time in ns, so that a new password in the same file
    also reaches the service.
    """
    return {
        "client_id": cfg.client_id,
        "broker": cfg.broker,
        "federation": cfg.federation,
        "username": cfg.username,
        "password_file": str(cfg.password_file) if cfg.password_file else None,
        "password_stamp": _stamp(cfg.password_file),
        "tls_ca": str(cfg.tls_ca) if cfg.tls_ca else None,
        "backend": cfg.backend,
        "labels": cfg.labels.name,
        "recording": None,
        "take_part": False,
        "charge_only": True,
    }


def _stamp(path: Path | None) -> int | None:
    try:
        return path.stat().st_mtime_ns if path else None
    except OSError:
        return None


def config_from_settings(folder: Path, settings: dict[str, Any]) -> AppConfig:
    """The service's :class:`AppConfig` from the settings file's content.

    A setting that is not valid (a CA file deleted since, a hand-edited id) is logged and
    left at its default, so the service still starts and the screen can show the cause.
    """
    labels = LABEL_SETS.get(str(settings.get("labels", "hapt6")), LABEL_SETS["hapt6"])
    cfg = AppConfig(state_dir=folder, labels=labels, client_id="phone")
    for key in ("client_id", "broker", "federation", "username", "password_file", "tls_ca", "backend"):
        if settings.get(key) is None:
            continue
        try:
            cfg = replace(cfg, **federation_fields(folder, {key: settings[key]}))
        except ValueError as exc:
            log.error("settings: %s", exc)
    return cfg


REQUESTS_KEPT = 20
"""Requests of the UI (in the settings) and their answers (in the status) kept: the newest ones."""
