"""When the next round of a served federation may start, and which devices may take part: pure functions.

A round starts when at least ``[schedule] min_clients`` devices are eligible, no sooner than
``min_round_interval_s`` after the end of the last round, and, with a ``window``, only while the
local time of day is inside it. Time is UNIX seconds; the local time of day comes from a
timezone given by the caller (tests inject a fixed-offset zone; ``None`` is the machine's own,
with its daylight-saving rules).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping

from coordinator.admission import Admission, Eligibility, eligibility
from coordinator.server.settings import parse_window
from har_models.wire.messages import ClientStatus


def _local(t: float, tz: dt.tzinfo | None) -> dt.datetime:
    """Local date and time of UNIX time ``t`` (aware when ``tz`` is given, else naive local)."""
    return dt.datetime.fromtimestamp(t, tz) if tz is not None else dt.datetime.fromtimestamp(t)


def _unix(day: dt.date, minutes: int, tz: dt.tzinfo | None) -> float:
    """UNIX time of local wall time ``minutes`` after midnight of ``day``."""
    wall = dt.datetime(day.year, day.month, day.day, minutes // 60, minutes % 60, tzinfo=tz)
    return wall.timestamp()  # naive: the machine's local time (mktime)


def minutes_of_day(t: float, tz: dt.tzinfo | None = None) -> float:
    """Local time of day of UNIX time ``t`` in minutes after midnight (fractional), in [0, 1440)."""
    d = _local(t, tz)
    return d.hour * 60 + d.minute + (d.second + d.microsecond / 1e6) / 60


def in_window(t: float, window: str | None, tz: dt.tzinfo | None = None) -> bool:
    """True if UNIX time ``t``'s local time of day is inside ``window`` (``"HH:MM-HH:MM"``, start
    included, end excluded, may cross midnight); always True without a window.

    Raises
    ------
    ValueError
        For a malformed or empty window (:func:`coordinator.server.settings.parse_window`).
    """
    if window is None:
        return True
    start, end = parse_window(window)
    m = minutes_of_day(t, tz)
    if start < end:
        return start <= m < end
    return m >= start or m < end


def next_start(
    now: float,
    last_end: float | None,
    min_round_interval_s: float,
    window: str | None = None,
    tz: dt.tzinfo | None = None,
) -> float:
    """The earliest UNIX time (s) >= ``now`` at which the next round may start.

    That is the later of ``now`` and ``last_end + min_round_interval_s`` (``last_end`` None: no
    round yet), moved, with a ``window``, to the next opening of the window when it falls outside.

    Parameters
    ----------
    now : float
        UNIX time now (s).
    last_end : float or None
        UNIX time (s) the last round ended.
    min_round_interval_s : float
        Seconds from a round's end to the next start, at least (>= 0).
    window : str, optional
        ``"HH:MM-HH:MM"`` local time; crosses midnight when end < start.
    tz : tzinfo, optional
        Timezone of the local time (default: the machine's).

    Raises
    ------
    ValueError
        For a negative interval or a malformed window.
    """
    if min_round_interval_s < 0:
        raise ValueError(f"min_round_interval_s = {min_round_interval_s}: must be >= 0 seconds")
    t = now if last_end is None else max(now, last_end + min_round_interval_s)
    if window is None or in_window(t, window, tz):
        return t
    start, _ = parse_window(window)
    day = _local(t, tz).date()
    opening = _unix(day, start, tz)
    if opening <= t:  # today's opening has passed (and the window is closed): tomorrow's
        opening = _unix(day + dt.timedelta(days=1), start, tz)
    return opening


def local_hhmm(t: float, tz: dt.tzinfo | None = None) -> str:
    """``"HH:MM"`` local time of UNIX time ``t`` (for progress lines)."""
    return _local(t, tz).strftime("%H:%M")


def eligible_devices(
    statuses: Mapping[str, ClientStatus],
    *,
    fresh: Callable[[str], bool],
    enrolled: Callable[[str], bool],
    revoked: Callable[[str], bool],
    require_charging: bool = False,
    label_set: str = "",
) -> Eligibility:
    """The devices that may be selected for a round, and why the others may not: :func:`coordinator.admission.eligibility`
    with an :class:`~coordinator.admission.Admission` of these predicates (the one rule; see there).

    Returns
    -------
    Eligibility
    """
    admission = Admission(revoked=revoked, enrolled=enrolled, require_charging=lambda: require_charging)
    return eligibility(statuses, fresh=fresh, admission=admission, label_set=label_set)


def waiting_line(n_eligible: int, min_clients: int, start_at: float, now: float, tz: dt.tzinfo | None = None) -> str:
    """The progress line of a server waiting for its next round, e.g.
    ``"waiting: 1 of 2 eligible devices (next start not before 14:05 local)"``. A start less than
    10 minutes away is given to the second (``"... not before 14:24:31 local"``): with a short
    ``min_round_interval_s`` the minute alone names a time that has already begun. The line does not
    change while the wait runs down (serve logs it each time it changes)."""
    if start_at <= now:
        when = ""
    elif start_at - now < 600:
        when = f" (next start not before {_local(start_at, tz).strftime('%H:%M:%S')} local)"
    else:
        when = f" (next start not before {local_hhmm(start_at, tz)} local)"
    if n_eligible >= min_clients:
        return f"waiting: {n_eligible} eligible devices, {min_clients} needed{when}"
    return f"waiting: {n_eligible} of {min_clients} eligible devices{when}"
