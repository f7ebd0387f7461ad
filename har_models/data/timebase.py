"""Which clock a sensor stream's stamps are on, established from when they arrive, and the stamps mapped to the boot clock.

Android's ``SensorEvent.timestamp`` should be the boot clock, yet devices stamp with the wall
clock or a clock that paused in deep sleep, and one phone's two sensors may differ; so each
stream's base is established and its stamps are mapped to the host's boot clock before pairing.

A delivery arriving at boot-clock time ``arrival`` with newest stamp ``t`` has lag
``arrival - t``: its latency (small, independent of the drain period) plus the clock's offset.
A base is established by consecutive deliveries spanning ``establish_ns`` (1 s) of arrivals
whose lags agree within ``tolerance_ns`` and whose stamps advanced as the boot clock did
(within 10 % plus ``ahead_ns`` and ``batching_ns``). With ``lag0`` the least lag:

* ``-ahead_ns <= lag0 <= tolerance_ns``: the **boot** clock; stamps kept;
* the same for ``lag0 + (wall - boot)``: the **wall** clock; stamps move by ``-(wall - boot)``;
* otherwise a fixed **offset**; stamps move by ``lag0``.

A stream is held at most ``establish_ns`` plus one drain period (under one window for drains up
to 1 s). Without a base after ``refuse_after_ns`` (10 s) of deliveries it is refused with
:class:`TimeBaseRefused`, never windowed on a guess. A base that no longer fits is established
again, and the change logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("har_models.data.timebase")

BASES = ("boot", "wall", "offset")
"""The time bases a stream can be on."""

TOLERANCE_NS = 2_000_000_000
"""Default ``tolerance_ns``: how far apart (2 s) the lags of deliveries on one base may be (delivery latency, batching)."""

AHEAD_NS = 200_000_000
"""How far (0.2 s) a stamp may be ahead of its arrival on the boot clock and still be on it (clocks read in another order)."""

SENSOR_WORDS = {"acc": "accelerometer", "gyro": "gyroscope"}


class TimeBaseRefused(ValueError):
    """A stream whose time base could not be established: its samples are refused (the message says why and what to do)."""


@dataclass(frozen=True)
class TimeBase:
    """An established base: its name (one of :data:`BASES`) and the shift (ns) that puts the stream's stamps on the boot clock."""

    base: str
    shift_ns: int


ESTABLISH_NS = 1_000_000_000
"""Default ``establish_ns``, 1 s: the rate check then tells the boot clock's rate from one 30 % off, and start-up waits under one window."""

REFUSE_AFTER_NS = 10_000_000_000
"""Default ``refuse_after_ns``: arrival time (10 s) of deliveries without an established base after which a stream is refused."""

WINDOW_NS = 2_560_000_000
"""One window (128 samples at 50 Hz): the most a pause in the deliveries adds to the time spent establishing."""


