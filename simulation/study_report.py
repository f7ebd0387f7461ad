"""The report of a ``fedhar-study`` grid: tables over seeds and figures, from the finished cells' ``report.json``.

The grid itself (cells, running, resuming) is :mod:`simulation.study`; this module only reads
what the cells wrote, through their round records (:class:`coordinator.record.RoundRecord`),
and writes into the study folder ``OUT``: ``study.md`` (mean and standard deviation over seeds
of global, personalisation and generalisation accuracy and macro-F1, and where the cells
recorded it of the start measure (each model as it starts local training), final and best round),
``study.json`` (the same numbers), and PNG plots: metrics per round per strategy with the band
of the seeds (min..max), FedDist layer widths per round, FedDWA's p_ij as a heat map,
per-client personalisation accuracy as a strip plot, and the confusion matrix of the best
global model (recomputed from its saved weights on the union test set).
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.record import RoundRecord, records
from coordinator.report import best_and_final
from har_models.files import atomic_write_bytes
from simulation.study_cells import BASELINES, MEASURES, Cell, StudySettings, finished


def _records(doc: dict[str, Any] | None) -> list[RoundRecord]:
    """The round records of a finished cell's report (none for an unfinished cell)."""
    return records((doc or {}).get("rounds") or [])


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(cells: Sequence[Cell], out: Path) -> list[dict[str, Any]]:
    """One row per (split, strategy): mean and standard deviation over the finished seeds.

    Each row holds, per measure m and metric k (``accuracy``, ``macro_f1``):
    ``final.m.k = [mean, std]`` and ``best.m.k = [mean, std]`` (best over rounds, per
    seed), plus ``best_round.m`` (the seeds' best-macro-F1 rounds), ``seeds`` and
    ``wall_seconds`` (mean). Baselines have no global model under local-only: NaN; a measure
    no seed recorded (``start`` in an earlier release's cells, or in a baseline) is NaN too.
    A report whose final and best figures lack a measure its rounds hold (written by a
    release that did not summarise it) gets them from its rounds
    (:func:`coordinator.report.best_and_final`).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        doc = finished(c.folder(out))
        if doc is not None:
            if any(m not in (doc.get("final") or {}) for m in MEASURES):
                summary = best_and_final(_records(doc))
                doc = {**doc, "final": {**summary["final"], **(doc.get("final") or {})},
                       "best": {**summary["best"], **(doc.get("best") or {})}}  # fmt: skip
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


_HEAD = {"global": "global", "personalisation": "pers.", "generalisation": "gen.", "start": "start"}


def _has(rows: Sequence[dict[str, Any]], m: str) -> bool:
    """Whether any row holds a figure of measure ``m``."""
    return any(not math.isnan(r[w][m][k][0]) for r in rows for w in ("final", "best") for k in ("accuracy", "macro_f1"))


def markdown(rows: Sequence[dict[str, Any]], s: StudySettings, plots: Sequence[str], notes: Sequence[str]) -> str:
    """The study as Markdown: per split, a final table and a best table, then the plots and notes.

    The start columns (each model as it starts local training) appear only when some cell recorded that measure.
    """
    shown = [m for m in MEASURES if m != "start" or _has(rows, m)]
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
                "| strategy | seeds |" + "".join(f" {_HEAD[m]} acc | {_HEAD[m]} F1 |" for m in shown)
                + (" best-F1 rounds (global) | wall s |" if when == "best" else ""),
                "|---|---:|" + "---:|---:|" * len(shown) + ("---|---:|" if when == "best" else ""),
            ]
            for r in part:
                cells = [r["strategy"], str(len(r["seeds"]))]
                cells += [_cell(r[when][m][k]) for m in shown for k in ("accuracy", "macro_f1")]
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
    """Global, personalisation and generalisation macro-F1 per round: seed mean line and min..max band per strategy.

    A fourth panel shows the start measure (each model as it starts local training) when some cell recorded it.
    """
    series: dict[str, list[list[list[float]]]] = {}
    for c in cells:
        doc = finished(c.folder(out))
        if c.split != split or doc is None or c.strategy in BASELINES:
            continue
        series.setdefault(c.strategy, []).append(
            [[float(got.macro_f1) if (got := r.measure(m)) is not None else math.nan for r in _records(doc)] for m in MEASURES]
        )
    if not series:
        return None
    shown = [j for j, m in enumerate(MEASURES)
             if m != "start" or any(not math.isnan(v) for runs in series.values() for r in runs for v in r[j])]  # fmt: skip
    plt = _plt()
    fig, axes = plt.subplots(1, len(shown), figsize=(14 * len(shown) / 3, 4), sharey=True)
    for strategy, runs in series.items():
        n = min(len(r[0]) for r in runs)
        arr = np.array([[r[j][:n] for j in shown] for r in runs], dtype=float)  # (seeds, measures shown, rounds)
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
    for ax, j in zip(axes, shown, strict=True):
        ax.set_title(f"{MEASURES[j]} macro-F1")
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
        recs = _records(doc)
        runs.append((c, [r.arch.conv_filters for r in recs], [r.arch.dense_units for r in recs]))
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
        rounds = [r for r in _records(doc) if r.feddwa_weights is not None and r.feddwa_weights.clients]
        if rounds:
            break
    else:
        return None
    last = rounds[-1]
    w = last.feddwa_weights
    assert w is not None
    p = np.asarray(w.p, dtype=float)
    names = [str(cid).split("-")[-1] for cid in w.clients]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 6))
    im = ax.imshow(p, cmap="viridis", vmin=0.0, vmax=max(float(p.max()), 1e-9))
    fig.colorbar(im, ax=ax, label="p_ij")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.set_xlabel("source client j")
    ax.set_ylabel("target client i")
    what = f"split {split}: FedDWA p_ij, {c.strategy} seed {c.seed} round {last.round}"
    ax.set_title(what, fontsize=9)
    path = _save(fig, out / f"feddwa-weights-{split.replace('+', '-')}.png")
    own = float(np.mean(np.diag(p)))
    return path, f"{what}; mean self-weight p_ii = {own:.2f}, {int((p > 0).sum(axis=1).max())} sources at most per client."


def plot_clients(cells: Sequence[Cell], out: Path, split: str) -> Path | None:
    """Final-round personalisation accuracy of every client, one strip per strategy (seeds pooled)."""
    strips: dict[str, list[float]] = {}
    for c in cells:
        doc = finished(c.folder(out))
        recs = _records(doc)
        if c.split != split or not recs:
            continue
        per = recs[-1].evaluation.personalisation_clients
        strips.setdefault(c.strategy, []).extend(float(v.accuracy) for v in per.values())
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
    for r in _records(doc):
        path = cell.folder(out) / "models" / f"r{r.round:04d}" / "global.safetensors"
        g = r.measure("global")
        if path.is_file() and g is not None:
            kept.append((float(g.macro_f1), r.round, path))
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

