"""``fedhar-study``: a grid of strategies x seeds x splits, each cell a real ``fedhar-simulate`` run.

Every cell runs the main job in this process (:func:`simulation.simulate.main`: broker,
coordinator and edge clients over MQTT), into ``OUT/<split>/<strategy>/seed<k>/``. A cell
whose ``report.json`` holds its final figures is finished and is not run again, so an
interrupted study resumes where it stopped. Next to the federated cells, the centralised
and local-only baselines (:mod:`simulation.baselines`) are trained on the same windows,
split and seeds for ``rounds x local_epochs`` passes.

Outputs in ``OUT``: ``study.md`` (mean and standard deviation over seeds of global,
personalisation and generalisation accuracy and macro-F1, final and best round),
``study.json`` (the same numbers), and PNG plots: metrics per round per strategy with the
band of the seeds (min..max), FedDist layer widths per round, per-client personalisation
accuracy as a strip plot, and the confusion matrix of the best global model (recomputed
from its saved weights on the union test set).

Strategy names join switches with ``+``: an aggregation (``fedavg``, ``feddwa``,
``fedadam``, ...), ``feddist`` (growth) and ``ala`` (client initialisation), e.g.
``feddwa+feddist+ala``. The seed of a cell is the federation's ``--seed`` (initial model,
selection, local shuffling); the split seed stays ``--split-seed`` for every cell, so all
cells of a split share the same test windows.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coordinator import strategies
from coordinator.config import CoordinatorConfig
from har_models.files import atomic_write_bytes

log = logging.getLogger("fedhar.study")

MEASURES = ("global", "personalisation", "generalisation")
BASELINES = ("centralised", "local-only")


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


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a split, a strategy (or a baseline) and a seed."""

    split: str
    strategy: str
    seed: int

    def folder(self, out: Path) -> Path:
        """``OUT/<split>/<strategy>/seed<k>``."""
        return out / self.split / self.strategy / f"seed{self.seed}"


def finished(folder: Path) -> dict[str, Any] | None:
    """The report of a finished cell, else None.

    Finished means: ``report.json`` has its final figures and wall time, and a federated
    run has every round its configuration asked for. A simulation stopped by a signal also
    writes its report with a wall time, after fewer rounds; that cell is not finished.
    """
    path = folder / "report.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not doc.get("final") or doc.get("wall_seconds") is None:
        return None
    planned = (doc.get("config") or {}).get("rounds")
    if isinstance(planned, int) and len(doc.get("rounds") or []) < planned:
        return None
    return doc


_FED = CoordinatorConfig(run_dir=Path("."))
"""The federation's defaults, which a study's cells share unless told otherwise."""


@dataclass(frozen=True)
class StudySettings:
    """What every cell shares.

    Parameters
    ----------
    rounds, local_epochs : int
        Federated rounds and local epochs (baselines train ``rounds * local_epochs`` epochs).
    lr : float
        Client (and baseline) SGD learning rate.
    conv_filters, dense_units : int
        CNN widths.
    clients : int
        First N subjects (0 = all).
    dataset : {"hapt", "realworld"}
    data : Path or None
        Dataset location (default: the committed HAPT).
    split_seed : int
        Seed of every split.
    extra : tuple of str
        Further ``fedhar-simulate`` options, given to every federated cell.
    """

    rounds: int = _FED.rounds
    local_epochs: int = _FED.local_epochs
    lr: float = _FED.lr
    conv_filters: int = _FED.conv_filters
    dense_units: int = _FED.dense_units
    clients: int = 0
    dataset: str = "hapt"
    data: Path | None = None
    split_seed: int = _FED.split_seed
    extra: tuple[str, ...] = ()

    def common(self) -> list[str]:
        """Options both ``fedhar-simulate`` and ``fedhar-baseline`` take."""
        out = ["--dataset", self.dataset, "--lr", str(self.lr), "--conv-filters", str(self.conv_filters),
               "--dense-units", str(self.dense_units), "--split-seed", str(self.split_seed)]
        if self.clients:
            out += ["--clients", str(self.clients)]
        if self.data is not None:
            out += ["--data", str(self.data)]
        return out


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
        if rc in (130, 143):  # the cell's simulation was stopped by SIGINT/SIGTERM: stop the grid too, resumable
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