class StreamTimeBase:
    """One stream's time base: established from its deliveries, then applied to its stamps (module docstring). Times in ns.

    Parameters
    ----------
    tolerance_ns : int
        How far apart the lags of deliveries on one base may be; above callback and batching latency.
    establish_ns : int
        Arrival span agreeing deliveries need (at least ``2 * (ahead_ns + batching_ns)``).
    refuse_after_ns : int
        Arrival time without a base after which the stream is refused (a pause counts 2.56 s at most).
    ahead_ns : int
        How far a stamp may lead its arrival.
    batching_ns : int
        The source's longest batching latency (``maxReportLatencyUs``), not the drain period.

    ``base`` is None while establishing; ``dropped`` counts samples that disagreed with the final
    base. ValueError for non-positive times, refusal before establishing, or negative ``ahead_ns``/``batching_ns``.
    """

    def __init__(
        self,
        sensor: str,
        tolerance_ns: int = TOLERANCE_NS,
        establish_ns: int = ESTABLISH_NS,
        refuse_after_ns: int = REFUSE_AFTER_NS,
        ahead_ns: int = AHEAD_NS,
        batching_ns: int = 0,
    ):
        if tolerance_ns <= 0 or establish_ns <= 0 or refuse_after_ns < establish_ns or ahead_ns < 0 or batching_ns < 0:
            raise ValueError(
                f"StreamTimeBase: tolerance_ns ({tolerance_ns}) and establish_ns ({establish_ns}) > 0, refuse_after_ns "
                f"({refuse_after_ns}) >= establish_ns, ahead_ns ({ahead_ns}) and batching_ns ({batching_ns}) >= 0 are needed"
            )
        self.sensor = sensor
        self.tolerance_ns = int(tolerance_ns) + int(batching_ns)
        # Over a span of 2 * (ahead + batching) a clock that stands still lags by more than the 10 % and the jitter allowed.
        self.establish_ns = max(int(establish_ns), 2 * (int(ahead_ns) + int(batching_ns)))
        self.refuse_after_ns = int(refuse_after_ns)
        self.ahead_ns = int(ahead_ns)
        self.batching_ns = int(batching_ns)
        self.base: TimeBase | None = None
        self.dropped = 0
        self._held: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (lag, arrival, t, xyz) of deliveries waiting for a base
        self._trying_ns = 0  # arrival time spent establishing since the base was last unknown (pauses count a window at most)

    @property
    def words(self) -> str:
        """The stream's name for a person ("gyroscope")."""
        return SENSOR_WORDS.get(self.sensor, self.sensor)

    def push(self, t_ns: np.ndarray, xyz: np.ndarray, arrival_ns: int, wall_minus_boot_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Take one delivery; return the samples released now, their stamps on the boot clock.

        ``t_ns`` (n,) int64 as the sensor gave them, ``xyz`` (n, 3), ``arrival_ns`` on the boot clock,
        ``wall_minus_boot_ns`` at that moment. Returns ``(t (m,), xyz (m, 3))``, empty while
        establishing. TimeBaseRefused after :attr:`refuse_after_ns` without a base; ValueError for mismatched lengths.
        """
        t = np.asarray(t_ns, dtype=np.int64)
        xyz = np.asarray(xyz, dtype=np.float64)
        if t.ndim != 1 or xyz.shape != (len(t), 3):
            raise ValueError(f"StreamTimeBase.push: stamps (n,) and samples (n, 3) needed, got {t.shape} and {xyz.shape}")
        if len(t) == 0:
            return t, xyz
        arrival = int(arrival_ns)
        lag = arrival - int(t.max())
        if self.base is not None:
            if self._fits(lag - self.base.shift_ns):  # the lag behind the boot clock once mapped
                return t + self.base.shift_ns, xyz
            log.info("%s: its stamps left the %s clock (they now lag the boot clock by %.1f s): establishing its time base again",
                     self.words, self.base.base, lag / 1e9)  # fmt: skip
            self.base = None
            self._trying_ns = 0
        if self._held:
            self._trying_ns += min(max(0, arrival - self._held[-1][1]), WINDOW_NS)
        self._held.append((lag, arrival, t, xyz))
        start = self._agreeing_run()
        if start is not None:
            run = self._held[start:]
            for _, _, old_t, _ in self._held[:start]:
                self.dropped += len(old_t)
            self._held = []
            self.base = self._decide(min(h[0] for h in run), int(wall_minus_boot_ns))
            log.info("%s: stamps on the %s clock (shift %+.3f s to the boot clock)", self.words, self.base.base, self.base.shift_ns / 1e9)
            return (np.concatenate([h[2] for h in run]) + self.base.shift_ns, np.concatenate([h[3] for h in run]))
        if self._trying_ns >= self.refuse_after_ns:
            raise TimeBaseRefused(self._refusal())
        while arrival - self._held[0][1] > self.refuse_after_ns:  # older than any run that could still establish a base
            self.dropped += len(self._held.pop(0)[2])
        return np.empty(0, np.int64), np.empty((0, 3))

    def _refusal(self) -> str:
        """Why no base was established, from what the held deliveries' stamps did against their arrivals."""
        first, last = self._held[0], self._held[-1]
        span = (last[1] - first[1]) / 1e9
        advanced = (int(last[2].max()) - int(first[2].max())) / 1e9
        lags = [h[0] for h in self._held]
        varied = (max(lags) - min(lags)) / 1e9
        return (
            f"the {self.words}'s timestamps keep no fixed relation to the boot clock or the wall clock: over {span:.1f} s of "
            f"deliveries they advanced {advanced:.1f} s, and their lag behind the boot clock varied by {varied:.1f} s, "
            f"so its samples cannot be paired with the other sensor's: the {self.words} is refused; restart sensing, or the device"
        )

    def _agreeing_run(self) -> int | None:
        """The first index of the longest run of held deliveries, ending with the newest, that establishes a base; None if none."""
        newest_lag, newest_arrival = self._held[-1][0], self._held[-1][1]
        newest_t = int(self._held[-1][2].max())
        lo = hi = newest_lag
        found = None
        for i in range(len(self._held) - 1, -1, -1):
            lag, arrival, t, _ = self._held[i]
            lo, hi = min(lo, lag), max(hi, lag)
            if hi - lo > self.tolerance_ns:
                break
            span = newest_arrival - arrival
            advanced = newest_t - int(t.max())
            if span >= self.establish_ns and abs(advanced - span) <= span // 10 + self.ahead_ns + self.batching_ns:
                found = i
        return found

    def _fits(self, lag: int) -> bool:
        return -self.ahead_ns <= lag <= self.tolerance_ns

    def _decide(self, lag0: int, wall_minus_boot_ns: int) -> TimeBase:
        if self._fits(lag0):
            return TimeBase("boot", 0)
        if self._fits(lag0 + wall_minus_boot_ns):
            return TimeBase("wall", -wall_minus_boot_ns)
        return TimeBase("offset", lag0)
