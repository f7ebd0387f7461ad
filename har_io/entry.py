"""The console scripts' entry points: each imports its program, so a missing extra is one clear exit.

A program imports its heavy dependencies (PyTorch, tqdm, Kivy) when its module loads, before its
``main`` could catch anything: without its extra an installed script would end in a traceback,
exit 1, which systemd restarts forever. Here a missing module ends it with
:data:`har_io.exit_codes.Exit.MISSING_MODULE` (7, never restarted) and a message naming the module
and the extra. The programs are imported by name; ``--version`` alone answers before any import.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import NamedTuple

from har_io.exit_codes import Exit, fail
from har_io.install_hints import install_hint, torch_hint


class Script(NamedTuple):
    """One console script: its program's module, the extra that brings what it imports, and whether that extra holds PyTorch."""

    module: str
    role: str
    extra: str
    torch: bool


SCRIPTS: dict[str, Script] = {
    "fedhar-coordinator": Script("coordinator.cli", "coordinator", "coordinator", True),
    "fedhar-client": Script("edge_client.cli", "device client", "pi", False),
    "fedhar-record": Script("edge_client.record_cli", "device client", "pi", False),
    "fedhar-app": Script("edge_client.app.main", "app", "app", False),
    "fedhar-simulate": Script("simulation.simulate", "simulation", "all", True),
    "fedhar-study": Script("simulation.study", "simulation", "all", True),
    "fedhar-baseline": Script("simulation.baselines", "simulation", "all", True),
    "fedhar-compare": Script("simulation.compare", "simulation", "all", True),
}
"""Every ``fedhar-*`` script (the names of ``[project.scripts]``)."""
SUBPROGRAMS: dict[tuple[str, str], str] = {("fedhar-coordinator", "broker"): "coordinator.broker.cli"}
"""(script, first word) -> the module whose ``main(rest)`` runs it: ``fedhar-coordinator broker`` needs only the base
install, while ``coordinator.cli`` imports PyTorch."""


PACKAGE = "fedhar"
"""The distribution every ``fedhar-*`` script belongs to (``[project] name``)."""


def release() -> str:
    """The installed release of fedhar, e.g. ``"0.9.0"``; ``"unknown"`` in a source tree never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown"


def version_line(program: str) -> str:
    """``fedhar-coordinator 0.9.0 (Python 3.11.7)``: what ``--version`` prints."""
    return f"{program} {release()} (Python {sys.version.split()[0]})"


def missing_extra(program: str, exc: ModuleNotFoundError) -> str:
    """The words for ``program`` when module ``exc.name`` is not installed: which module, where, and what to install."""
    s = SCRIPTS[program]
    # PyTorch's CPU build first: a pin cannot choose the build, and the plain pin fetches the CUDA one (several GB).
    steps = f"{torch_hint()}, then {install_hint(s.extra)}" if s.torch else install_hint(s.extra)
    return f"{program}: the Python module {exc.name!r} is not installed in {sys.prefix}; install the {s.role}'s extra: {steps}"


def run(program: str, argv: list[str] | None = None) -> int:
    """Import ``program``'s module and run its ``main(argv)``; exit 7 with :func:`missing_extra`'s words if a module is missing.

    A first word in :data:`SUBPROGRAMS` runs that module's ``main`` with the rest; ``--version`` alone
    prints :func:`version_line`. KeyError for a program not in :data:`SCRIPTS`.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    module = SCRIPTS[program].module
    if words == ["--version"]:
        print(version_line(program))
        return Exit.OK
    if words and (program, words[0]) in SUBPROGRAMS:
        module, argv = SUBPROGRAMS[(program, words[0])], words[1:]
    try:
        main: Callable[[list[str] | None], int] = importlib.import_module(module).main
        return main(argv)
    except ModuleNotFoundError as exc:
        return fail(missing_extra(program, exc), Exit.MISSING_MODULE)


def _entry(program: str) -> Callable[[], int]:
    def entry() -> int:
        return run(program)

    entry.__doc__ = f"``{program}``."
    return entry


coordinator = _entry("fedhar-coordinator")
client = _entry("fedhar-client")
record = _entry("fedhar-record")
app = _entry("fedhar-app")
simulate = _entry("fedhar-simulate")
study = _entry("fedhar-study")
baseline = _entry("fedhar-baseline")
compare = _entry("fedhar-compare")
