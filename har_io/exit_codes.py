"""The one table of exit statuses of the fedhar programs and of systemd when it cannot start them.

Every number means one thing for every program that returns it. The README's table
(:func:`markdown_table`, printed by ``python -m har_io.exit_codes``), each program's ``--help``
epilog (:func:`epilog`) and the units' ``RestartPreventExitStatus=`` (:func:`restart_prevented`)
come from, or are checked against, :data:`EXIT_CODES` (tests/test_exit_codes.py). Earlier releases
used 4 for a held state folder (now 6), 5 for a duplicate client id (now 8) and 1 for a study with
unfinished cells (now 5).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

CLIENT = "fedhar-client"
COORDINATOR = "fedhar-coordinator"
SIMULATE = "fedhar-simulate"
STUDY = "fedhar-study"
APP = "fedhar-app"
PROGRAMS = (CLIENT, COORDINATOR, SIMULATE, STUDY, APP)
# The unit of each program that runs as a systemd service (firmware_scripts/systemd/).
UNITS = {"fedhar-client@.service": CLIENT, "fedhar-coordinator.service": COORDINATOR}


class Exit(IntEnum):
    """The exit statuses by name; ``Exit.USAGE`` is 2 wherever a program returns it."""

    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    DATA = 3
    BROKER_REFUSED = 4
    FEDERATION_FAILED = 5
    FOLDER_UNUSABLE = 6
    MISSING_MODULE = 7
    DUPLICATE_ID = 8
    SIGINT = 130
    SIGTERM = 143
    SYSTEMD_EXEC = 203
    SYSTEMD_USER = 217
    SYSTEMD_CREDENTIALS = 243


@dataclass(frozen=True)
class ExitCode:
    """One row of the table: the code, its meaning for every program in ``programs`` (for systemd's own codes, the
    programs whose units can end with it), whether restarting the same command can succeed (``False`` puts it in the
    units' ``RestartPreventExitStatus=``), a program's own ``detail``, and whether systemd gives it (``man systemd.exec``)."""

    code: Exit
    meaning: str
    programs: tuple[str, ...]
    restart_helps: bool
    detail: dict[str, str] = field(default_factory=dict)
    by_systemd: bool = False

    def meaning_for(self, program: str) -> str:
        """The meaning for ``program``: the general one, then the program's own detail if any."""
        more = self.detail.get(program)
        return f"{self.meaning}; {more}" if more else self.meaning


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(Exit.OK, "finished", PROGRAMS, True),
    ExitCode(Exit.UNEXPECTED, "an unexpected error (a traceback); please report it", PROGRAMS, True),
    ExitCode(Exit.USAGE, "usage: a bad option, setting or certificate file", PROGRAMS, False),
    ExitCode(Exit.DATA, "data: nothing to train or evaluate on, or unreadable recordings", (CLIENT, COORDINATOR, SIMULATE), False,
             {CLIENT: "--source gives no labelled training window",
              COORDINATOR: "--eval-data cannot be read; `broker`: mosquitto_passwd is missing or fails"}),
    ExitCode(Exit.BROKER_REFUSED, "the broker refused the login or TLS failed (an unreachable broker is retried, not an exit)",
             (CLIENT, COORDINATOR, SIMULATE), False,
             {SIMULATE: "also when the embedded broker, Mosquitto or the Ray cluster cannot be started or joined"}),
    ExitCode(Exit.FEDERATION_FAILED, "the federation could not go on (no clients, failed rounds); a restart with --resume continues",
             (COORDINATOR, SIMULATE, STUDY), True,
             {STUDY: "some cells have no final report; the same command runs them again",
              COORDINATOR: "`serve`: also a database another program held for longer than the wait (a restart waits again)"}),
    ExitCode(Exit.FOLDER_UNUSABLE, "the run or state folder cannot be used as asked (another run's, in use, or damaged)",
             (CLIENT, COORDINATOR, SIMULATE), False,
             {CLIENT: "another running client holds --state-dir (it is named), or the folder cannot be written (read-only, full)",
              COORDINATOR: "`serve`: also another serve holds the data folder, or its account may not write it (the chown is named)"}),
    ExitCode(Exit.MISSING_MODULE, "a Python module the run needs is not installed; the message names it and the install step",
             (CLIENT, COORDINATOR, APP), False,
             {CLIENT: "e.g. torch for --backend torch", COORDINATOR: "the coordinator extra", APP: "Kivy, the app extra"}),
    ExitCode(Exit.DUPLICATE_ID, "another process uses this client id (its retained status says so)", (CLIENT,), False),
    ExitCode(Exit.SIGINT, "stopped by SIGINT (Ctrl-C); completed rounds and finished cells are kept", (COORDINATOR, SIMULATE, STUDY), True),
    ExitCode(Exit.SIGTERM, "stopped by SIGTERM; completed rounds and finished cells are kept", (SIMULATE, STUDY), True),
    ExitCode(Exit.SYSTEMD_EXEC, "systemd: the program is missing (no venv in /opt/fedhar)", (CLIENT, COORDINATOR), False, by_systemd=True),
    ExitCode(Exit.SYSTEMD_USER, "systemd: there is no user fedhar", (CLIENT, COORDINATOR), False, by_systemd=True),
    ExitCode(Exit.SYSTEMD_CREDENTIALS, "systemd: the unit's password file in /etc/fedhar is missing", (CLIENT, COORDINATOR), False,
             by_systemd=True),
)  # fmt: skip


