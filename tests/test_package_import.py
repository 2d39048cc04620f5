"""``import attnbook`` loads only what the first chapter starts with; every submodule is an
attribute that loads on first use."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnbook"
SUBMODULES = sorted(i.name for i in pkgutil.iter_modules([str(PACKAGE)]) if not i.name.startswith("_"))


def _loaded(code: str) -> list[str]:
    """The attnbook modules a fresh interpreter holds after running ``code``."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('attnbook'))))"
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_import_attnbook_loads_at_most_eight_of_the_packages_modules():
    loaded = [m for m in _loaded("import attnbook") if m != "attnbook"]
    assert len(loaded) <= 8, loaded
    assert "attnbook.core" in loaded and "attnbook.utils" in loaded
    assert not any(m.startswith(("attnbook.exercises", "attnbook.grader", "attnbook.kernels")) for m in loaded)


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
