"""The status page of a large federation in headless Chromium: 1,000 devices, 2,000 rounds, the device table paged.

A study with a thousand phones is past the home design point, but its operator reads the same
page. Before the device table was paged, the page of such a federation held a row per device
(1,052 rows, 386 kB) and took Chromium 1.5-3.7 s to load. This benchmark builds that federation
(:func:`build_fleet`: every device enrolled and reporting a status, rounds of ten devices each,
their participation; rows written straight into the databases, the models are not needed to
render), serves the real app with uvicorn on 127.0.0.1, and loads the page in headless Chromium:

* ``paged``: the page as served (:data:`coordinator.server.web.page.DEVICES_PER_PAGE` rows);
* baseline, in the same run: ``every row``, the same page with the whole table on one page (what it was).

For each it prints the server's time for the page (median of ``--reps``, over HTTP), Chromium's
load time (``performance.timing``: navigation start to the load event, median of ``--reps``), the
page's size and its device rows, then ``load_vs_every_row=<paged / baseline>``.

Run: ``python benchmarks/bench_status_page_devices.py`` (needs chromium, chromium-driver and
selenium; about a minute).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from coordinator.record import RoundRecord
from coordinator.server.monitor import Monitor
from coordinator.server.registry import Registry
from coordinator.server.web import ServerView, WebServer, make_app
from coordinator.server.web import page as page_module
from coordinator.state import RunState
from har_models.wire.messages import ClientStatus, CoordinatorStatus
from har_models.wire.topics import Topics

NOW = 1_800_000_000.0


def _round(r: int, names: list[str], per_round: int) -> dict[str, Any]:
    chosen = [names[(r * per_round + i) % len(names)] for i in range(per_round)]
    figures = {c: {"accuracy": 0.8, "macro_f1": 0.75, "n": 40} for c in chosen}
    return RoundRecord.from_json({
        "round": r, "selected": per_round, "updates": per_round, "rejected": 0, "missing": [], "seconds": 60.0,
        "bytes_up": 260_000 * per_round, "bytes_down": 1_040_000 * per_round, "arch_version": 0, "conv_filters": 16,
        "dense_units": 32, "personalisation": {"accuracy": 0.8, "macro_f1": 0.75 + (r % 11) / 100},
        "personalisation_clients": figures, "start": {"accuracy": 0.7, "macro_f1": 0.65 + (r % 9) / 100}, "start_clients": figures,
    }).to_json()  # fmt: skip


def build_fleet(root: Path, devices: int = 1000, rounds: int = 2000, per_round: int = 10) -> ServerView:
    """A view over a federation of ``devices`` enrolled devices, each online, and ``rounds`` completed rounds of ``per_round``."""
    names = [f"phone-{i:04d}" for i in range(devices)]
    reg = Registry(root / "data")
    state = RunState(root / "data" / "run")
    for name in names:
        reg.enrol(name, None)
    rows = [_round(r, names, per_round) for r in range(rounds)]
    db = sqlite3.connect(root / "data" / "run" / "state.sqlite")
    with db:
        db.executemany("INSERT INTO rounds (round, completed, summary) VALUES (?, ?, ?)",
                       ((r["round"], NOW - 600 * (rounds - r["round"]), json.dumps(r)) for r in rows))  # fmt: skip
    db.close()
    db = sqlite3.connect(root / "data" / "server.sqlite")
    with db:
        db.executemany("INSERT INTO participation (name, round, t, accuracy, macro_f1) VALUES (?, ?, ?, ?, ?)",
                       ((c, r["round"], NOW, 0.8, 0.75) for r in rows for c in r["personalisation_clients"]))  # fmt: skip
    db.close()
    t = Topics("home")
    mon = Monitor(t, wall=lambda: NOW)
    mon.handle(t.coordinator_status, CoordinatorStatus("online", "run", "a1", NOW, 30.0).to_bytes(), True)
    for name in names:
        mon.handle(t.client_status(name), ClientStatus(name, "idle", n_train=300, n_test=80, sent_unix=NOW, refresh_s=1e9,
                                                       sensing="live").to_bytes(), True)  # fmt: skip
    return ServerView(name="study", run_state=state, registry=reg, monitor=mon, wall=lambda: NOW)


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def measure(view: ServerView, driver: Any, reps: int) -> dict[str, Any]:
    """Server time, Chromium load time, size and device rows of the page as served now."""
    server = WebServer(make_app(view), port=0)
    port = server.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        body = b""
        serve_ms = []
        for _ in range(reps):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=60) as r:
                body = r.read()
            serve_ms.append(1000 * (time.perf_counter() - t0))
        driver.get(url)  # a first load warms the browser's caches; not counted
        load_ms = []
        for _ in range(reps):
            driver.get(url)
            timing = driver.execute_script("const t = performance.timing; return [t.navigationStart, t.loadEventEnd];")
            load_ms.append(float(timing[1] - timing[0]))
        rows = len(driver.find_elements("css selector", "tr.device"))
    finally:
        server.stop()
    return {"serve_ms": statistics.median(serve_ms), "load_ms": statistics.median(load_ms), "page_kB": len(body) / 1000,
            "device_rows": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--reps", type=int, default=5, help="loads of each variant; medians are reported (default: %(default)s)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        view = build_fleet(Path(tmp), args.devices, args.rounds)
        view.warm()
        driver = _driver()
        try:
            paged = measure(view, driver, args.reps)
            per_page = page_module.DEVICES_PER_PAGE
            page_module.DEVICES_PER_PAGE = 10**9  # the baseline: every device on one page
            try:
                every = measure(view, driver, args.reps)
            finally:
                page_module.DEVICES_PER_PAGE = per_page
        finally:
            driver.quit()
    print(f"{args.devices} devices, {args.rounds} rounds")
    print(f"{'variant':>10} | {'serve ms':>9} | {'load ms':>8} | {'page kB':>8} | {'device rows':>11}")
    for name, r in (("paged", paged), ("every row", every)):
        print(f"{name:>10} | {r['serve_ms']:>9.0f} | {r['load_ms']:>8.0f} | {r['page_kB']:>8.0f} | {r['device_rows']:>11}")
    print(f"load_vs_every_row={paged['load_ms'] / every['load_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