def fail(message: str, code: int = Exit.USAGE) -> int:
    """Print a program's one-line refusal ``message`` on stderr and return its exit status ``code``."""
    print(message, file=sys.stderr)
    return code


def stopped_by(signum: int) -> int:
    """The exit status of a program stopped by signal ``signum``: 128 + signum, the shell's convention (SIGINT 130, SIGTERM 143)."""
    return 128 + int(signum)


def _known(program: str) -> None:
    if program not in PROGRAMS:
        raise ValueError(f"unknown program {program!r}; one of {', '.join(PROGRAMS)}")


def of(program: str) -> list[ExitCode]:
    """The rows for ``program`` that it returns itself (systemd's own codes left out), by number; ValueError if unknown."""
    _known(program)
    return [c for c in EXIT_CODES if program in c.programs and not c.by_systemd]


def restart_prevented(program: str) -> set[int]:
    """The codes its systemd unit must list in ``RestartPreventExitStatus=`` (a restart cannot fix them, systemd's
    included); ValueError for an unknown program."""
    _known(program)
    return {int(c.code) for c in EXIT_CODES if program in c.programs and not c.restart_helps}


def epilog(program: str) -> str:
    """The ``--help`` epilog of ``program``: its exit statuses, one a line (raw-epilog formatter); ValueError if unknown."""
    lines = [f"  {int(c.code):>3}  {c.meaning_for(program)}" for c in of(program)]
    return "exit status (README, 'Exit codes'):\n" + "\n".join(lines)


def markdown_table() -> str:
    """The README's exit-code table (Markdown), one row per code, with the programs and whether systemd restarts."""

    def cell(c: ExitCode) -> str:
        text = c.meaning
        for program, more in c.detail.items():
            text += f"; `{program}`: {more}"
        return text.replace("|", "\\|")

    rows = ["| code | name | meaning | returned by | the units restart |", "|---|---|---|---|---|"]
    for c in EXIT_CODES:
        who = "systemd, for " if c.by_systemd else ""
        who += ", ".join(f"`{p}`" for p in c.programs) if c.programs != PROGRAMS else "all"
        restart = "-" if c.code in (Exit.OK, Exit.SIGINT, Exit.SIGTERM) else ("yes" if c.restart_helps else "no")
        rows.append(f"| {int(c.code)} | {c.code.name.lower()} | {cell(c)} | {who} | {restart} |")
    return "\n".join(rows)


ErrorExits = Sequence[tuple["type[BaseException] | tuple[type[BaseException], ...]", Exit]]
"""Exception kinds and the exit status each ends a program with, first match wins (:func:`exit_status_of`)."""


def exit_status_of(prog: str, body: Callable[[], int | None], errors: ErrorExits, interrupted: str | None = None) -> int:
    """Run ``body`` (its return value is the status, None: OK) and turn the errors a person can act on into one line on
    stderr and an exit status.

    ``errors`` are tried in order: the first match prints ``"{prog}: {exc}"`` and gives its status;
    an exception matching none propagates (a bug). With ``interrupted``, Ctrl-C prints
    ``"{prog}: {interrupted}"`` and gives :attr:`Exit.SIGINT`; without it, it propagates.
    """
    try:
        status = body()
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        return fail(f"{prog}: {interrupted}", Exit.SIGINT)
    except Exception as exc:
        for kinds, code in errors:
            if isinstance(exc, kinds):
                return fail(f"{prog}: {exc}", code)
        raise
    return Exit.OK if status is None else status


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
