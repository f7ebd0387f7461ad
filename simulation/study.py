"""``fedhar-study``: a grid of strategies x seeds x splits, each cell a real ``fedhar-simulate`` run.

Every cell runs the main job in this process (:func:`simulation.simulate.main`: broker,
coordinator and edge clients over MQTT), into ``OUT/<split>/<strategy>/seed<k>/``. A cell
whose ``report.json`` holds its final figures is finished and is not run again, so an
interrupted study resumes where it stopped. Next to the federated cells, the centralised
and local-only baselines (:mod:`simulation.baselines`) are trained on the same windows,
split and seeds for ``rounds x local_epochs`` passes.

This module is the grid: its cells' command lines, running and resuming them (the cells and
their shared settings are :mod:`simulation.study_cells`). What
the study writes from the finished cells into ``OUT`` (``study.md``, ``study.json`` and the
plots) is :mod:`simulation.study_report`.

Strategy names join switches with ``+``: an aggregation (``fedavg``, ``feddwa``,
``fedadam``, ...), ``feddist`` (growth) and ``ala`` (client initialisation), e.g.
``feddwa+feddist+ala``. The seed of a cell is the federation's ``--seed`` (initial model,
selection, local shuffling); the split seed stays ``--split-seed`` for every cell, so all
cells of a split share the same test windows.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from coordinator import strategies
from har_io import exit_codes
from har_io.cli import HelpFormatter, plain
from har_io.exit_codes import Exit
from simulation.study_cells import BASELINES, MEASURES, Cell, StudySettings, finished
from simulation.study_report import write_outputs

log = logging.getLogger("fedhar.study")

__all__ = ["BASELINES", "MEASURES", "Cell", "StudySettings", "finished", "main", "run_grid", "strategy_args"]



def strategy_args(name: str) -> list[str]:
    """``fedhar-simulate`` switches of a strategy name (``feddwa+feddist+ala`` -> aggregation, growth, init).

    A name without an aggregation part (``feddist``, ``ala``) aggregates with plain FedAvg,
    whatever the simulation's default aggregation is, so a name means the same run on every
    version.

    Raises
    ------
    ValueError
        For an unknown part (the message lists the accepted ones).
    """
    args: list[str] = []
    for part in name.split("+"):
        if part in strategies.REGISTRY:
            args += ["--aggregation", part]
        elif part == "feddist":
            args += ["--growth", "feddist"]
        elif part == "ala":
            args += ["--client-init", "ala"]
        else:
            raise ValueError(
                f"strategy {name!r}: unknown part {part!r}; use {'|'.join(strategies.names())}, feddist, ala joined by +"
            )
    if "--aggregation" not in args:
        args = ["--aggregation", strategies.FedAvg.name, *args]
    return args


def cell_argv(cell: Cell, s: StudySettings, folder: Path) -> list[str]:
    """The command line of a cell (``fedhar-simulate`` options, or ``fedhar-baseline MODE`` options)."""
    if cell.strategy in BASELINES:
        return [cell.strategy, *s.common(), "--split", cell.split, "--seed", str(cell.seed),
                "--epochs", str(s.rounds * s.local_epochs), "--run-dir", str(folder), "--no-progress"]
    return [*s.common(), *strategy_args(cell.strategy), "--split", cell.split, "--seed", str(cell.seed),
            "--rounds", str(s.rounds), "--local-epochs", str(s.local_epochs), "--run-dir", str(folder),
            "--run-id", f"study-{cell.split.replace('+', '-')}-{cell.strategy.replace('+', '-')}-s{cell.seed}",
            "--no-progress", *s.extra]


def run_grid(
    cells: Sequence[Cell], s: StudySettings, out: Path,
    runner: Callable[[Cell, list[str]], int] | None = None,
) -> list[Cell]:
    """Run every unfinished cell; return the cells that were run (finished ones are skipped).

    An unfinished cell's folder (a run that stopped midway) is removed first, so the cell
    starts clean. A cell that fails is logged and left unfinished; the others still run.

    Parameters
    ----------
    cells : sequence of Cell
    s : StudySettings
    out : Path
        Study folder.
    runner : callable, optional
        ``runner(cell, argv) -> exit status``; default: ``fedhar-simulate``/``fedhar-baseline`` in-process.

    Raises
    ------
    StudyInterrupted
        When a cell's run exits with 130 or 143 (SIGINT/SIGTERM): the grid stops there
        instead of going on with the next cell.
    """
    run = runner or _run_in_process
    done: list[Cell] = []
    for i, cell in enumerate(cells):
        folder = cell.folder(out)
        if finished(folder):
            log.info("[%d/%d] %s: finished, skipped", i + 1, len(cells), folder)
            continue
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        argv = cell_argv(cell, s, folder)
        t0 = time.monotonic()
        log.info("[%d/%d] %s: running", i + 1, len(cells), folder)
        rc = run(cell, argv)
        done.append(cell)
        if rc in (Exit.SIGINT, Exit.SIGTERM):  # the cell's simulation was stopped by SIGINT/SIGTERM: stop the grid too, resumable
            log.error("%s: stopped by a signal (exit status %d); run the same command again to continue", folder, rc)
            raise StudyInterrupted(rc)
        if rc != 0 or not finished(folder):
            log.error("%s: exit status %d, no final report; it runs again next time", folder, rc)
        else:
            log.info("%s: done in %.0f s", folder, time.monotonic() - t0)
    return done


class StudyInterrupted(Exception):
    """A cell's run was stopped by SIGINT or SIGTERM; ``status`` is its exit status (130 or 143)."""

    def __init__(self, status: int):
        super().__init__(f"stopped by a signal (exit status {status})")
        self.status = status


