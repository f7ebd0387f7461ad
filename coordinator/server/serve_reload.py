"""SIGHUP to ``serve``: re-read ``server.toml``; ``[server]`` and ``[schedule]`` take effect at once, the rest at the next start.

A file the next start would refuse is refused at once with the reason, the settings in force kept;
a reload during an open round waits for the round to close and says so; each reload is written to
the audit log the page shows (:class:`SettingsReload`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from coordinator.server.serve_setup import changes, federation_config
from coordinator.server.settings import ServeFile, read_serve_file
from har_io.broker_config import BrokerConfig

log = logging.getLogger("fedhar.serve")

AT_START = frozenset(
    {"name", "data_dir", "http_bind", "http_port", "token", "broker_dir", "monitor_user", "monitor_password_file", "stall_after"}
)
"""``[server]`` keys read once, when serve starts (the status page, its monitor session, the data folder): a reload
logs their change as taking effect at the next start."""


class SettingsReload:
    """The reloads of one served federation; ``federation`` and ``run_id`` check a new file's federation settings."""

    def __init__(self, data_dir: Path, config_path: Path, broker: BrokerConfig, federation: str, run_id: str):
        self.data_dir, self.config_path = Path(data_dir), Path(config_path)
        self._broker, self._federation, self._run_id = broker, federation, run_id
        self.asked = threading.Event()
        self._deferred_round: int | None = None
        self.later: list[str] = []  # changes read by a reload that take effect at the next start

    def request(self, open_round: int | None) -> None:
        """Ask for a reload (SIGHUP); during round ``open_round`` it waits for the round to close, and says so."""
        self.asked.set()
        if open_round is not None and self._deferred_round is None:
            self._deferred_round = open_round
            log.info("reload: deferred until round %d closes", open_round)
            self._audit(f"deferred until round {open_round} closes")

    def _audit(self, detail: str) -> None:
        from coordinator.server.audit import audit

        try:
            audit(self.data_dir, "reload", None, detail)
        except OSError as exc:
            log.warning("reload: the audit log in %s cannot be written (%s); the reload is only in this log", self.data_dir, exc)

    def refusal(self, new: ServeFile) -> str | None:
        """Why the next start with ``new`` would fail (None: it would start): bad federation settings, or a status page
        off loopback without a token."""
        try:
            federation_config(new, self.data_dir, self._broker, self._federation, self._run_id)
        except ValueError as exc:
            return str(exc)
        if new.server.http_port:
            try:
                from coordinator.server.web import check_bind
            except ImportError:
                return None
            try:
                check_bind(new.server.http_bind, new.server.token)
            except ValueError as exc:
                return str(exc)
        return None

    def apply(self, current: ServeFile) -> tuple[ServeFile, list[str]]:
        """Re-read the file: ``(settings in force, changes as lines)``, e.g. ``[schedule] min_clients 2 -> 3``.

        A file the next start would refuse is refused now (ERROR, audit entry, ``current`` kept); keys read
        only at start (:data:`AT_START`) and federation settings take effect at the next start (INFO, kept
        in :attr:`later`). Every reload is written to the audit log.
        """
        self.asked.clear()
        deferred, self._deferred_round = self._deferred_round, None
        after = f" (deferred until round {deferred} closed)" if deferred is not None else ""
        try:
            new = read_serve_file(self.config_path)
        except (ValueError, OSError) as exc:
            why: str | None = str(exc)
        else:
            why = self.refusal(new)
        if why is not None:
            log.error("reload refused%s: %s; the settings in force are kept (fix %s, or the next start fails too)",
                      after, why, self.config_path)  # fmt: skip
            self._audit(f"refused{after}: {why}; the settings in force are kept")
            return current, []
        now = changes(current.server, new.server, "server") + changes(current.schedule, new.schedule, "schedule")
        later = [c for c in now if c.split()[1] in AT_START]
        now = [c for c in now if c not in later]
        fed_old, fed_new = current.federation, new.federation
        for key in sorted(set(fed_old) | set(fed_new)):
            if fed_old.get(key) != fed_new.get(key):
                later.append(f"{key} {fed_old.get(key)!r} -> {fed_new.get(key)!r}")
        self.later = later
        if deferred is not None:
            log.info("reload: round %d closed; the deferred reload is applied now", deferred)
        for line in now:
            log.info("reload: %s", line)
        for line in later:
            log.info("reload: %s takes effect at the next start", line)
        if not now and not later:
            log.info("reload: %s read; nothing changed", self.config_path)
        self._audit(f"applied{after}: " + ("; ".join(now + [f"{c} (at the next start)" for c in later]) or "nothing changed"))
        # The page, its bind and token, and the federation's settings are set up once at start.
        return ServeFile(new.server, new.schedule, fed_old), now
