"""The small federation the end-to-end tests run: the main job's programs with a CNN that trains in seconds.

One place for the command-line options those tests share (an 8-filter, 32-unit CNN instead of
the paper's 196 filters and 1024 units, no progress bar, two-minute deadlines), so that each
test writes only the options it is about. ``conftest.py``'s ``small_simulation`` fixture runs
one; modules that build a command line at import time (for a subprocess, a study, a Ray
cluster) import these functions directly, as they import ``support.realworld_synth``.

Options are strings in argparse's form; a later repeat of an option overrides an earlier one,
so ``[*simulate_args(), "--rounds", "3"]`` is the usual way to add to them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from simulation.broker import stop_process

CONV_FILTERS = 8  # the small CNN: convolution filters (the paper's CNN has 196)
DENSE_UNITS = 32  # hidden units (the paper's 1024)
TIMEOUT_S = 120  # --start-timeout and --round-timeout, seconds: generous for a loaded 2-core machine


def model_args(conv_filters: int = CONV_FILTERS, dense_units: int = DENSE_UNITS) -> list[str]:
    """``--conv-filters N --dense-units M``: the CNN's width, for fedhar-coordinator, fedhar-simulate and fedhar-study."""
    return ["--conv-filters", str(conv_filters), "--dense-units", str(dense_units)]


def coordinator_args(
    *,
    conv_filters: int = CONV_FILTERS,
    dense_units: int = DENSE_UNITS,
    start_timeout_s: int = TIMEOUT_S,
    round_timeout_s: int = TIMEOUT_S,
) -> list[str]:
    """The options fedhar-coordinator and fedhar-simulate share: the CNN's width, no progress bar, both deadlines [s]."""
    return [*model_args(conv_filters, dense_units), "--no-progress", "--round-timeout", str(round_timeout_s),
            "--start-timeout", str(start_timeout_s)]  # fmt: skip


def simulate_args(*, clients: int | None = 3, generalisation_every: int | None = 1, **coordinator: int) -> list[str]:
    """fedhar-simulate's options for a small federation: ``clients`` HAPT subjects and :func:`coordinator_args`.

    ``clients=None`` leaves ``--clients`` out (the dataset's own subject count, e.g. REALWORLD's 15);
    ``generalisation_every=None`` leaves ``--generalisation-every`` at its default. The other keywords
    go to :func:`coordinator_args`; an unknown one raises ``TypeError``.
    """
    args = [] if clients is None else ["--clients", str(clients)]
    args += coordinator_args(**coordinator)
    if generalisation_every is not None:
        args += ["--generalisation-every", str(generalisation_every)]
    return args


def run_simulation(run_dir: Path, *extra: str, run_id: str | None = None, **small: Any) -> dict[str, Any]:
    """Run fedhar-simulate in this process in ``run_dir``; return its ``report.json``.

    The command line is ``simulate_args(**small)``, then ``--run-dir run_dir --run-id run_id``
    (default: the folder's name), then ``extra``. Fails the calling test (AssertionError) when
    the simulation exits non-zero.
    """
    from simulation import simulate  # imported here: a module importing this one for its options need not load torch

    argv = [*simulate_args(**small), "--run-dir", str(run_dir), "--run-id", run_id or run_dir.name, *extra]
    rc = simulate.main(argv)
    assert rc == 0, f"fedhar-simulate exited {rc}: {' '.join(argv)}"
    doc: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    return doc


def wait_or_stop(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    """``proc``'s exit status within ``timeout`` s; else stop it and fail with the tail of its ``log``."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise AssertionError(f"still running after {timeout} s; log:\n{log.read_text()[-4000:]}") from None


@contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to put started programs in; on leaving, each one still running is stopped.

    A program a test paused with SIGSTOP gets SIGCONT first, so that it can act on the stop
    (:func:`simulation.broker.stop_process`: SIGTERM, then SIGKILL after its grace period).
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                stop_process(p)


def wait_for(pred: Callable[[], bool], timeout: float, what: str, logs: list[Path]) -> None:
    """Poll ``pred`` every 0.5 s until it is true.

    Raises
    ------
    AssertionError
        After ``timeout`` seconds, naming ``what`` and ending with the last 3000 characters of
        every log in ``logs`` that exists, so a failure shows what the programs said.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"{what} not within {timeout} s\n{tails}")


UPLOAD_BYTE_KEYS = ("bytes_up", "bytes_up_by_encoding")
"""Round-record keys that hold upload bytes: an update's metadata carries its measured training time as text."""


def round_figures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every number of every round of a report.json except wall times and upload bytes (:data:`UPLOAD_BYTE_KEYS`).

    Two runs with the same seed give equal lists; their upload bytes differ by the few digits of
    each update's training time, which :func:`assert_upload_bytes_close` allows.
    """
    return [{k: v for k, v in r.items() if k not in ("seconds", *UPLOAD_BYTE_KEYS)} for r in doc["rounds"]]


def assert_upload_bytes_close(a: dict[str, Any], b: dict[str, Any], per_round: int = 64) -> None:
    """Both reports uploaded in the same encodings, with bytes per round within ``per_round`` of each other."""
    for ra, rb in zip(a["rounds"], b["rounds"], strict=True):
        assert abs(ra["bytes_up"] - rb["bytes_up"]) < per_round, (ra["round"], ra["bytes_up"], rb["bytes_up"])
        ea, eb = ra.get("bytes_up_by_encoding", {}), rb.get("bytes_up_by_encoding", {})
        assert set(ea) == set(eb) and all(abs(ea[k] - eb[k]) < per_round for k in ea), (ra["round"], ea, eb)
