"""Pace steering: when a device should check in again, carried by the round announcement.

With a cohort goal the coordinator selects a bounded number of devices per round, so most of a
large population has nothing to do in a given round. Rather than a message to each of them (bytes
that grow with the population), the round announcement, which every device reads anyway, carries
one :class:`Pace` for all: when the next round is expected to open, and the window in which a
device that is not needed now should check in again. Each device draws its own time in that
window (:meth:`Pace.draw`), which spreads the check-ins of a large population over several rounds
instead of letting them arrive together. This is the pace steering of Bonawitz et al.,
"Towards Federated Learning at Scale: System Design", MLSys 2019, section 2.3: the server suggests
to each device a window to reconnect in, so that roughly the devices a round needs are present
when it opens, without a thundering herd.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

MAX_UNIX = 1e11
"""Upper bound on a time carried by a pace (s since the epoch): far beyond any real clock."""


@dataclass(frozen=True)
class Pace:
    """When the devices of a federation should check in again (all times in s since the epoch, the coordinator's clock).

    Parameters
    ----------
    next_round_unix : float
        When the coordinator expects the next round to open (its cohort is picked among the
        devices present then).
    check_in_after_unix, check_in_before_unix : float
        The window, ``check_in_after_unix <= check_in_before_unix``, in which a device that is
        not selected now (or that delivered its update) should come back: each device draws
        its own time in it, uniformly.

    Raises
    ------
    ValueError
        If a time is not a finite number in [0, :data:`MAX_UNIX`) or the window is reversed.
    """

    next_round_unix: float
    check_in_after_unix: float
    check_in_before_unix: float

    def __post_init__(self) -> None:
        for name in ("next_round_unix", "check_in_after_unix", "check_in_before_unix"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v < MAX_UNIX:
                raise ValueError(f"pace: {name} must be a time in seconds since the epoch in [0, {MAX_UNIX:g}), got {v!r:.40}")
        if self.check_in_before_unix < self.check_in_after_unix:
            raise ValueError(
                f"pace: the check-in window ends ({self.check_in_before_unix}) before it starts ({self.check_in_after_unix})"
            )

    @property
    def window_s(self) -> float:
        """Width of the check-in window (s)."""
        return self.check_in_before_unix - self.check_in_after_unix

    def draw(self, rng: random.Random) -> float:
        """This device's check-in time (s since the epoch): uniform in the window, from ``rng`` (the jitter)."""
        return self.check_in_after_unix + rng.random() * self.window_s

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> Pace:
        """Parse the ``pace`` object of an announcement.

        Raises
        ------
        ValueError
            If ``d`` is not an object with exactly the three times, or they are invalid.
        """
        if not isinstance(d, dict):
            raise ValueError(f"pace must be an object, got {type(d).__name__}")
        try:
            return cls(**d)
        except TypeError as exc:
            raise ValueError(f"pace: {exc}") from None
