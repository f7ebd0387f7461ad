"""``python -m simulation.time_to_accuracy``: seconds and client-epochs until global macro-F1 first reaches each target.

Reads two or more ``report.json`` files (``fedhar-simulate``'s and ``fedhar-baseline
centralised``'s, which writes one row per pass in the same form) and prints a Markdown
table: for each report and each target (in % of macro-F1), the first round (or pass) whose
global macro-F1 is at or above the target, the seconds until the end of that round, and the
client-epochs spent until then.

- **seconds**: the sum of the rows' ``seconds`` up to and including that row. For the
  federation a row's seconds are the round's wall time at the coordinator (announcement,
  training, transfers, aggregation, evaluation); for the centralised baseline one pass of
  training and its evaluation. Start-up (loading windows, starting clients and broker) is
  in neither; the table's last column gives the report's whole ``wall_seconds``.
- **client-epochs**: passes over one client's training windows, summed over clients:
  ``updates x local_epochs`` per federated round (E from the report's ``config``), and one
  per subject per centralised pass (``updates`` is the subject count there, E = 1), so
  both count the same work.

A target never reached reads "not reached".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from har_io.exit_codes import Exit


@dataclass(frozen=True)
class Crossing:
    """Where a run first reached a target: 0-based ``round``, cumulative ``seconds`` (s) and ``client_epochs``."""

    round: int
    seconds: float
    client_epochs: int


def crossings(doc: Mapping[str, Any], targets: Sequence[float]) -> dict[float, Crossing | None]:
    """The first crossing of each target (macro-F1 in %, e.g. 90.0) in one report document, or None if never reached.

    Raises
    ------
    ValueError
        If the document has no ``rounds`` list, or a row lacks ``seconds`` or ``updates``
        (the message names the row).
    """
    rows = doc.get("rounds")
    if not isinstance(rows, list):
        raise ValueError("time_to_accuracy: the report has no 'rounds' list; give a report.json of fedhar-simulate or fedhar-baseline")
    cfg = doc.get("config")
    epochs = int(cfg.get("local_epochs", 1)) if isinstance(cfg, Mapping) else 1
    out: dict[float, Crossing | None] = {t: None for t in targets}
    seconds, client_epochs = 0.0, 0
    for i, row in enumerate(rows):
        try:
            seconds += float(row["seconds"])
            client_epochs += int(row["updates"]) * epochs
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"time_to_accuracy: round row {i} needs numeric 'seconds' and 'updates', got {row!r:.120}") from None
        g = row.get("global")
        f1 = g.get("macro_f1") if isinstance(g, Mapping) else None
        if f1 is None:
            continue
        for t in targets:
            if out[t] is None and round(100.0 * float(f1), 9) >= t:  # 0.905 is 90.5 %, not 90.49999...
                out[t] = Crossing(int(row.get("round", i)), seconds, client_epochs)
    return out


def table(named: Sequence[tuple[str, Mapping[str, Any]]], targets: Sequence[float]) -> str:
    """The Markdown table of :func:`crossings` for each ``(name, report document)``: one row per run."""
    head = "| run | " + " | ".join(f"F1 {t:g}: round, s, client-epochs" for t in targets) + " | final F1 | wall s |"
    lines = [head, "|---|" + "---:|" * (len(targets) + 2)]
    for name, doc in named:
        cells = []
        for c in crossings(doc, targets).values():
            cells.append("not reached" if c is None else f"{c.round}, {c.seconds:.0f}, {c.client_epochs}")
        g = doc["rounds"][-1].get("global") if doc["rounds"] else None
        final = f"{100 * g['macro_f1']:.1f}" if isinstance(g, Mapping) and "macro_f1" in g else "-"
        wall = doc.get("wall_seconds")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {final} | {wall if wall is not None else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table for the reports given. 0 ok, 2 usage, 3 a report that cannot be read."""
    ap = argparse.ArgumentParser(prog="python -m simulation.time_to_accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", metavar="NAME=REPORT.json", help="a report.json, optionally named (NAME=path)")
    ap.add_argument("--targets", default="85,90,94", help="global macro-F1 targets in %% (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        targets = [float(x) for x in args.targets.split(",")]
    except ValueError:
        print(f"time_to_accuracy: --targets {args.targets!r} must be comma-separated numbers", file=sys.stderr)
        return Exit.USAGE
    named = []
    for spec in args.reports:
        name, eq, path = spec.partition("=")
        if not eq:
            name, path = Path(spec).parent.name or spec, spec
        try:
            doc = json.loads(Path(path).read_text())
            crossings(doc, targets)
        except (OSError, json.JSONDecodeError, ValueError) as exc:
            print(f"time_to_accuracy: {path}: {exc}", file=sys.stderr)
            return Exit.DATA
        named.append((name, doc))
    print(table(named, targets))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
