"""The package's layers (pyproject.toml's ``[tool.importlinter]``), checked by import-linter, and
no import cycle anywhere in the package, function-level imports included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout and "KEPT" in run.stdout


def _cycle(imports: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among ``imports`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(imports.get(module, ())):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(imports):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_module_of_the_package_is_in_an_import_cycle():
    graph = grimp.build_graph("attnbook", include_external_packages=False)
    # a package's __init__ importing its own submodules is how a package exposes them: leave out
    # the edges from a package to its children and from a child to its parent package
    imports = {
        m: {o for o in graph.find_modules_directly_imported_by(m)
            if not o.startswith(m + ".") and not m.startswith(o + ".")}
        for m in graph.modules
    }
    assert _cycle(imports) is None, " -> ".join(_cycle(imports))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