# -- summary ---------------------------------------------------------------------------


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(cells: Sequence[Cell], out: Path) -> list[dict[str, Any]]:
    """One row per (split, strategy): mean and standard deviation over the finished seeds.

    Each row holds, per measure m and metric k (``accuracy``, ``macro_f1``):
    ``final.m.k = [mean, std]`` and ``best.m.k = [mean, std]`` (best over rounds, per
    seed), plus ``best_round.m`` (the seeds' best-macro-F1 rounds), ``seeds`` and
    ``wall_seconds`` (mean). Baselines have no global model under local-only: NaN.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        doc = finished(c.folder(out))
        if doc is not None:
            groups.setdefault((c.split, c.strategy), []).append({"seed": c.seed, **doc})
    rows = []
    for (split, strategy), docs in groups.items():
        row: dict[str, Any] = {"split": split, "strategy": strategy, "seeds": [d["seed"] for d in docs]}
        for when in ("final", "best"):
            row[when] = {}
            for m in MEASURES:
                row[when][m] = {}
                for k in ("accuracy", "macro_f1"):
                    vals = []
                    for d in docs:
                        v = (d.get("final", {}).get(m) or {}).get(k) if when == "final" else \
                            ((d.get("best", {}).get(m) or {}).get(k) or {}).get("value")
                        if v is not None and not (isinstance(v, float) and math.isnan(v)):
                            vals.append(float(v))
                    row[when][m][k] = list(_mean_std(vals))
        row["best_round"] = {
            m: [((d.get("best", {}).get(m) or {}).get("macro_f1") or {}).get("round") for d in docs] for m in MEASURES
        }
        row["rounds"] = statistics.fmean(len(d.get("rounds", [])) for d in docs)
        row["wall_seconds"] = statistics.fmean(float(d.get("wall_seconds") or 0.0) for d in docs)
        rows.append(row)
    return rows


def _cell(ms: Sequence[float]) -> str:
    m, s = ms
    return "n/a" if math.isnan(m) else f"{100 * m:.1f} ± {100 * s:.1f}"


def markdown(rows: Sequence[dict[str, Any]], s: StudySettings, plots: Sequence[str], notes: Sequence[str]) -> str:
    """The study as Markdown: per split, a final table and a best table, then the plots and notes."""
    lines = [
        "# fedhar study",
        "",
        f"{s.dataset}, {s.clients or 'all'} clients, {s.rounds} rounds of {s.local_epochs} local epoch(s), lr {s.lr}, "
        f"CNN ({s.conv_filters}, {s.dense_units}), split seed {s.split_seed}. Baselines: "
        f"{s.rounds * s.local_epochs} epochs. Mean ± standard deviation over seeds, in %.",
        "",
    ]
    for split in dict.fromkeys(r["split"] for r in rows):
        part = [r for r in rows if r["split"] == split]
        for when in ("final", "best"):
            lines += [
                f"## Split `{split}`: {when} {'round' if when == 'final' else 'over rounds'}",
                "",
                "| strategy | seeds | global acc | global F1 | pers. acc | pers. F1 | gen. acc | gen. F1 |"
                + (" best-F1 rounds (global) | wall s |" if when == "best" else ""),
                "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|---:|" if when == "best" else ""),
            ]
            for r in part:
                cells = [r["strategy"], str(len(r["seeds"]))]
                cells += [_cell(r[when][m][k]) for m in MEASURES for k in ("accuracy", "macro_f1")]
                if when == "best":
                    cells += [", ".join(str(x) for x in r["best_round"]["global"]), f"{r['wall_seconds']:.0f}"]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


# -- plots -----------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as PNG (100 dpi, atomically) and close it; return ``path``."""
    import io

    try:
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, dpi=100, format="png")
        atomic_write_bytes(path, buf.getvalue())
    finally:
        _plt().close(fig)
    return path


