"""The house rules of DESIGN.md section 1, checked on every module's imports (AST, so nothing is executed).

- the core (``har_models``) holds math and formats: no network, command line, OS-call or UI
  library, and none of the programs or adapters;
- the adapters (``har_io``) serve both programs and import neither;
- ``edge_client`` never imports ``coordinator``, nor the reverse;
- the research harness (``simulation``) starts the programs and is imported by none of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN: dict[str, set[str]] = {
    "har_models": {"paho", "argparse", "socket", "ssl", "ctypes", "subprocess", "kivy", "jnius", "smbus2",
                   "har_io", "edge_client", "coordinator", "simulation"},
    "har_io": {"edge_client", "coordinator", "simulation"},
    "edge_client": {"coordinator", "simulation"},
    "coordinator": {"edge_client", "simulation"},
    "simulation": set(),
}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imported_roots(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth (function-local imports too)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_house_rules(package: str) -> None:
    files = _modules(package)
    assert files, f"no modules found under {package}/"
    broken = {}
    for f in files:
        name = str(f.relative_to(ROOT))
        bad = _imported_roots(f) & FORBIDDEN[package]
        if bad:
            broken[name] = sorted(bad)
    assert not broken, f"{package} imports what the house rules forbid: {broken}"


def test_the_checker_sees_function_local_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef g():\n    from paho.mqtt import client\n    import argparse as a\n")
    assert _imported_roots(f) == {"os", "paho", "argparse"}


def _imported_modules(path: Path) -> set[str]:
    """Full names of every module ``path`` imports (``from a.b import c`` gives ``a.b``), function-local imports too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


BROKER_MAY_IMPORT = ("coordinator.broker", "coordinator", "har_models.files", "har_models.wire.chunking", "har_models.wire.topics",
                     "har_io.exit_codes")  # fmt: skip
"""What the broker tooling (``coordinator/broker/``) may import beside the standard library: it runs on an operator's
machine from a bare install (no numpy, paho or torch; tests/test_broker_cli.py installs it so), and the home server's
``coordinator.server.broker_admin`` imports it, never the reverse."""


def test_the_broker_tooling_imports_only_the_standard_library_and_its_few_helpers() -> None:
    import sys

    files = _modules("coordinator/broker")
    assert files, "no modules found under coordinator/broker/"
    broken = {}
    for f in files:
        bad = sorted(
            m for m in _imported_modules(f)
            if m.split(".")[0] not in sys.stdlib_module_names and m not in BROKER_MAY_IMPORT and not m.startswith("coordinator.broker.")
        )  # fmt: skip
        if bad:
            broken[str(f.relative_to(ROOT))] = bad
    assert not broken, f"the broker tooling imports more than the standard library and its helpers: {broken}"
    # The one-command script is only its wrapper.
    wrapper = _imported_modules(ROOT / "firmware_scripts" / "mosquitto_config.py")
    assert wrapper == {"__future__", "sys", "pathlib", "coordinator.broker.cli"}
