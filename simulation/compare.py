"""``fedhar-compare``: one Markdown table of several runs' final metrics (from their ``report.json``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

MEASURES = ("global", "personalisation", "generalisation")


def _pct(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def row(doc: dict[str, Any], name: str) -> list[str]:
    """Table cells of one run: final accuracy / macro-F1 per measure, widths, traffic, time."""
    rounds = doc.get("rounds", [])
    last = rounds[-1] if rounds else {}
    final = doc.get("final", {})
    cells = [name, str(len(rounds))]
    for m in MEASURES:
        f = final.get(m, {})
        cells += [_pct(f.get("accuracy")), _pct(f.get("macro_f1"))]
    ups = [r["bytes_up"] for r in rounds if r.get("bytes_up")]
    downs = [r["bytes_down"] for r in rounds if r.get("bytes_down")]
    cells += [
        f"{last.get('conv_filters', 'n/a')}, {last.get('dense_units', 'n/a')}",
        f"{sum(ups) / len(ups) / 1e6:.0f}" if ups else "n/a",
        f"{sum(downs) / len(downs) / 1e6:.0f}" if downs else "n/a",
        f"{doc.get('wall_seconds', 0):.0f}",
    ]
    return cells


def table(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Markdown table over ``(name, report document)`` pairs."""
    head = ["run", "rounds", "global acc", "global F1", "pers. acc", "pers. F1", "gen. acc", "gen. F1",
            "final (F, H)", "up MB/round", "down MB/round", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(row(doc, name)) + " |" for name, doc in runs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table of the given run folders (or ``report.json`` files)."""
    ap = argparse.ArgumentParser(prog="fedhar-compare", description=__doc__)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders holding report.json")
    args = ap.parse_args(argv)
    docs = []
    for path in args.runs:
        f = path / "report.json" if path.is_dir() else path
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"fedhar-compare: cannot read {f}: {exc}", file=sys.stderr)
            return 3
        docs.append((str(doc.get("strategy") or path.name), doc))
    sys.stdout.write(table(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