def plot_rounds(cells: Sequence[Cell], out: Path, split: str) -> Path | None:
    """Global, personalisation and generalisation macro-F1 per round: seed mean line and min..max band per strategy."""
    series: dict[str, list[list[list[float]]]] = {}
    for c in cells:
        doc = finished(c.folder(out))
        if c.split != split or doc is None or c.strategy in BASELINES:
            continue
        series.setdefault(c.strategy, []).append(
            [[float((r.get(m) or {}).get("macro_f1", math.nan)) for r in doc["rounds"]] for m in MEASURES]
        )
    if not series:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for strategy, runs in series.items():
        n = min(len(r[0]) for r in runs)
        arr = np.array([[m[:n] for m in r] for r in runs], dtype=float)  # (seeds, 3, rounds)
        for j, ax in enumerate(axes):
            v = arr[:, j, :]
            if np.all(np.isnan(v)):
                continue
            x = np.arange(n)
            with warnings.catch_warnings():  # rounds without a measure (generalisation is not measured every round)
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, lo, hi = np.nanmean(v, axis=0), np.nanmin(v, axis=0), np.nanmax(v, axis=0)
            ok = ~np.isnan(mean)
            ax.plot(x[ok], mean[ok], marker="o", label=f"{strategy} ({len(runs)} seeds)")
            ax.fill_between(x[ok], lo[ok], hi[ok], alpha=0.2)
    for ax, m in zip(axes, MEASURES, strict=True):
        ax.set_title(f"{m} macro-F1")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"split {split}: mean over seeds, band = min..max")
    path = _save(fig, out / f"rounds-{split.replace('+', '-')}.png")
    return path


def plot_widths(cells: Sequence[Cell], out: Path) -> Path | None:
    """FedDist layer widths (conv filters F, hidden units H) per round, for cells that grow."""
    runs = []
    for c in cells:
        doc = finished(c.folder(out))
        if doc is None or "feddist" not in c.strategy.split("+"):
            continue
        runs.append((c, [r.get("conv_filters") for r in doc["rounds"]], [r.get("dense_units") for r in doc["rounds"]]))
    if not runs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for c, f, h in runs:
        label = f"{c.split} {c.strategy} s{c.seed}"
        axes[0].plot(range(len(f)), f, marker="o", label=label)
        axes[1].plot(range(len(h)), h, marker="o", label=label)
    for ax, t in zip(axes, ("conv filters F", "hidden units H"), strict=True):
        ax.set_title(t)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    path = _save(fig, out / "feddist-widths.png")
    return path


def plot_feddwa_weights(cells: Sequence[Cell], out: Path, split: str) -> tuple[Path, str] | None:
    """Heat map of FedDWA's aggregation weights p_ij for the last round of a split's first FedDWA cell.

    Row i is the target client, column j the source: p_ij is the weight of client j's trained
    model in client i's personalised model (Liu et al., IJCAI 2023, Eq. 17, with top-K), as
    the coordinator records it in each round's summary (``feddwa_weights``). The cell with the
    lowest seed among the first FedDWA strategy (in grid order) is drawn.

    Returns
    -------
    (path of ``feddwa-weights-<split>.png``, a one-line description), or None when no finished
    FedDWA cell of the split recorded the weights.
    """
    for c in sorted((c for c in cells if c.split == split and "feddwa" in c.strategy.split("+")), key=lambda c: c.seed):
        doc = finished(c.folder(out))
        rounds = [r for r in (doc or {}).get("rounds", []) if r.get("feddwa_weights")]
        if rounds:
            break
    else:
        return None
    last = rounds[-1]
    w = last["feddwa_weights"]
    p = np.asarray(w["p"], dtype=float)
    names = [str(cid).split("-")[-1] for cid in w["clients"]]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 6))
    im = ax.imshow(p, cmap="viridis", vmin=0.0, vmax=max(float(p.max()), 1e-9))
    fig.colorbar(im, ax=ax, label="p_ij")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.set_xlabel("source client j")
    ax.set_ylabel("target client i")
    what = f"split {split}: FedDWA p_ij, {c.strategy} seed {c.seed} round {last['round']}"
    ax.set_title(what, fontsize=9)
    path = _save(fig, out / f"feddwa-weights-{split.replace('+', '-')}.png")
    own = float(np.mean(np.diag(p)))
    return path, f"{what}; mean self-weight p_ii = {own:.2f}, {int((p > 0).sum(axis=1).max())} sources at most per client."


