"""One table of exit codes (har_io/exit_codes.py): the README's table, each program's --help and the code agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from har_io import exit_codes
from har_io.exit_codes import EXIT_CODES, Exit

ROOT = Path(__file__).resolve().parents[1]
MODULES = {
    exit_codes.CLIENT: "edge_client.cli",
    exit_codes.COORDINATOR: "coordinator.cli",
    exit_codes.SIMULATE: "simulation.simulate",
    exit_codes.STUDY: "simulation.study",
    exit_codes.APP: "edge_client.app.main",
}


def _readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("| code | name | meaning |")
    return text[start : text.index("\n\n", start)]


def test_readme_table_is_the_generated_one():
    assert _readme_table() == exit_codes.markdown_table()


def test_every_number_has_one_name_and_known_values():
    numbers = [int(c.code) for c in EXIT_CODES]
    assert numbers == sorted(set(numbers))
    # The numbers that one meant two things, and what they mean now (hand-written).
    assert (Exit.BROKER_REFUSED, Exit.FEDERATION_FAILED, Exit.FOLDER_UNUSABLE) == (4, 5, 6)
    assert (Exit.MISSING_MODULE, Exit.DUPLICATE_ID, Exit.SIGINT, Exit.SIGTERM) == (7, 8, 130, 143)
    rows = {int(c.code): c for c in EXIT_CODES}
    assert exit_codes.CLIENT not in rows[5].programs and exit_codes.CLIENT in rows[6].programs
    assert rows[5].restart_helps and not rows[8].restart_helps and rows[203].by_systemd


@pytest.mark.slow
@pytest.mark.parametrize("program", sorted(MODULES))
def test_help_ends_with_the_programs_rows(program):
    r = subprocess.run([sys.executable, "-m", MODULES[program], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    shown = r.stdout[r.stdout.index("exit status (README, 'Exit codes'):") :].splitlines()[1:]
    assert [int(line.split()[0]) for line in shown] == [int(c.code) for c in exit_codes.of(program)]
    assert shown == exit_codes.epilog(program).splitlines()[1:]


@pytest.mark.parametrize("program", sorted(MODULES))
def test_no_bare_exit_number_in_a_program(program):
    """Every status a program returns is a name of the table, so a number cannot drift from its meaning."""
    src = (ROOT / (MODULES[program].replace(".", "/") + ".py")).read_text()
    assert re.findall(r"(?:return|sys\.exit\(|SystemExit\(|PlanError\()\s*[1-9]\d*\b", src) == []


def test_unknown_program_is_named():
    with pytest.raises(ValueError, match="unknown program 'fedhar-x'"):
        exit_codes.epilog("fedhar-x")


def test_client_exits_6_when_another_client_holds_the_state_folder(tmp_path):
    from edge_client.cli import prepare
    from edge_client.store import ClientStore
    from har_models.data.labels import HAPT_LABELS

    holder = ClientStore(tmp_path / "state", HAPT_LABELS, owner="first")
    try:
        rc = prepare(["--client-id", "second", "--source", "hapt:" + str(ROOT / "datasets/hapt/user01.npz"),
                      "--state-dir", str(tmp_path / "state"), "--backend", "numpy"])  # fmt: skip
    finally:
        holder.close()
    assert rc == Exit.FOLDER_UNUSABLE == 6


def test_exit_status_of_maps_errors_in_order_and_lets_bugs_through(capsys):
    class Damaged(ValueError):
        pass

    errors = [(Damaged, Exit.FOLDER_UNUSABLE), ((ValueError, OSError), Exit.USAGE)]

    def fail(exc: BaseException):
        def body():
            raise exc

        return body

    # The first matching row wins: Damaged is a ValueError, but its own row comes first.
    assert exit_codes.exit_status_of("prog", fail(Damaged("folder x is damaged")), errors) == Exit.FOLDER_UNUSABLE
    assert capsys.readouterr().err == "prog: folder x is damaged\n"
    assert exit_codes.exit_status_of("prog", fail(OSError("no such file y")), errors) == Exit.USAGE
    assert capsys.readouterr().err == "prog: no such file y\n"
    assert exit_codes.exit_status_of("prog", lambda: None, errors) == Exit.OK
    assert exit_codes.exit_status_of("prog", lambda: Exit.DATA, errors) == Exit.DATA
    assert exit_codes.exit_status_of("prog", fail(KeyboardInterrupt()), errors, interrupted="stopped") == Exit.SIGINT
    assert capsys.readouterr().err == "prog: stopped\n"
    with pytest.raises(KeyError):  # a bug keeps its traceback
        exit_codes.exit_status_of("prog", fail(KeyError("k")), errors)
    with pytest.raises(KeyboardInterrupt):  # no message for Ctrl-C given: it propagates
        exit_codes.exit_status_of("prog", fail(KeyboardInterrupt()), errors)


@pytest.mark.slow
def test_every_main_returns_a_name_of_the_table_not_a_bare_number():
    """A ``main`` (or ``*_main``) of the packages says ``return Exit.USAGE``, never ``return 2``: the number then means
    what the table says, and a grep for a code's name finds every place that returns it."""
    import ast

    bare: list[str] = []
    for package in ("har_io", "edge_client", "coordinator", "simulation"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.FunctionDef) and (node.name == "main" or node.name.endswith("_main")):
                    for ret in ast.walk(node):
                        if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Constant) and isinstance(ret.value.value, int):
                            bare.append(f"{path.relative_to(ROOT)}:{ret.lineno} {node.name}: return {ret.value.value}")
    assert bare == [], "return a name of har_io.exit_codes.Exit instead:\n" + "\n".join(bare)
