"""Every console script enters through har_io.entry: a missing extra is exit 7 with the module and the fix."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from har_io import entry
from har_io.exit_codes import Exit

ROOT = Path(__file__).resolve().parents[1]


def test_every_script_of_the_project_enters_through_the_table() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(entry.SCRIPTS)
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert module == "har_io.entry" and callable(getattr(entry, attr)), name
        assert (ROOT / (entry.SCRIPTS[name].module.replace(".", "/") + ".py")).is_file(), name


def test_a_module_missing_at_import_is_exit_7_naming_it_and_the_extra(monkeypatch, capsys) -> None:
    monkeypatch.setitem(entry.SCRIPTS, "fedhar-coordinator", entry.Script("fedhar_no_such_module", "coordinator", "coordinator", True))
    assert entry.run("fedhar-coordinator", []) == Exit.MISSING_MODULE == 7
    err = capsys.readouterr().err
    assert "the Python module 'fedhar_no_such_module' is not installed" in err
    assert "install the coordinator's extra" in err and "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in err
    # fedhar is not on PyPI: the extra is installed from this checkout, by path, with this interpreter's pip
    assert f"-m pip install -e '{ROOT}[coordinator]'" in err and "fedhar[" not in err


def test_the_program_runs_with_its_own_exit_status() -> None:
    with pytest.raises(SystemExit) as e:  # argparse's own exit for --help
        entry.run("fedhar-compare", ["--help"])
    assert e.value.code == 0


@pytest.mark.parametrize("program", sorted(entry.SCRIPTS))
def test_every_program_says_its_release_with_version(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert entry.run(program, ["--version"]) == Exit.OK
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{program} {version('fedhar')} (Python ") and entry.release() == version("fedhar")
