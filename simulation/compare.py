"""``fedhar-compare``: one Markdown table of several runs' final metrics (from their ``report.json``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from coordinator.record import PROTOCOL_MEASURES, RecordError, records
from har_io.cli import HelpFormatter, plain
from har_io.exit_codes import Exit
from har_models.nn.metrics import pct

MEASURES = PROTOCOL_MEASURES
"""The measures compared, in column order: the FedDist protocol's three (:data:`coordinator.record.PROTOCOL_MEASURES`)."""


def row(doc: dict[str, Any], name: str) -> list[str]:
    """Table cells of one run: final accuracy / macro-F1 per measure, widths, traffic, time.

    Raises
    ------
    coordinator.record.RecordError
        If a round of the report cannot be read as a round record.
    """
    rounds = records(doc.get("rounds", []))
    final = doc.get("final", {})
    cells = [name, str(len(rounds))]
    for m in MEASURES:
        f = final.get(m, {})
        cells += [pct(f.get("accuracy"), sign=""), pct(f.get("macro_f1"), sign="")]
    traffic = [r.traffic for r in rounds if r.traffic is not None]
    ups = [t.bytes_up for t in traffic if t.bytes_up]
    downs = [t.bytes_down for t in traffic if t.bytes_down]
    arch = rounds[-1].arch if rounds else None
    cells += [
        f"{arch.conv_filters}, {arch.dense_units}" if arch is not None else "n/a, n/a",
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
    ap = argparse.ArgumentParser(prog="fedhar-compare", description=plain(__doc__ or ""), formatter_class=HelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders holding report.json")
    args = ap.parse_args(argv)
    docs = []
    for path in args.runs:
        f = path / "report.json" if path.is_dir() else path
        try:
            doc = json.loads(f.read_text())
            records(doc.get("rounds", []))
        except (OSError, json.JSONDecodeError, RecordError) as exc:
            print(f"fedhar-compare: cannot read {f}: {exc}", file=sys.stderr)
            return Exit.DATA
        docs.append((str(doc.get("strategy") or path.name), doc))
    sys.stdout.write(table(docs))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
