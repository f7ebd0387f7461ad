"""The status page and ``/metrics`` as a served federation grows: render time and size at 100 to 100,000 rounds.

A home server at the README's 600 s interval completes 52,560 rounds a year; the page reloads
itself every 10 s and Prometheus scrapes ``/metrics`` every 15-60 s. What must not grow with the
round count is the cost of one request once the server is up: the page's charts have a bounded
number of points (:func:`coordinator.server.charts.downsample`) and are drawn again only when a
round completes, and the metrics are folded one round at a time (:class:`coordinator.server.metrics.RoundTotals`).

For each round count n (``--rounds``, default 100, 10,000 and 100,000) the benchmark writes n
synthetic round records into a fresh run database (rows written straight into its ``rounds``
table: the records are what a two-device federation writes, the models are not needed to
render), then over the real ASGI app (``starlette.testclient``) measures, as medians of
``--reps``:
- ``start``: the first page of a new server (every record read and folded once);
- ``page``: a page while no round completes (what a browser's reload costs);
- ``page+1``: a page right after one more round (the new record read, the charts drawn again);
- ``metrics``: one ``/metrics`` scrape while no round completes, and ``metrics+1`` after one more round;
and the page's and the metrics' sizes in bytes.

Baseline, in the same run: the same requests at the smallest n. The last line is
``page_vs_smallest=<page+1 ms at the largest n over at the smallest> metrics_vs_smallest=<metrics ms ratio>``;
flat costs give ratios near 1.

Run: ``python benchmarks/bench_status_page.py`` (about a minute; ``--rounds 100,10000`` for a quick one).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from starlette.testclient import TestClient

from coordinator.record import RoundRecord
from coordinator.server.registry import Registry
from coordinator.server.web import ServerView, make_app
from coordinator.state import RunState


def synthetic_row(r: int) -> dict:
    """Round ``r`` of a two-device federation, as the coordinator records it (figures vary with r)."""
    return RoundRecord.from_json({
        "round": r, "selected": 2, "updates": 2, "rejected": int(r % 5 == 0), "missing": [], "seconds": 30.0 + r % 17,
        "rejections": [["phone-b", "stale_round", 1]] if r % 5 == 0 else [],
        "bytes_up": 260_000, "bytes_down": 1_040_000, "arch_version": 0, "conv_filters": 16, "dense_units": 32,
        "personalisation": {"accuracy": 0.8 + (r % 13) / 100, "macro_f1": 0.75 + (r % 11) / 100},
        "start": {"accuracy": 0.7 + (r % 7) / 100, "macro_f1": 0.65 + (r % 9) / 100},
        "personalisation_clients": {"phone-a": {"accuracy": 0.9, "macro_f1": 0.85},
                                    "phone-b": {"accuracy": 0.7 + (r % 3) / 100, "macro_f1": 0.6}},
    }).to_json()  # fmt: skip


def _fill(run: Path, first: int, n: int) -> None:
    """Write rounds first .. first + n - 1 into the run database's ``rounds`` table."""
    db = sqlite3.connect(run / "state.sqlite")
    with db:
        db.executemany("INSERT OR REPLACE INTO rounds (round, completed, summary) VALUES (?, ?, ?)",
                       ((r, 1.8e9 + 600 * r, json.dumps(synthetic_row(r))) for r in range(first, first + n)))  # fmt: skip
    db.close()


def _ms(f: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(n: int, reps: int) -> dict[str, float]:
    """The figures of the module docstring for ``n`` rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = RunState(root / "run")
        reg = Registry(root / "data")
        for name in ("phone-a", "phone-b"):
            reg.enrol(name, None)
        _fill(root / "run", 0, n)
        view = ServerView(name="bench", run_state=state, registry=reg)
        client = TestClient(make_app(view))
        t0 = time.perf_counter()
        first = client.get("/")
        start_ms = 1000 * (time.perf_counter() - t0)
        assert first.status_code == 200, first.text[:200]
        page_ms = _ms(lambda: client.get("/"), reps)
        metrics_ms = _ms(lambda: client.get("/metrics"), reps)
        next_round = [n]

        def page_after_a_round() -> None:
            _fill(root / "run", next_round[0], 1)
            next_round[0] += 1
            client.get("/")

        def metrics_after_a_round() -> None:
            _fill(root / "run", next_round[0], 1)
            next_round[0] += 1
            client.get("/metrics")

        page1_ms = _ms(page_after_a_round, reps)
        metrics1_ms = _ms(metrics_after_a_round, reps)
        page = client.get("/").content
        metrics = client.get("/metrics").content
        assert f'<span id="rounds-completed">{next_round[0]}</span>' in page.decode(), "the page lost rounds"
        state.close()
        return {"rounds": n, "start_ms": start_ms, "page_ms": page_ms, "page+1_ms": page1_ms, "metrics_ms": metrics_ms,
                "metrics+1_ms": metrics1_ms, "page_bytes": len(page), "metrics_bytes": len(metrics)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", default="100,10000,100000", help="round counts, comma-separated (default: %(default)s)")
    p.add_argument("--reps", type=int, default=7, help="repetitions of each request; the median is reported (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    args = p.parse_args(argv)
    counts = sorted(int(x) for x in args.rounds.split(","))
    rows = [measure(n, args.reps) for n in counts]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        cols = list(rows[0])
        print(" | ".join(f"{c:>13}" for c in cols))
        for r in rows:
            print(" | ".join(f"{r[c]:>13.1f}" if isinstance(r[c], float) else f"{r[c]:>13}" for c in cols))
    lo, hi = rows[0], rows[-1]
    print(f"page_vs_smallest={hi['page+1_ms'] / lo['page+1_ms']:.2f} metrics_vs_smallest={hi['metrics+1_ms'] / lo['metrics+1_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
