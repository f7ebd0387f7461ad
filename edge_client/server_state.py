"""What the home server is doing, as a device sees it, in words: offline since when, waiting for what, the next round.

The agent keeps the coordinator's newest retained status and judges it "online", "offline" (its
will or last word), "gone" (stopped refreshing for over three ``refresh_s``: died with its will
lost) or "unknown". :class:`ServerWatch` remembers when the server was last alive, so a dead one
reads "home server offline since 14:02"; :func:`server_words` says it, on the app's Federation
screen and in ``fedhar-client``'s log (:func:`follow_server`). No Kivy or PyTorch.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from har_models.wire.messages import CoordinatorStatus, RoundOutlook

log = logging.getLogger("fedhar.client.server")

LOG_EVERY_S = 60.0
"""Least time between two log lines of :func:`follow_server` whose server presence is the same (s)."""


@dataclass(frozen=True)
class ServerState:
    """The home server as a device sees it now: ``presence`` (as the agent's ``coordinator_presence``), the last time
    it was known alive when offline or gone (None: never seen alive), the newest status and outlook (devices taking
    part and needed, next round, open round, model version, why no round runs)."""

    presence: str
    since_unix: float | None = None
    status: CoordinatorStatus | None = None
    outlook: RoundOutlook | None = None

    @property
    def down(self) -> bool:
        """True when the server is offline or gone."""
        return self.presence in ("offline", "gone")


class ServerWatch:
    """Follows the coordinator's status over time and remembers when it was last alive (``last_online_unix``: before
    this watch started, kept by its holder; None: never seen)."""

    def __init__(self, last_online_unix: float | None = None):
        self.last_online_unix = last_online_unix

    def observe(self, status: CoordinatorStatus | None, presence: str, now_unix: float,
                outlook: RoundOutlook | None = None) -> ServerState:  # fmt: skip
        """The server's state from the agent's ``coordinator``, ``coordinator_presence`` and ``outlook`` (one of another run
        is not used) at this device's ``now_unix``; "online" moves :attr:`last_online_unix` on to the status's own time."""
        if outlook is not None and (status is None or outlook.run_id != status.run_id):
            outlook = None
        if presence == "online" and status is not None:
            seen = status.sent_unix if status.refresh_s > 0 and status.sent_unix > 0 else now_unix
            self.last_online_unix = max(self.last_online_unix or 0.0, min(seen, now_unix))
            return ServerState("online", None, status, outlook)
        if presence in ("offline", "gone"):
            since = self.last_online_unix
            if since is None and status is not None and status.sent_unix > 0:
                since = status.sent_unix  # never seen alive here: the status's own stamp is all there is
            return ServerState(presence, since, status, outlook)
        return ServerState("unknown", None, status, outlook)


def clock_words(t_unix: float, now_unix: float) -> str:
    """``14:02`` today, ``yesterday 14:02``, else ``Tue 3 Mar 14:02`` (local time)."""
    t, now = dt.datetime.fromtimestamp(t_unix), dt.datetime.fromtimestamp(now_unix)
    days = (now.date() - t.date()).days
    if days == 0:
        return t.strftime("%H:%M")
    if days == 1:
        return "yesterday " + t.strftime("%H:%M")
    return t.strftime("%a %d %b %H:%M").replace(" 0", " ")


def devices_words(n: int) -> str:
    """``1 device``, ``3 devices``."""
    return f"{n} device" if n == 1 else f"{n} devices"


def server_words(state: ServerState, now_unix: float) -> str:
    """The home server's state in one line for the person holding the device, "" while no status has arrived.

    E.g. "home server offline since 14:02"; "home server online: waiting for 2 more devices (1 device
    taking part)"; "home server online: round 18 open (3 devices taking part)".
    """
    if state.down:
        since = f" since {clock_words(state.since_unix, now_unix)}" if state.since_unix else ""
        why = "" if state.presence == "offline" else " (it stopped without saying so)"
        return f"home server offline{since}{why}"
    st = state.outlook
    if state.presence != "online" or state.status is None:
        return ""
    if st is None:
        return "home server online"
    parts = []
    if st.open_round is not None:
        parts.append(f"round {st.open_round} open")
    else:
        if st.devices_needed is not None and st.devices_taking_part is not None and st.devices_taking_part < st.devices_needed:
            more = st.devices_needed - st.devices_taking_part
            parts.append(f"waiting for {more} more device{'s' if more != 1 else ''}")
        if st.next_round_unix is not None:
            when = "now" if st.next_round_unix <= now_unix else f"at about {clock_words(st.next_round_unix, now_unix)}"
            parts.append(f"next round {when}")
        if st.waiting_reason:
            parts.append(st.waiting_reason)
    taking = f" ({devices_words(st.devices_taking_part)} taking part)" if st.devices_taking_part is not None else ""
    return "home server online" + (": " + "; ".join(parts) if parts else "") + taking


def follow_server(agent: Any, stop: threading.Event, every_s: float = 2.0, clock: Any = time.time) -> threading.Thread:
    """Log the home server's state in words while ``agent`` runs, from a daemon thread of its own (returned, started).

    A line when the presence changes (at once), else when the words change, at most every
    :data:`LOG_EVERY_S`; the thread looks every ``every_s`` until ``stop`` is set.
    """
    watch = ServerWatch()

    def run() -> None:
        said, presence, at = "", "", -float("inf")
        while not stop.wait(every_s):
            now = clock()
            state = watch.observe(agent.coordinator, agent.coordinator_presence, now, agent.outlook)
            words = server_words(state, now)
            if not words or words == said:
                continue
            if state.presence != presence or time.monotonic() - at >= LOG_EVERY_S:
                level = logging.WARNING if state.down else logging.INFO
                log.log(level, "[%s] %s", agent.cfg.client_id, words)
                said, presence, at = words, state.presence, time.monotonic()

    thread = threading.Thread(target=run, name="server-state", daemon=True)
    thread.start()
    return thread
