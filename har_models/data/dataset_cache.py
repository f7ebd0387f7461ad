"""On-disk cache of prepared per-subject arrays, so a second run does not re-parse raw files.

One ``.npz`` file (``allow_pickle=False``) per dataset, subject and preprocessing settings.
Next to the arrays it stores a *key*: a JSON document with the cache format version, the
settings and a fingerprint of the source files. An entry is used only when its stored key
equals the key the caller computes now, so a changed setting, a changed source file or a
new :data:`CACHE_FORMAT` always means a fresh preparation. Files are written to a
temporary name in the same folder and renamed over the old entry, so a reader never sees
a half-written file and a crash leaves at worst a stray ``*.tmp``.
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
    """Path of the cache entry for one subject prepared with ``settings``.

    The file name carries a short hash of the settings, so entries for different settings
    (say, one position versus all seven) live side by side; a change of the *source*
    overwrites the entry of the same name.

    Parameters
    ----------
    cache_dir : Path
        Cache folder (need not exist yet).
    dataset, subject : str
        E.g. ``"realworld"``, ``"proband4"``; used verbatim in the file name.
    settings : mapping
        JSON-serialisable preprocessing settings.
    """
    digest = hashlib.sha256(_canonical({"format": CACHE_FORMAT, "settings": settings}).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{dataset}-{subject}-{digest}.npz"


def load_cached(path: Path, key: Mapping[str, object]) -> dict[str, np.ndarray] | None:
    """Arrays of the cache entry at ``path`` if its stored key equals ``key``, else None.

    A missing, unreadable or outdated entry is a miss (logged at debug level for a missing
    file, info for an outdated one, warning for an unreadable one), never an error.

    Parameters
    ----------
    path : Path
        From :func:`cache_file`.
    key : mapping
        JSON-serialisable: settings, source fingerprint and anything else that must match.

    Returns
    -------
    dict of str to ndarray, or None
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
    """Write a cache entry atomically (temporary file in the same folder, then rename).

    Parameters
    ----------
    path : Path
        From :func:`cache_file`; its folder is created if needed.
    key : mapping
        The key :func:`load_cached` will compare against.
    arrays : mapping of str to ndarray
        Numeric or unicode arrays (no objects: the file is read with ``allow_pickle=False``).

    Raises
    ------
    OSError
        If the folder cannot be created or written (the caller decides whether that matters).
    ValueError
        If an array has dtype object or a name clashes with the reserved key entry.
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
