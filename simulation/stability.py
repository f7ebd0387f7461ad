"""``python -m simulation.stability``: the stability table of server steps from probe curves (docs/tuning/server-step.md).

Usage: ``python -m simulation.stability OUT.md PLOT.png FILE.json ...``, the files written by
``python -m simulation.probe --json``. Each JSON file is one
probe run (one federation size, CNN, split and seed; its name says which:
``{model}_{split}_n{N}_s{seed}.json``). For every curve it reports, on the global macro-F1 of the
union test windows (the figure the issue names; the choice was made on validation windows):

* final: the last round's F1;
* worst: the lowest F1 of rounds 5 to the last (after the first third of a 15-round run);
* drop: the largest fall from the best round so far, max_t (max_{s <= t} F1_s - F1_t), in points;
* end fall: how far the last round ends below the best round, max_t F1_t - F1_last, in points;
* diverged: a curve cut short by non-finite weights, or a drop of more than 10 points.

The same drop is computed on the validation windows (``vdrop``). For files of exactly two
settings (the old default against the new one) a second table puts their runs side by side
(a bold drop: diverged; "cut": stopped by non-finite weights); a last table gives, per
model, split and setting, the means over sizes and seeds (the final validation F1 is what the
choice reads). The plot draws each
setting's test curve for every file, one panel per (model, N).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from har_io.exit_codes import Exit

DIVERGED_DROP = 0.10
"""A fall of more than this (10 points of macro-F1) from the best round so far counts as divergence (issue 28)."""


_NAME = re.compile(r"^(?P<model>[a-z]+)_(?P<split>[a-z]+)_n(?P<n>\d+)_s(?P<seed>\d+)$")


def cell_of(path: Path) -> tuple[str, str, int, str]:
    """(model, split, N, seed) from a file name ``{model}_{split}_n{N}_s{seed}.json``.

    Raises
    ------
    ValueError
        If the name is not of that form (the message names the file).
    """
    m = _NAME.match(path.stem)
    if m is None:
        raise ValueError(f"{path}: expected a probe file named MODEL_SPLIT_nN_sSEED.json (e.g. small_iid_n2_s1.json)")
    return m["model"], m["split"], int(m["n"]), m["seed"]


def max_drop(curve: list[float]) -> float:
    """The largest fall from the best value so far, max_t (max_{s <= t} c_s - c_t); 0 for an empty or rising curve.

    Parameters
    ----------
    curve : list of float
        One value per round (macro-F1 in [0, 1]).
    """
    best, out = float("-inf"), 0.0
    for c in curve:
        best = max(best, c)
        out = max(out, best - c)
    return out


def summarise(rows: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """``final``, ``vfinal``, ``worst`` (rounds >= 5), ``drop``, ``vdrop``, ``cut`` and ``diverged`` of one probe curve.

    Parameters
    ----------
    rows : list of dict
        The probe's rows (``test_f1``, ``val_f1`` per round).
    rounds : int
        The rounds the setting was to run; fewer rows mean the probe stopped it (non-finite step).
    """
    test = [float(r["test_f1"]) for r in rows]
    val = [float(r["val_f1"]) for r in rows]
    cut = len(rows) < rounds
    return {"final": test[-1] if test else float("nan"), "vfinal": val[-1] if val else float("nan"),
            "worst": min(test[5:] or test or [float("nan")]), "end_fall": (max(test) - test[-1]) if test else float("nan"),
            "drop": max_drop(test), "vdrop": max_drop(val), "cut": cut,
            "diverged": cut or max_drop(test) > DIVERGED_DROP}


def main(argv: list[str]) -> int:
    """Write the markdown tables to argv[0] and the plot to argv[1] from the probe files argv[2:]; 0 ok, 2 usage."""
    if len(argv) < 3:
        print("usage: python -m simulation.stability OUT.md PLOT.png PROBE.json ...", file=sys.stderr)
        return Exit.USAGE
    out_md, out_png, files = Path(argv[0]), Path(argv[1]), [Path(a) for a in argv[2:]]
    lines = ["| model | split | N | seed | setting | final | worst (r5+) | max drop | val max drop | diverged |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---|"]
    panels: dict[tuple[str, int], list[tuple[str, list[float]]]] = defaultdict(list)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    cells: dict[tuple[str, str, int, str], list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    try:
        files = sorted(files, key=cell_of)
    except ValueError as exc:
        print(f"stability: {exc}", file=sys.stderr)
        return Exit.USAGE
    for f in files:
        model, split, n, seed = cell_of(f)
        doc = json.loads(f.read_text())
        for c in doc["curves"]:
            s = summarise(c["rows"], int(c["setting"]["rounds"]))
            label = c["label"].replace("lr=0.1 E=1 ", "").replace("lr=0.1 E=1", "fedavg")
            lines.append(f"| {model} | {split} | {n} | {seed} | {label} | {s['final']:.3f} | {s['worst']:.3f} | "
                         f"{100 * s['drop']:.1f} | {100 * s['vdrop']:.1f} | {'**yes**' if s['diverged'] else 'no'} |")
            groups[(model, split, label)].append(s)
            cells[(model, split, n, seed)].append((label, s))
            panels[(model, n)].append((f"{label} {split} s{seed}", [float(r["test_f1"]) for r in c["rows"]]))
    pairs = [(key, runs) for key, runs in cells.items() if len(runs) == 2]
    if pairs:  # files of two settings (the old default against the new one): one row per run, side by side
        (a, _), (b, _) = pairs[0][1]
        lines += ["", f"| model | split | N | seed | {a}: final | worst | drop | end fall | {b}: final | worst | drop | end fall |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for (model, split, n, seed), ((_, x), (_, y)) in pairs:
            cols = [f"{z['final']:.3f}{' (cut)' if z['cut'] else ''} | {z['worst']:.3f} | "
                    f"{'**' if z['diverged'] else ''}{100 * z['drop']:.1f}{'**' if z['diverged'] else ''} | "
                    f"{100 * z['end_fall']:.1f}" for z in (x, y)]
            lines.append(f"| {model} | {split} | {n} | {seed} | {cols[0]} | {cols[1]} |")
    lines += ["", "| model | split | setting | runs | mean final val F1 | mean final test F1 | lowest worst (r5+) | "
              "largest drop | val largest drop | diverged |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (model, split, label), ss in sorted(groups.items()):
        k = len(ss)
        lines.append(f"| {model} | {split} | {label} | {k} | {sum(x['vfinal'] for x in ss) / k:.3f} | "
                     f"{sum(x['final'] for x in ss) / k:.3f} | {min(x['worst'] for x in ss):.3f} | "
                     f"{100 * max(x['drop'] for x in ss):.1f} | {100 * max(x['vdrop'] for x in ss):.1f} | "
                     f"{sum(x['diverged'] for x in ss)} of {k} |")
    out_md.write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return Exit.OK
    keys = sorted(panels)
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2.6 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        colours: dict[str, str] = {}
        for label, curve in panels[key]:
            kind = label.rsplit(" ", 1)[0]  # the setting and split, without the seed: one colour each
            colour = colours.setdefault(kind, f"C{len(colours)}")
            style = "-" if label.startswith("fedexp") else ":"
            ax.plot(range(len(curve)), curve, style, color=colour, lw=1,
                    label=kind if label.endswith(" s1") else None)
        ax.set_title(f"{key[0]} CNN, N = {key[1]}", fontsize=9)
        ax.set_ylim(0, 1)
        ax.set_ylabel("global macro-F1 (test)", fontsize=8)
        ax.legend(fontsize=6, ncol=2)
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
