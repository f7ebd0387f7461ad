"""Broker bytes of a round's announcement with and without a cohort goal (counted, not timed).

Baseline: a round without a goal (``fraction`` 1.0, the default) announces every eligible device
in ``selected``; the broker sends the retained announcement to every device subscribed, so its
bytes per round are (announcement size) x (devices), O(N^2). Candidate: a cohort goal
(``--cohort-goal``, ``--cohort-overselect``; :mod:`coordinator.rounds.cohort`): the announcement names
the capped cohort drawn by :func:`coordinator.round.select_clients` and carries one pace
(:func:`coordinator.rounds.cohort.pace_window`), so it stays the same size whatever N.

Both are encoded by :meth:`har_models.wire.messages.RoundAnnouncement.to_bytes` with the smallest
CNN of ``bench_scale.py`` (1 filter, 2 units) and ids of the load generator's form (``dev-00000``).
It prints a table per N and, last, the ratio of the candidate's bytes per round to the baseline's
at the largest N. Nothing is timed, so the figures do not depend on the machine.

    python benchmarks/bench_cohort_bytes.py [--sizes 100,1000,10000] [--goal 100] [--margin 0.3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.config import CohortSettings, CoordinatorConfig
from coordinator.rounds.cohort import CohortRounds, pace_window
from har_models.nn.model import ArchSpec
from har_models.wire.messages import RoundAnnouncement


def announcement_bytes(n: int, goal: int, margin: float, seed: int = 1) -> tuple[int, int, int, int]:
    """(selected, bytes) of round 0's announcement among ``n`` devices without a goal, then with ``goal`` and ``margin``."""
    spec = ArchSpec(n_classes=6, conv_filters=1, dense_units=2).to_dict()
    ids = [f"dev-{i:05d}" for i in range(n)]
    plain = RoundAnnouncement("run", 0, "training", spec, "hapt6", selected=tuple(ids)).to_bytes()
    cfg = CoordinatorConfig(run_dir=Path("unused"), seed=seed, cohort=CohortSettings(goal=goal, overselect=margin))
    cohort = CohortRounds(cfg).select(ids, 0)
    pace = pace_window(1.7e9, 60.0, n, len(cohort))
    steered = RoundAnnouncement("run", 0, "training", spec, "hapt6", selected=tuple(cohort), pace=pace).to_bytes()
    return len(ids), len(plain), len(cohort), len(steered)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="devices eligible (comma-separated)")
    ap.add_argument("--goal", type=int, default=100, help="cohort goal (updates per round)")
    ap.add_argument("--margin", type=float, default=0.3, help="over-selection margin")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    print(f"{'devices':>8} | {'no goal: selected':>17} | {'bytes':>9} | {'MB per round':>12} | "
          f"{'goal: selected':>14} | {'bytes':>7} | {'MB per round':>12}")  # fmt: skip
    ratio = 1.0
    for n in sizes:
        n_all, b_all, n_cohort, b_cohort = announcement_bytes(n, a.goal, a.margin)
        print(f"{n:>8,} | {n_all:>17,} | {b_all:>9,} | {b_all * n / 1e6:>12,.2f} | {n_cohort:>14,} | {b_cohort:>7,} | "
              f"{b_cohort * n / 1e6:>12,.2f}")  # fmt: skip
        ratio = b_cohort / b_all
    print(f"announcement bytes per round with goal {a.goal} over without, at {sizes[-1]:,} devices: ratio={ratio:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
