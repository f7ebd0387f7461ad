"""The broker's TLS certificates as the status site watches them: their expiry, or why they cannot be read.

Read from the broker folder's manifest and the files it names; an unreadable file is a health problem
naming the ``chgrp``/``chmod`` fix, logged once.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from coordinator.server.templating import stamp
from coordinator.server.web.health import first_unreadable, unreadable

log = logging.getLogger("fedhar.server.web")

WARN_EVERY_S = 86400.0
"""A certificate close to its expiry is logged at most this often (s)."""


class CertificateWatch:
    """The certificates of one broker folder, read again only when a file changed; ``problem`` says why they cannot be read."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.problem: str | None = None
        self._lock = threading.Lock()
        self._cache: tuple[tuple[tuple[str, float], ...], list[Any]] = ((), [])
        self._warned: dict[str, float] = {}

    def read(self, now: float) -> list[Any]:
        """The server certificate's and CA's expiry ([] without TLS or unreadable); warns at most daily from 30 days before expiry."""
        from coordinator.broker.certificates import EXPIRY_WARNING_S, certificate_expiry
        from coordinator.broker.settings import MANIFEST_NAME, SetupError, read_settings

        problem: str | None = None
        cached: list[Any] = []
        try:
            bad = first_unreadable([self.folder / MANIFEST_NAME])
            settings = read_settings(self.folder) if bad is None else None
            paths = [Path(p) for p in (settings.tls_cert, settings.tls_ca) if p] if settings is not None else []
            bad = bad or first_unreadable(paths)
            if bad is not None:
                problem = unreadable(*bad)
            else:
                key = tuple((str(p), p.stat().st_mtime) for p in paths)
                with self._lock:
                    cached_key, cached = self._cache
                if key != cached_key and settings is not None:
                    cached = certificate_expiry(settings)
                    with self._lock:
                        self._cache = (key, cached)
        except (SetupError, OSError) as exc:
            problem = f"the broker's certificates cannot be read: {exc}"
        if problem is not None and problem != self.problem:
            log.warning("status page: %s", problem)
        self.problem = problem
        if problem is not None:
            return []
        for c in cached:
            left = c.seconds_left(now)
            if left < EXPIRY_WARNING_S and now - self._warned.get(c.which, -1e18) > WARN_EVERY_S:
                self._warned[c.which] = now
                log.warning("the broker's %s certificate %s %s on %s: renew it (fedhar-coordinator broker renew --out %s "
                            "--ca-key ca.key)", c.which, c.path, "expired" if left < 0 else f"expires in {left / 86400:.0f} days",
                            stamp(c.not_after_unix), self.folder)  # fmt: skip
        return list(cached)
