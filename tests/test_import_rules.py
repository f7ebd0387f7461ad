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


PRODUCT = ("har_models", "har_io", "edge_client", "coordinator", "simulation")


def _module_files() -> dict[str, Path]:
    """Dotted name -> file of every product module (a package is its ``__init__.py``)."""
    out = {}
    for package in PRODUCT:
        for f in _modules(package):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports, every import counted (function-local and ``TYPE_CHECKING`` ones too: a
    reader of the code follows those as well). ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``."""
    files = _module_files()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, f in files.items():
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            graph[m].update(t for n in names if (t := resolve(n)) is not None and t != m)
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` (its nodes in order), or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str]:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return [*path[path.index(w):], w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return []

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return []


def test_the_checker_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    circle = _circle(_import_graph())
    assert not circle, f"these modules import each other in a circle: {' -> '.join(circle)}"


def test_no_import_runs_back_up_in_any_folder() -> None:
    """In every folder, its files and sub-folders (each one room) import each other without a circle: then every room
    stands on a floor above all it imports, and no import runs from a lower floor back up to a higher one."""
    graph = _import_graph()
    folders = {m.rpartition(".")[0] for m in graph} | {m for m in graph if _module_files()[m].name == "__init__.py"}
    broken = {}
    for folder in sorted(f for f in folders if f):
        def room(m: str, folder: str = folder) -> str | None:
            if not m.startswith(folder + "."):
                return None
            return m[len(folder) + 1:].split(".")[0]

        rooms: dict[str, set[str]] = {}
        for m, targets in graph.items():
            a = room(m)
            if a is None:
                continue
            rooms.setdefault(a, set()).update(b for t in targets if (b := room(t)) is not None and b != a)
        circle = _circle(rooms)
        if circle:
            broken[folder] = " -> ".join(circle)
    assert not broken, f"imports that run back up (rooms of one folder in a circle): {broken}"