def plot_clients(cells: Sequence[Cell], out: Path, split: str) -> Path | None:
    """Final-round personalisation accuracy of every client, one strip per strategy (seeds pooled)."""
    strips: dict[str, list[float]] = {}
    for c in cells:
        doc = finished(c.folder(out))
        if c.split != split or doc is None or not doc.get("rounds"):
            continue
        per = doc["rounds"][-1].get("personalisation_clients") or {}
        strips.setdefault(c.strategy, []).extend(float(v["accuracy"]) for v in per.values())
    strips = {k: v for k, v in strips.items() if v}
    if not strips:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(strips)), 4))
    rng = np.random.default_rng(0)  # horizontal jitter only
    for i, vals in enumerate(strips.values()):
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(vals)), vals, s=12, alpha=0.7)
        ax.hlines(statistics.fmean(vals), i - 0.3, i + 0.3, color="k")
    ax.set_xticks(range(len(strips)), list(strips), rotation=20, fontsize=8)
    ax.set_ylabel("personalisation accuracy (final round)")
    ax.set_title(f"split {split}: one dot per client and seed, bar = mean")
    ax.grid(alpha=0.3, axis="y")
    path = _save(fig, out / f"clients-{split.replace('+', '-')}.png")
    return path


def best_global_confusion(
    cells: Sequence[Cell], out: Path, s: StudySettings, split: str
) -> tuple[Cell, int, np.ndarray, bool] | None:
    """Confusion matrix (C, C) of the best global model of a split, recomputed on the union test set.

    The federated cell with the highest best-round global macro-F1 is taken; the
    coordinator keeps the models of its last two completed rounds only
    (``models/rNNNN/global.safetensors``), so the matrix is of the best round when its
    model is still on disk, else of the kept round with the highest global macro-F1.

    Returns
    -------
    (cell, round, confusion matrix, whether it is the best round), or None when no model is on disk.
    """
    best: tuple[float, Cell, dict[str, Any]] | None = None
    for c in cells:
        doc = finished(c.folder(out))
        if c.split != split or doc is None or c.strategy in BASELINES:
            continue
        b = ((doc.get("best") or {}).get("global") or {}).get("macro_f1") or {}
        if b.get("value") is not None and (best is None or b["value"] > best[0]):
            best = (float(b["value"]), c, doc)
    if best is None:
        return None
    _, cell, doc = best
    kept = []
    for r in doc["rounds"]:
        path = cell.folder(out) / "models" / f"r{int(r['round']):04d}" / "global.safetensors"
        f1 = (r.get("global") or {}).get("macro_f1")
        if path.is_file() and f1 is not None:
            kept.append((float(f1), int(r["round"]), path))
    if not kept:
        return None
    _, rnd, path = max(kept)
    from coordinator.state import load_state_file
    from har_models.data.splits import SplitSpec
    from har_models.data.subjects import DEFAULT_HAPT, subject_sources, union_test_set
    from har_models.nn.training import evaluate

    sources = subject_sources(s.dataset, Path(s.data or DEFAULT_HAPT))
    if s.clients:
        sources = dict(list(sources.items())[: s.clients])
    union = union_test_set(sources, split=SplitSpec.parse(split, seed=s.split_seed))
    spec, state = load_state_file(path)
    return cell, rnd, evaluate(spec, state, union), rnd == doc["best"]["global"]["macro_f1"]["round"]


