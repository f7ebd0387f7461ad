"""The README's two fresh-machine commands stay true: CI runs the second one verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()[:12]
    return [ln.strip() for ln in lines if ln.startswith("    ") and ln.strip()]


def test_readme_opens_with_exactly_two_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert cmds[0].endswith("fedhar-simulate") and "pip install" in cmds[0]
    assert "pytest" in cmds[1] and "'.[test]'" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in [ln.strip() for ln in ci]


def test_console_scripts_exist():
    text = (ROOT / "pyproject.toml").read_text()
    for script in ("fedhar-simulate", "fedhar-coordinator", "fedhar-client"):
        assert f"{script} = " in text


def test_ci_checks_style_and_types_over_the_whole_tree_before_the_tests():
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in ci  # a failing check stops CI
    tests = ci.index(_readme_commands()[1])
    # Bare commands: ruff and mypy take their settings (and mypy its list of files) from pyproject.toml.
    assert ".venv/bin/ruff check ." in ci[:tests] and ".venv/bin/mypy" in ci[:tests]


def test_style_and_types_run_once_in_ci_not_again_in_the_tests():
    # .ci/run is the one place: a test that ran ruff or mypy would make CI run them twice.
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.count("bin/ruff check") == 1 and ci.count("bin/mypy") == 1
    for test in (ROOT / "tests").glob("test_*.py"):
        text = test.read_text()
        if test.name != "test_readme.py":
            assert '"ruff", "check"' not in text and '"mypy", "' not in text, f"{test.name} runs ruff or mypy again"