def _run_in_process(cell: Cell, argv: list[str]) -> int:
    if cell.strategy in BASELINES:
        from simulation import baselines

        return baselines.main(argv)
    from simulation import simulate

    return simulate.main(argv)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedhar-study",
        description=plain(__doc__.split("\n\n")[0]),
        epilog=exit_codes.epilog(exit_codes.STUDY),
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=Path("runs/study"), help="study folder (default %(default)s)")
    ap.add_argument("--strategies", default="fedavg,fedavg+ala,feddwa,feddist",
                    help="comma-separated strategy names, switches joined by + (default %(default)s)")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated federation seeds (default %(default)s)")
    ap.add_argument("--splits", default="paper,blocks", help="comma-separated splits, e.g. paper,blocks,blocks+label_skew")
    ap.add_argument("--no-baselines", action="store_true", help="skip the centralised and local-only baselines")
    ap.add_argument("--rounds", type=int, default=StudySettings.rounds, help="(default %(default)s)")
    ap.add_argument("--local-epochs", type=int, default=StudySettings.local_epochs, help="(default %(default)s)")
    ap.add_argument("--lr", type=float, default=StudySettings.lr, help="(default %(default)s)")
    ap.add_argument("--conv-filters", type=int, default=StudySettings.conv_filters, help="(default %(default)s)")
    ap.add_argument("--dense-units", type=int, default=StudySettings.dense_units, help="(default %(default)s)")
    ap.add_argument("--clients", type=int, default=0, help="first N subjects (0 = all)")
    ap.add_argument("--dataset", choices=("hapt", "realworld"), default="hapt")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--split-seed", type=int, default=StudySettings.split_seed, help="(default %(default)s)")
    ap.add_argument("--results", type=Path, default=None, help="also write the Markdown table here (e.g. docs/study.md)")
    ap.add_argument("--summary-only", action="store_true", help="run nothing; summarise and plot the finished cells")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: further fedhar-simulate options for every cell")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-study``; returns the exit status (:mod:`har_io.exit_codes`, the table of every code).

    0 when every cell finished, 5 when some did not (it was 1, Python's own status for a traceback), 2 on
    usage errors, 130/143 when SIGINT/SIGTERM stopped it (finished cells are kept; the same command continues).
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        strategy_names = [x for x in args.strategies.split(",") if x]
        for name in strategy_names:
            strategy_args(name)
        from har_models.data.splits import SplitSpec

        splits = [x for x in args.splits.split(",") if x]
        for sp in splits:
            SplitSpec.parse(sp)
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError as exc:
        print(f"fedhar-study: {exc}", file=sys.stderr)
        return Exit.USAGE
    extra = tuple(a for a in args.extra if a != "--")
    s = StudySettings(args.rounds, args.local_epochs, args.lr, args.conv_filters, args.dense_units, args.clients,
                      args.dataset, args.data, args.split_seed, extra)
    names = strategy_names + ([] if args.no_baselines else list(BASELINES))
    cells = [Cell(sp, name, seed) for sp in splits for name in names for seed in seeds]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        try:
            run_grid(cells, s, out)
        except StudyInterrupted as stop:
            print(f"fedhar-study: {stop}; finished cells are kept, the same command continues", file=sys.stderr)
            return stop.status

    write_outputs(cells, s, out, args.results)
    missing = [c for c in cells if finished(c.folder(out)) is None]
    print(f"fedhar-study: {len(cells) - len(missing)}/{len(cells)} cells finished; {out / 'study.md'}")
    return Exit.FEDERATION_FAILED if missing else Exit.OK


if __name__ == "__main__":
    sys.exit(main())
