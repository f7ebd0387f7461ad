"""On-disk cache of prepared per-subject arrays, so a second run does not re-parse raw files.

One ``.npz`` (``allow_pickle=False``) per dataset, subject and settings, with a stored *key*
(JSON: :data:`CACHE_FORMAT`, settings, source fingerprint); an entry is used only when its key
equals the caller's. Writes go to a temporary name and are renamed over the entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from har_models.files import atomic_write

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
"""Version of the cache file layout; bump it when the stored arrays change meaning."""

_KEY_ARRAY = "__cache_key__"


def default_cache_dir() -> Path:
    """Where prepared datasets are cached when the caller does not say.

    ``$FEDHAR_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/fedhar``, else ``~/.cache/fedhar``.
    """
    env = os.environ.get("FEDHAR_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fedhar"


def cache_file(cache_dir: Path, dataset: str, subject: str, settings: Mapping[str, object]) -> Path:
    """Path of the cache entry for ``subject`` of ``dataset`` prepared with (JSON-serialisable) ``settings``.

    A short settings hash is in the name.
    """
    digest = hashlib.sha256(_canonical({"format": CACHE_FORMAT, "settings": settings}).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{dataset}-{subject}-{digest}.npz"


def load_cached(path: Path, key: Mapping[str, object]) -> dict[str, np.ndarray] | None:
    """Arrays of the cache entry at ``path`` if its stored key equals ``key``, else None.

    A missing, unreadable or outdated entry is a logged miss, never an error.
    """
    path = Path(path)
    if not path.is_file():
        log.debug("cache miss: %s does not exist", path)
        return None
    want = _canonical({"format": CACHE_FORMAT, "key": key})
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = str(npz[_KEY_ARRAY][()]) if _KEY_ARRAY in npz.files else None
            if stored != want:
                log.info("cache entry %s is outdated (source files, settings or format changed); preparing again", path)
                return None
            return {name: np.asarray(npz[name]) for name in npz.files if name != _KEY_ARRAY}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        log.warning("cache entry %s is unreadable (%s); preparing again and overwriting it", path, exc)
        return None


def save_cached(path: Path, key: Mapping[str, object], arrays: Mapping[str, np.ndarray]) -> None:
    """Write a cache entry atomically (temporary file in the same folder, then rename); the folder is created if needed.

    OSError if it cannot be written; ValueError for an object array or a name clashing with the key entry.
    """
    path = Path(path)
    if _KEY_ARRAY in arrays:
        raise ValueError(f"save_cached: array name {_KEY_ARRAY!r} is reserved")
    for name, a in arrays.items():
        if np.asarray(a).dtype == object:
            raise ValueError(f"save_cached: array {name!r} has dtype object; store numbers or strings only")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {name: np.asarray(a) for name, a in arrays.items()}
    payload[_KEY_ARRAY] = np.array(_canonical({"format": CACHE_FORMAT, "key": key}))
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **payload)

    atomic_write(path, write)


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
