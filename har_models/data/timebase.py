"""Which clock a sensor stream's stamps are on, established from when they arrive, and the stamps mapped to the boot clock.

Android documents ``SensorEvent.timestamp`` as the boot clock (``elapsedRealtimeNanos``), yet
some devices stamp with the wall clock, some with a clock that stopped in deep sleep (a fixed
offset from the boot clock once awake), and the accelerometer and gyroscope of one phone need
not agree. Pairing the two streams on stamps of different clocks pairs samples seconds or
decades apart, so each stream's base is established first and its stamps are mapped to one
clock, the host's boot clock, before the resampler pairs them.

Each delivery (a chunk of stamps) arrives at a known boot-clock time ``arrival``; its newest
stamp ``t`` is then ``lag = arrival - t`` behind, where the lag is the delivery's latency (small,
never much below zero) plus whatever separates the stream's clock from the boot clock. The
newest sample of a delivery was taken at most a sample period and the callback's latency before
the drain read the clock, however long the drain period is, so the lag does not grow with the
drain period. A base is established by samples and time, never by a count of deliveries: by
consecutive deliveries that span at least ``establish_ns`` of arrivals (1 s by default), whose
lags agree within ``tolerance_ns``, and whose samples' stamps advanced as the boot clock did
(within 10 % of the span plus ``ahead_ns`` and ``batching_ns``: a stream stamped 0, or by a clock
at another rate, establishes nothing). With ``lag0`` the least lag of them (the fastest delivery):

* ``-ahead_ns <= lag0 <= tolerance_ns``: the **boot** clock; stamps are kept as they are;
* the same for ``lag0 + (wall - boot)``: the **wall** clock; stamps move by ``-(wall - boot)``;
* otherwise a clock at a fixed **offset** (one that paused in deep sleep, or counts from another
  start); stamps move by ``lag0``.

So whatever the drain period (10 ms or 1 s) and the sample rate (50 to 400 Hz), a stream is
held for ``establish_ns`` plus one drain period at most: under one window (2.56 s) for drain
periods up to 1 s. Deliveries whose lags never agree (stamps that do not advance with time,
garbage, a clock that runs at another rate) establish nothing; once deliveries have come in for
``refuse_after_ns`` of arrival time (10 s; a pause in the deliveries counts one window at most)
without a base, the stream is refused with :class:`TimeBaseRefused`, whose message says what its
stamps did, never windowed on a guess. Samples wait (are held) until their stream's base is
established; when an established base no longer fits (the lag leaves the band, e.g. the stream's
clock paused through a deep sleep), the base is established again from the deliveries that
follow, and the change is logged.
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
"""Default ``establish_ns``: arrival time (1 s) agreeing deliveries must span to establish a base; the rate check then
tells a clock at the boot clock's rate from one 30 % off, and a stream waits less than one window at start."""

REFUSE_AFTER_NS = 10_000_000_000
"""Default ``refuse_after_ns``: arrival time (10 s) of deliveries without an established base after which a stream is refused."""

WINDOW_NS = 2_560_000_000
"""One window (128 samples at 50 Hz): the most a pause in the deliveries adds to the time spent establishing."""


class StreamTimeBase:
    """One stream's time base: established from its deliveries, then applied to its stamps (see the module docstring).

    Parameters
    ----------
    sensor : str
        The stream's name ("acc", "gyro"), for the messages.
    tolerance_ns : int
        How far apart the lags of deliveries on one base may be (ns); above the callback latency
        and the batching latency of the source.
    establish_ns : int
        Arrival time that agreeing deliveries must span to establish a base (ns; default 1 s, and
        at least ``2 * (ahead_ns + batching_ns)``, where the rate check can tell a clock that stands still).
    refuse_after_ns : int
        Arrival time of deliveries without an established base after which the stream is refused
        (ns; default 10 s). A pause between two deliveries counts one window (2.56 s) at most.
    ahead_ns : int
        How far a stamp may lead its arrival and still be on the clock it arrived by (ns).
    batching_ns : int
        The longest batching latency the source asked for (ns; ``maxReportLatencyUs``): deliveries
        may lag by that much more. Not the drain period: a drain reads what was delivered up to it.

    Attributes
    ----------
    base : TimeBase or None
        The established base; None while establishing.
    dropped : int
        Samples of deliveries that did not agree with the base finally established (never windowed).

    Raises
    ------
    ValueError
        For a non-positive tolerance, establishing span or refusal time, a refusal time shorter
        than the establishing span, or a negative ``ahead_ns`` or ``batching_ns``.
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

        Parameters
        ----------
        t_ns : (n,) int64
            The delivery's stamps, as the sensor gave them (arrival order).
        xyz : (n, 3) float64
            Its samples.
        arrival_ns : int
            When it arrived, on the boot clock (ns).
        wall_minus_boot_ns : int
            The wall clock minus the boot clock at that moment (ns).

        Returns
        -------
        (t (m,) int64 on the boot clock, xyz (m, 3))
            Empty while the base is being established; then this delivery's samples and the
            held ones that agree with the base.

        Raises
        ------
        TimeBaseRefused
            When deliveries spanning :attr:`refuse_after_ns` established no base.
        ValueError
            If ``t_ns`` and ``xyz`` do not match in length.
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
