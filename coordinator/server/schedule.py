"""When the next round of a served federation may start, and which devices may take part: pure functions.

A round starts when ``[schedule] min_clients`` devices are eligible, no sooner than
``min_round_interval_s`` after the last round ended, and only while the ``window`` is open. Times are
UNIX seconds; local time comes from the caller's timezone (None: the machine's). A window is open for
its length in real time from the first moment the clock shows its start: on the night the clocks go
back it opens once; on the night they jump past its start it opens at the jump.
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


def _wall(t: float, tz: dt.tzinfo | None) -> dt.datetime:
    """The local wall-clock time of UNIX time ``t``, without a zone (to compare with a window's times)."""
    return _local(t, tz).replace(tzinfo=None)


def _unix(wall: dt.datetime, tz: dt.tzinfo | None) -> float:
    """UNIX time of the first moment the local clock shows ``wall`` (a naive date and time)."""
    return (wall.replace(tzinfo=tz, fold=0) if tz is not None else wall.replace(fold=0)).timestamp()


def opening(day: dt.date, minutes: int, tz: dt.tzinfo | None = None) -> float:
    """UNIX time (s) a window starting ``minutes`` after midnight opens on local date ``day`` (the jump if that time is skipped)."""
    wall = dt.datetime(day.year, day.month, day.day, minutes // 60, minutes % 60)
    first = _unix(wall, tz)
    if _wall(first, tz) == wall:
        return first
    # The wall time is skipped: before the jump the clock shows less, after it more. The jump is on a whole second.
    lo = int((wall.replace(tzinfo=tz, fold=1) if tz is not None else wall.replace(fold=1)).timestamp())
    hi = int(first)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _wall(mid, tz) < wall else (lo, mid)
    return float(hi)


def window_length_s(window: str) -> float:
    """How long ``window`` is open each day (s of real time); ValueError for a malformed or empty window."""
    start, end = parse_window(window)
    return 60.0 * ((end - start) % 1440)


def minutes_of_day(t: float, tz: dt.tzinfo | None = None) -> float:
    """Local time of day of UNIX time ``t`` in minutes after midnight (fractional), in [0, 1440)."""
    d = _local(t, tz)
    return d.hour * 60 + d.minute + (d.second + d.microsecond / 1e6) / 60


def in_window(t: float, window: str | None, tz: dt.tzinfo | None = None) -> bool:
    """True if UNIX time ``t`` falls inside ``window`` (from its :func:`opening`, for its length); True without a window.

    Raises ValueError for a malformed or empty window.
    """
    if window is None:
        return True
    start, _ = parse_window(window)
    length = window_length_s(window)
    today = _wall(t, tz).date()
    for day in (today - dt.timedelta(days=1), today):
        opened = opening(day, start, tz)
        if opened <= t < opened + length:
            return True
    return False


def next_start(
    now: float,
    last_end: float | None,
    min_round_interval_s: float,
    window: str | None = None,
    tz: dt.tzinfo | None = None,
) -> float:
    """The earliest UNIX time (s) >= ``now`` at which the next round may start.

    The later of ``now`` and ``last_end + min_round_interval_s`` (``last_end`` None: no round yet), moved
    to the window's next opening when outside it. Raises ValueError for a negative interval or a malformed window.
    """
    if min_round_interval_s < 0:
        raise ValueError(f"min_round_interval_s = {min_round_interval_s}: must be >= 0 seconds")
    t = now if last_end is None else max(now, last_end + min_round_interval_s)
    if window is None or in_window(t, window, tz):
        return t
    start, _ = parse_window(window)
    day = _wall(t, tz).date()
    return min(o for o in (opening(day + dt.timedelta(days=k), start, tz) for k in range(3)) if o > t)


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
    """The devices that may be selected, and why not the others: :func:`coordinator.admission.eligibility` with these predicates."""
    admission = Admission(revoked=revoked, enrolled=enrolled, require_charging=lambda: require_charging)
    return eligibility(statuses, fresh=fresh, admission=admission, label_set=label_set)


def when_words(t: float, now: float, tz: dt.tzinfo | None = None, seconds: bool = False) -> str:
    """UNIX time ``t`` in words seen at ``now``: ``"14:05 local"``, ``"03:00 local tomorrow"``, ``"09:00 local on Tue 31 Mar"``."""
    shown, today = _local(t, tz), _local(now, tz).date()
    text = shown.strftime("%H:%M:%S" if seconds else "%H:%M") + " local"
    days = (shown.date() - today).days
    if days == 1:
        return text + " tomorrow"
    if days > 1:
        return text + shown.strftime(" on %a %d %b")
    return text


def waiting_line(n_eligible: int, min_clients: int, start_at: float, now: float, tz: dt.tzinfo | None = None) -> str:
    """The progress line of a server waiting for its next round: ``"waiting: 1 of 2 eligible devices (next start ...)"``.

    A start less than 10 minutes away is given to the second; the line does not change while the wait runs down.
    """
    when = "" if start_at <= now else f" (next start not before {when_words(start_at, now, tz, seconds=start_at - now < 600)})"
    if n_eligible >= min_clients:
        return f"waiting: {n_eligible} eligible devices, {min_clients} needed{when}"
    return f"waiting: {n_eligible} of {min_clients} eligible devices{when}"


def not_eligible(left_out: Mapping[str, str]) -> str:
    """``"; not eligible: a (offline), b (no training windows)"`` for the waiting line, or ""; revoked devices are left out."""
    named = sorted((c, r) for c, r in left_out.items() if r != "revoked")
    return "; not eligible: " + ", ".join(f"{c} ({r})" for c, r in named) if named else ""
