"""Run a scripted session in the real Kivy app window: the loop the app drivers (tests/app_*_driver.py) share.

A driver writes its session as a generator. Each item it yields is either a number (wait that
many seconds, with the window live) or a callable (wait until it returns true, at most the
session's deadline). :func:`run_script` steps the generator from Kivy's clock on the UI thread,
so every step may touch widgets; it stops the app when the script ends or raises, and writes
``results`` (with the traceback under ``"error"``) to ``OUT_DIR/results.json``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Step = float | Callable[[], bool]

PHONE_LACKS = ("torch", "scipy")
"""Modules a driver makes unimportable, as on a phone: neither is in the APK."""


def as_on_a_phone() -> Path:
    """Prepare a driver's process as the app runs on a phone; returns the repository root, now on ``sys.path``.

    Call it before any import of Kivy or of the project: Kivy is told to leave the command line
    and the console alone, :data:`PHONE_LACKS` cannot be imported, and the repository comes first
    on ``sys.path`` (the driver runs as a script from ``tests/``).
    """
    import os
    import sys

    os.environ.setdefault("KIVY_NO_ARGS", "1")
    os.environ.setdefault("KIVY_NO_CONSOLELOG", "1")
    for name in PHONE_LACKS:
        sys.modules[name] = None  # type: ignore[assignment]
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    return root


def run_script(app: Any, script: Iterator[Step], results: dict[str, Any], out: Path, timeout_s: float) -> int:
    """Run ``app`` (a Kivy ``App``) while ``script`` drives it; write ``out / "results.json"``; 0 if no step failed, else 1.

    A condition not met within ``timeout_s`` seconds of the session's start is a failure
    (``TimeoutError``, recorded in ``results["error"]`` with the results gathered so far).
    """
    from kivy.clock import Clock

    results.setdefault("error", None)
    state: dict[str, Any] = {"wait": None, "until": 0.0, "deadline": time.monotonic() + timeout_s}

    def tick(_dt: float) -> None:
        try:
            while True:
                wait = state["wait"]
                if callable(wait):
                    if not wait():
                        if time.monotonic() > state["deadline"]:
                            raise TimeoutError(f"waited {timeout_s} s for a condition; results so far: {results}")
                        return
                elif time.monotonic() < state["until"]:
                    return
                step = next(script)
                if callable(step):
                    state["wait"] = step
                else:
                    state["wait"], state["until"] = None, time.monotonic() + float(step)
        except StopIteration:
            Clock.unschedule(tick)
            app.stop()
        except Exception:
            results["error"] = traceback.format_exc()
            Clock.unschedule(tick)
            app.stop()

    Clock.schedule_interval(tick, 0.05)
    app.run()
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if results["error"] is None else 1


def run_driver(
    driver: str,
    out: Path,
    *args: str,
    display: str,
    kivy_home: Path | None = None,
    timeout_s: float = 180.0,
    context: Callable[[], str] | None = None,
) -> tuple[dict[str, Any], str]:
    """Run the app driver ``tests/<driver>`` (``OUT_DIR`` then ``args``) on X display ``display``.

    Returns its ``results.json`` and what it printed (stdout and stderr), which a test may search
    for a secret that must not appear.

    The driver runs in a process of its own with the repository on ``PYTHONPATH`` (and
    ``KIVY_HOME`` when given). Fails the calling test (AssertionError) when the driver wrote no
    results, recorded an error or exited non-zero; ``context()`` is added to that message (a
    coordinator's log, say). Raises ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds.
    """
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, DISPLAY=display, PYTHONPATH=str(root))
    if kivy_home is not None:
        env["KIVY_HOME"] = str(kivy_home)
    r = subprocess.run([sys.executable, str(root / "tests" / driver), str(out), *args], cwd=root, env=env,
                       capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    more = context() if context is not None else ""
    assert (out / "results.json").exists(), r.stdout[-3000:] + r.stderr[-3000:] + more
    res: dict[str, Any] = json.loads((out / "results.json").read_text())
    assert res["error"] is None, str(res["error"]) + more
    assert r.returncode == 0, r.stderr[-3000:] + more
    return res, r.stdout + r.stderr


@contextlib.contextmanager
def xvfb(log_dir: Path, screen: str = "1280x800") -> Iterator[str | None]:
    """An Xvfb X server of ``screen`` pixels (24-bit) on a free display number, while the block runs; yields its ``DISPLAY``.

    Yields None where Xvfb is not installed (the caller skips or fails). Raises RuntimeError, with
    the server's log, when it does not start within 10 s.
    """
    from simulation.broker import stop_process

    exe = shutil.which("Xvfb")
    if exe is None:
        yield None
        return
    n = next(i for i in range(99, 199) if not Path(f"/tmp/.X11-unix/X{i}").exists() and not Path(f"/tmp/.X{i}-lock").exists())
    log = Path(log_dir) / f"xvfb-{n}.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([exe, f":{n}", "-screen", "0", f"{screen}x24", "-nolisten", "tcp"], stdout=logf, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if Path(f"/tmp/.X11-unix/X{n}").exists():
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"Xvfb did not start: {log.read_text()}")
        yield f":{n}"
    finally:
        stop_process(proc)
