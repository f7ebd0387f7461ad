"""``fedhar-coordinator run``: a short loop over the federation runner and the MQTT grid (the two ``serve`` drives too)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from coordinator.admission import OPEN, Admission
from coordinator.config import CoordinatorConfig
from coordinator.evaluation import Evaluator
from coordinator.grid import CoordinatorError, StateError
from coordinator.mqtt_grid import MqttGrid
from coordinator.rounds import compose
from coordinator.runner import FederationRunner, open_state
from coordinator.state import StateDamaged

__all__ = ["Coordinator", "CoordinatorError", "StateError"]

log = logging.getLogger("fedhar.coordinator")


class Coordinator:
    """A federation described by a :class:`CoordinatorConfig`, run for ``cfg.rounds`` rounds over MQTT.

    ``evaluator`` holds the union test set for the global and generalisation measures (research);
    ``clients_gone``, ``admission``, ``epoch`` and ``clients_restarted`` are :class:`MqttGrid`'s.
    Raises StateError if the run folder's database is damaged.
    """

    def __init__(
        self,
        cfg: CoordinatorConfig,
        evaluator: Evaluator | None = None,
        progress: bool = True,
        report_header: dict[str, Any] | None = None,
        clients_gone: Callable[[], tuple[set[str], str | None]] | None = None,
        admission: Admission = OPEN,
        epoch: int = 0,
        clients_restarted: Callable[[], Mapping[str, float]] | None = None,
    ):
        self.cfg = cfg
        self.progress = progress
        self.state = open_state(cfg)
        parts = compose(cfg, self.state)  # the round policy and the strategy, shared by the grid and the runner
        self.grid = MqttGrid(cfg, self.state, lambda: self.runner.spec, clients_gone=clients_gone, admission=admission,
                             epoch=epoch, clients_restarted=clients_restarted, late=parts.policy.late)  # fmt: skip
        self.runner = FederationRunner(cfg, self.grid, evaluator, report_header, state=self.state, parts=parts)

    def run(self) -> dict[str, Any]:
        """Run (or resume) the federation to its last round; return the report document.

        Raises CoordinatorError if no usable clients come online in time or a round failed 3 times in a row;
        StateError if the run folder cannot be used; BrokerRefused if the broker refused the login or TLS.
        """
        t_start = time.monotonic()
        runner = self.runner
        grid = self.grid
        grid.open()
        try:
            last = runner.start(self.cfg.resume)
            if last < 0:
                grid.clear_retained()
            runner.wait_for_clients()
            runner.ensure_federation()
            with (
                logging_redirect_tqdm(),
                tqdm(
                    total=self.cfg.rounds,
                    initial=last + 1,
                    desc="rounds",
                    unit="round",
                    disable=not self.progress or not sys.stderr.isatty(),
                    dynamic_ncols=True,
                ) as bar,
            ):
                grid.bar = bar
                r, failures = last + 1, 0
                while r < self.cfg.rounds:
                    runner.note({"wall_seconds": round(time.monotonic() - t_start, 1)})
                    runner.wait_for_restarted(r)
                    ahead = runner.catch_up(r)
                    bar.update(ahead - r)
                    r = ahead
                    if r >= self.cfg.rounds:  # the devices already went past the last round with an earlier folder
                        break
                    if runner.run_round(r) is None:
                        failures += 1
                        if failures >= 3:
                            raise CoordinatorError(f"round {r} failed 3 times in a row ({runner.last_failure}); see the log and "
                                                   f"{self.cfg.run_dir}")  # fmt: skip
                        runner.wait_for_clients()
                        continue
                    failures = 0
                    bar.update(1)
                    r += 1
            grid.bar = None
            runner.measure_last()  # a figure still waiting for a next round's clients
            assert runner.spec is not None  # ensure_federation made it
            grid.finish(runner.spec, runner.label_set)
            return runner.report({"wall_seconds": round(time.monotonic() - t_start, 1)})
        except StateDamaged as exc:  # any read or write of the database, at any point of the run
            raise StateError(str(exc)) from None
        finally:
            grid.close()

    def write_final_report(self, extra: dict[str, Any]) -> dict[str, Any]:
        """Rewrite the report with extra run facts (wall time, peak memory) known only at the end (the runner's report)."""
        return self.runner.report(extra)
