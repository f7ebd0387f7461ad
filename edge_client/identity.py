"""Another user of this device's client id: a second process of this federation, or anyone on the same broker.

(docs/reliability.md, "Identity".) A second process in this federation shows its own instance id
in the retained status on our topic (:class:`TwinWatch`): the agent stops with
:data:`~har_io.exit_codes.Exit.DUPLICATE_ID`. Another device or federation on the same broker is
seen only through the broker, which keeps one session per client id and closes the older:
:class:`IdCollision` says so when the broker names the cause (MQTT 5 reason 142, "Session taken
over") or after :data:`KNOCKS` sessions within :data:`WINDOW_S` were closed within :data:`KNOCK_S`
of opening (MQTT 3.1.1 gives no reason; a bad network fails attempts, it does not close accepted
sessions). The words clear once a session stayed up :data:`CLEAR_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from har_models.wire.messages import ClientStatus, MessageError

log = logging.getLogger("fedhar.client")

TAKEN_OVER = "Session taken over"
"""paho's name of MQTT 5's DISCONNECT reason code 142: another client connected with this client id."""

KNOCK_S = 10.0
"""A session the broker closes within this many seconds of opening it was knocked off."""

KNOCKS = 3
"""Knock-offs within :data:`WINDOW_S` that name another user of the id (MQTT 3.1.1, where the broker gives no reason)."""

WINDOW_S = 120.0
"""Seconds over which knock-offs are counted."""

CLEAR_S = 300.0
"""A session that stays up this long means the id is ours alone again."""


def collision_words(client_id: str) -> str:
    """What this device tells its person and its coordinator when another user of its id keeps knocking it off."""
    return (f"another device or federation uses the id {client_id} on this broker: the broker disconnects this device "
            f"whenever the other connects. Give each device its own client id (and its own account)")  # fmt: skip


class IdCollision:
    """Tells from the broker's disconnections that another device or federation uses this client id (module docstring);
    :attr:`words` holds the collision in words while it lasts, else ""."""

    def __init__(self, client_id: str, clock: Callable[[], float] = time.monotonic):
        self.client_id = client_id
        self._clock = clock
        self._lock = threading.Lock()
        self._up_since: float | None = None
        self._knocks: deque[float] = deque()
        self.words = ""

    def connected(self) -> None:
        """A session opened (paho's network thread)."""
        with self._lock:
            self._up_since = self._clock()

    def disconnected(self, reason: str) -> str | None:
        """The broker closed an open session for ``reason`` (paho's reason name); the collision's words once it is one, else None."""
        with self._lock:
            now = self._clock()
            up, self._up_since = self._up_since, None
            if up is not None and now - up <= KNOCK_S:
                self._knocks.append(now)
            while self._knocks and now - self._knocks[0] > WINDOW_S:
                self._knocks.popleft()
            if reason != TAKEN_OVER and len(self._knocks) < KNOCKS:
                return self.words or None
            first = not self.words
            self.words = collision_words(self.client_id)
        if first:
            log.error("[%s] %s (%s)", self.client_id, self.words,
                      "the broker said so" if reason == TAKEN_OVER else f"{KNOCKS} sessions closed right after they opened")  # fmt: skip
        return self.words

    def current(self) -> str:
        """The words now: cleared once a session has stayed up for :data:`CLEAR_S` (any thread)."""
        with self._lock:
            up = self._up_since
            if self.words and up is not None and self._clock() - up >= CLEAR_S:
                self.words = ""
                self._knocks.clear()
                log.info("[%s] the client id is this device's alone again: connected for %.0f s without being knocked off",
                         self.client_id, CLEAR_S)  # fmt: skip
            return self.words


class TwinWatch:
    """Watches this client's own retained status for another process of the same id (``instance``: this one's)."""

    def __init__(self, instance: str):
        self.instance = instance
        self._predecessor: str | None = None  # the instance whose status was retained when we first connected
        self._own_seen = False

    def twin(self, payload: bytes, connects: int) -> str | None:
        """The other process's instance id if ``payload`` (a status on our topic) is another live process's; else None.

        Before the first connection settled (``connects``), another instance's status is the process before us.
        """
        try:
            st = ClientStatus.from_bytes(payload)
        except MessageError:
            return None
        if st.instance == self.instance:
            self._own_seen = True
            return None
        if not self._own_seen and connects <= 1 and self._predecessor is None:
            self._predecessor = st.instance  # left by the process before us
            return None
        if not st.instance or (st.instance == self._predecessor and (st.state == "offline" or not self._own_seen)):
            return None  # the process before us (its status, or its will arriving late); a dead one never comes back online
        if st.state == "offline" and connects <= 1:
            return None  # a will we never saw the owner of, from before our first connection settled
        return st.instance
