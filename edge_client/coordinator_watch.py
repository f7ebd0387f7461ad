"""The coordinator as one edge client sees it: present for a run, fresh, or gone without its will.

A round is acted on only while its coordinator is online for that run and attempt and its status
fresh: one that stopped refreshing for :data:`~har_models.wire.messages.PRESENCE_PERIODS` periods
is gone (crashed, its will lost), logged once and shown in :attr:`CoordinatorWatch.presence`.
"""

from __future__ import annotations

import logging
import time

from har_models.wire.messages import CoordinatorStatus, RoundAnnouncement, fresh_until

log = logging.getLogger("fedhar.client")


class CoordinatorWatch:
    """The newest coordinator status one client holds (:attr:`status`, None before one), and whether it is still fresh."""

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.status: CoordinatorStatus | None = None
        self._until: float | None = None  # monotonic time its status goes stale; None = never
        self._gone_logged = False

    def take(self, co: CoordinatorStatus, retained: bool) -> None:
        """Hold ``co``, arrived now (``retained``: delivered as the broker's retained copy, aged by its stamp)."""
        self.status = co
        self._until = fresh_until(co.sent_unix, co.refresh_s, retained, time.monotonic(), time.time())
        if self._gone_logged and self.fresh():
            log.info("[%s] the coordinator of run %s is online again", self.client_id, co.run_id)
            self._gone_logged = False

    def fresh(self) -> bool:
        """False once the coordinator's status is older than its promised refresh periods allow."""
        until = self._until
        return until is None or time.monotonic() < until

    @property
    def presence(self) -> str:
        """``"unknown"`` (no status yet), ``"offline"`` (its will or last word), ``"gone"`` (stopped refreshing) or ``"online"``."""
        co = self.status
        if co is None:
            return "unknown"
        if co.state != "online":
            return "offline"
        return "online" if self.fresh() else "gone"

    def runs(self, ann: RoundAnnouncement, backlog: bool) -> bool:
        """True if the coordinator that announced ``ann`` is online for its run and attempt (not a dead run's leftovers).

        ``backlog``: messages wait unread (a training blocked the reader while the coordinator's
        refreshes queued up): a stale status then says nothing yet, and is judged once they are read.
        """
        co = self.status
        if co is None or co.state != "online" or co.run_id != ann.run_id or (co.attempt and co.attempt != ann.attempt):
            return False
        if self.fresh():
            return True
        if backlog:
            return False
        if not self._gone_logged:
            self._gone_logged = True
            log.warning(
                "[%s] the coordinator of run %s is gone: its status is %.0f s old and it promised one every %.0f s "
                "(it stopped without its last will reaching the broker); not training on round %d until it is back",
                self.client_id, co.run_id, time.time() - co.sent_unix, co.refresh_s, ann.round,
            )  # fmt: skip
        return False