def plot_confusion(cm: np.ndarray, labels: Sequence[str], title: str, path: Path) -> Path:
    """Row-normalised confusion matrix (true rows, predicted columns) with counts."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 5))
    norm = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, str(int(cm[i, j])), ha="center", va="center", fontsize=8, color="w" if norm[i, j] > 0.5 else "k")
    ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    _save(fig, path)
    return path


def write_outputs(cells: Sequence[Cell], s: StudySettings, out: Path, results: Path | None = None) -> dict[str, Any]:
    """Summarise, plot and write ``study.md`` / ``study.json`` into ``out`` (and the Markdown to ``results``)."""
    rows = summarise(cells, out)
    plots: list[Path] = []
    notes: list[str] = []
    from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS

    labels = list((HAPT_LABELS if s.dataset == "hapt" else REALWORLD_LABELS).names)
    for split in dict.fromkeys(c.split for c in cells):
        for p in (plot_rounds(cells, out, split), plot_clients(cells, out, split)):
            if p is not None:
                plots.append(p)
        found = best_global_confusion(cells, out, s, split)
        if found is not None:
            cell, rnd, cm, is_best = found
            which = "best global model" if is_best else "best kept global model\n(the best round's model was not kept)"
            title = f"split {split}: {which}, {cell.strategy} seed {cell.seed} round {rnd}"
            plots.append(plot_confusion(cm, labels, title, out / f"confusion-{split.replace('+', '-')}.png"))
            notes.append(f"Confusion matrix ({split}): {title.replace(chr(10), ' ')}; {int(cm.sum())} union test windows.")
        heat = plot_feddwa_weights(cells, out, split)
        if heat is not None:
            plots.append(heat[0])
            notes.append(heat[1])
    w = plot_widths(cells, out)
    if w is not None:
        plots.append(w)
    rel = [str(p.relative_to(out)) for p in plots]
    text = markdown(rows, s, rel, notes)
    atomic_write_bytes(out / "study.md", text)
    doc = {"settings": {**s.__dict__, "data": str(s.data) if s.data else None}, "rows": rows, "plots": rel, "notes": notes}
    atomic_write_bytes(out / "study.json", json.dumps(doc, indent=2, default=str))
    if results is not None:
        base = results.parent.resolve()
        rel_res = [str(Path(p).resolve().relative_to(base)) if Path(p).resolve().is_relative_to(base) else str(p) for p in plots]
        atomic_write_bytes(results, markdown(rows, s, rel_res, notes))
    return doc


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fedhar-study", description=__doc__.split("\n\n")[0])
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
    """Entry point of ``fedhar-study``: 0 when every cell finished, 1 when some did not, 2 on usage errors,
    130/143 when SIGINT/SIGTERM stopped it (finished cells are kept; the same command continues)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        strategies = [x for x in args.strategies.split(",") if x]
        for name in strategies:
            strategy_args(name)
        from har_models.data.splits import SplitSpec

        splits = [x for x in args.splits.split(",") if x]
        for sp in splits:
            SplitSpec.parse(sp)
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError as exc:
        print(f"fedhar-study: {exc}", file=sys.stderr)
        return 2
    extra = tuple(a for a in args.extra if a != "--")
    s = StudySettings(args.rounds, args.local_epochs, args.lr, args.conv_filters, args.dense_units, args.clients,
                      args.dataset, args.data, args.split_seed, extra)
    names = strategies + ([] if args.no_baselines else list(BASELINES))
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
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
