"""``import attnbook`` loads only what the first chapter starts with; every submodule is an
attribute that loads on first use."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnbook"
MOVED = {"grader": "attnbook.course.grader", "sandbox": "attnbook.course.sandbox"}  # one-release aliases
SUBMODULES = sorted(i.name for i in pkgutil.iter_modules([str(PACKAGE)])
                    if not i.name.startswith("_") and i.name not in MOVED)


def _loaded(code: str) -> list[str]:
    """The attnbook modules a fresh interpreter holds after running ``code``."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('attnbook'))))"
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_import_attnbook_loads_at_most_eight_of_the_packages_modules():
    loaded = [m for m in _loaded("import attnbook") if m != "attnbook"]
    assert len(loaded) <= 8, loaded
    assert "attnbook.core" in loaded and "attnbook.utils" in loaded
    assert not any(m.startswith(("attnbook.exercises", "attnbook.course", "attnbook.kernels")) for m in loaded)


@pytest.mark.parametrize("name", SUBMODULES)
def test_every_submodule_is_an_attribute_that_loads_on_first_use(name):
    import attnbook

    assert name in dir(attnbook)
    module = getattr(attnbook, name)
    assert module.__name__ == f"attnbook.{name}"


def test_an_unknown_attribute_raises_attribute_error():
    import attnbook

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnbook.nope  # noqa: B018


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_module_still_imports_and_warns_for_one_release(name):
    code = (f"import warnings\nwarnings.simplefilter('error')\ntry:\n    import attnbook.{name}\n"
            f"except DeprecationWarning as err:\n    print('warned:', err)\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert f"warned: attnbook.{name} moved to {MOVED[name]}" in run.stdout
    probe = f"import warnings\nwarnings.simplefilter('ignore')\nimport attnbook.{name} as m\nprint(m.__name__)"
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == MOVED[name]


def test_the_library_never_imports_the_course_kit():
    import ast

    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        # the kit, and the names that forward to it: the checks' and two one-release aliases
        if rel.parts[0] == "course" or rel.name in ("exercises.py", "grader.py", "sandbox.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            assert not any(n.split(".")[-1] in ("course", "grader", "sandbox", "exercises")
                           or ".course" in n for n in names), (rel, names)
