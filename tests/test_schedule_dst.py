"""Schedule windows on the two nights the clocks change (Europe/Berlin, 2026): a window is open for its length in real
time from the first moment the clock shows its start, or from the jump when that time is skipped, so it starts no more
rounds than on any other night; and the waiting line says "tomorrow" when the next start is on another day."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from coordinator.server.schedule import in_window, next_start, opening, waiting_line

BERLIN = ZoneInfo("Europe/Berlin")
FORWARD = dt.date(2026, 3, 29)  # 02:00 CET -> 03:00 CEST: 02:00-02:59 does not exist
BACK = dt.date(2026, 10, 25)  # 03:00 CEST -> 02:00 CET: 02:00-02:59 happens twice
NORMAL = dt.date(2026, 3, 22)


def _at(day: dt.date, hh: int, mm: int = 0, fold: int = 0) -> float:
    return dt.datetime(day.year, day.month, day.day, hh, mm, tzinfo=BERLIN, fold=fold).timestamp()


def _starts(day: dt.date, window: str, interval_s: float) -> list[float]:
    """Each start of a night whose rounds take no time: from 18:00 the evening before to 12:00."""
    now, end, last = _at(day - dt.timedelta(days=1), 18), _at(day, 12), None
    out: list[float] = []
    while True:
        t = next_start(now, last, interval_s, window, BERLIN)
        if t >= end:
            return out
        out.append(t)
        now = last = t


@pytest.mark.parametrize("window", ["02:00-03:00", "01:30-03:30", "22:00-06:00"])
def test_each_dst_night_starts_as_many_rounds_as_a_normal_night(window: str) -> None:
    normal = len(_starts(NORMAL, window, 600))
    assert normal >= 6
    assert len(_starts(FORWARD, window, 600)) == normal
    assert len(_starts(BACK, window, 600)) == normal


def test_the_window_opens_at_the_first_02_00_when_it_repeats_and_at_the_jump_when_it_is_skipped() -> None:
    assert opening(BACK, 120, BERLIN) == _at(BACK, 2, fold=0)  # 02:00 CEST, the first of the two
    assert opening(FORWARD, 120, BERLIN) == _at(FORWARD, 3)  # 02:00 never shows: the jump to 03:00 CEST
    assert opening(FORWARD, 150, BERLIN) == _at(FORWARD, 3)  # 02:30 neither
    assert opening(NORMAL, 120, BERLIN) == _at(NORMAL, 2)
    # the repeated hour: 02:00-03:00 is open one real hour, from 02:00 CEST to the second 02:00 (CET)
    assert in_window(_at(BACK, 2, 59, fold=0), "02:00-03:00", BERLIN)
    assert not in_window(_at(BACK, 2, 0, fold=1), "02:00-03:00", BERLIN)
    assert not in_window(_at(BACK, 2, 30, fold=1), "02:00-03:00", BERLIN)
    # the skipped hour: open one real hour from the jump
    assert in_window(_at(FORWARD, 3, 59), "02:00-03:00", BERLIN) and not in_window(_at(FORWARD, 4), "02:00-03:00", BERLIN)
    assert not in_window(_at(FORWARD, 1, 59), "02:00-03:00", BERLIN)


def test_the_waiting_line_names_tomorrow_on_the_night_the_clocks_go_forward() -> None:
    evening = _at(FORWARD - dt.timedelta(days=1), 22)
    start = next_start(evening, None, 600, "02:00-03:00", BERLIN)
    assert start == _at(FORWARD, 3)
    line = waiting_line(2, 2, start, evening, BERLIN)
    assert line == "waiting: 2 eligible devices, 2 needed (next start not before 03:00 local tomorrow)"
    after = _at(FORWARD, 1, 30)  # the same night, after midnight: today, at the jump
    assert waiting_line(1, 2, start, after, BERLIN) == "waiting: 1 of 2 eligible devices (next start not before 03:00 local)"
    far = _at(FORWARD - dt.timedelta(days=3), 12)
    assert waiting_line(1, 2, start, far, BERLIN).endswith("(next start not before 03:00 local on Sun 29 Mar)")
