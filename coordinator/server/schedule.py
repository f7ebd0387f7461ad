"""When the next round of a served federation may start, and which devices may take part: pure functions.

A round starts when at least ``[schedule] min_clients`` devices are eligible, no sooner than
``min_round_interval_s`` after the end of the last round, and, with a ``window``, only while the
window is open. Time is UNIX seconds; the local time of day comes from a timezone given by the
caller (tests inject one; ``None`` is the machine's own, with its daylight-saving rules).

A window is defined in local wall time and is open for its length in real time from its opening:
``"02:00-03:00"`` opens when the clock first shows 02:00 and stays open one hour. So on the night
the clocks go back, when 02:00-03:00 happens twice, it is still open one hour (the first time) and
starts no more rounds than on any other night; on the night they go forward, when 02:00-03:00 does
not exist, it opens at the moment the clock jumps (03:00) and stays open one hour. A window that
crosses midnight (``"22:00-06:00"``) is open eight hours from 22:00, whatever the clocks do in between.
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
    """UNIX time (s) a window starting at ``minutes`` after midnight opens on local date ``day``.

    The first moment the clock shows that time (the first of two on the night the clocks go back);
    on the night they go forward past it, the moment of the jump (the time itself never shows).
    """
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
    """How long ``window`` (``"HH:MM-HH:MM"``) is open each day, in seconds of real time.

    Raises
    ------
    ValueError
        For a malformed or empty window.
    """
    start, end = parse_window(window)
    return 60.0 * ((end - start) % 1440)


def minutes_of_day(t: float, tz: dt.tzinfo | None = None) -> float:
    """Local time of day of UNIX time ``t`` in minutes after midnight (fractional), in [0, 1440)."""
    d = _local(t, tz)
    return d.hour * 60 + d.minute + (d.second + d.microsecond / 1e6) / 60


def in_window(t: float, window: str | None, tz: dt.tzinfo | None = None) -> bool:
    """True if UNIX time ``t`` falls inside ``window`` (``"HH:MM-HH:MM"`` local time, start included, end excluded,
    may cross midnight; open for its length from its :func:`opening`, see the module docstring); always True without a window.

    Raises
    ------
    ValueError
        For a malformed or empty window (:func:`coordinator.server.settings.parse_window`).
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
    """The devices that may be selected for a round, and why the others may not: :func:`coordinator.admission.eligibility`
    with an :class:`~coordinator.admission.Admission` of these predicates (the one rule; see there).

    Returns
    -------
    Eligibility
    """
    admission = Admission(revoked=revoked, enrolled=enrolled, require_charging=lambda: require_charging)
    return eligibility(statuses, fresh=fresh, admission=admission, label_set=label_set)


def when_words(t: float, now: float, tz: dt.tzinfo | None = None, seconds: bool = False) -> str:
    """``"14:05 local"``, ``"03:00 local tomorrow"`` or ``"09:00 local on Tue 31 Mar"``: UNIX time ``t`` in words as
    seen at ``now`` (``seconds``: ``HH:MM:SS``). The day is named whenever it is not today's, so a time the clock
    skips tonight (a window opening at the jump) is never read as one later today."""
    shown, today = _local(t, tz), _local(now, tz).date()
    text = shown.strftime("%H:%M:%S" if seconds else "%H:%M") + " local"
    days = (shown.date() - today).days
    if days == 1:
        return text + " tomorrow"
    if days > 1:
        return text + shown.strftime(" on %a %d %b")
    return text


def waiting_line(n_eligible: int, min_clients: int, start_at: float, now: float, tz: dt.tzinfo | None = None) -> str:
    """The progress line of a server waiting for its next round, e.g.
    ``"waiting: 1 of 2 eligible devices (next start not before 14:05 local)"``. A start less than
    10 minutes away is given to the second (``"... not before 14:24:31 local"``): with a short
    ``min_round_interval_s`` the minute alone names a time that has already begun. A start on
    another day says so (``"... not before 03:00 local tomorrow"``, :func:`when_words`). The line
    does not change while the wait runs down (serve logs it each time it changes)."""
    when = "" if start_at <= now else f" (next start not before {when_words(start_at, now, tz, seconds=start_at - now < 600)})"
    if n_eligible >= min_clients:
        return f"waiting: {n_eligible} eligible devices, {min_clients} needed{when}"
    return f"waiting: {n_eligible} of {min_clients} eligible devices{when}"


def not_eligible(left_out: Mapping[str, str]) -> str:
    """``"; not eligible: a (offline), b (no training windows)"`` for the waiting line, or "" when every device is.

    Revoked devices are left out: they are no candidates (the devices table says revoked), and a
    forgotten one's name must not come back on the page.
    """
    named = sorted((c, r) for c, r in left_out.items() if r != "revoked")
    return "; not eligible: " + ", ".join(f"{c} ({r})" for c, r in named) if named else ""
